"""The ledger mirror (node/chain/mirror.py): the pipelined client reads the blocks a subscription pushed
whole from what it pushed, with no request, and reads exactly what the endpoint would have answered.

The rules first, on made-up heads and logs (which blocks it holds whole, when it starts again); then a
scripted history of a real PipelinedLedger on Anvil read at every block by a client fed by a real
`ChainFeed` and by one asking the endpoint, which must agree on every read."""

from __future__ import annotations

from functools import partial

import trio
from eth_account import Account
from eth_utils import keccak

from node.chain import mirror as mirror_module
from node.chain.client import connect
from node.chain.mirror import MIRROR_LOGS, LedgerMirror, MirroredLog, PushedHeader, bloom_has
from node.chain.pipelined import PipelinedClient
from node.chain.records import RoundState
from node.chain.subscription import ChainFeed, ws_url_for
from node.peer import watch
from node.peer.watch import ChainWatcher
from node.protocol.wire import encode_bitmap
from tests.node.chain.test_pipelined_ledger import WINDOW_SECONDS, Ledger

ADDRESS = bytes.fromhex("5FbDB2315678afecb367f032d93F642f64180aa3")
EVERYONE = encode_bitmap([True] * 4)
ALL_THREE = encode_bitmap([True] * 3)


def bloom_of(*items: bytes) -> bytes:
    """A logs bloom holding `items` (the yellow paper's M3:2048), as a header carries it."""
    bits = bytearray(256)
    for item in items:
        digest = keccak(item)
        for i in (0, 2, 4):
            bit = ((digest[i] << 8) | digest[i + 1]) & 2047
            bits[255 - bit // 8] |= 1 << (bit % 8)
    return bytes(bits)


QUIET = bloom_of(b"another contract")  # a head whose block holds no ledger log


def header(number: int, *, bloom: bytes | None = QUIET, fork: int = 0) -> PushedHeader:
    digest = number.to_bytes(31, "big") + bytes([fork])
    parent = (number - 1).to_bytes(31, "big") + bytes([fork])
    return PushedHeader(number, digest, parent, 1_000 + number, 7, bloom)


def push_log(mirror: LedgerMirror, block: int, index: int = 0, removed: bool = False) -> None:
    mirror.take_log(block, index, (b"\x01" * 32,), {"blockNumber": block, "logIndex": index}, removed)


def test_a_block_is_held_whole_once_a_later_head_came_or_its_bloom_excludes_the_ledger():
    mirror = LedgerMirror(ADDRESS)
    mirror.take_header(header(10, bloom=bloom_of(ADDRESS)))
    assert not mirror.covers(10, 10), "its logs may have come before the subscription"
    push_log(mirror, 11)
    mirror.take_header(header(11, bloom=bloom_of(ADDRESS)))
    assert not mirror.covers(11, 11), "the ledger may have more logs in the head's block"
    mirror.take_header(header(12, bloom=bloom_of(b"another contract")))
    assert mirror.covers(11, 12), "a later head seals 11; 12's bloom has none of the ledger's bits"
    assert [e.block for e in mirror.logs(11, 12)] == [11]
    assert mirror.logs(10, 12) is None and mirror.logs(11, 13) is None
    mirror.take_header(header(13, bloom=bloom_of(ADDRESS)))  # may hold a ledger log: none pushed yet
    assert not mirror.covers(13, 13)
    mirror.take_header(header(14, bloom=bloom_of(b"another contract")))
    assert mirror.covers(11, 12) and not mirror.covers(13, 13), "its logs may come after the next head"
    mirror.take_header(header(15, bloom=bloom_of(b"another contract")))
    assert mirror.covers(11, 15), "a second later head: taken as a bloom's false positive"
    assert mirror.last_change(14) == (0, 11) and mirror.last_change(10) == (0, 10)
    assert mirror.last_change(9) is None and mirror.last_change(16) is None
    assert mirror.timestamp(header(12).hash) == 1_012


def test_a_log_pushed_after_the_next_head_is_waited_for_where_the_bloom_says_so():
    """Anvil under load pushed a block's logs after the next head: a block whose bloom may hold a
    ledger log and that holds none is not held whole on the next head, so its late log is kept."""
    mirror = LedgerMirror(ADDRESS)
    mirror.take_header(header(10))
    mirror.take_header(header(11, bloom=bloom_of(ADDRESS)))
    mirror.take_header(header(12))
    assert not mirror.covers(11, 11)
    push_log(mirror, 11)
    assert mirror.resets == 0
    mirror.take_header(header(13))
    assert [e.block for e in mirror.logs(11, 13)] == [11]


def test_what_could_leave_the_mirror_wrong_starts_it_again():
    resets: list[int] = []
    mirror = LedgerMirror(ADDRESS)
    mirror.on_reset(resets.append)
    for n in range(10, 14):
        mirror.take_header(header(n))
    assert mirror.covers(11, 12)
    push_log(mirror, 12)  # a log of a block already held whole: the endpoint pushed out of order
    assert resets == [12] and not mirror.covers(11, 11)
    for n in range(14, 17):
        mirror.take_header(header(n))
    assert mirror.covers(15, 15)
    push_log(mirror, 16, removed=True)  # a reorganisation
    assert resets == [12, 16] and mirror.logs(15, 15) is None
    for n in range(17, 20):
        mirror.take_header(header(n))
    mirror.reorganised(19)  # a replaced head, seen by the feed
    assert resets == [12, 16, 19] and mirror.logs(18, 18) is None
    mirror.take_header(header(19, fork=1))
    mirror.take_header(header(20, fork=1))
    mirror.stopped()  # the subscription dropped: nothing is held until it is back
    assert mirror.logs(20, 20) is None and mirror.resets == 4 and resets == [12, 16, 19]


def test_the_mirror_keeps_a_bounded_number_of_logs():
    mirror = LedgerMirror(ADDRESS)
    mirror.take_header(header(1))
    for n in range(2, 2 + MIRROR_LOGS // 4 + 10):
        for i in range(4):
            push_log(mirror, n, i)
        mirror.take_header(header(n + 1, bloom=bloom_of(ADDRESS)))
    held = mirror.logs(mirror_start(mirror), mirror_start(mirror))
    assert held is not None and sum(len(v) for v in mirror._logs.values()) <= MIRROR_LOGS
    assert mirror.logs(2, 2) is None, "the oldest blocks are read from the endpoint again"


def entry(block: int, index: int = 0):
    return MirroredLog(block, index, (b"\x01" * 32,), {"blockNumber": block, "logIndex": index})


def test_the_blocks_before_the_first_pushed_are_taken_once_and_only_where_they_fit():
    mirror = LedgerMirror(ADDRESS)
    assert mirror.gap(0, 5) is None, "nothing held yet"
    for n in (10, 11, 12):
        mirror.take_header(header(n))
    assert mirror.gap(11, 11) is None and mirror.gap(3, 13) is None, "held already; past the blocks held"
    assert mirror.gap(3, 11) == (0, 11)
    assert not mirror.backfill(0, 0, 9, [entry(4)]), "not up to the first block held"
    assert not mirror.backfill(0, 0, 10, [entry(11)]), "a log outside the blocks read"
    assert mirror.backfill(0, 0, 10, [entry(4, 1), entry(4, 0), entry(9)])
    assert [(e.block, e.index) for e in mirror.logs(0, 11)] == [(4, 0), (4, 1), (9, 0)]
    mirror.reorganised(11)
    for n in (13, 14, 15):
        mirror.take_header(header(n))
    epoch, first = mirror.gap(0, 14)
    assert (epoch, first) == (1, 14)
    assert not mirror.backfill(epoch, 0, 13, [entry(5)] * (MIRROR_LOGS + 1)), "past the bound"
    assert mirror.gap(0, 14) is None, "not asked again in that epoch"


def mirror_start(mirror: LedgerMirror) -> int:
    assert mirror._start is not None
    return mirror._start


def test_the_bloom_check_matches_a_real_block(automine_chain, kit):
    """A block holding a commit has the ledger's address in its bloom; an empty one has not."""
    led = Ledger(automine_chain, kit, 2)
    committed = int(led.commit(0, 1)["blockNumber"])
    automine_chain.mine(1)
    address = bytes.fromhex(led.reader.address[2:])
    blooms = [bytes(led.reader.w3.eth.get_block(n)["logsBloom"]) for n in (committed, committed + 1)]
    assert bloom_has(blooms[0], address) and not bloom_has(blooms[1], address)


def test_a_mirrored_client_reads_what_the_endpoint_says_at_every_block(automine_chain, kit):
    """Rounds 1-5 of 4 members (round 1 finalized by round 2's commits, round 2 split and aborted with
    round 3, round 4 finalized by a commit and final votes), played while a `ChainFeed` feeds a
    mirror: at every block since the mirror began, the mirrored client's round reads equal those of a
    client asking the endpoint, and the mirrored client asks for nothing the mirror holds."""
    led = Ledger(automine_chain, kit, 4)
    w3 = connect(automine_chain.url)
    address, deployed = led.reader.address, led.members[0].from_block
    plain = PipelinedClient(w3, address, from_block=deployed)
    mirrored = PipelinedClient(connect(automine_chain.url), address, from_block=deployed)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), address, mirrored.take_head)
    mirror = LedgerMirror(bytes.fromhex(address[2:]))
    feed.mirror(mirror)
    mirrored.use_mirror(mirror)
    mirrored.pushed_head = feed.live_head
    members = [Account.from_key(k).address for k in automine_chain.private_keys[:4]]

    def history() -> None:
        agg1, agg4 = kit.digest("agg-1"), kit.digest("agg-4")
        for i in range(4):
            led.commit(i, 1)
        for i in range(4):
            led.commit(i, 2, agg1, EVERYONE)
        for i in range(4):
            led.commit(i, 3, kit.digest(f"split-{i % 2}"), EVERYONE)
        led.pass_window(WINDOW_SECONDS)
        led.members[0].abort_round(2)
        for i in range(4):
            led.commit(i, 4)
        led.commit(0, 5, agg4, EVERYONE)
        led.members[1].vote(4, agg4, EVERYONE)
        led.members[2].vote(4, agg4, EVERYONE)
        automine_chain.mine(1)  # the last transaction's block held whole

    def reads(client: PipelinedClient, at: int, first: int = 1) -> tuple:
        return (
            client.current_round(block=at),
            client.open_round_participants(block=at),
            [client.round_info(r, block=at) for r in range(first, 7)],
        )

    def at_head(client: PipelinedClient) -> tuple:
        return (
            [client.commitments(r) for r in range(1, 6)],
            [client.attestations(r) for r in range(1, 5)],
            client.final_votes(4),
            client.last_finalized(),
            [client.finalized(r) for r in range(1, 5)],
            [client.eps_spent(m) for m in members],
            [client.commit_history(m) for m in members],
        )

    async def play() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed.run)
            with trio.fail_after(30):
                while mirror._start is None:  # automine: a block for the first head
                    if feed.live:
                        automine_chain.mine(1)
                    await trio.sleep(0.1)
            start = mirror._start
            await trio.to_thread.run_sync(history)
            head = automine_chain.block_number()
            with trio.fail_after(30):
                while not mirror.covers(start, head - 1):
                    await trio.sleep(0.02)
            for at in range(start, head):
                mine = await trio.to_thread.run_sync(reads, mirrored, at)
                assert mine == await trio.to_thread.run_sync(reads, plain, at), f"block {at}"
            assert await trio.to_thread.run_sync(at_head, mirrored) == await trio.to_thread.run_sync(at_head, plain)
            assert plain.round_info(4).state is RoundState.FINALIZED and plain.round_info(2).state is RoundState.ABORTED
            asked = mirrored.rpc_requests()
            for at in range(start, head):
                await trio.to_thread.run_sync(partial(reads, mirrored, at))
            assert mirrored.rpc_requests() == asked, "every block read again from the mirror"
            assert mirror.covers(deployed, start), "the blocks before the first pushed were read into it once"
            nursery.cancel_scope.cancel()

    trio.run(play)


