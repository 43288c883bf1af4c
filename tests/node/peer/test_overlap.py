"""What a peer overlaps with waiting: it fetches the blobs of an open round as their
commits land, and trains the next round on its own aggregate while the majority forms, keeping
that training only if the chain finalizes exactly that model. Real `Peer`s on the fakes, in
trio's virtual time."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
import trio

from node.chain.errors import LedgerError
from node.chain.records import RoundState
from node.peer.peer import Peer
from node.peer.watch import REREAD_AFTER
from node.protocol import aggregate, wire
from node.protocol.blob import sha256
from node.protocol.settings import SharedSettings
from tests.node.peer.harness import (
    FETCH_TIMEOUT,
    SHARED,
    FakeSwarm,
    closed_round,
    digest_of,
    genesis_vector,
    run_virtual,
    samples_of,
    update_blob,
    update_vector,
)
from tests.node.peer.test_peer_round import run_all


def record_trainings(peer: Peer, swarm: FakeSwarm, log: list[tuple[int, bool, RoundState]]) -> None:
    """Log (round trained, from genesis?, state of the previous round on chain then) per training."""
    train = peer._train_and_perturb

    def logged(r: int, base: torch.Tensor) -> tuple[torch.Tensor, int]:
        before = swarm.chain.round(r - 1).state if r > 1 else RoundState.FINALIZED
        log.append((r, bool(base.equal(genesis_vector())), before))
        return train(r, base)

    peer._train_and_perturb = logged  # type: ignore[method-assign]


def test_peers_train_the_next_round_on_their_own_aggregate_before_the_round_finalizes():
    async def main():
        swarm = FakeSwarm(3)
        peers = [swarm.peer(i, rounds=2) for i in range(3)]
        logs: list[list[tuple[int, bool, RoundState]]] = [[] for _ in peers]
        for peer, log in zip(peers, logs):
            record_trainings(peer, swarm, log)
        for slow in peers[1:]:  # peer 0 attests first, the majority forms 5 s later
            attest = slow._aggregate_and_attest

            async def later(r, previous, out, attest=attest):
                await trio.sleep(5)
                return await attest(r, previous, out)

            slow._aggregate_and_attest = later  # type: ignore[method-assign]

        outcomes = await run_all(peers)

        assert [swarm.chain.round(r).state for r in (1, 2)] == [RoundState.FINALIZED] * 2
        for log, outcome in zip(logs, outcomes):
            # one training per round, none thrown away: round 2's started from the aggregate, not genesis
            assert [(r, from_genesis) for r, from_genesis, _ in log] == [(1, True), (2, False)]
            assert [o.state for o in outcome] == ["finalized", "finalized"]
            assert all(o.train_started is not None and o.train_ended >= o.train_started for o in outcome)
        # the first attester began round 2 while round 1 still waited for its majority
        assert logs[0][1][2] is RoundState.CLOSED
        # and what they committed in round 2 is what the chain holds
        assert {c.peer for c in swarm.members[0].ledger.commitments(2)} == {m.address for m in swarm.members}

    run_virtual(main)


def test_a_speculation_on_a_model_the_chain_did_not_finalize_is_dropped():
    """Peer 0 attests alone, the others never vote: round 1 is aborted, so the model is still
    genesis and the round-2 update trained on peer 0's own aggregate is thrown away unseen."""

    async def main():
        swarm = FakeSwarm(3, min_peers=1)
        swarm.register(1, 2)
        for i in (1, 2):
            swarm.commit(i, update_blob(i))
        peer = swarm.peer(0, rounds=2)
        log: list[tuple[int, bool, RoundState]] = []
        record_trainings(peer, swarm, log)

        outcome = await peer.run()

        assert [o.state for o in outcome] == ["aborted", "finalized"]
        assert [(r, from_genesis) for r, from_genesis, _ in log] == [(1, True), (2, False), (2, True)]
        (mine,) = swarm.members[0].ledger.commitments(2)  # the round-2 commit: trained from genesis
        blob = swarm.members[0].store.get(mine.digest.hex())
        assert blob is not None and outcome[1].committed

    run_virtual(main)


