"""The reads the round loop, the agreement step, the catch-up and `swarm verify` make of a ledger
(node/peer/ports.py `LedgerPort`), served by `PipelinedClient` from the events of a real Anvil
(docs/LEDGER.md "Porting the peers", step 2): a scripted history read through every one of them
and checked against what was sent, and `ChainWatcher` waiting on a pipelined round's close and end
(and nudging the close and the abort) as it does on SwarmLedger's, polling or fed by a subscription."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from typing import Any

import trio
from eth_account import Account

from node.chain.client import LedgerClient, connect
from node.chain.pipelined import PipelinedClient
from node.chain.records import RoundState
from node.chain.registration import registration_message, resolve
from node.chain.subscription import ChainFeed, ws_url_for
from node.chain.votes import majority, votes_on
from node.peer.watch import ChainWatcher
from node.protocol.wire import encode_bitmap
from tests.e2e.testnet_box import ProxyFaults, rpc_proxy
from tests.node.chain.test_pipelined_attacks import send
from tests.node.chain.test_pipelined_ledger import NO_VOTE, WINDOW_BLOCKS, WINDOW_SECONDS, Ledger

EVERYONE = encode_bitmap([True] * 4)
OTHER_MECHANISM = json.dumps({"name": "pnpm", "epsilon": 0.5}, separators=(",", ":")).encode()


def block_of(receipt) -> int:
    return int(receipt["blockNumber"])


def timestamp(led: Ledger, block: int) -> int:
    return int(led.reader.w3.eth.get_block(block)["timestamp"])


def test_a_scripted_history_reads_as_it_happened(automine_chain, kit):
    """Round 1 finalizes from round 2's commits; round 2 gets no majority and is aborted with round
    3, the open round trained from it; round 4 opens from round 1's model, closes full, and
    finalizes from a vote in a round 5 commit and two final votes. Member 3 names a new mechanism in
    round 3 and none in round 4."""
    led = Ledger(automine_chain, kit, 4)
    reader, members = led.reader, [Account.from_key(k).address for k in automine_chain.private_keys[:4]]
    agg1, agg4 = kit.digest("agg-1"), kit.digest("agg-4")
    deployed = led.members[0].from_block
    assert reader.last_finalized() == (0, kit.GENESIS)
    r1 = [led.commit(i, 1) for i in range(4)]  # the fourth closes round 1
    assert reader.round_info(1).state is RoundState.CLOSED
    r2 = [led.commit(i, 2, agg1, EVERYONE) for i in range(4)]  # the third finalizes round 1, the fourth closes 2
    assert reader.last_finalized() == (1, agg1)
    r3 = [
        led.members[i].commit(
            3, kit.digest(f"3-{i}"), 100, led.eps[i] + 1, mechanism, kit.digest(f"split-{i % 2}"), EVERYONE
        )
        for i, mechanism in enumerate((b"", b"", b"", OTHER_MECHANISM))
    ]
    led.eps = [e + 1 for e in led.eps]
    assert reader.round_info(3).state is RoundState.OPEN and reader.round_info(2).state is RoundState.CLOSED
    led.pass_window(WINDOW_SECONDS)
    aborted = block_of(led.members[0].abort_round(2))
    r4 = [led.commit(i, 4) for i in range(4)]  # nothing to vote on: round 3 went with round 2
    r5 = led.commit(0, 5, agg4, EVERYONE)
    led.members[1].vote(4, agg4, EVERYONE)
    final = block_of(led.members[2].vote(4, agg4, EVERYONE))  # 3 of 4: round 4 final

    # params: the constructor's settings, as SwarmLedger's client reads the same settings
    params = reader.params()
    swarm = LedgerClient.deploy(
        reader.w3,
        Account.from_key(automine_chain.private_keys[0]),
        min_peers=2,
        commit_window=WINDOW_BLOCKS,
        attest_window=WINDOW_BLOCKS,
        commit_window_seconds=WINDOW_SECONDS,
        attest_window_seconds=WINDOW_SECONDS,
        eps_cap_micro=10_000_000,
        delta=1e-5,
        genesis_digest=kit.GENESIS,
    ).params()
    assert params == replace(swarm, deploy_block=deployed)
    assert params.deployer == members[0] and not params.secure_aggregation

    # registrations, peer ids, what they sign, the account
    peer_ids = [kit.peer_id_of_key(kit.identity(i)) for i in range(4)]
    assert [reader.peer_id_of(m) for m in members] == peer_ids
    assert reader.peer_id_of(Account.create().address) == b""
    assert reader.registration_message(members[1]) == registration_message(31337, reader.address, members[1])
    registrations = reader.registrations()
    assert [(r.address, r.peer_id) for r in registrations] == list(zip(members, peer_ids))
    assert len(resolve(registrations, reader.chain_id(), reader.address)) == 4, "every signature verifies"
    assert reader.account is None and led.members[2].account.address == members[2]

    # the rounds
    assert reader.current_round() == 5
    info = reader.round_info(1)
    assert info == replace(
        info,
        state=RoundState.FINALIZED,
        opened_block=deployed,
        closed_block=block_of(r1[3]),
        ended_block=block_of(r2[2]),
        participant_count=4,
        finalized_digest=agg1,
        opened_at=timestamp(led, deployed),
        closed_at=timestamp(led, block_of(r1[3])),
    )
    assert reader.round_info(1, block=block_of(r1[3])).state is RoundState.CLOSED, "read at an earlier block"
    info = reader.round_info(2)
    assert (info.state, info.opened_block, info.closed_block, info.ended_block, info.participant_count) == (
        RoundState.ABORTED,
        block_of(r1[3]),
        block_of(r2[3]),
        aborted,
        4,
    )
    assert info.finalized_digest is None
    info = reader.round_info(3)  # aborted with round 2 while open: never closed
    assert (info.state, info.opened_block, info.closed_block, info.closed_at, info.ended_block) == (
        RoundState.ABORTED,
        block_of(r2[3]),
        0,
        0,
        aborted,
    )
    assert info.participant_count == 4 and info.opened_at == timestamp(led, block_of(r2[3]))
    info = reader.round_info(4)
    assert (info.state, info.opened_block, info.closed_block, info.ended_block, info.finalized_digest) == (
        RoundState.FINALIZED,
        aborted,
        block_of(r4[3]),
        final,
        agg4,
    )
    info = reader.round_info(5)
    assert (info.state, info.opened_block, info.participant_count, info.closed_block) == (
        RoundState.OPEN,
        block_of(r4[3]),
        1,
        0,
    )
    assert reader.round_info(6).state is RoundState.OPEN and reader.round_info(6).opened_block == 0
    assert [reader.finalized_digest(r) for r in (1, 2, 3, 4, 5)] == [agg1, None, None, agg4, None]
    assert reader.last_finalized() == (4, agg4)

    # commits, participants, mechanisms resolved
    assert [reader.participants(r) for r in (1, 2, 3, 4, 5)] == [members] * 4 + [members[:1]]
    assert [c.mechanism for c in reader.voted_commits(3)] == [b"", b"", b"", OTHER_MECHANISM]
    assert [c.mechanism for c in reader.commitments(3)] == [kit.MECHANISM] * 3 + [OTHER_MECHANISM]
    assert [c.mechanism for c in reader.commitments(4)] == [kit.MECHANISM] * 3 + [OTHER_MECHANISM]
    assert [(c.round, c.digest, c.block_number) for c in reader.commitments(5)] == [
        (5, kit.digest("5-0"), block_of(r5))
    ]
    history = reader.commit_history(members[3])
    assert [(c.round, c.mechanism, c.eps_micro) for c in history] == [
        (1, kit.MECHANISM, 1),
        (2, kit.MECHANISM, 2),
        (3, OTHER_MECHANISM, 3),
        (4, OTHER_MECHANISM, 4),
    ]
    fresh = PipelinedClient(reader.w3, reader.address, from_block=deployed)  # nothing read before
    assert [c.round for c in fresh.commit_history(members[3], from_block=block_of(r3[0]))] == [3, 4]
    assert [c.mechanism for c in fresh.commit_history(members[1], from_block=aborted)] == [kit.MECHANISM]

    # the votes: attestations are the votes the contract counted (votes_on, up to the transaction
    # that ended the round), and the one reaching the majority is the finalizing transaction's
    def counted_off_chain(r: int) -> list:
        return votes_on(reader.voted_commits(r), reader.voted_commits(r + 1), reader.final_votes(r))

    assert reader.attestations(2) == counted_off_chain(2), "every vote came before the abort"
    assert reader.attestations(4) == counted_off_chain(4), "the last vote finalized it"
    votes = reader.attestations(1)
    assert votes == counted_off_chain(1)[:3], "the fourth vote came after the third finalized round 1"
    assert [(v.peer, v.votes) for v in votes] == [(m, i + 1) for i, m in enumerate(members[:3])]
    assert majority(votes, 4).block_number == reader.round_info(1).ended_block == block_of(r2[2])
    assert [v.votes for v in reader.attestations(2)] == [1, 1, 2, 2] and majority(reader.attestations(2), 4) is None
    assert len(counted_off_chain(3)) == 4 and reader.attestations(3) == [], "round 4's commits came after the abort"
    votes = reader.attestations(4)
    assert [(v.peer, v.votes, v.block_number) for v in votes] == [
        (members[0], 1, block_of(r5)),
        (members[1], 2, final - 1),
        (members[2], 3, final),
    ]
    assert [v.peer for v in reader.final_votes(4)] == members[1:3]

    # eps: the view, and the record-level eps from the member's slot, whose low 64 bits are the eps
    assert [reader.eps_spent(m) for m in members] == [5, 4, 4, 4]
    assert [reader._member_word(m, reader.block_number()) % 2**64 for m in members] == [5, 4, 4, 4]
    assert [reader.record_eps_spent(m) for m in members] == [0] * 4

    # the registry's reads: no allowlist changes after deployment in this contract
    assert reader.block_hash(final) == bytes(reader.w3.eth.get_block(final)["hash"])
    assert reader.block_hash(reader.head() + 100) is None and reader.allowlist_changes() == []

    # the watcher's probe
    assert reader.activity(block_of(r1[0]), block_of(r1[0]))
    quiet = reader.block_number() + 1
    led.anvil.mine(2)
    assert not reader.activity(quiet, quiet + 1)
    assert not reader.activity(quiet + 1, quiet)


def test_the_chain_watcher_waits_on_pipelined_rounds_and_nudges_the_close_and_the_abort(automine_chain, kit):
    """`ChainWatcher.closed` returns once the last member's commit closes round 1, `ended` once round 2's
    commits finalize it; with round 3's votes split, `ended(3)` aborts round 3 itself once its
    attestation window is over, and with a member gone after the abort, `closed(5)` closes
    round 5 itself once its commit window is over."""
    led = Ledger(automine_chain, kit, 4)
    client = led.members[0]
    watcher = ChainWatcher(client, _off_loop, poll_interval=0.05, chain_timeout=60)
    params = client.params()
    watcher.windows = (params.commit_window, params.attest_window)
    agg1, agg2 = kit.digest("agg-1"), kit.digest("agg-2")

    async def send(*steps) -> None:
        for step in steps:
            await trio.to_thread.run_sync(step)

    async def play() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.run)
            for i in range(3):
                await send(partial(led.commit, i, 1))
            nursery.start_soon(send, partial(led.commit, 3, 1))
            info = await watcher.closed(1)
            assert (info.state, info.participant_count) == (RoundState.CLOSED, 4)
            nursery.start_soon(send, *(partial(led.commit, i, 2, agg1, EVERYONE) for i in range(4)))
            info = await watcher.ended(1)
            assert (info.state, info.finalized_digest) == (RoundState.FINALIZED, agg1)
            assert (await watcher.closed(2)).participant_count == 4
            await send(*(partial(led.commit, i, 3, agg2, EVERYONE) for i in range(4)))  # closes round 3
            await send(*(partial(led.commit, i, 4, kit.digest(f"split-{i % 2}"), EVERYONE) for i in range(4)))
            assert (await trio.to_thread.run_sync(client.round_info, 3)).state is RoundState.CLOSED
            await send(partial(led.pass_window, WINDOW_SECONDS))
            info = await watcher.ended(3)  # nobody else aborts: the watcher's nudge does
            assert (info.state, info.ended_block) == (RoundState.ABORTED, client.round_info(4).ended_block)
            await send(*(partial(led.commit, i, 5) for i in range(3)))  # member 3 is gone
            await send(partial(led.pass_window, WINDOW_SECONDS))
            info = await watcher.closed(5)  # the watcher's nudge closes it
            assert (info.state, info.participant_count) == (RoundState.CLOSED, 3)
            nursery.cancel_scope.cancel()

    trio.run(play)
    assert led.current() == 6


def test_a_round_read_while_its_events_lag_is_read_again(automine_chain, kit):
    """An endpoint that serves a block's logs 0.5 s after the block: the round the last commit
    just closed, and the round it opened, read at once, come out CLOSED and OPEN with their blocks
    (the state says closed: its RoundClosed is waited for), not as rounds with no events."""
    led = Ledger(automine_chain, kit, 2)
    with rpc_proxy(led.anvil.url, ProxyFaults(latency_s=0.0, jitter_s=0.0, log_lag_s=0.5)) as proxy:
        reader = PipelinedClient(connect(proxy.url), led.reader.address, from_block=led.members[0].from_block)
        assert reader.round_info(1).state is RoundState.OPEN  # the proxy has seen the chain up to here
        led.commit(0, 1)
        closed = block_of(led.commit(1, 1))
        info = reader.round_info(1)
        assert (info.state, info.closed_block, info.participant_count) == (RoundState.CLOSED, closed, 2)
        assert (reader.round_info(2).state, reader.round_info(2).opened_block) == (RoundState.OPEN, closed)
        assert proxy.stats.logs_held_back > 0  # the lag was real


def test_a_subscription_pushes_the_pipelined_clients_head_and_wakes_the_watcher(automine_chain, kit):
    """With a ChainFeed on Anvil's WebSocket, the client takes the pushed head (`pushed_head`,
    `take_head`) instead of asking for it, and `ChainWatcher.closed` returns on the pushed logs of
    the commit that closes the round."""
    led = Ledger(automine_chain, kit, 2)
    reader = PipelinedClient(connect(automine_chain.url), led.reader.address, from_block=led.members[0].from_block)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), reader.address, reader.take_head)
    reader.pushed_head = feed.live_head
    watcher = ChainWatcher(reader, _off_loop, poll_interval=0.05, chain_timeout=30)
    watcher.follow(feed, confirmations=0)

    async def play() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed.run)
            nursery.start_soon(watcher.run)
            with trio.fail_after(30):
                while not feed.live:
                    await trio.sleep(0.02)
            await trio.to_thread.run_sync(led.commit, 0, 1)
            nursery.start_soon(trio.to_thread.run_sync, led.commit, 1, 1)
            info = await watcher.closed(1)
            assert (info.state, info.participant_count) == (RoundState.CLOSED, 2)
            with trio.fail_after(30):  # the last block's head is pushed to the feed in its own time
                while feed.head != automine_chain.block_number():
                    await trio.sleep(0.02)
            asked = reader.rpc_requests()
            assert reader.head() == feed.head
            assert reader.rpc_requests() == asked, "the head came pushed"
            nursery.cancel_scope.cancel()

    trio.run(play)


async def _off_loop(fn, *args, **kwargs):
    """The peer's `chain` (node/peer/peer.py): a blocking ledger call off the trio loop."""
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs))