async def _off_loop(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs))


def test_a_pushed_commit_wakes_the_watcher_once_its_block_is_held_whole(automine_chain, kit, monkeypatch):
    """With a mirror and no confirmations, the watcher takes a pushed commit (round 2's, the mirror
    holding the round whole) as a move once the next
    head makes the mirror hold its block whole, so the read it wakes asks the endpoint nothing; on a
    chain that makes no next block (automine), the move comes SEAL_GRACE_S later anyway."""
    led = Ledger(automine_chain, kit, 3)
    address = led.reader.address
    client = PipelinedClient(connect(automine_chain.url), address, from_block=led.members[0].from_block)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), address, client.take_head)
    mirror = LedgerMirror(bytes.fromhex(address[2:]))
    feed.mirror(mirror)
    client.use_mirror(mirror)
    client.pushed_head = feed.live_head
    watcher = ChainWatcher(client, _off_loop, poll_interval=0.05, chain_timeout=30)
    watcher.follow(feed, confirmations=0, mirror=mirror)
    monkeypatch.setattr(watch, "SEAL_GRACE_S", 3600.0)
    monkeypatch.setattr(mirror_module, "SEAL_GRACE_S", 3600.0)

    async def until(predicate) -> None:
        with trio.fail_after(30):
            while not predicate():
                await trio.sleep(0.02)

    async def play() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed.run)
            nursery.start_soon(watcher.run)
            await until(lambda: feed.live)
            automine_chain.mine(1)
            await until(lambda: mirror._start is not None)
            for i in range(3):  # round 1, its close in the mirror: round 2 is read from it alone
                await trio.to_thread.run_sync(led.commit, i, 1)
            automine_chain.mine(1)
            await until(lambda: feed.head == automine_chain.block_number())  # round 1's moves made
            await trio.to_thread.run_sync(client.voted_commits, 1)  # a peer's reads of round 1 (the index fed)
            agg = kit.digest("agg-1")
            moves = watcher.moves
            committed = int((await trio.to_thread.run_sync(led.commit, 0, 2, agg, ALL_THREE))["blockNumber"])
            await until(lambda: committed in mirror._logs and feed.head == committed)
            await trio.sleep(0.5)  # time for a move that should not come
            assert watcher.moves == moves, "its block is not held whole yet"
            automine_chain.mine(1)
            await until(lambda: watcher.moves > moves)
            asked = client.rpc_requests()
            assert len(await trio.to_thread.run_sync(client.voted_commits, 2)) == 1
            assert client.rpc_requests() == asked, "the woken read came from the mirror"
            monkeypatch.setattr(watch, "SEAL_GRACE_S", 0.2)
            monkeypatch.setattr(mirror_module, "SEAL_GRACE_S", 0.2)
            moves = watcher.moves
            await trio.to_thread.run_sync(led.commit, 1, 2, agg, ALL_THREE)  # automine: no block after it
            await until(lambda: watcher.moves > moves)
            assert len(await trio.to_thread.run_sync(client.voted_commits, 2)) == 2, "read from the endpoint"
            nursery.cancel_scope.cancel()

    trio.run(play)


