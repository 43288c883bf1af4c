"""A peer's protocol CPU per round (node/peer/cpu.py): the process's CPU time less its training and
evaluation, so that a heavy training does not show as protocol cost."""

from __future__ import annotations

import threading
import time

import trio

from node.peer.cpu import ComputeMeter
from node.peer.peer import Peer, RoundOutcome
from tests.node.peer.harness import FakeSwarm, run_virtual

BURN = 0.4  # CPU seconds each training burns on top of its real work


def burn(seconds: float) -> None:
    """Spend `seconds` of this thread's CPU time."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_timed_call_in_another_thread_is_compute_and_the_rest_is_protocol():
    meter = ComputeMeter()
    burnt, release = threading.Event(), threading.Event()

    def training() -> None:
        burn(0.2)
        burnt.set()
        release.wait()  # still running: counted up to now, as a speculation spanning two rounds is

    protocol0, compute0 = meter.protocol_seconds(), meter.compute_seconds()
    worker = threading.Thread(target=meter.timed(training))
    worker.start()
    burnt.wait()
    running = meter.compute_seconds() - compute0
    burn(0.1)  # protocol work, in this thread
    release.set()
    worker.join()
    protocol = meter.protocol_seconds() - protocol0
    assert running >= 0.2
    assert meter.compute_seconds() - compute0 >= 0.2
    # the 0.1 s burnt here, plus what starting and joining a thread costs; the 0.2 s of training excluded
    assert 0.1 <= protocol < 0.15


def test_a_cpu_heavy_training_leaves_the_protocol_cpu_of_the_round_small():
    async def main() -> list[list[RoundOutcome]]:
        swarm = FakeSwarm(3)
        peers = [swarm.peer(i) for i in range(3)]
        for p in peers:
            real = p._train_and_perturb

            def heavy(r, v, real=real):  # type: ignore[no-untyped-def]
                burn(BURN)
                return real(r, v)

            p._train_and_perturb = heavy  # type: ignore[method-assign]
        outcomes: list[list[RoundOutcome]] = [[] for _ in peers]

        async def one(i: int, peer: Peer) -> None:
            outcomes[i] = await peer.run()

        async with trio.open_nursery() as nursery:
            for i, p in enumerate(peers):
                nursery.start_soon(one, i, p)
        return outcomes

    outcomes = run_virtual(main)
    for (o,) in outcomes:
        assert o.state == "finalized"
        # the three peers share this process and its one meter: a round holds its own training and
        # those of the others that ran meanwhile, all left out of the protocol's share
        assert o.compute_cpu_s >= BURN
        assert 0 < o.protocol_cpu_s < BURN
