"""A pipelined `swarm node`'s clean stop (node.peer.runner.stop_on_signals), with real signals sent to
this process: the first SIGTERM asks the peer to stop (once), a second signal ends the run at once
as a KeyboardInterrupt, which `swarm node` reports as an interruption."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from node.cli.common import interrupted
from node.peer.runner import stop_on_signals


def test_the_first_signal_stops_the_peer_cleanly_and_a_second_at_once():
    stops: list[float] = []

    async def node() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(stop_on_signals, lambda: stops.append(trio.current_time()))
            os.kill(os.getpid(), signal.SIGTERM)
            with trio.fail_after(10):
                while not stops:
                    await trio.sleep(0.01)
            await trio.sleep(0.1)  # a stop asked once: the run goes on
            assert len(stops) == 1
            os.kill(os.getpid(), signal.SIGINT)
            with trio.fail_after(10):
                await trio.sleep_forever()

    with pytest.raises(BaseException) as raised:
        trio.run(node)
    assert interrupted(raised.value), raised.value
    assert len(stops) == 1
