"""scripts/scaling_model.py: the message-count simulation agrees with the closed forms it stands for
(docs/SCALING.md), for small swarms, in well under a second."""

from __future__ import annotations

import importlib.util
import itertools
import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("scaling_model", ROOT / "scripts" / "scaling_model.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaling_model"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


sm = _load()
GAS = sm.Gas(register=139_464, commit=65_787, close=73_502, attest=57_390, attest_peers=64, source="test")
MESH = sm.Mesh(6, 4, 12, 1.0, 3, 6, 0.25, "test")


@pytest.mark.parametrize("n", [2, 5, 7, 16, 40])
def test_gossip_reaches_every_peer_once_and_sends_2e_minus_n_plus_1(n: int) -> None:
    # forward on first receipt to every mesh peer but the forwarder and the origin: each message is
    # sent sum(degree) - (N - 1) = 2E - (N - 1) times and delivered N - 1 times, whatever the origin
    adj = sm.build_mesh(n, MESH, random.Random(n))
    edges = sum(len(a) for a in adj) // 2
    assert all(p not in a for p, a in enumerate(adj)) and all(p in adj[q] for p in range(n) for q in adj[p])
    assert all(len(a) <= MESH.degree_high for a in adj)
    for origin in range(n):
        run = sm.propagate(adj, origin)
        assert run.deliveries == n - 1
        assert run.transmissions == 2 * edges - (n - 1)
        assert run.duplicates == run.transmissions - run.deliveries


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9, 16, 33])
def test_chain_attestations_stop_at_the_strict_majority(n: int) -> None:
    chain = sm.Chain()
    cr = sm.simulate_chain(n, GAS, chain, [0.5] * n, random.Random(1))
    votes = cr.txs["attest"] - cr.reverted["attest"]
    assert votes == n // 2 + 1
    assert cr.txs["commit"] == n and cr.reverted["commit"] == 0
    # the close race: every waiting peer sends closeRound, one closes, the rest revert
    assert cr.txs["close"] == n and cr.reverted["close"] == n - 1
    assert cr.gas["commit"] == n * GAS.commit
    assert cr.gas["close"] == GAS.close + (n - 1) * sm.reverted_close_gas()
    assert cr.gas["attest"] == votes * sm.attest_gas(GAS, n) + cr.reverted["attest"] * sm.reverted_attest_gas(n)
    assert cr.closed_at < cr.finalized_at


def test_commits_fill_blocks_by_gas() -> None:
    chain = sm.Chain(block_share=0.01)  # 300,000 gas for the swarm: 4 commits per block
    per_block = 300_000 // GAS.commit
    cr = sm.simulate_chain(10, GAS, chain, [0.1] * 10, random.Random(0), commit_spread=0.5)
    assert cr.commits_per_block == per_block == 4
    assert cr.blocks_commit == math.ceil(10 / per_block)


@pytest.mark.parametrize("n", [2, 6, 17])
def test_all_to_all_moves_n_minus_1_blobs_per_peer(n: int) -> None:
    for rule in ("committer", "any-holder"):
        uploads = sm.all_to_all_uploads(n, rule, np.random.default_rng(0))
        assert uploads.sum() == n * (n - 1)  # each peer downloads N - 1 blobs: the mean upload too
    assert (sm.all_to_all_uploads(n, "committer", np.random.default_rng(0)) == n - 1).all()


@pytest.mark.parametrize("n", [5, 30, 200])
def test_one_blob_spread(n: int) -> None:
    from_committer = sm.spread_one(n, [0], "committer", n, random.Random(0))
    assert from_committer.uploads[0] == n - 1 and from_committer.steps == 1
    fanout = 3
    any_holder = sm.spread_one(n, [0], "any-holder", fanout, random.Random(0))
    assert sum(any_holder.uploads) == n - 1
    # each slot a holder serves at most `fanout`: holders grow at most (1 + fanout)-fold per slot
    assert any_holder.steps >= math.ceil(math.log(n) / math.log(1 + fanout))
    assert max(any_holder.uploads) <= fanout * any_holder.steps


def test_round_figures_follow_the_closed_forms() -> None:
    n = 12
    r = sm.simulate_round(n, model=sm.CNN, gas=GAS, mesh=MESH, seed=3)
    assert r.blobs["download_per_peer"] == (n - 1) * sm.CNN.update_bytes
    assert r.blobs["total_bytes"] == n * (n - 1) * sm.CNN.update_bytes
    assert r.gossip["per_message_deliveries"] == n - 1
    assert r.gossip["transmissions"] == r.gossip["per_message_transmissions"] * r.gossip["published"]
    assert r.chain["txs"]["attest"] - r.chain["reverted"]["attest"] == n // 2 + 1
    # a participants() read: block_number, roundInfo, one eth_getLogs (+ commitmentsByDigest if the client calls it)
    assert r.rpc["participants_read_calls"] == 3 + sm.commitments_reads_storage()
    assert r.rpc["participants_read_bytes"] > n * sm.COMMITTED_LOG


def test_committee_capture_probability() -> None:
    # hypergeometric against a direct count on a tiny population, and the impossible case
    n, f, k = 10, 4, 5
    draws = list(itertools.combinations(range(n), k))
    captured = sum(1 for c in draws if sum(1 for x in c if x < f) >= k // 2 + 1)
    hyper, binom = sm.majority_capture(n, f, k)
    assert hyper == pytest.approx(captured / len(draws))
    assert 0 < binom < 1
    assert sm.majority_capture(1000, 10, 64)[0] == 0.0  # 10 peers cannot hold 33 seats


def test_gas_is_read_from_the_benchmarks_doc(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(
        "<!-- bench:ledger -->\n| operation | gas |\n|---|---|\n| register (x) | 100 |\n| commit (max) | 200 |\n"
        "| closeRound | 300 |\n| attest (max) | 400 |\n\n| peers | commit max | closeRound | attest first |\n"
        "| 4 | 200 | 300 | 401 | 9 |\n| 16 | 200 | 300 | 402 | 9 |\n<!-- /bench:ledger -->\n"
    )
    gas = sm.measured_gas(doc)
    assert (gas.register, gas.commit, gas.close, gas.attest, gas.attest_peers) == (100, 200, 300, 402, 16)
    assert sm.measured_gas(tmp_path / "missing.md") == sm.FALLBACK_GAS
