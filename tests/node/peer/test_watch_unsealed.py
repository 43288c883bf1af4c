"""The watcher's pushed logs waiting for their block to be held whole (node/peer/watch.py `_hold`):
a flood of them, and a subscription that drops while some wait, still wake the peer, at once and
once, and what waits stays bounded. The chain side of a held block: tests/node/chain/test_mirror.py."""

from __future__ import annotations

import trio

from node.chain.mirror import LedgerMirror
from node.chain.subscription import MAX_PENDING_LOGS, LedgerLog
from node.peer.watch import ChainWatcher

LEDGER = bytes(range(20))
TOPIC = bytes(32)


def watcher_following_a_mirror_that_holds_nothing() -> ChainWatcher:
    """A watcher as `follow` leaves it with no confirmations, its subscription live, at block 10^6; its
    mirror has taken no head, so no block is held whole and every pushed log waits. The ledger client
    is never reached: only pushed logs and the feed's state are given to the watcher here."""
    watcher = ChainWatcher(None, None, poll_interval=0.05, chain_timeout=30)  # type: ignore[arg-type]
    watcher._mirror = LedgerMirror(LEDGER)
    watcher.block = 10**6
    watcher._feed_live(True)
    watcher._catch_up = False
    return watcher


def test_a_flood_of_logs_for_blocks_not_held_whole_wakes_the_peer_and_stays_bounded() -> None:
    async def main() -> None:
        watcher = watcher_following_a_mirror_that_holds_nothing()
        moves = watcher.moves
        for block in range(1, MAX_PENDING_LOGS + 1):
            watcher._pushed_log(LedgerLog(block, TOPIC, removed=False))
        assert len(watcher._unsealed) == MAX_PENDING_LOGS and watcher.moves == moves  # each waits its block
        for block in range(MAX_PENDING_LOGS + 1, MAX_PENDING_LOGS + 101):
            watcher._pushed_log(LedgerLog(block, TOPIC, removed=False))
        assert len(watcher._unsealed) == MAX_PENDING_LOGS, "the flood is not kept"
        assert watcher.moves == moves + 100, "each log past the bound is a move at once, read from the endpoint"

    trio.run(main)


def test_a_subscription_that_drops_while_logs_wait_wakes_the_peer_once_and_forgets_them() -> None:
    async def main() -> None:
        watcher = watcher_following_a_mirror_that_holds_nothing()
        for block in (5, 6, 6, 7):
            watcher._pushed_log(LedgerLog(block, TOPIC, removed=False))
        assert sorted(watcher._unsealed) == [5, 6, 7]
        moves = watcher.moves
        watcher._feed_live(False)  # the next head they waited for will not come pushed
        assert watcher.moves == moves + 1 and not watcher._unsealed
        assert not watcher.pushed and watcher._catch_up is False  # the poller takes over
        watcher._feed_live(False)  # said twice: nothing waits, no move
        assert watcher.moves == moves + 1
        watcher._pushed_log(LedgerLog(8, TOPIC, removed=False))  # a late push after the drop is not taken
        assert not watcher._unsealed and watcher.moves == moves + 1

    trio.run(main)
