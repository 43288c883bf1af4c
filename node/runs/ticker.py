"""The block clock of a `swarm up` chain, held while the peers start.

Round windows last blocks (and seconds: both must pass), and round 1's opens when the ledger is
deployed. Anvil's own interval mining would tick from then on at `chain.block_time`, while N
processes import torch, opacus, web3 and py-libp2p and load their data: 16 peers on 2 cores take
over a minute, longer than the demo's commit window (240 blocks of 0.25 s), so round 1 closed with
the peers that happened to be up and the rest joined in round 2 (a 6-peer test swarm with a 10 s
window: 2 of 6 in round 1). Anvil's RPC cannot set a sub-second interval (evm_setIntervalMining
takes whole seconds), so the run's chain mines on transactions only and this thread makes its empty
blocks instead: one every HOLD_PACE seconds (under the peers' 3 s stall limit,
node/chain/liveness.py, so nobody nudges or warns) until `ready()` says every started peer has got
through start-up and its first training, then one every `block_time`. The switch is one-way;
HOLD_LIMIT bounds the wait for a peer that never gets going, and the window itself still passes at
the slow pace (HOLD_PACE / block_time times later).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from node.chain.rawrpc import RawRPC

log = logging.getLogger("swarm.up")

HOLD_PACE = 1.5  # seconds per block while peers start
HOLD_LIMIT = 600.0  # seconds after the first peer started at most before the chain runs at its pace


class BlockTicker:
    """Mines an empty block every `block_time` seconds once `ready()` says so (HOLD_PACE before)."""

    def __init__(
        self,
        rpc_url: str,
        block_time: float,
        ready: Callable[[], bool],
        *,
        hold_pace: float = HOLD_PACE,
        hold_limit: float = HOLD_LIMIT,
    ) -> None:
        if block_time <= 0 or hold_pace <= 0:
            raise ValueError(f"block_time and hold_pace must be > 0 seconds, got {block_time} and {hold_pace}")
        self._rpc = RawRPC(rpc_url)
        self.block_time, self.hold_pace, self.hold_limit = block_time, hold_pace, hold_limit
        self._ready = ready
        self._stop = threading.Event()
        self._started: float | None = None  # when the first peer started (the hold limit's origin)
        self.released_at: float | None = None  # monotonic time the chain went to its own pace
        self.blocks = 0  # blocks mined by this ticker
        self._thread = threading.Thread(target=self._run, name="block-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def peers_starting(self) -> None:
        """The peers are being started: the hold limit counts from the first call."""
        if self._started is None:
            self._started = time.monotonic()

    @property
    def holding(self) -> bool:
        return self.released_at is None

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self._rpc.close()

    def _pace(self) -> float:
        if self.released_at is None and self._started is not None:
            over = time.monotonic() - self._started > self.hold_limit
            try:
                release = over or self._ready()
            except Exception as exc:  # a status file mid-write, say: hold one more tick
                log.debug("peer readiness unknown this tick: %s", exc)
                release = False
            if release:
                if over:  # said before the release is seen: whoever waits on the release finds it said
                    log.warning("peers still starting after %.0f s: the chain runs at its pace anyway", self.hold_limit)
                self.released_at = time.monotonic()
        return self.block_time if self.released_at is not None else self.hold_pace

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            due += self._pace()
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            try:
                self._rpc.call("evm_mine", [])
                self.blocks += 1
            except Exception as exc:  # the chain stopping, or busy: the next tick tries again
                log.debug("evm_mine failed: %s", exc)
            due = max(due, time.monotonic() - self.block_time)  # after a stall, no burst of catch-up blocks
