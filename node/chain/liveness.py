"""Keeps a peer from waiting forever on a chain that mines only on transactions.

A round window ends once its blocks and its seconds have passed, and the contract reads both from
a new block: its number and its timestamp. A plain `anvil` or `ganache` mines a block only when a
transaction arrives, so once a peer is missing nobody sends one, the commit window never passes (not
even its seconds: the last block's timestamp stands still too), and every other peer sits in
waiting-close (seen: 75 s and counting, the block number frozen).

`watch_chain` runs beside the peer. While the peer waits on the chain (a phase in
WAITING_PHASES) and no block has come for a while, it acts:
- on a local dev chain (chain id 31337 or 1337: Anvil, Hardhat, Ganache) it mines an empty block
  with `evm_mine` after 3 s without one (STALL_AFTER_DEV_S), then whenever a second passes without
  one (NUDGE_EVERY_S) for as long as the peer waits: any block restarts the count, so several
  waiting peers make the chain tick about once a second, not once a second each. Once the chain
  moves without this watcher (a transaction, another peer's nudge, a clock of its own), the next
  stall takes the 3 s again: a chain that ticks on its own, if slowly, is not sped up.
  `evm_mine` rather than a zero-value self-transaction: it needs no gas and, above all, no nonce,
  so it cannot race the peer's own transactions (the sender tracks nonces locally);
- anywhere else (a testnet, a private chain) nothing is mined for it: it warns after 30 s
  (STALL_AFTER_S; a public chain's slot is 12 s, so a shorter limit would cry wolf), reading the
  head every 5 s only (CHECK_EVERY_S_NOT_DEV);
- either way it logs one warning naming the URL and the fix: start the chain with interval
  mining, `swarm chain` or `anvil --block-time 1`. A dev chain that refuses `evm_mine` (geth
  --dev) gets the same warning and is no longer nudged.

While a subscription pushes the chain's heads (`pushed_head`: node.chain.subscription), the
head is the last one pushed, and the watcher asks the endpoint nothing but its `evm_mine`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

import trio
from web3 import Web3
from web3.types import RPCEndpoint

from node.chain.client import head_block, raw_reader

log = logging.getLogger("swarm.chain")

LOCAL_CHAIN_IDS = frozenset({31337, 1337})  # development chains: public dev keys, nothing of value
# Peer phases (node.peer.peer.Phase values; this layer cannot import it) that wait for blocks.
WAITING_PHASES = frozenset({"waiting-close", "waiting-final", "following"})
STALL_AFTER_DEV_S = 3.0
STALL_AFTER_S = 30.0
NUDGE_EVERY_S = 1.0
CHECK_EVERY_S = 1.0
# Elsewhere nothing is nudged and a stall is only told after STALL_AFTER_S: one read every 5 s
# tells it as well, for a fifth of the requests to an endpoint that counts them.
CHECK_EVERY_S_NOT_DEV = 5.0
FIX = "start the chain with interval mining: `swarm chain`, or `anvil --block-time 1`"


class ChainLiveness:
    """One chain's stall detector; `check()` is one synchronous step (RPC calls inside)."""

    def __init__(
        self,
        w3: Web3,
        rpc_url: str,
        *,
        stall_after: float | None = None,
        nudge_every: float = NUDGE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        pushed_head: Callable[[], int | None] | None = None,
    ) -> None:
        self.w3 = w3
        self.rpc_url = rpc_url
        self.clock = clock
        self.chain_id = int(w3.eth.chain_id)
        self.nudging = self.chain_id in LOCAL_CHAIN_IDS
        default = STALL_AFTER_DEV_S if self.nudging else STALL_AFTER_S
        self.stall_after = default if stall_after is None else stall_after
        self.nudge_every = nudge_every
        # the head through the bare reader where there is one (a tenth of web3's CPU per read)
        raw = raw_reader(w3)
        self._read_head: Callable[[], int] = raw.block_number if raw is not None else partial(head_block, w3)
        self._pushed_head = pushed_head  # the subscription's last head while it runs, else None
        self.last_block = self._head()
        self.last_change = clock()  # when the block number last moved (or this watcher mined)
        self.nudges = 0  # empty blocks this watcher mined since the chain last moved without it
        self.warned = False  # one warning per stall: re-armed when the chain moves on its own

    def check(self, waiting: bool) -> str:
        """Read the block number; nudge or warn if the peer is waiting and the chain stalled.
        Returns what it did: "moving", "idle", "nudged" or "warned"."""
        now = self.clock()
        block = self._head()
        if block != self.last_block:
            self.last_block, self.last_change = block, now
            if self.nudges == 0:
                self.warned = False
            # Moved without us (a transaction, another peer's nudge, a clock such as `swarm up`'s
            # held ticker): the next stall has to prove itself again (stall_after), so a chain that
            # ticks slower than nudge_every on its own is not sped up by every waiting peer.
            self.nudges = 0
            return "moving"
        # the first stall takes stall_after to be sure; once the chain is known to need it, a block
        # is mined whenever nudge_every passes without one (from any peer: several waiting peers
        # restart each other's count, so the chain ticks about once per nudge_every, not once per peer)
        limit = self.nudge_every if self.nudging and self.nudges else self.stall_after
        if not waiting or now - self.last_change < limit:
            return "idle"
        if self.nudging:
            self.last_change = now  # the next nudge is due nudge_every from now
            try:
                self.w3.manager.request_blocking(RPCEndpoint("evm_mine"), [])
            except Exception as exc:  # an error answer or none: stop nudging, say what to do
                self.nudging = False
                self._warn(f"it refused evm_mine ({type(exc).__name__}), so this peer cannot nudge it")
                return "warned"
            self.nudges += 1
            # our own block is not the chain moving (a pushed head of it may not have come yet)
            self.last_block = self.last_block + 1 if self._pushed() is not None else self._head()
            if not self.warned:
                self._warn(
                    f"this local dev chain gets an empty block (evm_mine) whenever {self.nudge_every:g} s pass "
                    "without one while peers wait"
                )
            return "nudged"
        if not self.warned:
            self._warn(f"chain id {self.chain_id} is not a local dev chain, so this peer cannot mine for it")
            return "warned"
        return "idle"

    def _pushed(self) -> int | None:
        return self._pushed_head() if self._pushed_head is not None else None

    def _head(self) -> int:
        """The chain's head: the last pushed one while a subscription runs, else read."""
        pushed = self._pushed()
        return pushed if pushed is not None else self._read_head()

    def _warn(self, what: str) -> None:
        self.warned = True
        log.warning(
            "the chain at %s made no block for %.0f s while this peer waits on a round window "
            "(a window passes only in a new block: it seems to mine only on transactions); %s. Fix: %s",
            self.rpc_url,
            self.stall_after,
            what,
            FIX,
        )