def test_a_peer_fetches_the_blobs_of_an_open_round_as_their_commits_land():
    """Members 1 and 2 commit at once, member 3 at t = 30 s: peer 0 holds 1's and 2's blobs long
    before the round closes, so at close only the last committer's blob is left to fetch."""

    async def main():
        swarm = FakeSwarm(4)
        swarm.register(0, 1, 2, 3)
        for i in (1, 2):
            swarm.commit(i, update_blob(i))
        swarm.chain.params = swarm.chain.params.__class__(
            **{**swarm.chain.params.__dict__, "commit_window": 1000}
        )  # the round stays open until the last commit
        peer = swarm.peer(0)
        late: dict[str, float] = {}

        async def commit_late():
            await trio.sleep(30)
            late["digest"] = swarm.commit(3, update_blob(3))
            late["time"] = trio.current_time()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(commit_late)
            outcome, _ = await peer.play_round(1, genesis_vector())

        assert outcome.committed and outcome.included == [True] * 4
        mine = swarm.members[0].peer_id
        fetched = {t.digest: t.time for t in swarm.network.transfers if t.receiver == mine}
        early = [d.hex() for d in (c.digest for c in swarm.members[0].ledger.commitments(1)[:3])]
        for digest in early:
            if digest in fetched:  # our own is not fetched
                assert fetched[digest] < late["time"]
        assert sum(d in fetched for d in early) == 2
        assert fetched[late["digest"]] >= late["time"]

    run_virtual(main)


def test_the_chain_watcher_outlives_bad_answers():
    """An RPC that answers the block number with garbage now and then delays the peer's waits;
    it does not end the peer (its waits keep their own deadlines)."""

    async def main():
        swarm = FakeSwarm(3)
        peers = [swarm.peer(i) for i in range(3)]
        ledger = swarm.members[0].ledger
        honest = ledger.block_number
        calls = {"n": 0}

        def flaky() -> int:
            calls["n"] += 1
            if calls["n"] % 3 == 0:
                raise LedgerError("eth_blockNumber: unexpected answer 'garbage'")
            return honest()

        ledger.block_number = flaky  # type: ignore[method-assign]
        outcomes = await run_all(peers)

        assert [o.state for o in outcomes[0]] == ["finalized"] and calls["n"] >= 3

    run_virtual(main)


def test_a_peer_whose_rpc_logs_lag_its_blocks_still_sees_the_rounds_move():
    """eth_getLogs may miss the newest block's events (an RPC under load): here it never finds
    any. A waiter then re-reads the ledger every REREAD_AFTER seconds of new blocks without an
    event, so the round still ends in seconds, not at chain_timeout (600 s here)."""

    async def main():
        swarm = FakeSwarm(3)
        peers = [swarm.peer(i) for i in range(3)]
        for member in swarm.members:
            member.ledger.activity = lambda first, last: False  # type: ignore[method-assign]
        started = trio.current_time()

        outcomes = await run_all(peers)

        assert all([o.state for o in out] == ["finalized"] for out in outcomes)
        assert trio.current_time() - started < 4 * REREAD_AFTER

    run_virtual(main)


def test_a_dropped_speculation_still_training_never_shares_the_model_with_the_next_training():
    """Real worker threads: the round's own training waits until a speculation it will not use
    is done (opacus refused a second set of hooks on the shared model: "Trying to add hooks twice
    to the same model", seen in a 32-peer swarm)."""

    async def main():
        swarm = FakeSwarm(1)
        peer = swarm.peer(0, rounds=2)
        peer._run_sync = trio.to_thread.run_sync
        running: list[int] = []
        most: list[int] = []

        def slow(r: int, base: torch.Tensor) -> tuple[torch.Tensor, int]:
            running.append(r)
            most.append(len(running))
            time.sleep(0.3)
            running.remove(r)
            return base, 1

        peer._train_and_perturb = slow  # type: ignore[method-assign]
        async with trio.open_nursery() as background:
            # trains from an aggregate the chain will not finalize
            peer.training.speculate(background, 2, (1, b"\xab" * 32, genesis_vector()))
            await trio.sleep(0.05)
            trained = await peer.training.trained(2, genesis_vector(), b"\xcd" * 32)

        assert most == [1, 1]  # both ran, never at once
        assert trained.ended - trained.started >= 0.3

    trio.run(main)


def test_a_round_finalized_before_the_peer_saw_it_close_reports_the_set_that_won():
    """Fast peers can close, attest and finalize within one poll of a slower one: its round line
    then says which blobs the majority included, read from the chain, not "none"."""

    async def main():
        swarm, blobs, _ = closed_round(3)
        digest = digest_of(blobs, [True, True, True])
        for i in (1, 2):
            swarm.members[i].ledger.attest_flags(1, digest, [True, True, True])
        assert swarm.chain.round(1).state is RoundState.FINALIZED
        for i in (1, 2):  # the model is held by the peers that computed it
            swarm.members[i].store.put(wire.model_blob(model_vector(blobs), 1))

        outcome, _ = await swarm.peer(0).play_round(1, genesis_vector())

        assert outcome.state == "finalized" and outcome.committed
        assert outcome.included == [True, True, True] and outcome.global_digest == digest.hex()

    run_virtual(main)


