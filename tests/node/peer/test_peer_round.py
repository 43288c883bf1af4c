"""Whole rounds of real `Peer`s (register, train, commit, close, agree, attest, finalize or
abort, evaluate) on a FakeChain and FakeNetwork in trio's virtual time: the round state machine
without processes, Anvil or libp2p (tests/e2e runs those)."""

from __future__ import annotations

import pytest
import trio

from node.chain.errors import WrongRound
from node.chain.records import RoundInfo, RoundState
from node.peer.peer import Peer, RoundOutcome
from node.protocol.blob import sha256
from tests.node.peer.harness import (
    FETCH_TIMEOUT,
    FakeSwarm,
    PhaseLog,
    closed_round,
    digest_of,
    genesis_digest,
    genesis_vector,
    model_digest,
    run_virtual,
    update_blob,
)

T, F = True, False


async def run_all(peers: list[Peer]) -> list[list[RoundOutcome]]:
    """Every peer's `run()`, concurrently, in one trio loop."""
    outcomes: list[list[RoundOutcome]] = [[] for _ in peers]

    async def one(i: int) -> None:
        outcomes[i] = await peers[i].run()

    async with trio.open_nursery() as nursery:
        for i in range(len(peers)):
            nursery.start_soon(one, i)
    return outcomes


def expected_digest(swarm: FakeSwarm, r: int, left_out: set[str]) -> tuple[list[bool], bytes]:
    """(bitmap, model digest) of round r over every committed blob not in `left_out`
    (addresses), recomputed from the commitments on chain and the committers' stores."""
    commitments = swarm.members[0].ledger.commitments(r)
    holder = {m.address: m.store for m in swarm.members}
    flags = [c.peer not in left_out for c in commitments]
    blobs = [holder[c.peer].get(c.digest.hex()) for c, f in zip(commitments, flags) if f]
    samples = [c.num_samples for c, f in zip(commitments, flags) if f]
    return flags, model_digest(r, genesis_vector(), blobs, samples)


def test_f_three_peers_play_a_whole_round_to_the_same_finalized_model():
    async def main():
        swarm = FakeSwarm(3)  # nobody registered: the peers register themselves
        logs = [PhaseLog() for _ in range(3)]
        peers = [swarm.peer(i, on_status=logs[i]) for i in range(3)]

        outcomes = await run_all(peers)

        chain = swarm.chain
        info = swarm.members[0].ledger.round_info(1)
        assert info.state is RoundState.FINALIZED and info.participant_count == 3
        assert chain.live.number == 2 and chain.live.state is RoundState.OPEN  # round 2 opened from it
        flags, digest = expected_digest(swarm, 1, left_out=set())
        assert info.finalized_digest == digest and flags == [T, T, T]
        assert chain.last_finalized() == (1, digest)
        for outcome in outcomes:
            assert [o.round for o in outcome] == [1]
            (o,) = outcome
            assert o.state == "finalized" and o.committed and o.included == [T, T, T]
            assert o.global_digest == digest.hex()
            assert o.accuracy is not None and 0.0 <= o.accuracy <= 1.0
            assert o.bytes_received > 0 and o.bytes_sent > 0
        # a strict majority (2 of 3) finalized; the third vote came too late and was refused quietly
        assert [a.votes for a in chain.rounds[0].attestations] == [1, 2]
        sent = [fn for _, _, fn, _ in chain.transactions]
        assert sent.count("register") == 3 and sent.count("commit") == 3 and sent.count("closeRound") == 1
        assert all(log.entries[-1][1] == "done" for log in logs)
        assert all(p.phase.value == "done" for p in peers)
        # every peer went through the phases of a contributing round, in order
        order = [p for _, p in logs[0].entries]
        wanted = ["training", "committing", "waiting-close", "fetching", "aggregating", "attesting", "waiting-final"]
        assert [p for p in order if p in wanted][: len(wanted)] == wanted

    run_virtual(main)


@pytest.mark.parametrize("how", ["committer-unreachable", "transfer-stalls", "malformed"])
def test_b_e_peers_leave_out_a_blob_that_never_arrives_or_is_malformed_and_still_finalize(how):
    """A fourth member commits first and then its blob never arrives (or is malformed): the three
    real peers each leave it out, attest the same bitmap, and 3 of 4 votes finalize the round.
    A malformed blob is settled at once; a missing one costs the fetch timeout."""

    async def main():
        swarm = FakeSwarm(4)
        absent = swarm.members[3]
        swarm.register(3)
        data = b"\x00" * 64 if how == "malformed" else update_blob(3)
        digest = swarm.commit(3, data)
        if how == "committer-unreachable":
            swarm.network.unreachable.add(absent.peer_id)
        elif how == "transfer-stalls":
            swarm.network.stall(digest)
        logs = [PhaseLog() for _ in range(3)]

        outcomes = await run_all([swarm.peer(i, on_status=logs[i]) for i in range(3)])

        flags, model = expected_digest(swarm, 1, left_out={absent.address})
        info = swarm.members[0].ledger.round_info(1)
        assert info.state is RoundState.FINALIZED and info.finalized_digest == model
        assert flags.count(False) == 1
        for (o,), log in zip(outcomes, logs):
            assert o.state == "finalized" and o.included == flags and o.global_digest == model.hex()
            if how == "malformed":
                assert log.duration("fetching") < 1.0
            else:
                assert log.duration("fetching") == pytest.approx(FETCH_TIMEOUT)
        assert swarm.chain.rounds[0].attestations[-1].votes == 3

    run_virtual(main)


