"""A registered peer serves a well-formed update blob holding one finite huge value (1e30). Before
the value bound, the exact aggregation raised on it (fedavg, trimmed-mean) and every honest peer
crashed; now `wire.read_vector` refuses it, every peer leaves it out like a malformed blob, and
the others aggregate and finalize without it. And if aggregation still raises (defence in
depth), the peer logs it and attests nothing for the round instead of ending."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
import trio

from node.chain.records import RoundState
from node.peer.peer import Peer, RoundOutcome
from node.protocol import aggregate, wire
from node.protocol.blob import sha256
from node.protocol.settings import SharedSettings
from tests.node.peer.harness import (
    MECHANISM,
    SHARED,
    FakeSwarm,
    closed_round,
    genesis_vector,
    member_address,
    run_virtual,
    samples_of,
    update_blob,
    update_vector,
)

T, F = True, False
RULES = ["fedavg", "trimmed-mean"]  # the two whose fixed-point sums overflowed


def huge_blob(seed: int) -> bytes:
    """A real update, but one coordinate is 1e30: finite, canonical, the right size and kind."""
    vector = update_vector(seed)
    vector[7] = 1e30
    return wire.update_blob(vector, 1, wire.canonical(MECHANISM), member_address(seed))


def next_model_digest(shared: SharedSettings, blobs: list[bytes], samples: list[int]) -> bytes:
    vectors = [wire.read_vector(b, genesis_vector().numel(), kind="update")[0] for b in blobs]
    return sha256(wire.model_blob(aggregate.next_global(shared, genesis_vector(), vectors, samples), 1))


@pytest.mark.parametrize("rule", RULES)
def test_a_blob_holding_1e30_is_left_out_and_the_rest_is_aggregated(rule, caplog):
    shared = dataclasses.replace(SHARED, aggregation=rule)
    honest = [update_blob(0), update_blob(1)]
    raw = torch.stack([update_vector(0), update_vector(1), update_vector(2)])
    raw[2, 7] = 1e30
    # what crashed every peer (untrimmed: of 3 values a trimmed mean now drops the extreme one itself)
    with pytest.raises(ValueError, match="too large for exact fixed-point"):
        aggregate.aggregate(rule, list(raw), [samples_of(i) for i in range(3)], trim_ratio=0.0)

    async def main():
        swarm, blobs, digests = closed_round(3, [*honest, huge_blob(2)])
        peer = swarm.peer(0, shared=shared)

        agreement = await peer._agreement(1)
        included = await agreement.run()

        assert included == [T, T, F]  # left out, as a malformed blob is
        assert agreement.blobs.malformed[2] and agreement.blobs.vectors[2] is None
        digest = await peer._aggregate(1, genesis_vector(), agreement.commitments, agreement.blobs.vectors, included)
        assert digest == next_model_digest(shared, honest, [samples_of(0), samples_of(1)])
        assert swarm.members[0].store.get(digest.hex()) is not None  # stored (and announced) for the others

    with caplog.at_level(logging.WARNING, logger="swarm.peer"):
        run_virtual(main)
    (warning,) = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert "round 1" in warning and "participant 2" in warning and "update value 1e+30 at coordinate 7" in warning


@pytest.mark.parametrize("rule", RULES)
def test_three_honest_peers_finalize_a_round_without_the_huge_blob(rule):
    """A fourth member commits the 1e30 blob; the three real peers leave it out alike, attest
    the same (digest, bitmap), and the round finalizes: nobody crashed."""

    async def main():
        swarm = FakeSwarm(4)
        shared = dataclasses.replace(SHARED, aggregation=rule)  # the genesis pins the rule: deploy that one
        genesis = sha256(wire.genesis_blob(genesis_vector(), shared.to_dict()))
        swarm.chain.params = dataclasses.replace(swarm.chain.params, genesis_digest=genesis)
        swarm.register(3)
        swarm.commit(3, huge_blob(3))
        peers = [swarm.peer(i, shared=shared) for i in range(3)]
        outcomes: list[RoundOutcome] = []

        async def one(p: Peer) -> None:
            outcomes.extend(await p.run())

        async with trio.open_nursery() as nursery:
            for p in peers:
                nursery.start_soon(one, p)

        info = swarm.members[0].ledger.round_info(1)
        assert info.state is RoundState.FINALIZED
        commitments = swarm.members[0].ledger.commitments(1)
        flags = [c.peer != swarm.members[3].address for c in commitments]
        assert flags.count(False) == 1
        stores = {m.address: m.store for m in swarm.members}
        kept = [(stores[c.peer].get(c.digest.hex()), c.num_samples) for c, f in zip(commitments, flags) if f]
        expected = next_model_digest(shared, [b for b, _ in kept], [n for _, n in kept])
        assert info.finalized_digest == expected
        assert len(outcomes) == 3
        assert all(o.state == "finalized" and o.included == flags for o in outcomes)

    run_virtual(main)


def test_an_aggregation_that_still_raises_ends_the_round_without_a_vote_not_the_peer(monkeypatch, caplog):
    """Defence in depth: whatever the aggregation raises, the peer logs it, attests nothing, and
    plays on; with nobody voting the round is aborted after the attestation window."""

    def broken(*args, **kwargs):
        raise ValueError("values too large for exact fixed-point averaging (simulated)")

    monkeypatch.setattr(aggregate, "next_global", broken)

    async def main():
        swarm, blobs, digests = closed_round(3)
        peer = swarm.peer(0)

        outcome, vector = await peer.play_round(1, genesis_vector())

        assert outcome.state == "aborted" and outcome.committed and outcome.included == []  # no vote
        assert swarm.chain.rounds[0].attestations == []
        assert swarm.chain.live.number == 2  # the chain moved on, and so can the peer
        assert vector.equal(genesis_vector())

    with caplog.at_level(logging.ERROR, logger="swarm.peer"):
        run_virtual(main)
    assert any("round 1: aggregation of 3 blobs failed, attesting nothing" in r.getMessage() for r in caplog.records)


def test_a_round_where_every_blob_is_left_out_ends_in_no_vote_not_a_crash():
    """Every release of the round holds a value past the fixed-point bound (a diverging model under
    PNPM on the weights did this at round 10 of a default `swarm up`): each peer leaves every blob
    out, its own included, and casts no vote; the peer process goes on."""

    async def main():
        swarm, _, _ = closed_round(3, [huge_blob(i) for i in range(3)])
        for i in range(3):
            out = RoundOutcome(round=1, state="closed")
            await swarm.peer(i)._aggregate_and_attest(1, genesis_vector(), out)
            assert (out.included, out.gas_used) == ([], 0)
            assert len(out.left_out) == 3 and all("malformed" in why for why in out.left_out)
        assert swarm.members[0].ledger.attestations(1) == []

    run_virtual(main)