def test_a_settled_rounds_reads_are_kept_until_a_reorganisation(automine_chain, kit):
    """Rounds 1 and 2 played by two members (round 1 finalized from round 2's commits, round 2
    closed), then one block on them: a second read of round 1 (its info, commits, participants,
    counted votes, digest) and of round 2's commits costs no request; round 2's info, closed and not
    ended, is read again, its views (`currentRound`, `votingRound`) once per pinned block. Then
    the chain is replaced twice (evm_revert, a reorganisation deeper than the reader's 0
    confirmations): by one where round 1 is open again, which the next read of the current round
    sees, and by one where round 1 finalized with another aggregate in other blocks, which the next
    read of the open round sees (its opening moved): each time round 1 reads as the new chain has it."""
    anvil, led = automine_chain, Ledger(automine_chain, kit, 2)
    reader, accounts = led.reader, [Account.from_key(k) for k in anvil.private_keys[:2]]
    everyone = encode_bitmap([True] * 2)

    def play(label: str, empty: int) -> None:
        """Rounds 1 and 2 after `empty` empty blocks, round 1 finalized with aggregate `label`."""
        anvil.mine(empty)
        for r, vote in ((1, NO_VOTE), (2, (kit.digest(label), everyone))):
            for i in range(2):
                mechanism = kit.MECHANISM if r == 1 else b""
                fn = reader.contract.functions.commit(r, kit.digest(f"{label}{r}{i}"), 100, r, 0, mechanism, *vote)
                send(reader.w3, accounts[i], fn)
        anvil.mine(1)  # round 1's end a block deep

    def round_1() -> tuple:
        return (
            reader.round_info(1),
            reader.commitments(1),
            reader.voted_commits(1),
            reader.participants(1),
            reader.attestations(1),
            reader.finalized_digest(1),
        )

    def cost(read) -> tuple[Any, int]:
        before = reader.rpc_requests()
        found = read()
        return found, reader.rpc_requests() - before

    def replay(label: str, empty: int) -> None:
        nonlocal snapshot
        head = anvil.block_number()
        anvil.rpc("evm_revert", [snapshot])
        snapshot = anvil.rpc("evm_snapshot")
        if label:
            play(label, empty)
        anvil.mine(max(0, head + 1 - anvil.block_number()))  # the reader takes no head behind one it read

    snapshot = anvil.rpc("evm_snapshot")
    play("a", 0)
    first, spent = cost(round_1)
    assert first[0].state is RoundState.FINALIZED and first[5] == kit.digest("a") and spent > 0
    assert len(first[4]) == 2 and first[3] == [a.address for a in accounts]
    assert cost(round_1) == (first, 0), "round 1 ended a block deep: kept"
    commits_2 = reader.commitments(2)
    assert cost(lambda: reader.commitments(2)) == (commits_2, 0), "round 2 closed a block deep: its commits kept"
    reader.round_info(2)  # what a first read keeps for good (its blocks' timestamps)
    anvil.mine(1)
    closed_2, fresh = cost(lambda: reader.round_info(2))
    assert closed_2.state is RoundState.CLOSED
    earlier = reader.block_number() - 1
    _, a_view = cost(lambda: reader.current_round(block=earlier))  # one bare eth_call
    assert a_view == 1
    assert cost(lambda: reader.round_info(2)) == (closed_2, fresh - 2 * a_view), "the views once per pinned block"

    replay("", 0)  # round 1 open again: the current round's next read drops what was kept
    assert reader.current_round() == 1
    assert reader.round_info(1).state is RoundState.OPEN and reader.commitments(1) == []

    play("b", 2)
    assert round_1()[5] == kit.digest("b") and cost(round_1)[1] == 0
    replay("c", 5)  # round 1 finalized again, with another aggregate, its close 3 blocks later
    assert reader.round_info(3).state is RoundState.OPEN  # the open round's read sees its opening moved
    again = round_1()
    assert again[0].finalized_digest == again[5] == kit.digest("c")
    assert [c.digest for c in again[1]] == [kit.digest("c10"), kit.digest("c11")]