async def watch_chain(
    w3: Web3,
    rpc_url: str,
    phase: Callable[[], str],
    *,
    interval: float = CHECK_EVERY_S,
    stall_after: float | None = None,
    nudge_every: float = NUDGE_EVERY_S,
    pushed_head: Callable[[], int | None] | None = None,
) -> None:
    """Watch the chain while `phase()` (the peer's phase value) runs; ends when cancelled.
    `pushed_head`: the subscription's last head while it runs (`ChainFeed.live_head`), else None."""
    watcher: ChainLiveness | None = None
    while watcher is None:  # the RPC may be down at this moment: the peer reports that itself
        try:
            watcher = await trio.to_thread.run_sync(
                lambda: ChainLiveness(
                    w3, rpc_url, stall_after=stall_after, nudge_every=nudge_every, pushed_head=pushed_head
                )
            )
        except Exception as exc:
            log.debug("chain liveness watcher not started yet: %s", exc)
            await trio.sleep(interval)
    while True:
        waiting = phase() in WAITING_PHASES
        try:
            await trio.to_thread.run_sync(watcher.check, waiting)
        except Exception as exc:  # a transient RPC error must not take the peer down
            log.debug("chain liveness check failed: %s", exc)
        await trio.sleep(interval if watcher.nudging else max(interval, CHECK_EVERY_S_NOT_DEV))
