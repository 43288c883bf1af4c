"""The held block clock of `swarm up` (node/runs/ticker.py), on a real Anvil that mines on
transactions only: slow while the peers start, the run's pace once they are ready."""

from __future__ import annotations

import logging
import time

import pytest

from node.chain.anvil import start_anvil
from node.runs.ticker import BlockTicker


def wait_for(predicate, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_the_clock_is_held_until_the_peers_are_ready_then_runs_at_the_block_time():
    ready = {"now": False}
    with start_anvil(accounts=1) as anvil:
        ticker = BlockTicker(anvil.url, 0.05, lambda: ready["now"], hold_pace=0.5)
        ticker.start()
        try:
            ticker.peers_starting()
            start = anvil.block_number()
            time.sleep(1.2)  # held: about 2 blocks (0.5 s each), never the 24 of the run's pace
            held = anvil.block_number() - start
            assert 1 <= held <= 4 and ticker.holding

            ready["now"] = True
            wait_for(lambda: not ticker.holding)
            released = anvil.block_number()
            wait_for(lambda: anvil.block_number() >= released + 20)  # 20 blocks: 1 s at the run's pace

            ready["now"] = False  # one-way: the clock does not go back to the slow pace
            time.sleep(0.3)
            assert not ticker.holding
        finally:
            ticker.stop()
        stopped = anvil.block_number()
        assert ticker.blocks == stopped - start  # every block came from the ticker
        time.sleep(0.3)
        assert anvil.block_number() == stopped


def test_a_peer_that_never_gets_going_holds_the_clock_only_until_the_limit(caplog):
    with start_anvil(accounts=1) as anvil:
        ticker = BlockTicker(anvil.url, 0.05, lambda: False, hold_pace=0.2, hold_limit=0.5)
        ticker.start()
        try:
            time.sleep(0.6)
            assert ticker.holding  # the limit counts from the first peer's start, not before
            with caplog.at_level(logging.WARNING, logger="swarm.up"):
                ticker.peers_starting()
                wait_for(lambda: not ticker.holding, timeout=10)
            assert "still starting" in caplog.text
        finally:
            ticker.stop()


def test_a_readiness_check_that_raises_holds_one_more_tick():
    calls = {"n": 0}

    def flaky() -> bool:
        calls["n"] += 1
        if calls["n"] < 3:
            raise ValueError("status file mid-write")
        return True

    with start_anvil(accounts=1) as anvil:
        ticker = BlockTicker(anvil.url, 0.05, flaky, hold_pace=0.1)
        ticker.peers_starting()
        ticker.start()
        try:
            wait_for(lambda: not ticker.holding)
            assert calls["n"] >= 3
        finally:
            ticker.stop()


def test_bad_paces_are_refused():
    with pytest.raises(ValueError, match="must be > 0"):
        BlockTicker("http://127.0.0.1:1", 0.0, lambda: True)
