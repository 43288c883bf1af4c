"""Chain watching by subscription: the chain's new heads and the ledger's logs pushed over one
WebSocket (`eth_subscribe` "newHeads" and "logs" filtered on the ledger's address), so a peer
need not ask its endpoint for the block number and the ledger's activity several times a block.

Where the endpoint has no WebSocket or no eth_subscribe, `ChainFeed.run` says so once in the log
and the peer polls, as it does without a feed (node/peer/watch.py); a connection that drops is
opened again with a growing pause, the peer polling meanwhile (`live` is False then).

Every notification is hostile until checked: its size is bounded before it is parsed (the
WebSocket refuses a longer message, and closes: a new connection follows), its fields are
validated, and a head goes through the ledger client's `rawrpc.HeadGuard` as a polled one does
(monotonic, bounded progress; a far jump only once the HTTP endpoint serves that block). A lying
endpoint therefore gains nothing over polling: a made-up log makes the waiters read the ledger
once more, as a polled `activity` that lied would.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import trio
from trio_websocket import WebSocketConnection, open_websocket_url
from web3._utils.method_formatters import log_entry_formatter

from node.chain.errors import LedgerError
from node.chain.mirror import LedgerMirror, PushedHeader
from node.chain.rawrpc import parse_hash32, parse_quantity

log = logging.getLogger("swarm.chain")

# A header is about 1-2 kB of JSON (logsBloom alone 514 characters); a ledger log about 1 kB (a
# Committed log carries its mechanism's JSON). Anything longer is not a notification of ours.
MAX_NOTIFICATION_BYTES = 64 << 10
CONNECT_TIMEOUT_S = 10.0  # to open the WebSocket, and again for both subscriptions' answers
# No new head for this long (a dead connection, or an endpoint that stopped pushing while the
# chain goes on: Sepolia makes a block every 12 s, and a local chain's waiting peers mine one a
# second) and the connection is opened again (the watcher reading the chain once meanwhile).
SILENCE_S = 30.0
CLOSE_TIMEOUT_S = 5.0
HEAD_CHECK_TIMEOUT_S = 30.0  # the guard's check of a far head reads the HTTP endpoint (retried there)
RECONNECT_PAUSES = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)  # seconds before the n-th reconnect in a row
REORG_MEMORY = 128  # the hashes of this many recent heads are kept, to see a reorganisation in a later head
MAX_PENDING_LOGS = 1024  # blocks of pushed logs not yet confirmed, kept (`node.peer.watch`); more is a flood

BLOOM_BYTES = 256
# the fields of a pushed log the mirror keeps, as eth_getLogs gives them
LOG_FIELDS = (
    "address",
    "blockHash",
    "blockNumber",
    "data",
    "logIndex",
    "removed",
    "topics",
    "transactionHash",
    "transactionIndex",
)
SUBSCRIBE_HEADS, SUBSCRIBE_LOGS = 1, 2  # JSON-RPC ids of the two eth_subscribe requests


class NoSubscriptions(Exception):
    """The endpoint answers, but has no eth_subscribe (an error answer): polling for good."""


@dataclass(frozen=True)
class LedgerLog:
    """One log of the ledger as pushed: its block, its first topic (the event) and whether a
    reorganisation removed it (`removed: true`: the block that held it is no longer the chain's);
    its index in the block, its topics and the log as web3's `eth_getLogs` formats it (for the
    mirror, `node.chain.mirror`)."""

    block: int
    topic: bytes
    removed: bool
    index: int = 0
    topics: tuple[bytes, ...] = ()
    formatted: Any = None


def ws_url_for(rpc_url: str, setting: str) -> str | None:
    """The WebSocket URL of `chain.ws_url`: "off" none, "auto" the HTTP endpoint's own with the
    ws(s) scheme (Anvil and Hardhat serve both on one port), else the URL given (a hosted
    endpoint has a wss URL of its own; geth serves ws on another port, 8546 by default)."""
    if setting == "off":
        return None
    if setting != "auto":
        if not setting.startswith(("ws://", "wss://")):
            raise ValueError(f"chain.ws_url must be auto, off or a ws(s):// URL, got {setting!r}")
        return setting
    parts = urlsplit(rpc_url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"not an http(s) RPC URL: {rpc_url!r}")
    return urlunsplit((scheme, parts.netloc, parts.path, parts.query, ""))


def _shown(url: str) -> str:
    """The URL without path and query: a hosted endpoint's key is in them, never logged."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


