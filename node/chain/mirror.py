"""The ledger's logs as a subscription pushed them, kept so that reads of recent blocks need no request.

A peer on a public endpoint may make some ten requests a round (issue 27); its reads of a round's
events would make dozens (every commit wakes a read of the open round). While `ChainFeed` runs, every log
of the ledger reaches the peer anyway: `LedgerMirror` keeps them, and answers a read of blocks it holds
whole with no request. It holds a block whole (sealed) once a later head was pushed (an endpoint pushes
a block's logs before the heads after it, nearly always: Anvil has been seen to push them after the next
head under load, so a block whose head's bloom may hold a ledger log and that has none pushed waits for a
second later head), or at once where the head's logs bloom has no bit of the ledger's address (a bloom
has no false negatives); from the first block whose logs were certainly subscribed to (the one after the
first head pushed: a block mined while the subscriptions were being made may have had its logs missed).
Blocks past the last sealed one are read from the endpoint as before; the blocks before the first pushed
are read into the mirror once (`gap`, `backfill`).

What would make it hold a wrong block resets it (it starts again at the next head, the reads going to
the endpoint meanwhile, and `on_reset` listeners are told, for their kept reads): a reorganisation (a
head replacing one seen, or a log pushed `removed`), a log pushed for a block already sealed (an endpoint
that does not push in order), or the subscription dropping. The pushed logs are as trusted as the HTTP
endpoint's answers: the WebSocket is the same endpoint's (`chain.ws_url`, docs/TESTNET.md) and the
values are checked as a polled log's are. The blocks before the first one pushed (from the ledger's
deployment) are read once, in one log read per LOG_CHUNK_BLOCKS blocks (`backfill`), so that the reads
of a member's whole history need no request either. Bounded: MIRROR_LOGS logs at most, the oldest
dropped first (reads of older blocks go to the endpoint), and a backfill that would pass that bound is
not made.

Fed on the trio thread (`ChainFeed`'s listeners), read by the ledger client from worker threads: one lock.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eth_utils import keccak

log = logging.getLogger("swarm.chain")

# A block is taken as held whole this long after its head came with no later one (a chain that makes
# no next block: automine without a clock): its reads go to the endpoint then (`readable`).
SEAL_GRACE_S = 1.0
MIRROR_LOGS = 50_000  # logs kept (about 1 kB each as formatted; a round at 16 members holds some 20)
TIMESTAMPS_KEPT = 4096  # headers' timestamps kept, by hash
BLOOMS_KEPT = 256  # recent heads whose bloom verdict is kept
MIRROR_BYTES = 64 << 20  # and about this many bytes of them (a log's data may be tens of kB)
MAX_AHEAD = 64  # a log more blocks past the last head than this is no block of the chain's: dropped
EARLY_LOGS = 1024  # logs pushed before the first head, kept until it comes


@dataclass(frozen=True)
class PushedHeader:
    """The fields of a pushed head the peer uses: its number and hash (with its parent's, for
    reorganisations), its timestamp, its base fee (None before London) and its logs bloom (None
    where the header lacks them)."""

    number: int
    hash: bytes
    parent: bytes
    timestamp: int | None
    base_fee: int | None
    bloom: bytes | None


@dataclass
class MirroredLog:
    """One pushed log: where it lies, its topics, the log as `web3`'s `eth_getLogs` formats it, and its
    decoded event once a reader decoded it (kept: the same log is read many times a round)."""

    block: int
    index: int
    topics: tuple[bytes, ...]
    log: Any
    decoded: Any = field(default=None, compare=False)


def bloom_has(bloom: bytes, item: bytes) -> bool:
    """Whether the 2048-bit logs bloom `bloom` has the three bits of `item` (an address or a topic,
    the yellow paper's M3:2048): False proves `item` is in none of the block's logs."""
    digest = keccak(item)
    for i in (0, 2, 4):
        bit = ((digest[i] << 8) | digest[i + 1]) & 2047
        if not bloom[255 - bit // 8] & (1 << (bit % 8)):
            return False
    return True


def _size(entry: MirroredLog) -> int:
    """About the bytes `entry` holds: its data and a fixed share for the rest."""
    data = entry.log.get("data", b"") if isinstance(entry.log, Mapping) else b""
    return len(data) + 512


class LedgerMirror:
    """The ledger's pushed logs over the blocks held whole (`covers`), and recent heads' timestamps."""

    def __init__(self, address: bytes) -> None:
        self._address = address  # 20 bytes
        self._lock = threading.Lock()
        self._start: int | None = None  # the first block held whole; None: none yet
        self._sealed = -1  # the last block held whole (from `_start`)
        self._head = -1  # the last head pushed
        self._head_at = 0.0  # when (time.monotonic)
        self._maybe_ours: dict[int, bool] = {}  # recent heads: whether their bloom may hold a ledger log
        self._logs: dict[int, dict[int, MirroredLog]] = {}  # block -> log index -> log
        self._order: list[int] = []  # the blocks of `_logs`, ascending
        self._count = self._bytes = 0  # logs held, and about how many bytes
        self._early: list[MirroredLog] = []  # logs pushed before the first head (kept if after it)
        self._read_to = -1  # the highest block `readable` gave in this epoch: it never gives less
        self._timestamps: dict[bytes, int] = {}  # header hash -> timestamp, the last TIMESTAMPS_KEPT
        self.resets = 0  # times it started again (reorganisation, out-of-order log, a drop)
        self._no_backfill = -1  # the epoch (`resets`) in which a backfill was refused: not asked again
        self._on_reset: list[Callable[[int], None]] = []

    def on_reset(self, listener: Callable[[int], None]) -> None:
        """`listener(block)` when the mirror starts again, `block` the first one it may have held wrong."""
        self._on_reset.append(listener)

    # ---------------------------------------------------------------- fed by the subscription

    def take_header(self, header: PushedHeader) -> None:
        """A head the subscription pushed (the feed's guard took it): seals the blocks before it, and
        itself where its bloom excludes the ledger."""
        with self._lock:
            if header.timestamp is not None:
                self._timestamps[header.hash] = header.timestamp
            if len(self._timestamps) > TIMESTAMPS_KEPT:
                del self._timestamps[next(iter(self._timestamps))]
            if header.number <= self._head:
                return  # not new (a replaced head comes through `reorganised` first)
            self._head, self._head_at = header.number, time.monotonic()
            quiet = header.bloom is not None and not bloom_has(header.bloom, self._address)
            self._maybe_ours[header.number] = not quiet
            if len(self._maybe_ours) > BLOOMS_KEPT:
                del self._maybe_ours[next(iter(self._maybe_ours))]
            if self._start is None:
                self._start, self._sealed = header.number + 1, header.number
                for entry in self._early:  # a log may come before its block's head
                    if entry.block > header.number:
                        self._add(entry)
                self._early.clear()
                return
            whole = header.number if quiet and header.number not in self._logs else header.number - 1
            block = self._sealed + 1
            while block <= whole:
                # a block whose bloom may hold a ledger log (or whose head never came) and that holds
                # none waits for a second later head
                if self._maybe_ours.get(block, True) and block not in self._logs and header.number < block + 2:
                    break
                block += 1
            self._sealed = max(self._sealed, block - 1)
            self._prune()

    def take_log(self, block: int, index: int, topics: tuple[bytes, ...], formatted: Any, removed: bool) -> None:
        """A ledger log the subscription pushed (validated there)."""
        if removed:
            self.reorganised(block)
            return
        entry = MirroredLog(block, index, topics, formatted)
        with self._lock:
            if self._start is None:
                if self._head < 0 and len(self._early) < EARLY_LOGS:
                    self._early.append(entry)
                return
            if block < self._start or block > self._head + MAX_AHEAD:
                return  # before the blocks held whole (read from the endpoint), or no block of the chain
            if block > self._sealed:
                self._add(entry)
                self._prune()
                return
        log.warning("the endpoint pushed a ledger log of block %d after a later head: the mirror starts again", block)
        self._reset(block)

    def _add(self, entry: MirroredLog) -> None:
        """Hold `entry` (under the lock); one pushed twice is held once."""
        held = self._logs.get(entry.block)
        if held is None:
            held = self._logs[entry.block] = {}
            bisect.insort(self._order, entry.block)
        if entry.index not in held:
            held[entry.index] = entry
            self._count += 1
            self._bytes += _size(entry)

    def reorganised(self, first: int) -> None:
        """Blocks `first` on were replaced (a head said so, or a removed log)."""
        with self._lock:
            held = self._start is not None and (first <= self._head or bool(self._order and self._order[-1] >= first))
        if held:
            self._reset(first)

    def stopped(self) -> None:
        """The subscription dropped: logs may be missed until it is back."""
        self._reset(None)

    def _reset(self, first: int | None) -> None:
        with self._lock:
            self._start, self._sealed, self._head, self._read_to = None, -1, -1, -1
            self._logs.clear()
            self._order.clear()
            self._early.clear()
            self._count = self._bytes = 0
            self.resets += 1
        if first is not None:
            for listener in self._on_reset:
                listener(first)

    def _prune(self) -> None:
        """Keep at most MIRROR_LOGS logs and MIRROR_BYTES (under the lock): the oldest blocks' go,
        the blocks held whole starting after them."""
        assert self._start is not None
        while self._order and (self._count > MIRROR_LOGS or self._bytes > MIRROR_BYTES):
            oldest = self._order.pop(0)
            dropped = self._logs.pop(oldest).values()
            self._count -= len(dropped)
            self._bytes -= sum(_size(e) for e in dropped)
            self._start = max(self._start, oldest + 1)
            self._sealed = max(self._sealed, self._start - 1)

    # ---------------------------------------------------------------- the blocks before the first pushed

    def gap(self, from_block: int, to_block: int) -> tuple[int, int] | None:
        """(epoch, the first block held) where a read of from_block..to_block lacks only blocks
        before the first held (a backfill from `from_block` would let the mirror answer it); None
        where it holds the read already, or cannot (past the blocks held, or a backfill refused)."""
        with self._lock:
            if self._start is None or to_block > self._sealed or from_block >= self._start:
                return None
            return None if self._no_backfill == self.resets else (self.resets, self._start)

    def backfill(self, epoch: int, from_block: int, to_block: int, entries: list[MirroredLog]) -> bool:
        """Take the ledger's logs of from_block..to_block, read from the endpoint, as held, where
        to_block is the block before the first held and nothing started the mirror again since
        the gap was asked (`epoch`); refused (and not asked for again in this epoch) where they
        would pass MIRROR_LOGS."""
        with self._lock:
            if epoch != self.resets or self._start is None or to_block != self._start - 1:
                return False
            if any(not from_block <= entry.block <= to_block for entry in entries):
                return False
            size = sum(_size(entry) for entry in entries)
            if self._count + len(entries) > MIRROR_LOGS or self._bytes + size > MIRROR_BYTES:
                self._no_backfill = epoch
                return False
            order = self._order
            self._order = []
            for entry in entries:
                self._add(entry)  # the blocks before every one held: their order first, then the rest
            self._order = sorted(set(self._order)) + order
            self._start = from_block
            return True

    # ---------------------------------------------------------------- read by the ledger client

    def readable(self, at: int) -> int:
        """The block to read at for a read at `at` (the head less the confirmations): the last one
        held whole where `at` is past it and the last head came less than SEAL_GRACE_S ago (the
        next head makes the blocks up to `at` whole; the watcher wakes the reads then; `at` may
        also be a head the client's guard took that the mirror is about to), else `at`."""
        with self._lock:
            fresh = time.monotonic() - self._head_at < SEAL_GRACE_S
            waiting = self._start is not None and at > self._sealed and fresh
            block = max(self._sealed, min(self._read_to, at)) if waiting else at
            self._read_to = max(self._read_to, block)
            return block

    def covers(self, from_block: int, to_block: int) -> bool:
        """Whether every ledger log of blocks from_block..to_block is held."""
        with self._lock:
            return self._start is not None and self._start <= from_block and to_block <= self._sealed

    def logs(self, from_block: int, to_block: int) -> list[MirroredLog] | None:
        """The ledger's logs of from_block..to_block in chain order; None unless all are held."""
        with self._lock:
            if self._start is None or not self._start <= from_block or to_block > self._sealed:
                return None
            low, high = bisect.bisect_left(self._order, from_block), bisect.bisect_right(self._order, to_block)
            return [e for b in self._order[low:high] for e in self._in_order(b)]

    def _in_order(self, block: int) -> list[MirroredLog]:
        return sorted(self._logs[block].values(), key=lambda e: e.index)

    def last_log(self, topics: frozenset[bytes], at: int) -> MirroredLog | None:
        """The last held log by block `at` whose first topic is one of `topics`, where every block
        from its own to `at` is held; None otherwise."""
        with self._lock:
            if self._start is None or at > self._sealed:
                return None
            for block in reversed(self._order[: bisect.bisect_right(self._order, at)]):
                for entry in reversed(self._in_order(block)):
                    if entry.topics and entry.topics[0] in topics:
                        return entry
            return None

    def last_change(self, at: int) -> tuple[int, int] | None:
        """(the mirror's epoch, the last block at or before `at` holding a ledger log, or `start - 1`
        if none does since the blocks held whole begin): the ledger's state at `at` is its state
        there, as every change of it emits a log; the epoch (`resets`) tells a block number reused
        by a reorganisation apart. None unless the blocks up to `at` are held."""
        with self._lock:
            if self._start is None or at > self._sealed or at < self._start - 1:
                return None
            below = bisect.bisect_right(self._order, at)
            return self.resets, self._order[below - 1] if below else self._start - 1

    def timestamp(self, block_hash: bytes) -> int | None:
        """The timestamp of a recent pushed head, by its hash."""
        with self._lock:
            return self._timestamps.get(block_hash)
