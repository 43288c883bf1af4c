"""Withholding costs the withholder (node/peer/agree.py): a member that commits a blob and serves
it to nobody no longer makes every honest peer wait for it, twice, every round.

Three real `Peer`s (members 0 to 2) and one scripted member 3 on the fakes of
tests/node/peer/harness.py, in trio's virtual time, so round times are exact: member 3 commits
every round and serves its blob to nobody. As it was attacked: it also attests at once a set that
includes its own blob (a claim to hold it), which used to cost each honest peer the fetch
timeout and then one more to complete that set. Silent: it never attests, so only its history
shows it: from its third round on it is not awaited, until one of its blobs arrives again."""

from __future__ import annotations

import trio

from node.chain.records import RoundState
from node.peer.agree import CLAIM_PATIENCE, NOT_AWAITED_AFTER, WATCH_INTERVAL
from node.peer.peer import RoundOutcome
from tests.node.peer.harness import FETCH_TIMEOUT, FakeSwarm, run_virtual, update_blob

T = True
WITHHOLDER = 3


async def play(
    rounds: int, *, withholds: set[int], claims: bool
) -> tuple[FakeSwarm, list[list[RoundOutcome]], list[float]]:
    """Members 0 to 2 play `rounds` rounds; member 3 commits in each and serves its blob to nobody
    in the rounds `withholds` names (attesting at once that it holds it if `claims`). Returns the
    swarm, each real peer's outcomes, and how long each round took (trio seconds, from its opening
    to the last real peer's end of it)."""
    swarm = FakeSwarm(4)
    peers = [swarm.peer(i, rounds=rounds) for i in range(3)]
    outcomes: list[list[RoundOutcome]] = [[] for _ in peers]
    opened: dict[int, float] = {}
    ended: dict[int, float] = {}
    member = swarm.members[WITHHOLDER]

    async def withholder() -> None:
        member.ledger.register(member.host.peer_id_bytes)
        for r in range(1, rounds + 1):
            while swarm.chain.live.number < r:
                await trio.sleep(0.05)
            opened[r] = trio.current_time()
            (swarm.network.unreachable.add if r in withholds else swarm.network.unreachable.discard)(member.peer_id)
            swarm.commit(WITHHOLDER, update_blob(WITHHOLDER, r), r=r)
            if claims and r in withholds:
                while swarm.chain.round(r).state is RoundState.OPEN:
                    await trio.sleep(0.05)
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
    return swarm, outcomes, [ended[r] - opened[r] for r in range(1, rounds + 1)]


def without(swarm: FakeSwarm, r: int, address: str) -> list[bool]:
    """Round r's bitmap of every participant but `address`."""
    return [c.peer != address for c in swarm.chain.round(r).commitments]


def test_a_withholder_that_claims_its_blob_costs_a_round_little_and_is_named():
    async def main():
        _, _, honest = await play(1, withholds=set(), claims=False)
        swarm, outcomes, withheld = await play(1, withholds={1}, claims=True)
        return swarm, outcomes, honest[0], withheld[0]

    swarm, outcomes, honest, withheld = run_virtual(main)

    # the fetch step waits CLAIM_PATIENCE x the fetch timeout after the claim (it used to wait 2 x FETCH_TIMEOUT)
    assert withheld <= honest + 2 * WATCH_INTERVAL + CLAIM_PATIENCE * FETCH_TIMEOUT, (honest, withheld)
    assert swarm.chain.round_info(1).state is RoundState.FINALIZED
    address = swarm.members[WITHHOLDER].address
    for (outcome,) in outcomes:
        assert outcome.state == "finalized" and outcome.included == without(swarm, 1, address)
        (why,) = outcome.left_out
        assert f" ({address}, peer {swarm.members[WITHHOLDER].peer_id})" in why and "is withheld" in why


def test_a_silent_withholder_is_not_awaited_after_two_rounds_until_it_serves_again():
    async def main():
        _, _, honest = await play(4, withholds=set(), claims=False)
        swarm, outcomes, withheld = await play(4, withholds={1, 2, 3}, claims=False)
        return swarm, outcomes, honest, withheld

    swarm, outcomes, honest, withheld = run_virtual(main)

    assert [swarm.chain.round_info(r).state for r in (1, 2, 3, 4)] == [RoundState.FINALIZED] * 4
    for r in (1, 2):  # waited for, the whole fetch timeout
        assert withheld[r - 1] >= FETCH_TIMEOUT, (honest, withheld)
    assert NOT_AWAITED_AFTER == 2
    assert withheld[2] <= honest[2] + WATCH_INTERVAL, (honest, withheld)  # round 3: not awaited
    address = swarm.members[WITHHOLDER].address
    for rounds in outcomes:
        # round 4: it serves again (a prefetch got its blob), and is included
        assert [o.included for o in rounds] == [without(swarm, r, address) for r in (1, 2, 3)] + [[T, T, T, T]]
        assert all(address in o.left_out[0] for o in rounds[:3]) and rounds[3].left_out == []
        assert "served by nobody within the fetch timeout" in rounds[0].left_out[0]
        assert "was not awaited" in rounds[2].left_out[0]
