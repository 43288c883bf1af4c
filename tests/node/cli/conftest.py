"""Real Anvil chains for the CLI tests, as tests/node/chain/conftest.py starts them: "automine" (a
block per transaction) and "testnet" (chain id 11155111, a block every second)."""

from __future__ import annotations

import pytest

from node.chain.anvil import start_anvil


@pytest.fixture(scope="session")
def automine_chain():
    with start_anvil(accounts=8) as anvil:
        yield anvil


@pytest.fixture(scope="session")
def testnet_chain():
    with start_anvil(accounts=8, chain_id=11155111, block_time=1) as anvil:
        yield anvil
