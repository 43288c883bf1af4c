"""Who the early close awaits (SwarmLedger.closeRound), on a real Anvil (automine) with the
contract the artifact holds (compiled from contracts/SwarmLedger.sol: test_tools checks it is
fresh). A round closes before its commit window once every member it awaits has committed: every
registered member after genesis or an abort, else every member but those the last finalized
aggregate left out (and, two finalized rounds in a row, those the one before left out and that
sat the last one out). Identity decides, not a count: a left-out member's commit never stands in
for an awaited member's."""

from __future__ import annotations

import pytest
from eth_account import Account

from node.chain import errors
from node.chain.anvil import start_anvil
from node.chain.records import RoundState
from node.protocol.wire import encode_bitmap


@pytest.fixture
def swarm(automine_chain, kit):
    """Four registered members (a, b, c honest; w the withholder), quorum 2, long windows so that
    only the early close can close a round here."""
    s = kit.Swarm(automine_chain, 5, min_peers=2, commit_window=500, attest_window=500)
    s.register(4)
    return s


def commit(swarm, kit, r: int, *who: int) -> None:
    for i in who:
        swarm.peers[i].commit(r, kit.digest(f"r{r}-p{i}"), 100, r * 1_000_000, kit.MECHANISM)


def finalize(swarm, kit, r: int, included: list[bool]) -> None:
    """Close round r (early: it must be allowed) and finalize it with `included` (over its
    participants, in commit order), every participant voting it."""
    swarm.peers[0].close_round(r)
    bitmap = encode_bitmap(included)
    participants = swarm.reader.participants(r)
    for p in swarm.peers:
        if p.account.address in participants and swarm.reader.round_info(r).state is RoundState.CLOSED:
            p.attest(r, kit.digest(f"agg{r}"), bitmap)
    assert swarm.reader.round_info(r).state is RoundState.FINALIZED


def finalize_closed(swarm, kit, r: int, included: list[bool]) -> None:
    """Finalize the closed round r with `included`, voted by a, b and c."""
    bitmap = encode_bitmap(included)
    for p in swarm.peers[:3]:
        if swarm.reader.round_info(r).state is RoundState.CLOSED:
            p.attest(r, kit.digest(f"agg{r}"), bitmap)
    assert swarm.reader.round_info(r).state is RoundState.FINALIZED


def address(swarm, i: int) -> str:
    return swarm.peers[i].account.address


def test_genesis_base_awaits_every_registered_member(swarm, kit):
    commit(swarm, kit, 1, 0, 1, 2)
    assert swarm.reader.awaited_count() == 1 and swarm.reader.is_awaited(address(swarm, 3))
    with pytest.raises(errors.CommitWindowOpen):
        swarm.peers[0].close_round(1)
    commit(swarm, kit, 1, 3)
    swarm.peers[0].close_round(1)


def test_a_left_out_member_cannot_hold_the_early_close(swarm, kit):
    """The withholder (w, participant 3 of round 1) left out of round 1's aggregate is not
    awaited in round 2: the three included members' commits close it, before the window, and
    w's commit then comes too late."""
    commit(swarm, kit, 1, 0, 1, 2, 3)
    finalize(swarm, kit, 1, [True, True, True, False])
    assert not swarm.reader.is_awaited(address(swarm, 3))
    assert all(swarm.reader.is_awaited(address(swarm, i)) for i in (0, 1, 2))
    assert swarm.reader.awaited_count() == 3
    commit(swarm, kit, 2, 0, 1)
    with pytest.raises(errors.CommitWindowOpen):  # c, included in round 1, is still awaited
        swarm.peers[0].close_round(2)
    commit(swarm, kit, 2, 2)
    assert swarm.reader.awaited_count() == 0
    swarm.peers[0].close_round(2)
    info = swarm.reader.round_info(2)
    assert info.closed_block < info.opened_block + 500 and info.participant_count == 3
    with pytest.raises(errors.CommitWindowClosed):
        commit(swarm, kit, 2, 3)


def test_a_withholder_that_commits_first_does_not_take_an_included_members_place(swarm, kit):
    """Round 2: w commits first, then two of the three included members. A count rule (3 commits
    of the 3 awaited) would close here, shutting out the third included member; it does not."""
    commit(swarm, kit, 1, 0, 1, 2, 3)
    finalize(swarm, kit, 1, [True, True, True, False])
    commit(swarm, kit, 2, 3, 0, 1)
    assert swarm.reader.awaited_count() == 1 and swarm.reader.is_awaited(address(swarm, 2))
    with pytest.raises(errors.CommitWindowOpen):
        swarm.peers[0].close_round(2)
    commit(swarm, kit, 2, 2)
    swarm.peers[0].close_round(2)
    # w committed again and was left out again: still not awaited in round 3
    finalize_closed(swarm, kit, 2, [False, True, True, True])
    assert not swarm.reader.is_awaited(address(swarm, 3)) and swarm.reader.awaited_count() == 3


