"""Watching the chain: the peer's one poller of the ledger, its waits on a round's state, and the
transactions that move a round along (close, abort) once the round's windows allow them.

A waiter re-reads the ledger only after the ledger emitted an event (every change of a round's
state does). With a subscription (`node.chain.subscription.ChainFeed`, `follow`) the endpoint
pushes both, new heads and the ledger's logs, and the watcher asks nothing; without one, or while
it is down, the poller asks: the cheap block number, and on a new block whether the ledger
emitted anything in it. So a peer with nothing to do stays idle.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from node.chain.errors import LedgerError
from node.chain.mirror import SEAL_GRACE_S, LedgerMirror
from node.chain.records import RoundInfo, RoundState
from node.chain.subscription import MAX_PENDING_LOGS, ChainFeed, LedgerLog
from node.peer.ports import LedgerPort, OffLoop

log = logging.getLogger("swarm.peer")

T = TypeVar("T")

RPC_RETRY_INTERVAL = 1.0  # seconds between two calls while the chain's RPC does not answer
QUICK_WAIT = 2.0  # seconds after the ledger's last event during which the chain is polled every poll_interval
IDLE_POLL = 0.5  # seconds between two polls once the ledger has been quiet that long (a waiting peer is idle)
# An RPC's logs may lag its blocks (node/chain/client.py, LOG_LAG_RETRIES): an event missed that way
# would leave a waiter waiting for the next one, and after a round's last event there is none. So a
# new block after this many seconds without an event is taken as one: the waiters re-read the ledger.
REREAD_AFTER = 5.0
# A poll between two blocks finds nothing: on a chain slower than the pauses above (Sepolia's 12 s
# against 0.1-0.5 s) the pause grows to the blocks' pace, POLLS_PER_BLOCK polls per block as seen,
# so a peer asks its endpoint a few times per block, not dozens (the requests a hosted endpoint
# counts and limits), for at most a quarter block more to notice one.
POLLS_PER_BLOCK = 4
MAX_POLL_PAUSE = 3.0  # a stall (no block for minutes) must not make the watcher that slow: Sepolia's pace
# With a ledger mirror (node/chain/mirror.py) and no confirmations, a pushed log's move waits for the
# next head, which makes its block held whole (the reads it wakes cost no request); a chain without
# a next head (automine, no clock) gets the move SEAL_GRACE_S after the log anyway, read from the endpoint.


class ChainWatcher:
    """What a peer knows of the chain's progress: the last block and round state read, and a count
    of the ledger's events (`moves`) that waiters compare to know when to read again."""

    def __init__(self, ledger: LedgerPort, call: OffLoop, *, poll_interval: float, chain_timeout: float) -> None:
        self.ledger = ledger
        self._call = call  # the peer's `chain`
        self.poll_interval = poll_interval
        self.chain_timeout = chain_timeout
        self.info: RoundInfo | None = None  # the round's state as last read
        self.block = 0  # the chain's block number as last read
        self.moves = 0  # ledger events seen so far: waiters re-read on a change
        self.windows = (0, 0)  # (commit, attest) windows in blocks, from the ledger's params (`Peer.start`)
        # a secure-aggregation ledger aborts an open round that never reached its quorum once both
        # windows passed (members that sat out of a step never commit): nudged here (`Peer.start`)
        self.aborts_unfilled = False
        self._last_move = 0.0  # trio time of the last move
        self._last_block_at: float | None = None  # trio time the last new block was read
        self.block_interval = 0.0  # seconds per block as seen (a moving average; 0 until two blocks)
        self._last_reread = 0.0  # trio time of the last re-read without an event (REREAD_AFTER)
        self._tick = trio.Event()  # set on every new block
        self._watching = False  # `run` runs
        self._nudged_at = (0, 0)  # (round, participant count) at our last try to close a round
        self._pushed = False  # a subscription pushes heads and logs: nothing to poll (`follow`)
        self._feed_changed = trio.Event()  # set when the subscription starts or stops
        self._confirmations = 0  # the ledger client's depth: a pushed head h is block h - confirmations
        self._pending: set[int] = set()  # blocks of pushed ledger logs not yet `confirmations` deep
        self._catch_up = False  # the subscription (re)started: `run` reads the chain once
        self._moved_at = 0  # the block of the last pushed move: one read of the ledger covers all of a block's logs
        self._mirror: LedgerMirror | None = None  # the ledger client's, where it reads pushed blocks from one
        self._unsealed: dict[int, float] = {}  # pushed logs' blocks awaiting the next head (`SEAL_GRACE_S`)

    @property
    def pushed(self) -> bool:
        """A subscription pushes the heads and the ledger's logs now: every ledger event is a move."""
        return self._pushed

    def follow(self, feed: ChainFeed, confirmations: int, mirror: LedgerMirror | None = None) -> None:
        """Take new heads and the ledger's logs from `feed` while it is live, polling otherwise.
        `confirmations`: the ledger client's, so the block watched is the one it reads at.
        `mirror`: the one the ledger client reads pushed blocks from (fed by `feed`), if any: a
        log's move then waits until the mirror holds its block whole (`SEAL_GRACE_S`)."""
        self._confirmations = confirmations
        self._mirror = mirror
        feed.on_head(self._pushed_head)
        feed.on_log(self._pushed_log)
        feed.on_live(self._feed_live)
        feed.on_reorg(self._reorganised)

    async def run(self) -> None:
        """The peer's one watcher of the chain, for its whole life (ends when cancelled): idle
        while a subscription pushes (`follow`), else polling; after QUICK_WAIT of quiet on the
        ledger it polls every IDLE_POLL only."""
        self._watching = True
        try:
            while True:
                if self._pushed and not self._catch_up:  # the subscription reports: until it changes
                    with trio.move_on_after(SEAL_GRACE_S if self._unsealed else float("inf")):
                        await self._feed_changed.wait()
                        self._feed_changed = trio.Event()
                    self._unseal(trio.current_time() - SEAL_GRACE_S)
                    continue
                quiet = trio.current_time() - self._last_move
                pause = self.poll_interval if quiet < QUICK_WAIT else IDLE_POLL
                pause = max(pause, min(self.block_interval / POLLS_PER_BLOCK, MAX_POLL_PAUSE))
                try:
                    if self._catch_up:  # what came between the last poll and the subscription
                        await self._read_chain()
                        self._catch_up = False
                    else:
                        await self.poll(pause=pause)
                except Exception as exc:  # an RPC that fails or lies: the waiters' own deadlines decide
                    round_now = self.info.round if self.info is not None else 0
                    log.warning("round %d: watching the chain failed, trying again: %s", round_now, exc)
                    await trio.sleep(RPC_RETRY_INTERVAL)
        finally:
            self._watching = False

    async def poll(self, *, pause: float) -> None:
        """One poll after `pause`: on a new block, wake the waiters, and count a move if the ledger
        emitted an event since the last block seen."""
        await trio.sleep(pause)
        if not self._pushed:  # a subscription came up meanwhile: it reports
            await self._read_chain()

    async def _read_chain(self) -> None:
        """Read the block number and, on a new block, whether the ledger emitted anything since."""
        block = await self._call(self.ledger.block_number)
        if block <= self.block:
            return
        seen = self._new_block(block)
        self._moved(not seen or await self._call(self.ledger.activity, seen + 1, block))

    def _new_block(self, block: int) -> int:
        """Take `block` as the one the ledger is read at; the one before."""
        seen, self.block = self.block, block
        now = trio.current_time()
        if seen and self._last_block_at is not None:
            gap = (now - self._last_block_at) / (block - seen)
            self.block_interval = gap if not self.block_interval else 0.75 * self.block_interval + 0.25 * gap
        self._last_block_at = now
        return seen

    def _moved(self, ledger_event: bool) -> None:
        """A new block: count a move if the ledger emitted an event (or a re-read is due), wake the waiters."""
        now = trio.current_time()
        if ledger_event:
            self.moves += 1
            self._last_move = now
        elif now - max(self._last_move, self._last_reread) > REREAD_AFTER:
            self.moves += 1
            self._last_reread = now  # not a move: the poller stays at its idle pace
        self._tick.set()
        self._tick = trio.Event()

    def _pushed_head(self, head: int) -> None:
        """A head the subscription pushed (through the ledger client's guard): the block the
        ledger is read at is `confirmations` below it, and the pushed logs that deep are moves."""
        block = head - self._confirmations
        if not self._pushed or block <= self.block:
            return
        self._new_block(block)
        deep = {b for b in self._pending if b <= block}
        self._pending -= deep
        sealed = {b for b in self._unsealed if self._mirror is None or self._mirror.covers(b, b)}
        if self._mirror is not None:  # (the feed gave the mirror this head first)
            for b in deep:
                if not self._mirror.covers(b, b):
                    self._hold(b)
            deep -= set(self._unsealed)
        for b in sealed:
            del self._unsealed[b]
        if deep or sealed:
            self._moved_at = block
        self._moved(bool(deep or sealed))

    def _hold(self, block: int) -> None:
        """No confirmations: a pushed log's move waits for the head after its block (`SEAL_GRACE_S`)."""
        if len(self._unsealed) >= MAX_PENDING_LOGS:  # (a flood): a move now, read from the endpoint
            self._moved(True)
            return
        self._unsealed.setdefault(block, trio.current_time())
        self._feed_changed.set()  # `run` times the grace

    def _unseal(self, before: float) -> None:
        """The blocks awaiting a next head since `before` are moves now: read from the endpoint."""
        waited = [b for b, at in self._unsealed.items() if at <= before]
        for b in waited:
            del self._unsealed[b]
        if waited:
            self._moved_at = max(self._moved_at, max(waited))
            self._moved(True)

    def _pushed_log(self, entry: LedgerLog) -> None:
        """A ledger log the subscription pushed: a move once its block is as deep as the ledger
        reads; a removed one (a reorganisation) at once, so the waiters read the ledger again."""
        if not self._pushed:
            return
        reached = not entry.removed and entry.block <= self.block
        if reached and self._mirror is not None and not self._mirror.covers(entry.block, entry.block):
            self._hold(entry.block)  # (a log late for its block too)
            return
        if entry.removed:
            self._pending.discard(entry.block)
            self._moved_at = min(self._moved_at, entry.block - 1)  # the logs of its block again are news
            self._moved(True)
        elif entry.block <= self._moved_at:
            return  # its block's move is counted: a read after it sees the whole block
        elif entry.block <= self.block:  # no confirmations: the head of its block came first
            self._moved_at = entry.block
            self._moved(True)
        elif len(self._pending) < MAX_PENDING_LOGS:
            self._pending.add(entry.block)

    def _reorganised(self, first: int) -> None:
        """The chain from block `first` on was replaced: the waiters read the ledger again (the
        logs pushed for those blocks are gone; those of the new blocks come pushed too)."""
        if not self._pushed:
            return
        self._pending = {b for b in self._pending if b < first}
        self._unsealed = {b: at for b, at in self._unsealed.items() if b < first}
        self._moved_at = min(self._moved_at, first - 1)
        self._moved(True)

    def _feed_live(self, live: bool) -> None:
        """The subscription started (`run` reads the chain once: the block, and the ledger's
        logs since the last poll, which no subscription saw) or stopped (the poller takes over,
        from the last block taken)."""
        self._pushed = self._catch_up = live
        self._pending.clear()
        if self._unsealed:  # moves that waited for a head that may not come now
            self._unsealed.clear()
            self._moved(True)
        self._feed_changed.set()  # `run` wakes: to read the chain once, or to poll

    async def next_tick(self) -> None:
        """Until the chain has a new block (read by `run` when it runs, else here)."""
        if self._watching:
            await self._tick.wait()
        else:  # a round played without Peer.run: poll here, as `run` would
            await self.poll(pause=self.poll_interval)

    async def moved_since(self, moves: int) -> None:
        """Until the ledger emitted an event after `moves` were counted."""
        while self.moves == moves:
            await self.next_tick()

    async def closed(self, r: int) -> RoundInfo:
        """Round r once it is no longer open, closing it ourselves as soon as the chain would take it."""
        return await self._wait_for(
            lambda: self._state_past(r, RoundState.OPEN), r=r, what="close", nudge=lambda: self._nudge_close(r)
        )

    async def ended(self, r: int) -> RoundInfo:
        """Round r once it is finalized or aborted, aborting it ourselves once its attestation window is over."""
        return await self._wait_for(
            lambda: self._state_past(r, RoundState.OPEN, RoundState.CLOSED),
            r=r,
            what="finalization",
            nudge=lambda: self._nudge_abort(r),
        )

    async def _wait_for(
        self,
        predicate: Callable[[], T | None],
        *,
        r: int,
        what: str,
        nudge: Callable[[], Awaitable[None]],
    ) -> T:
        """Watch the chain until predicate() is truthy; `nudge` may send a transaction that moves
        the round along (close or abort), and decides itself whether the chain would take it.
        The predicate is re-read only after the ledger emitted an event; `nudge` is offered every
        new block (the round's windows count blocks)."""
        with trio.move_on_after(self.chain_timeout):
            while True:
                moves = self.moves
                value = await self._call(predicate)
                if value:
                    return value
                while self.moves == moves:
                    await nudge()
                    if self.moves == moves:  # a move during the nudge (its own transaction's) is not waited past
                        await self.next_tick()
        raise TimeoutError(f"round {r}: no {what} on chain within {self.chain_timeout:.0f} s")

    def _state_past(self, r: int, *states: RoundState) -> RoundInfo | None:
        """Round r's state (blocking), if it is none of `states` any more."""
        info = self.info = self.ledger.round_info(r)
        return None if info.state in states else info

    async def _nudge_close(self, r: int) -> None:
        """Close round r when the chain would take it: its commit window is over, or a commit came
        since our last try (the commit of the last member the round awaits lets anyone close it at
        once: every registered peer but those the last finalized aggregate left out, contracts/
        SwarmLedger.sol closeRound; a late commit of a left-out one is then refused)."""
        info = self.info
        if info is None or info.round != r:
            return
        window_over = self.block > info.opened_block + self.windows[0]
        if window_over or (r, info.participant_count) != self._nudged_at:
            self._nudged_at = (r, info.participant_count)
            await self._try(self.ledger.close_round, r)
        if self.aborts_unfilled and self.block > info.opened_block + self.windows[0] + self.windows[1]:
            await self._try(self.ledger.abort_round, r)  # refused while the round can still close

    async def _nudge_abort(self, r: int) -> None:
        """Abort round r once its attestation window is over without a majority."""
        info = self.info
        if info is None or info.round != r or info.state != RoundState.CLOSED:
            return
        if self.block > info.closed_block + self.windows[1]:
            await self._try(self.ledger.abort_round, r)

    async def _try(self, fn: Callable[..., object], *args: Any) -> None:
        """Close or abort when the chain allows it; refusals (window still open, quorum not
        met, someone else was first) are the normal case and are ignored."""
        with contextlib.suppress(LedgerError):
            await self._call(fn, *args)
