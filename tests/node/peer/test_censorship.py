"""No censorship by attestation order (node/peer/agree.py, docs/NODE.md "Agreement on the set").

A participant attests right after the round closes, with the right digest for a bitmap that
leaves a victim's blob out. Under the old rule (the first attestation that includes our own blob
becomes the focal set, and completing it ends the fetch) every honest peer but the victim voted
the attacker's set and the round finalized as [1, 0, 1, 1]. Now a peer never adopts a set that
leaves out a blob it holds, and no attestation cuts its fetch short: every honest peer votes the
full set, which finalizes.

Three real `Peer`s (members 0 to 2, member 1 the victim) and one scripted attacker (member 3) on
the fakes of tests/node/peer/harness.py, in trio's virtual time."""

from __future__ import annotations

import pytest
import trio

from node.chain.records import RoundState
from node.peer.agree import choose_focal
from node.peer.peer import RoundOutcome
from tests.node.peer.harness import FETCH_TIMEOUT, closed_round, digest_of, genesis_vector, run_virtual

T, F = True, False
EVERYONE, WITHOUT_VICTIM = [T, T, T, T], [T, F, T, T]


def test_a_set_that_leaves_out_a_blob_we_hold_is_never_the_focal_set():
    assert choose_focal([WITHOUT_VICTIM, EVERYONE], 0, [T, T, F, F]) == EVERYONE
    assert choose_focal([WITHOUT_VICTIM], 0, [T, T, F, F]) is None  # we then vote what we hold
    assert choose_focal([WITHOUT_VICTIM], 1, [F, T, F, F]) is None  # the victim's own view


@pytest.mark.parametrize(
    "attack_at, victim_delay",
    [(0.0, 0.0), (0.0, 3.0), (0.0, FETCH_TIMEOUT - 1.0), (2.0, 3.0)],
    ids=["victim-at-once", "victim-slow", "victim-just-in-time", "attack-before-victim-arrives"],
)
def test_an_early_attestation_without_the_victim_does_not_censor_it(attack_at, victim_delay):
    async def main():
        swarm, blobs, digests = closed_round(4)
        swarm.network.delay(digests[1], victim_delay)  # the victim's blob arrives later than the rest
        outcomes: dict[int, RoundOutcome] = {}

        async def honest(i: int) -> None:
            outcomes[i], _ = await swarm.peer(i).play_round(1, genesis_vector())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(swarm.attest_at, attack_at, 3, digest_of(blobs, WITHOUT_VICTIM), WITHOUT_VICTIM)
            for i in range(3):
                nursery.start_soon(honest, i)

        attestations = swarm.chain.rounds[0].attestations
        first_honest = next(i for i, a in enumerate(attestations) if a.peer != swarm.members[1].address)
        assert attestations[first_honest].peer == swarm.members[3].address  # it came before 0's and 2's
        info = swarm.chain.round_info(1)
        assert info.state is RoundState.FINALIZED
        assert info.finalized_digest == digest_of(blobs, EVERYONE)  # the victim is in
        for i in range(3):
            assert outcomes[i].state == "finalized" and outcomes[i].included == EVERYONE
        honest_votes = [a for a in attestations if a.peer != swarm.members[3].address]
        assert len(honest_votes) >= 2 and all(a.aggregate_digest == digest_of(blobs, EVERYONE) for a in honest_votes)

    run_virtual(main)


def test_a_peer_that_cannot_reach_the_victim_joins_the_full_set_of_those_that_can():
    """The victim's committer is unreachable to everyone, but member 2 fetched its blob earlier
    (and attests the full set at 2.25 s). Member 0 prefers that superset over the attacker's
    earlier set, fetches the victim's blob from 2, and votes it: 0, 2 and the victim finalize."""

    async def main():
        swarm, blobs, digests = closed_round(4)
        swarm.network.unreachable.add(swarm.members[1].peer_id)
        swarm.members[2].store.put(blobs[1])
        outcome: list[RoundOutcome] = []

        async def ours() -> None:
            outcome.append((await swarm.peer(0).play_round(1, genesis_vector()))[0])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(swarm.attest_at, 0.1, 3, digest_of(blobs, WITHOUT_VICTIM), WITHOUT_VICTIM)
            nursery.start_soon(swarm.attest_at, 2.25, 2, digest_of(blobs, EVERYONE), EVERYONE)
            nursery.start_soon(swarm.attest_at, 2.5, 1, digest_of(blobs, EVERYONE), EVERYONE)
            nursery.start_soon(ours)

        assert outcome[0].state == "finalized" and outcome[0].included == EVERYONE
        assert swarm.chain.round_info(1).finalized_digest == digest_of(blobs, EVERYONE)

    run_virtual(main)
