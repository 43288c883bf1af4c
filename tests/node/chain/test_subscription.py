"""Chain watching by subscription (node/chain/subscription.py) on a real Anvil's WebSocket: new
heads and the ledger's logs arrive pushed, a reorganisation shows in the heads (Anvil pushes the
replacing head, no removed logs) and the chain watcher reads the ledger again, a hostile
endpoint's notifications change nothing, and an endpoint without a WebSocket leaves the peer
polling.

The hostile endpoint is a real WebSocket server on 127.0.0.1 that speaks eth_subscribe and then
lies (a fault a real Anvil cannot be made to commit); the heads it claims are checked against the
real Anvil behind the ledger client, as a peer's would be."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket

from node.chain.anvil import free_port
from node.chain.client import LedgerClient
from node.chain.liveness import ChainLiveness
from node.chain.subscription import MAX_NOTIFICATION_BYTES, ChainFeed, LedgerLog, ws_url_for
from node.peer.registry import REGISTRY_TOPICS, RegistryCache
from node.peer.watch import ChainWatcher
from p2p import peer_id_from_bytes
from tests.node.chain.conftest import Swarm, identity, peer_id_of_key, register_signed

WAIT_S = 20.0  # every wait below ends on an event; this only bounds a broken run


def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    return trio.to_thread.run_sync(partial(fn, *args))


async def until(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT_S):
        while not predicate():
            await trio.sleep(0.02)


def run_with_feed(feed: ChainFeed, body: Callable[[trio.Nursery], Any]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed.run)
            await body(nursery)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_ws_url_follows_the_http_endpoint_or_the_setting():
    assert ws_url_for("http://127.0.0.1:8545", "auto") == "ws://127.0.0.1:8545"
    assert ws_url_for("https://rpc.example/v2/KEY", "auto") == "wss://rpc.example/v2/KEY"
    assert ws_url_for("https://rpc.example/v2/KEY", "wss://ws.example/v2/KEY") == "wss://ws.example/v2/KEY"
    assert ws_url_for("http://127.0.0.1:8545", "off") is None
    with pytest.raises(ValueError):
        ws_url_for("http://127.0.0.1:8545", "http://127.0.0.1:8546")


def test_heads_and_ledger_logs_arrive_pushed(automine_chain):
    swarm = Swarm(automine_chain, 3)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), swarm.address, swarm.reader.take_head)
    heads: list[int] = []
    logs: list[LedgerLog] = []
    feed.on_head(heads.append)
    feed.on_log(logs.append)

    async def body(nursery: trio.Nursery) -> None:
        await until(lambda: feed.live)
        await trio.to_thread.run_sync(swarm.register, 2)
        target = automine_chain.block_number()
        await until(lambda: len(logs) == 2 and bool(heads) and heads[-1] == target)

    run_with_feed(feed, body)
    assert [entry.topic in REGISTRY_TOPICS for entry in logs] == [True, True]
    assert not any(entry.removed for entry in logs)
    assert heads == sorted(set(heads))
    assert feed.refused == 0 and feed.requests == 2
    # the feed's heads cost the reader nothing: its guard takes a close head without asking
    # (the register transactions went through the peers' clients, on the same Web3)
    assert swarm.reader.take_head(heads[-1]) == heads[-1]


def test_a_pushed_head_takes_no_thread_where_the_guard_needs_no_request(automine_chain):
    """The runner's feed (`take_head_at_once` given): the blocking `take_head` runs only for a head
    the guard must ask the endpoint about (here the first), every later head is taken at once."""
    swarm = Swarm(automine_chain, 3)
    blocking: list[int] = []

    def take_head(n: int) -> int:
        blocking.append(n)
        return swarm.reader.take_head(n)

    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), swarm.address, take_head, swarm.reader.take_head_at_once)
    heads: list[int] = []
    feed.on_head(heads.append)

    async def body(nursery: trio.Nursery) -> None:
        await until(lambda: feed.live)
        await trio.to_thread.run_sync(swarm.register, 2)  # two transactions: two blocks
        target = automine_chain.block_number()
        await until(lambda: bool(heads) and heads[-1] == target)

    run_with_feed(feed, body)
    assert len(heads) >= 2 and heads == sorted(set(heads))
    assert len(blocking) <= 1 and (not blocking or blocking[0] == heads[0])


def test_a_reorganisation_shows_in_the_heads_and_the_watcher_reads_again(automine_chain):
    swarm = Swarm(automine_chain, 3)
    swarm.register(1)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), swarm.address, swarm.reader.take_head)
    watcher = ChainWatcher(swarm.reader, off_loop, poll_interval=0.05, chain_timeout=WAIT_S)
    watcher.follow(feed, confirmations=0)
    logs: list[LedgerLog] = []
    reorgs: list[int] = []
    feed.on_log(logs.append)
    feed.on_reorg(reorgs.append)

    async def body(nursery: trio.Nursery) -> None:
        nursery.start_soon(watcher.run)
        await until(lambda: feed.live and watcher.block == automine_chain.block_number())
        moves = watcher.moves
        await trio.to_thread.run_sync(register_signed, swarm.peers[1], identity(1))
        landed = automine_chain.block_number()
        await until(lambda: len(logs) == 1 and feed.head == landed and watcher.moves > moves)
        moves = watcher.moves
        requests = swarm.reader.rpc_requests()
        automine_chain.rpc("anvil_reorg", [1, []])  # the registration's block replaced, the transaction dropped
        await until(lambda: watcher.moves > moves)
        assert reorgs == [landed]
        # nothing asked of the HTTP endpoint to learn it: the head came pushed
        assert swarm.reader.rpc_requests() == requests

    run_with_feed(feed, body)
    assert [(entry.removed, entry.block) for entry in logs] == [(False, logs[0].block)]
    assert not swarm.reader.is_registered(swarm.accounts[1].address)  # the chain the peer re-reads


def test_confirmations_hold_a_pushed_log_until_it_is_deep(automine_chain):
    swarm = Swarm(automine_chain, 3)
    reader = LedgerClient(swarm.w3, swarm.address, confirmations=2)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), swarm.address, reader.take_head)
    watcher = ChainWatcher(reader, off_loop, poll_interval=0.05, chain_timeout=WAIT_S)
    watcher.follow(feed, reader.confirmations)

    async def body(nursery: trio.Nursery) -> None:
        nursery.start_soon(watcher.run)
        await until(lambda: feed.live)
        automine_chain.mine(1)
        await until(lambda: feed.head == automine_chain.block_number())
        await trio.to_thread.run_sync(register_signed, swarm.peers[0], identity(0))
        landed = automine_chain.block_number()
        await until(lambda: feed.head == landed)
        moves = watcher.moves
        automine_chain.mine(1)
        await until(lambda: feed.head == landed + 1)
        assert watcher.moves == moves and watcher.block == landed - 1  # one block deep: not yet
        automine_chain.mine(1)
        await until(lambda: watcher.moves > moves)
        assert watcher.block == landed

    run_with_feed(feed, body)


class LyingEndpoint:
    """A WebSocket endpoint that confirms both subscriptions, then sends `lies` (raw messages),
    then one honest head (`honest()`), and on a second connection that honest head again."""

    def __init__(self, lies: list[str], honest: Callable[[], int]) -> None:
        self.lies = lies
        self.honest = honest
        self.connections = 0
        self.port = free_port()

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await serve_websocket(self.handle, "127.0.0.1", self.port, ssl_context=None, task_status=task_status)

    async def handle(self, request: WebSocketRequest) -> None:
        ws = await request.accept()
        self.connections += 1
        try:
            for _ in range(2):
                ask = json.loads(await ws.get_message())
                await ws.send_message(json.dumps({"jsonrpc": "2.0", "id": ask["id"], "result": f"0xs{ask['id']}"}))
            for lie in self.lies if self.connections == 1 else []:
                await ws.send_message(lie)
            await ws.send_message(notification("0xs1", header(self.honest())))
            await trio.sleep_forever()
        except ConnectionClosed:
            pass


def notification(sub: str, result: Any) -> str:
    return json.dumps(
        {"jsonrpc": "2.0", "method": "eth_subscription", "params": {"subscription": sub, "result": result}}
    )


def header(number: int) -> dict[str, Any]:
    return {"number": hex(number), "hash": "0x" + "ab" * 32, "parentHash": "0x" + "cd" * 32}


def test_hostile_notifications_change_nothing(automine_chain):
    swarm = Swarm(automine_chain, 3)
    real = automine_chain.block_number()
    ledger_log = {"address": swarm.address, "blockNumber": hex(real), "topics": ["0x" + "11" * 32], "removed": False}
    full_log = ledger_log | {
        "blockHash": "0x" + "ab" * 32,
        "transactionHash": "0x" + "cd" * 32,
        "transactionIndex": "0x0",
        "logIndex": "0x0",
        "data": "0x",
    }
    lies = [
        "{not json",
        json.dumps([1, 2, 3]),
        notification("0xs1", header(50_002)),  # a made-up head: the HTTP endpoint serves no such block
        notification("0xs1", {"number": hex(real + 1), "hash": "0x12"}),  # no block hash
        notification("0xs1", {"number": "0x" + "f" * 40, "hash": "0x" + "ab" * 32}),  # past 64 bits
        notification("0xs2", ledger_log | {"address": "0x" + "99" * 20}),  # another contract's log
        notification("0xs2", ledger_log | {"removed": "yes"}),
        notification("0xs2", full_log | {"data": "0xzz"}),  # a log the mirror would keep: not hex
        notification("0xs2", full_log | {"logIndex": "0x" + "f" * 40}),
        notification("0xs1", header(real) | {"timestamp": "soon"}),
        notification("0xs9", header(real)),  # a subscription never made
        "x" * (MAX_NOTIFICATION_BYTES + 1),  # oversized: the connection is dropped, then opened again
    ]
    endpoint = LyingEndpoint(lies, automine_chain.block_number)
    feed = ChainFeed(f"ws://127.0.0.1:{endpoint.port}", swarm.address, swarm.reader.take_head)
    heads: list[int] = []
    logs: list[LedgerLog] = []
    feed.on_head(heads.append)
    feed.on_log(logs.append)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.serve)
            nursery.start_soon(feed.run)
            await until(lambda: endpoint.connections == 2 and feed.live and heads == [real])
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert logs == [] and feed.head == real
    assert feed.refused == 11  # all but the oversized one, which closed the connection
    assert swarm.reader.head() == real  # the client's guard never took the made-up head


def test_no_websocket_leaves_the_peer_polling(automine_chain, caplog):
    swarm = Swarm(automine_chain, 3)
    feed = ChainFeed(f"ws://127.0.0.1:{free_port()}", swarm.address, swarm.reader.take_head)  # nobody listens
    watcher = ChainWatcher(swarm.reader, off_loop, poll_interval=0.05, chain_timeout=WAIT_S)
    watcher.follow(feed, confirmations=0)

    async def body(nursery: trio.Nursery) -> None:
        nursery.start_soon(watcher.run)
        await until(lambda: watcher.block == automine_chain.block_number())
        moves = watcher.moves
        await trio.to_thread.run_sync(register_signed, swarm.peers[0], identity(0))
        await until(lambda: watcher.moves > moves)  # polled: the block number, then the activity

    with caplog.at_level(logging.INFO, logger="swarm.chain"):
        run_with_feed(feed, body)
    assert not feed.live
    said = [r.getMessage() for r in caplog.records if "watching the chain by polling" in r.getMessage()]
    assert len(said) == 1


def test_an_endpoint_without_eth_subscribe_is_polled_for_good(automine_chain, caplog):
    swarm = Swarm(automine_chain, 3)
    port = free_port()

    async def refuse(request: WebSocketRequest) -> None:
        ws = await request.accept()
        with trio.move_on_after(WAIT_S):
            ask = json.loads(await ws.get_message())
            error = {"code": -32601, "message": "the method eth_subscribe does not exist"}
            await ws.send_message(json.dumps({"jsonrpc": "2.0", "id": ask["id"], "error": error}))

    feed = ChainFeed(f"ws://127.0.0.1:{port}", swarm.address, swarm.reader.take_head)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve_websocket, refuse, "127.0.0.1", port, ssl_context=None))
            with trio.fail_after(WAIT_S):
                await feed.run()  # returns: nothing to try again
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING, logger="swarm.chain"):
        trio.run(main)
    assert not feed.live
    assert any("has no eth_subscribe" in r.getMessage() for r in caplog.records)


def test_the_logs_of_one_block_are_one_move(automine_chain):
    swarm = Swarm(automine_chain, 3)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), swarm.address, swarm.reader.take_head)
    watcher = ChainWatcher(swarm.reader, off_loop, poll_interval=0.05, chain_timeout=WAIT_S)
    watcher.follow(feed, confirmations=0)
    logs: list[LedgerLog] = []
    feed.on_log(logs.append)

    async def body(nursery: trio.Nursery) -> None:
        nursery.start_soon(watcher.run)
        await until(lambda: feed.live)
        automine_chain.mine(1)
        await until(lambda: watcher.block == automine_chain.block_number())
        moves = watcher.moves
        automine_chain.rpc("evm_setAutomine", [False])
        try:
            for i in range(2):  # two registrations waiting in the pool for one block
                nursery.start_soon(trio.to_thread.run_sync, register_signed, swarm.peers[i], identity(i))
            await until(lambda: int(automine_chain.rpc("txpool_status")["pending"], 16) == 2)
            automine_chain.rpc("evm_mine", [])
        finally:
            automine_chain.rpc("evm_setAutomine", [True])
        await until(lambda: len(logs) == 2 and watcher.block == automine_chain.block_number())
        await until(lambda: swarm.reader.is_registered(swarm.accounts[1].address))
        assert logs[0].block == logs[1].block
        assert watcher.moves == moves + 1  # one read of the ledger after the block sees both

    run_with_feed(feed, body)


def test_an_endpoint_that_stops_pushing_heads_is_left(automine_chain, monkeypatch):
    monkeypatch.setattr("node.chain.subscription.SILENCE_S", 0.5)
    swarm = Swarm(automine_chain, 3)
    endpoint = LyingEndpoint([], automine_chain.block_number)  # one head per connection, then nothing
    feed = ChainFeed(f"ws://127.0.0.1:{endpoint.port}", swarm.address, swarm.reader.take_head)
    lives: list[bool] = []
    feed.on_live(lives.append)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.serve)
            nursery.start_soon(feed.run)
            await until(lambda: endpoint.connections == 2 and feed.live)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert lives == [True, False, True]  # left (the peer polled meanwhile), then subscribed again


def test_the_stall_watcher_takes_pushed_heads_and_asks_only_evm_mine(automine_chain):
    swarm = Swarm(automine_chain, 3)
    pushed = [automine_chain.block_number()]
    now = [0.0]
    liveness = ChainLiveness(
        swarm.w3,
        automine_chain.url,
        stall_after=3.0,
        nudge_every=1.0,
        clock=lambda: now[0],
        pushed_head=lambda: pushed[0],
    )
    requests = swarm.w3.provider.all_requests()
    now[0] = 3.5
    assert liveness.check(True) == "nudged"  # one evm_mine: the only request
    pushed[0] = automine_chain.block_number()  # its head, pushed
    assert pushed[0] == liveness.last_block  # taken as its own block, not the chain moving
    now[0] = 4.0
    assert liveness.check(True) == "idle"
    now[0] = 4.6
    assert liveness.check(True) == "nudged"  # known to need it: every nudge_every now
    assert swarm.w3.provider.all_requests() - requests == 2


def test_the_registry_refreshes_on_pushed_registrations_not_on_a_clock(automine_chain):
    swarm = Swarm(automine_chain, 3)
    registry = RegistryCache(swarm.reader)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), swarm.address, swarm.reader.take_head)
    swarm.reader.pushed_head = feed.live_head
    newcomer = peer_id_from_bytes(peer_id_of_key(identity(0)))

    async def body(nursery: trio.Nursery) -> None:
        await until(lambda: feed.live)
        nursery.start_soon(partial(registry.keep_fresh, interval=0.05, feed=feed))
        await until(lambda: registry.scanned_to == automine_chain.block_number())  # its first refresh
        requests = swarm.reader.rpc_requests()
        automine_chain.mine(3)  # blocks without a registration: nothing to refresh for
        await until(lambda: feed.head == automine_chain.block_number())
        await trio.sleep(0.5)  # ten polling intervals
        assert swarm.reader.rpc_requests() == requests and not registry(newcomer)
        await trio.to_thread.run_sync(register_signed, swarm.peers[0], identity(0))
        await until(lambda: registry(newcomer))

    run_with_feed(feed, body)


def test_a_lagging_pushed_head_never_takes_reads_back_behind_a_read_at_latest(automine_chain):
    """A peer reads at "latest" until its subscription pushes a first head; that head may come
    from a block older than what those reads saw (the notification sat in a queue). Pinned reads
    must not go back there: a round read as current would not exist yet (WrongRound), as a peer
    restarted in the middle of a run once found. The head a subscription pushes is a timing fault
    a real Anvil does not commit on demand, so the pushed head here is a plain value."""
    swarm = Swarm(automine_chain, 2)
    reader = swarm.reader
    pushed: list[int | None] = [None]
    reader.pushed_head = lambda: pushed[0]
    before = automine_chain.block_number()
    register_signed(swarm.peers[1], identity(1))  # a state change in a later block
    assert automine_chain.block_number() > before
    assert reader.registered_count() == 1  # no head pushed yet: read at "latest"
    pushed[0] = before  # the subscription's first head: behind that read
    assert reader.block_number() == automine_chain.block_number()
    assert reader.registered_count() == 1  # pinned, and not behind the read before
    requests = reader.rpc_requests()
    assert reader.registered_count() == 1
    assert reader.rpc_requests() - requests == 1  # once caught up, a pinned read asks no head


def test_the_pushed_base_fee_is_the_last_heads_while_live_and_none_otherwise(automine_chain):
    """What the sender builds its fees from (node/chain/sender.py): the base fee of the last head the
    subscription pushed, a spike included; a feed that is not live answers None (the sender asks the
    endpoint)."""
    swarm = Swarm(automine_chain, 1)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), swarm.address, swarm.reader.take_head)
    assert feed.live_base_fee() is None
    spike = 7 * 10**11  # 700 gwei

    def latest_base_fee() -> int:
        return int(automine_chain.rpc("eth_getBlockByNumber", ["latest", False])["baseFeePerGas"], 16)

    async def body(nursery: trio.Nursery) -> None:
        await until(lambda: feed.live)
        automine_chain.mine(1)
        await until(lambda: feed.head == automine_chain.block_number())
        assert feed.live_base_fee() == latest_base_fee()
        automine_chain.rpc("anvil_setNextBlockBaseFeePerGas", [hex(spike)])
        automine_chain.mine(1)
        await until(lambda: feed.head == automine_chain.block_number())
        assert feed.live_base_fee() == latest_base_fee() == spike

    run_with_feed(feed, body)
    offline = ChainFeed(f"ws://127.0.0.1:{free_port()}", swarm.address, swarm.reader.take_head)

    async def never_live(nursery: trio.Nursery) -> None:
        await until(lambda: offline._said_polling)  # its first connection refused: polling
        assert not offline.live and offline.live_base_fee() is None

    run_with_feed(offline, never_live)