def test_what_a_hostile_or_disordered_feed_pushes_is_bounded_and_never_held_wrong():
    """A log far past the head is dropped; a log before the first head is kept only if after it; a
    removed log of a block not pushed yet still starts the mirror again; `readable` never goes back;
    bytes are bounded as well as logs."""
    mirror = LedgerMirror(ADDRESS)
    push_log(mirror, 11)  # before any head: kept until the first head says whether it is after it
    push_log(mirror, 9)
    mirror.take_header(header(10))
    push_log(mirror, 10 + mirror_module.MAX_AHEAD + 1)  # no block of the chain's
    mirror.take_header(header(11, bloom=bloom_of(ADDRESS)))
    mirror.take_header(header(12))
    assert [e.block for e in mirror.logs(11, 12)] == [11] and mirror._count == 1
    push_log(mirror, 14)  # ahead of the head
    push_log(mirror, 14, removed=True)  # taken out before its head came
    assert mirror.resets == 1 and mirror._count == 0
    mirror.take_header(header(20))
    mirror.take_header(header(21, bloom=bloom_of(ADDRESS)))
    assert mirror.readable(21) == 20
    mirror.take_header(header(22, bloom=bloom_of(ADDRESS)))
    mirror.take_header(header(23, bloom=bloom_of(ADDRESS)))
    assert mirror.readable(23) == 21 and mirror.readable(21) == 21, "never behind a block given before"
    big = MirroredLog(24, 0, (b"\x01" * 32,), {"blockNumber": 24, "data": b"x" * (mirror_module.MIRROR_BYTES // 2)})
    for n in range(24, 28):
        mirror.take_log(n, 0, big.topics, big.log, False)
        mirror.take_header(header(n + 1, bloom=bloom_of(ADDRESS)))
    assert mirror._bytes <= mirror_module.MIRROR_BYTES and mirror.logs(24, 24) is None


def test_a_backfill_that_lacks_the_endpoints_last_logs_is_not_taken(automine_chain, kit):
    """An endpoint whose logs lag its blocks answers the backfill without the last ones: checked
    against the state at its last block (the open round and its count), it is not held."""
    led = Ledger(automine_chain, kit, 3)
    for i in range(3):
        led.commit(i, 1)
    led.commit(0, 2, kit.digest("agg"), ALL_THREE)
    client = PipelinedClient(connect(automine_chain.url), led.reader.address, from_block=led.members[0].from_block)
    at = automine_chain.block_number()
    logs = client.w3.eth.get_logs({"address": client.address, "fromBlock": client.from_block, "toBlock": at})
    entries = [
        MirroredLog(int(e["blockNumber"]), int(e["logIndex"]), tuple(bytes(t) for t in e["topics"]), e) for e in logs
    ]
    assert client._backfill_agrees(entries, at)
    assert not client._backfill_agrees(entries[:-1], at), "round 2's one commit lagging"
    before_close = [e for e in entries if e.block < entries[-1].block - 1]  # round 1's last commit and close lag
    assert not client._backfill_agrees(before_close, at), "round 1's close lagging"
