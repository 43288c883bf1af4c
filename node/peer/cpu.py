"""The CPU a peer process spends on the protocol: its whole CPU time (every thread) less what
local training and evaluation used, each read on the CPU clock of the thread that ran it. A
training still running is counted up to now, so a speculative training that spans two rounds
is split between them as it ran (docs/BENCHMARKS.md, "Round overhead")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class ComputeMeter:
    """CPU seconds of the calls wrapped by `timed` (training, evaluation), from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._finished = 0.0
        self._running: dict[int, tuple[int, float]] = {}  # thread ident: (its CPU clock, reading at start)

    def timed(self, fn: Callable[P, T]) -> Callable[P, T]:
        """`fn`, its CPU time counted as compute; runs in whichever thread calls it."""

        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            ident = threading.get_ident()
            clock = time.pthread_getcpuclockid(ident)
            with self._lock:
                if ident in self._running:  # nested in a timed call: counted by the outer one
                    nested = True
                else:
                    nested = False
                    self._running[ident] = (clock, time.clock_gettime(clock))
            try:
                return fn(*args, **kwargs)
            finally:
                if not nested:
                    with self._lock:
                        _, start = self._running.pop(ident)
                        self._finished += time.clock_gettime(clock) - start

        return run

    def compute_seconds(self) -> float:
        """CPU seconds spent in timed calls so far, those still running included."""
        with self._lock:
            return self._finished + sum(time.clock_gettime(c) - start for c, start in self._running.values())

    def protocol_seconds(self) -> float:
        """The process's CPU seconds so far outside timed calls."""
        return time.process_time() - self.compute_seconds()


# One per process: `process_time` is the whole process's, so every Peer in it (the in-memory
# tests run several) must subtract every Peer's training.
PROCESS_COMPUTE = ComputeMeter()