def test_a_peer_that_missed_the_close_rebuilds_the_finalized_model_when_its_holders_are_gone():
    """CI's ganache run: the two fast peers of the last round finalized it, lingered and left
    before the slow one asked them for the model. The slow one holds every included blob (it
    prefetched them while the round was open), so it computes the model itself and checks it
    against the finalized digest; it needs nobody."""

    async def main():
        swarm, blobs, digests = closed_round(3)
        digest = digest_of(blobs, [True, True, False])
        for i in (1, 2):
            swarm.members[i].ledger.attest_flags(1, digest, [True, True, False])
            swarm.network.unreachable.add(swarm.members[i].peer_id)  # finished and gone
        swarm.members[0].store.put(blobs[1])  # prefetched while the round was open
        peer = swarm.peer(0)

        outcome, vector = await peer.play_round(1, genesis_vector())

        assert outcome.state == "finalized" and outcome.included == [True, True, False]
        assert outcome.global_digest == digest.hex() and swarm.members[0].store.has(digest.hex())
        assert vector.equal(model_vector(blobs[:2]))
        assert outcome.accuracy is not None

    run_virtual(main)


def test_a_rebuild_that_is_not_the_finalized_model_is_not_taken():
    """The rebuild is only a shortcut: a swarm that shares updates adds them to the round's base
    model, and from another base (this peer missed a round) the rebuild's digest differs: the
    peer fetches the finalized model instead of keeping its own."""

    async def main():
        swarm, blobs, _ = closed_round(3)
        shares_updates = dataclasses.replace(SHARED, share="update")
        model = model_vector(blobs, shares_updates)
        digest = bytes.fromhex(swarm.members[1].store.put(wire.model_blob(model, 1)))  # the holder
        for i in (1, 2):
            swarm.members[i].ledger.attest_flags(1, digest, [True, True, True])
            swarm.members[0].store.put(blobs[i])

        outcome, vector = await swarm.peer(0, shared=shares_updates).play_round(1, genesis_vector() + 0.5)

        assert outcome.global_digest == digest.hex() and vector.equal(model)
        assert swarm.members[1].host.bytes_served > 0  # fetched from the holder, not rebuilt

    run_virtual(main)


def model_vector(blobs: list[bytes], shared: SharedSettings = SHARED) -> torch.Tensor:
    vectors = [wire.read_vector(b, genesis_vector().numel(), kind="update")[0] for b in blobs]
    return aggregate.next_global(shared, genesis_vector(), vectors, [samples_of(i) for i in range(len(blobs))])


def test_a_peer_that_cannot_fetch_the_finalized_model_follows_the_next_round_and_catches_up():
    """Every holder of round 1's model is gone when peer 0, a follower, asks for it: the fetch
    gives up at its deadline without ending the peer, which follows round 2 (it commits nothing:
    it has no model to train from) and takes round 2's model once that round finalizes."""

    async def main():
        swarm = FakeSwarm(3, min_peers=2)
        swarm.register(1, 2)
        others = swarm.members[1:]

        def finalize(r: int, model: bytes) -> None:  # members 1 and 2 play round r without peer 0
            for m in others:
                swarm.commit(m.index, update_blob(m.index, r), r=r)
            others[0].ledger.close_round(r)
            for m in others:
                m.store.put(model)
                m.ledger.attest_flags(r, sha256(model), [True, True])

        first, second = wire.model_blob(update_vector(5), 1), wire.model_blob(update_vector(6), 2)
        finalize(1, first)
        swarm.network.unreachable.update(m.peer_id for m in others)
        peer = swarm.peer(0, rounds=2)
        started = trio.current_time()

        outcome, vector = await peer.play_round(1, genesis_vector())

        assert outcome.state == "finalized" and vector is None and outcome.global_digest is None
        assert trio.current_time() - started == pytest.approx(3 * FETCH_TIMEOUT, abs=1.0)
        swarm.network.unreachable.clear()

        async def round_two_later():
            await trio.sleep(1.0)
            finalize(2, second)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(round_two_later)
            outcome, vector = await peer.play_round(2, None)

        assert outcome.state == "finalized" and not outcome.committed
        assert [c.peer for c in swarm.members[0].ledger.commitments(2)] == [m.address for m in others]
        assert vector is not None and vector.equal(update_vector(6))
        assert outcome.global_digest == sha256(second).hex()

    run_virtual(main)