class ChainFeed:
    """One endpoint's pushed heads and ledger logs, for listeners (called on the trio thread):
    `on_head(head)` with each head the guard takes, `on_log(LedgerLog)` with each ledger log,
    `on_live(bool)` when the subscriptions start or stop, `on_reorg(block)` when a head shows
    that block `block` and those after it were replaced (Anvil pushes no removed logs then, only
    the new heads: a head of a number already seen with another hash, or whose parent is not the
    head seen at the number before). `take_head(n)` (blocking: the ledger
    client's guard) returns the head taken, which is n or the last one taken, or raises;
    `take_head_at_once(n)`, where given, the same without blocking where that needs no request,
    else None (then `take_head` runs in a thread: a hop costs more CPU than the rest of a head)."""

    def __init__(
        self,
        ws_url: str,
        address: str,
        take_head: Callable[[int], int],
        take_head_at_once: Callable[[int], int | None] | None = None,
    ) -> None:
        self.ws_url = ws_url
        self.address = address.lower()
        self._take_head = take_head
        self._take_head_at_once = take_head_at_once
        self.live = False  # both subscriptions confirmed on an open connection
        self.head: int | None = None  # the last head taken from a notification
        self.base_fee: int | None = None  # that head's base fee per gas (None before London)
        self.requests = 0  # eth_subscribe requests sent (two per connection)
        self.notifications = 0  # notifications taken
        self.refused = 0  # messages dropped as not a valid notification (or a head the guard refused)
        self._heads: list[Callable[[int], None]] = []
        self._logs: list[Callable[[LedgerLog], None]] = []
        self._lives: list[Callable[[bool], None]] = []
        self._reorgs: list[Callable[[int], None]] = []
        self._headers: list[Callable[[PushedHeader], None]] = []
        self._hashes: dict[int, bytes] = {}  # block number -> hash of the heads pushed lately
        self._head_at = 0.0  # trio time of the last new head (or of the subscription)
        self._said_polling = False
        self._ids: dict[str, int] = {}  # subscription id -> SUBSCRIBE_HEADS or SUBSCRIBE_LOGS

    def on_head(self, listener: Callable[[int], None]) -> None:
        self._heads.append(listener)

    def on_log(self, listener: Callable[[LedgerLog], None]) -> None:
        self._logs.append(listener)

    def on_live(self, listener: Callable[[bool], None]) -> None:
        self._lives.append(listener)

    def on_reorg(self, listener: Callable[[int], None]) -> None:
        self._reorgs.append(listener)

    def on_header(self, listener: Callable[[PushedHeader], None]) -> None:
        """`listener(header)` with each head the guard takes as new, after any reorganisation it shows."""
        self._headers.append(listener)

    def mirror(self, mirror: LedgerMirror) -> None:
        """Feed `mirror` with this feed's heads and logs while it is live (reset when it drops)."""
        self.on_header(mirror.take_header)
        self.on_log(
            lambda entry: mirror.take_log(entry.block, entry.index, entry.topics, entry.formatted, entry.removed)
        )
        self.on_reorg(mirror.reorganised)
        self.on_live(lambda live: None if live else mirror.stopped())

    def live_head(self) -> int | None:
        """The last pushed head while the subscriptions run; None while the peer must poll."""
        return self.head if self.live else None

    def live_base_fee(self) -> int | None:
        """The last pushed head's base fee while the subscriptions run; None while the peer polls."""
        return self.base_fee if self.live else None

    async def run(self) -> None:
        """Subscribe, and again after every drop (pauses growing to a minute); ends when
        cancelled, or at once where the endpoint has no eth_subscribe."""
        failures = 0
        while True:
            try:
                await self._connection()
                problem = "the connection closed"
            except NoSubscriptions as exc:
                self._set_live(False)
                log.warning("%s has no eth_subscribe (%s): watching the chain by polling", _shown(self.ws_url), exc)
                return
            except Exception as exc:  # refused, closed, silent, or anything else: the peer polls, never stops
                problem = f"{type(exc).__name__}: {str(exc)[:200]}"
            if self.live:
                failures = 0
                log.info(
                    "the chain's subscription at %s dropped (%s): polling until it is back",
                    _shown(self.ws_url),
                    problem,
                )
            elif not self._said_polling:
                log.warning(
                    "no WebSocket subscription at %s (%s): watching the chain by polling, and trying again",
                    _shown(self.ws_url),
                    problem,
                )
                self._said_polling = True
            else:
                log.debug("no WebSocket subscription at %s yet: %s", _shown(self.ws_url), problem)
            self._set_live(False)
            await trio.sleep(RECONNECT_PAUSES[min(failures, len(RECONNECT_PAUSES) - 1)])
            failures += 1

    async def _connection(self) -> None:
        """One connection: subscribe, then take notifications until it fails (every wait bounded:
        the opening and closing handshakes by trio-websocket's timeouts, the rest here)."""
        async with open_websocket_url(
            self.ws_url,
            max_message_size=MAX_NOTIFICATION_BYTES,
            connect_timeout=CONNECT_TIMEOUT_S,
            disconnect_timeout=CLOSE_TIMEOUT_S,
        ) as ws:
            await self._subscribe(ws)
            self._head_at = trio.current_time()
            while True:
                with trio.move_on_at(self._head_at + SILENCE_S):
                    await self._take(await ws.get_message())
                    continue
                raise trio.TooSlowError(f"no new head for {SILENCE_S:g} s")

    async def _subscribe(self, ws: WebSocketConnection) -> None:
        heads = {"jsonrpc": "2.0", "id": SUBSCRIBE_HEADS, "method": "eth_subscribe", "params": ["newHeads"]}
        logs = {
            "jsonrpc": "2.0",
            "id": SUBSCRIBE_LOGS,
            "method": "eth_subscribe",
            "params": ["logs", {"address": self.address}],
        }
        self._ids.clear()
        with trio.fail_after(CONNECT_TIMEOUT_S):
            for request in (heads, logs):
                self.requests += 1
                await ws.send_message(json.dumps(request))
            while set(self._ids.values()) != {SUBSCRIBE_HEADS, SUBSCRIBE_LOGS}:
                answer = _parse(await ws.get_message())
                if answer is None or answer.get("id") not in (SUBSCRIBE_HEADS, SUBSCRIBE_LOGS):
                    self.refused += 1  # nothing else may come before the answers
                    continue
                if "error" in answer:
                    raise NoSubscriptions(str(answer["error"])[:200])
                sub = answer.get("result")
                if not isinstance(sub, str) or not 0 < len(sub) <= 130:
                    raise LedgerError(f"eth_subscribe answered no subscription id: {str(sub)[:100]}")
                self._ids[sub] = answer["id"]
        log.info("watching the chain by subscription at %s (new heads, the ledger's logs)", _shown(self.ws_url))
        self._set_live(True)

    async def _take(self, message: str | bytes) -> None:
        """One message: a valid notification reaches the listeners, anything else is counted and dropped."""
        note = _parse(message)
        params = note.get("params") if note is not None and note.get("method") == "eth_subscription" else None
        sub = params.get("subscription") if isinstance(params, dict) else None
        kind = self._ids.get(sub) if isinstance(sub, str) else None
        try:
            if kind == SUBSCRIBE_HEADS:
                assert isinstance(params, dict)
                await self._take_head_note(params.get("result"))
                return
            if kind == SUBSCRIBE_LOGS:
                assert isinstance(params, dict)
                entry = self._ledger_log(params.get("result"))
                self.notifications += 1
                for listener in self._logs:
                    listener(entry)
                return
        except LedgerError as exc:  # HeadRefused too: the guard refused the head
            log.debug("dropped a notification: %s", exc)
        self.refused += 1

    async def _take_head_note(self, header: Any) -> None:
        if not isinstance(header, dict):
            raise LedgerError(f"newHeads: not a header: {str(header)[:100]}")
        number = parse_quantity(header.get("number"), "newHeads")
        digest = parse_hash32(header.get("hash"), "newHeads hash")
        parent = parse_hash32(header.get("parentHash"), "newHeads parentHash")
        pushed = PushedHeader(
            number,
            digest,
            parent,
            parse_quantity(header["timestamp"], "newHeads timestamp") if "timestamp" in header else None,
            parse_quantity(header["baseFeePerGas"], "newHeads baseFeePerGas") if "baseFeePerGas" in header else None,
            _bloom(header.get("logsBloom")),
        )
        taken = self._take_head_at_once(number) if self._take_head_at_once is not None else None
        if taken is None:
            with trio.fail_after(HEAD_CHECK_TIMEOUT_S):
                taken = await trio.to_thread.run_sync(self._take_head, number)
        self.notifications += 1
        replaced = self._hashes.get(number, digest) != digest or self._hashes.get(number - 1, parent) != parent
        if replaced:  # at most a re-read of the ledger: what a lie here can buy, as a made-up log
            first = number if self._hashes.get(number - 1, parent) == parent else number - 1
            self._hashes = {n: h for n, h in self._hashes.items() if n < first}
            for on_reorg in self._reorgs:
                on_reorg(first)
        self._hashes[number] = digest
        if len(self._hashes) > REORG_MEMORY:
            del self._hashes[min(self._hashes)]
        if self.head is not None and taken <= self.head:
            return  # behind or equal to the last one taken: the guard kept the last
        self.head, self._head_at = taken, trio.current_time()
        if taken == number:
            self.base_fee = pushed.base_fee
            for on_header in self._headers:
                on_header(pushed)
        for listener in self._heads:
            listener(taken)

    def _ledger_log(self, entry: Any) -> LedgerLog:
        if not isinstance(entry, dict):
            raise LedgerError(f"logs: not a log: {str(entry)[:100]}")
        address = entry.get("address")
        if not isinstance(address, str) or address.lower() != self.address:
            raise LedgerError(f"logs: a log of another address: {str(address)[:50]}")
        block = parse_quantity(entry.get("blockNumber"), "logs blockNumber")
        topics = entry.get("topics")
        if not isinstance(topics, list) or not 1 <= len(topics) <= 4:
            raise LedgerError(f"logs: topics {str(topics)[:100]}")
        topic = parse_hash32(topics[0], "logs topic")
        removed = entry.get("removed", False)
        if not isinstance(removed, bool):
            raise LedgerError(f"logs: removed {str(removed)[:20]}")
        index = parse_quantity(entry.get("logIndex"), "logs logIndex")
        raw = {key: entry.get(key) for key in LOG_FIELDS} | {"removed": removed}
        for key in ("blockHash", "transactionHash"):
            parse_hash32(raw[key], f"logs {key}")
        parse_quantity(raw["transactionIndex"], "logs transactionIndex")
        data = raw["data"]
        if not isinstance(data, str) or not data.startswith("0x") or len(data) % 2:
            raise LedgerError(f"logs: data {str(data)[:50]}")
        try:
            bytes.fromhex(data[2:])
            formatted = log_entry_formatter(raw)
        except (ValueError, TypeError) as exc:
            raise LedgerError(f"logs: not a log: {exc}") from None
        return LedgerLog(block, topic, removed, index, tuple(parse_hash32(t, "logs topic") for t in topics), formatted)

    def _set_live(self, live: bool) -> None:
        if live == self.live:
            return
        self.live = live
        for listener in self._lives:
            listener(live)


def _bloom(value: Any) -> bytes | None:
    """A header's logs bloom (256 bytes), None where the header has none or not that."""
    if not isinstance(value, str) or not value.startswith("0x") or len(value) != 2 + 2 * BLOOM_BYTES:
        return None
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        return None


def _parse(message: str | bytes) -> dict[str, Any] | None:
    """A JSON object, or None (the message's length is already bounded by the WebSocket)."""
    if len(message) > MAX_NOTIFICATION_BYTES:
        return None
    try:
        value = json.loads(message)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
