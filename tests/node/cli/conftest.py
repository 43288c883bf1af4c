"""Real Anvil chains for the CLI tests, as tests/node/chain/conftest.py starts them: "automine" (a
block per transaction) and "testnet" (chain id 11155111, a block every second); and a finished
run folder with its saved chain (`swarm simulate --ledger`: 3 peers on digits, 2 rounds)."""

from __future__ import annotations

import pytest

from node.chain.anvil import start_anvil
from node.config import load_config
from node.runs.simulate import Simulation

RECORDED_SETS = [
    "data.dataset=digits",
    "model.name=logreg",
    "train.dp_sgd=false",
    "train.batch_size=32",
    "train.lr=0.3",
    "swarm.peers=3",
    "swarm.rounds=2",
]


@pytest.fixture(scope="session")
def automine_chain():
    with start_anvil(accounts=8) as anvil:
        yield anvil


@pytest.fixture(scope="session")
def testnet_chain():
    with start_anvil(accounts=8, chain_id=11155111, block_time=1) as anvil:
        yield anvil


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory):
    """A finished, verifiable run folder: run.json, archive/, chain/state.json (read, never changed)."""
    out = tmp_path_factory.mktemp("recorded") / "sim"
    Simulation(load_config(None, RECORDED_SETS), out=out, ledger=True).run()
    return out