def test_a_left_out_member_that_sits_a_round_out_is_awaited_after_two(swarm, kit):
    """w, left out of round 1, sits round 2 out (its late commit refused): round 3 still does
    not await it (round 1's bitmap, two finalized rounds back, still counts); round 4 does. A
    newcomer registered since is awaited at once."""
    commit(swarm, kit, 1, 0, 1, 2, 3)
    finalize(swarm, kit, 1, [True, True, True, False])
    commit(swarm, kit, 2, 0, 1, 2)
    finalize(swarm, kit, 2, [True, True, True])
    assert not swarm.reader.is_awaited(address(swarm, 3)) and swarm.reader.awaited_count() == 3
    kit.register_signed(swarm.peers[4], kit.identity(4))  # a newcomer: awaited
    assert swarm.reader.is_awaited(address(swarm, 4)) and swarm.reader.awaited_count() == 4
    commit(swarm, kit, 3, 0, 1, 2, 4)
    finalize(swarm, kit, 3, [True, True, True, True])
    assert swarm.reader.is_awaited(address(swarm, 3))  # round 1 is three finalized rounds back
    commit(swarm, kit, 4, 0, 1, 2, 4)
    with pytest.raises(errors.CommitWindowOpen):
        swarm.peers[0].close_round(4)
    commit(swarm, kit, 4, 3)
    swarm.peers[0].close_round(4)


def test_after_an_aborted_round_every_member_is_awaited(swarm, kit):
    commit(swarm, kit, 1, 0, 1, 2, 3)
    finalize(swarm, kit, 1, [True, True, True, False])
    commit(swarm, kit, 2, 0, 1, 2)
    swarm.peers[0].close_round(2)
    swarm.peers[0].attest(2, kit.digest("agg2"), b"\x07")  # one vote of three: no majority
    swarm.pass_attest_window(2)
    swarm.peers[1].abort_round(2)
    assert swarm.reader.last_finalized()[0] == 1  # round 3 starts from round 1, which left w out
    assert swarm.reader.is_awaited(address(swarm, 3)) and swarm.reader.awaited_count() == 4
    commit(swarm, kit, 3, 0, 1, 2)
    with pytest.raises(errors.CommitWindowOpen):
        swarm.peers[0].close_round(3)
    commit(swarm, kit, 3, 3)
    swarm.peers[0].close_round(3)


@pytest.fixture
def allowlisted(automine_chain, kit):
    members = [Account.from_key(k).address for k in automine_chain.private_keys[:5]]
    s = kit.Swarm(automine_chain, 5, allowlist=members, min_peers=2, commit_window=500, attest_window=500)
    s.register(4)
    return s


def test_removing_a_left_out_member_does_not_let_the_round_close_without_an_included_one(allowlisted, kit):
    """w left out of round 1, then removed: it leaves both the registered count and the members
    not awaited, so the three included members are still all awaited."""
    swarm = allowlisted
    commit(swarm, kit, 1, 0, 1, 2, 3)
    finalize(swarm, kit, 1, [True, True, True, False])
    swarm.peers[0].disallow(address(swarm, 3))
    assert swarm.reader.awaited_count() == 3
    commit(swarm, kit, 2, 0, 1)
    with pytest.raises(errors.CommitWindowOpen):
        swarm.peers[0].close_round(2)
    swarm.peers[0].allow([address(swarm, 3)])  # back: still left out of round 1, still not awaited
    assert not swarm.reader.is_awaited(address(swarm, 3)) and swarm.reader.awaited_count() == 1
    swarm.peers[0].disallow(address(swarm, 2))  # an included member removed: no longer awaited
    assert swarm.reader.awaited_count() == 0
    with pytest.raises(errors.CommitWindowOpen):  # 2 commits of 3 registered: not more than two thirds
        swarm.peers[0].close_round(2)
    commit(swarm, kit, 2, 3)
    swarm.peers[0].close_round(2)