def test_c_a_peer_adopts_the_first_attested_set_that_includes_it_and_the_round_finalizes():
    """One real peer (already committed, the round closed) and three scripted ones. Member 3 is
    unreachable to us (member 2 fetched its blob earlier, and did not announce it); member 1 attests
    a set without us at 1.25 s, member 2 all four at 2.25 s, member 3 all four at 2.5 s. Our peer
    votes 2's (digest, bitmap), fetching 3's blob from 2: 3 of 4 votes finalize."""

    async def main():
        swarm, blobs, digests = closed_round(4)
        swarm.network.unreachable.add(swarm.members[3].peer_id)
        swarm.members[2].store.put(blobs[3])
        without_us, everyone = [F, T, T, F], [T, T, T, T]
        log = PhaseLog()
        peer = swarm.peer(0, on_status=log)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(swarm.attest_at, 1.25, 1, digest_of(blobs, without_us), without_us)
            nursery.start_soon(swarm.attest_at, 2.25, 2, digest_of(blobs, everyone), everyone)
            nursery.start_soon(swarm.attest_at, 2.5, 3, digest_of(blobs, everyone), everyone)
            outcome, vector = await peer.play_round(1, genesis_vector())

        assert outcome.state == "finalized" and outcome.committed and outcome.included == everyone
        assert outcome.global_digest == digest_of(blobs, everyone).hex()
        ours = next(a for a in swarm.chain.rounds[0].attestations if a.peer == swarm.members[0].address)
        assert ours.aggregate_digest == digest_of(blobs, everyone)
        assert 2.25 < log.duration("fetching") <= 3.0
        assert swarm.network.providers_of(digests[3], swarm.members[0].peer_id) == [swarm.members[2].peer_id]
        assert outcome.accuracy is not None and vector.shape == genesis_vector().shape

    run_virtual(main)


def test_a_round_whose_votes_split_is_aborted_after_the_attestation_window():
    """Our peer fetched everything and votes all three; the two others vote two different
    digests. No (digest, bitmap) reaches a majority: the peer aborts once the window passed,
    and round 2 starts from the genesis again."""

    async def main():
        swarm, blobs, digests = closed_round(3)
        log = PhaseLog()
        peer = swarm.peer(0, on_status=log)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(swarm.attest_at, 1.25, 1, sha256(b"one model"), [F, T, T])
            nursery.start_soon(swarm.attest_at, 2.25, 2, sha256(b"another"), [F, T, T])
            outcome, vector = await peer.play_round(1, genesis_vector())

        assert outcome.state == "aborted" and outcome.included == [T, T, T]
        assert outcome.global_digest is None and outcome.accuracy is None
        assert [a.votes for a in swarm.chain.rounds[0].attestations] == [1, 1, 1]
        aborted_at = next(t for t, _, fn, _ in swarm.chain.transactions if fn == "abortRound")
        assert aborted_at > swarm.chain.params.attest_window  # not before the window passed
        assert swarm.chain.last_finalized() == (0, genesis_digest())
        assert swarm.chain.live.number == 2
        assert vector.equal(genesis_vector())  # the peer keeps the model it had

    run_virtual(main)


def test_a_round_the_chain_no_longer_shows_as_current_is_read_again_not_the_end_of_the_peer():
    """A reorganisation can take back the transaction that opened the round a peer just read as
    current: the contract then refuses that round (WrongRound) on the next read. The peer reads the
    chain's round again on the next block instead of ending (a restarted peer once exited so)."""

    async def main():
        swarm = FakeSwarm(3)
        peers = [swarm.peer(i) for i in range(3)]
        ledger = swarm.members[0].ledger
        real_round_info = ledger.round_info
        refused: list[int] = []

        def round_info_gone_back(round: int) -> RoundInfo:
            if not refused:
                refused.append(round)
                raise WrongRound(given=round, current=round - 1)
            return real_round_info(round)

        ledger.round_info = round_info_gone_back  # type: ignore[method-assign]
        outcomes = await run_all(peers)
        assert refused == [1]
        assert [[o.state for o in outcome] for outcome in outcomes] == [["finalized"]] * 3

    run_virtual(main)
