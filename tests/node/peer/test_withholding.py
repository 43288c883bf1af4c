"""Withholding costs the withholder (node/peer/agree.py): a member that commits a blob and serves
it to nobody no longer makes every honest peer wait for it.

Three real `Peer`s (members 0 to 2) and one scripted member 3 on the fakes of
tests/node/peer/harness.py, in trio's virtual time, so round times are exact and the same on a
loaded machine: member 3 commits every round and, in rounds 1 to 3, serves its blob to nobody;
in round 4 it serves it again. Each round is timed against the same round of a swarm whose
member 3 serves every blob, and must take at most HONEST_RATIO times as long. How member 3 withholds:

- `attests`: as `--fault withhold` does and as the attack was found, it announces its blob and,
  ATTEST_AFTER the close (as a peer that fetched and aggregated the others' blobs would), attests a
  set that includes it (both claims to hold it); each honest peer used to wait for that attestation;
- `silent`: it announces its blob and never attests (it used to cost the fetch timeout);
- `hides`: it neither announces nor attests: nothing tells it from an honest committer we cannot
  reach, so its first two rounds cost the fetch timeout; from its third it is not awaited.

A claim by attestation alone is tested in tests/node/peer/test_agree.py."""

from __future__ import annotations

import contextlib

import pytest
import trio

from node.chain.errors import RoundNotClosed
from node.chain.records import RoundState
from node.peer.agree import NOT_AWAITED_AFTER
from node.peer.peer import RoundOutcome
from tests.node.peer.harness import FETCH_TIMEOUT, FakeSwarm, run_virtual, update_blob

T = True
WITHHOLDER = 3
ROUNDS = 4
WITHHELD_IN = {1, 2, 3}  # round 4: it serves again
ATTEST_AFTER = 1.0  # seconds after the close the attesting withholder attests
HONEST_RATIO = 1.5  # a round with a withholder takes at most this many times the honest round


def play(*, withholds: set[int], mode: str) -> tuple[FakeSwarm, list[list[RoundOutcome]], list[float]]:
    """Members 0 to 2 play ROUNDS rounds; member 3 commits in each and serves its blob to nobody in
    the rounds `withholds` names, claiming it as `mode` says (the module doc). Returns the swarm,
    each real peer's outcomes, and how long each round took (trio seconds, from its opening to the
    last real peer's end of it). One trio run per swarm: each starts at trio time 0."""

    async def main() -> tuple[FakeSwarm, list[list[RoundOutcome]], list[float]]:
        swarm = FakeSwarm(4)
        peers = [swarm.peer(i, rounds=ROUNDS) for i in range(3)]
        outcomes: list[list[RoundOutcome]] = [[] for _ in peers]
        opened: dict[int, float] = {}
        ended: dict[int, float] = {}
        member = swarm.members[WITHHOLDER]

        async def withholder() -> None:
            member.ledger.register(member.host.peer_id_bytes)
            for r in range(1, ROUNDS + 1):
                while swarm.chain.live.number < r:
                    await trio.sleep(0.05)
                opened[r] = trio.current_time()
                withheld = r in withholds
                (swarm.network.unreachable.add if withheld else swarm.network.unreachable.discard)(member.peer_id)
                digest = swarm.commit(WITHHOLDER, update_blob(WITHHOLDER, r), r=r)
                if not withheld or mode != "hides":  # an honest committer announces what it committed
                    await member.host.announce_blob(digest)
                if withheld and mode == "attests":
                    while swarm.chain.round(r).state is RoundState.OPEN:
                        await trio.sleep(0.05)
                    await trio.sleep(ATTEST_AFTER)
                    with contextlib.suppress(RoundNotClosed):  # the round may be over by then (not awaited)
                        member.ledger.attest_flags(r, b"\x07" * 32, [T, T, T, T])  # its own blob included: a claim

        async def honest(i: int) -> None:
            def done(outcome: RoundOutcome) -> None:
                outcomes[i].append(outcome)
                ended[outcome.round] = max(ended.get(outcome.round, 0.0), trio.current_time())

            await peers[i].run(on_round=done)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(withholder)
            for i in range(3):
                nursery.start_soon(honest, i)
        return swarm, outcomes, [ended[r] - opened[r] for r in range(1, ROUNDS + 1)]

    return run_virtual(main)


def without(swarm: FakeSwarm, r: int, address: str) -> list[bool]:
    """Round r's bitmap of every participant but `address`."""
    return [c.peer != address for c in swarm.chain.round(r).commitments]


def check_rounds(swarm: FakeSwarm, outcomes: list[list[RoundOutcome]]) -> None:
    """Every round finalized; rounds 1 to 3 leave the withholder out, named; round 4 includes it."""
    assert [swarm.chain.round_info(r).state for r in range(1, ROUNDS + 1)] == [RoundState.FINALIZED] * ROUNDS
    member = swarm.members[WITHHOLDER]
    for rounds in outcomes:
        assert [o.state for o in rounds] == ["finalized"] * ROUNDS
        assert [o.included for o in rounds] == [without(swarm, r, member.address) for r in (1, 2, 3)] + [[T] * 4]
        for o in rounds[:3]:
            (why,) = o.left_out
            assert f" ({member.address}, peer {member.peer_id})" in why, why
        assert rounds[3].left_out == []


@pytest.fixture(scope="module")
def honest_rounds() -> list[float]:
    _, _, seconds = play(withholds=set(), mode="silent")
    return seconds


@pytest.mark.parametrize("mode", ["attests", "silent"])
def test_a_withholder_that_claims_its_blob_costs_every_round_little_and_is_named(honest_rounds, mode):
    swarm, outcomes, seconds = play(withholds=WITHHELD_IN, mode=mode)

    ratios = [w / h for w, h in zip(seconds, honest_rounds)]
    assert all(ratio <= HONEST_RATIO for ratio in ratios), (honest_rounds, seconds)
    check_rounds(swarm, outcomes)
    for rounds in outcomes:
        assert "is withheld" in rounds[0].left_out[0] and "is withheld" in rounds[1].left_out[0]
        # round 3: withheld again, or (its two rounds in a row past) not awaited at all
        assert "is withheld" in rounds[2].left_out[0] or "was not awaited" in rounds[2].left_out[0]


def test_a_withholder_that_hides_its_blob_is_not_awaited_after_two_rounds_until_it_serves_again(honest_rounds):
    swarm, outcomes, seconds = play(withholds=WITHHELD_IN, mode="hides")

    for r in (1, 2):  # waited for, the whole fetch timeout: it may be an honest peer we cannot reach
        assert seconds[r - 1] >= FETCH_TIMEOUT, (honest_rounds, seconds)
    assert NOT_AWAITED_AFTER == 2
    assert seconds[2] <= HONEST_RATIO * honest_rounds[2], (honest_rounds, seconds)  # round 3: not awaited
    check_rounds(swarm, outcomes)
    for rounds in outcomes:
        assert "served by nobody within the fetch timeout" in rounds[0].left_out[0]
        assert "was not awaited" in rounds[2].left_out[0]