def test_two_colluders_of_five_cannot_close_early_on_honest_members_left_out(automine_chain, kit):
    """Two honest members (1, 2) left out of round 1 (they crashed after committing); the two
    colluders (3, 4) and one honest member (0) are all round 2 awaits. Their three commits do not
    close it early (3 of 5 registered: not more than two thirds), so the restarted members commit
    in time and the colluders are no majority of its participants. Without the two-thirds bound
    the colluders decided round 2, then round 3 alone (an attacker's review of the early close)."""
    s = kit.Swarm(automine_chain, 5, min_peers=2, commit_window=500, attest_window=500)
    s.register(5)
    commit(s, kit, 1, 0, 1, 2, 3, 4)
    finalize(s, kit, 1, [True, False, False, True, True])
    commit(s, kit, 2, 0, 3, 4)
    assert s.reader.awaited_count() == 0  # nobody awaited is missing...
    with pytest.raises(errors.CommitWindowOpen):  # ...but 3 of 5 is not enough to close early
        s.peers[3].close_round(2)
    commit(s, kit, 2, 1)  # a restarted honest member gets in
    s.peers[3].close_round(2)  # 4 of 5
    participants = s.reader.participants(2)
    assert len(participants) == 4 and address(s, 1) in participants


def test_a_participant_removed_in_its_round_makes_the_next_round_await_everyone(allowlisted, kit):
    """b commits in round 1 and is removed before it finalizes: which bit was b's cannot be
    told without a loop, so round 1's bitmap counts as all ones and round 2 awaits w too."""
    swarm = allowlisted
    commit(swarm, kit, 1, 0, 1, 2, 3)
    swarm.peers[0].close_round(1)
    swarm.peers[0].disallow(address(swarm, 1))
    bitmap = encode_bitmap([True, True, True, False])
    for i in (0, 2, 3):
        if swarm.reader.round_info(1).state is RoundState.CLOSED:
            swarm.peers[i].attest(1, kit.digest("agg1"), bitmap)
    assert swarm.reader.round_info(1).state is RoundState.FINALIZED
    assert swarm.reader.is_awaited(address(swarm, 3)) and swarm.reader.awaited_count() == 3
    commit(swarm, kit, 2, 0, 2)
    with pytest.raises(errors.CommitWindowOpen):
        swarm.peers[0].close_round(2)
    commit(swarm, kit, 2, 3)
    swarm.peers[0].close_round(2)


def test_each_members_own_bit_decides_past_the_first_byte(kit):
    """Twelve members, round 1 finalized without participants 2 and 9 (byte 1 of the bitmap):
    round 2 awaits exactly the other ten, each by its own bit."""
    with start_anvil(accounts=12) as anvil:
        s = kit.Swarm(anvil, 12, min_peers=2, commit_window=500, attest_window=500)
        s.register(12)
        commit(s, kit, 1, *range(12))
        left_out = {2, 9}
        s.peers[0].close_round(1)
        bitmap = encode_bitmap([i not in left_out for i in range(12)])
        for p in s.peers[:7]:
            p.attest(1, kit.digest("agg1"), bitmap)
        assert s.reader.round_info(1).state is RoundState.FINALIZED
        assert [s.reader.is_awaited(address(s, i)) for i in range(12)] == [i not in left_out for i in range(12)]
        assert s.reader.awaited_count() == 10
        commit(s, kit, 2, 9, *(i for i in range(12) if i not in left_out and i != 11))
        with pytest.raises(errors.CommitWindowOpen):  # 11 is awaited; 9's commit does not stand in
            s.peers[0].close_round(2)
        commit(s, kit, 2, 11)
        s.peers[0].close_round(2)


def test_a_refused_close_costs_one_raw_request_and_no_web3_call(swarm, kit):
    """Every member tries to close after each commit it sees, and nearly every try is refused: the
    refusal comes from one raw eth_estimateGas (encoded from the ABI), never from web3's estimate."""
    commit(swarm, kit, 1, 0)  # b, c and w are still awaited: the chain refuses an early close
    closer = swarm.peers[1]
    provider = closer.w3.provider
    web3_before, all_before = provider.requests, provider.all_requests()
    with pytest.raises(errors.CommitWindowOpen):
        closer.close_round(1)
    assert provider.requests == web3_before  # web3 built and estimated nothing
    assert provider.all_requests() == all_before + 1
    commit(swarm, kit, 1, 1, 2, 3)
    closer.close_round(1)  # allowed now: the raw estimate passes it on to the sender
    assert swarm.reader.round_info(1).state is RoundState.CLOSED
