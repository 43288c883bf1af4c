"""The chain-liveness watcher (node/chain/liveness.py) on real Anvil chains started without
--block-time, which mine only on transactions: a round with a missing peer stalls for real (its
window's blocks and its seconds both wait for a block), and the watcher's nudges let it close;
off a dev chain it warns instead of mining."""

from __future__ import annotations

import logging
import time

import trio

from node.chain.anvil import start_anvil
from node.chain.client import connect
from node.chain.errors import CommitWindowOpen
from node.chain.liveness import WAITING_PHASES, ChainLiveness, watch_chain
from node.peer.peer import Phase
from node.peer.watch import ChainWatcher


def test_a_stalled_round_closes_once_the_watcher_nudges_the_chain(kit, caplog):
    with start_anvil(accounts=3) as anvil:  # automine only: a block per transaction, none otherwise
        swarm = kit.Swarm(anvil, 3, min_peers=1, commit_window=5, attest_window=5, commit_window_seconds=3)
        swarm.register(2)  # two registered peers; only one commits: the other is "missing"
        swarm.peers[0].commit(1, kit.digest("only"), 100, 1_000_000, kit.MECHANISM)
        stalled_at = anvil.block_number()
        time.sleep(1.0)
        assert anvil.block_number() == stalled_at  # nobody sends a transaction: the chain stands still
        try:
            swarm.peers[0].close_round(1)
            raise AssertionError("closeRound succeeded inside the commit window")
        except CommitWindowOpen:
            pass  # refused at estimation: nothing sent, nothing mined

        closed_after: list[float] = []

        async def peer_waiting_close() -> None:
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: watch_chain(
                        swarm.w3, anvil.url, lambda: "waiting-close", interval=0.1, stall_after=0.5, nudge_every=0.2
                    )
                )
                with trio.fail_after(20):
                    while True:  # what the peer does in waiting-close: try closeRound now and then
                        try:
                            await trio.to_thread.run_sync(swarm.peers[0].close_round, 1)
                            break
                        except CommitWindowOpen:  # the window's blocks, or its seconds, are still running
                            await trio.sleep(0.3)
                closed_after.append(trio.current_time() - started)
                nursery.cancel_scope.cancel()

        with caplog.at_level(logging.WARNING, logger="swarm.chain"):
            trio.run(peer_waiting_close)
        closed = swarm.reader.round_info(1)
        assert closed.state.name == "CLOSED"
        assert closed.closed_block > closed.opened_block + 5 and closed.closed_at >= closed.opened_at + 3  # both passed
        assert closed_after[0] < 20
        warnings = [r.getMessage() for r in caplog.records if r.name == "swarm.chain"]
        assert len(warnings) == 1, warnings  # one warning, not one per nudge
        assert anvil.url in warnings[0] and "swarm chain" in warnings[0] and "evm_mine" in warnings[0]


def test_a_waiting_peer_retries_a_close_refused_for_the_seconds_until_the_window_ends(kit):
    """The peer's own wait (node/peer/watch.py, `ChainWatcher.closed`) on a chain that mines only on
    transactions: the window's blocks pass first, and its closeRound is refused for the seconds
    (CommitWindowOpen) without ending the wait; the liveness nudges bring the blocks whose
    timestamps end the window, and the peer closes it."""
    with start_anvil(accounts=3) as anvil:
        swarm = kit.Swarm(anvil, 3, min_peers=1, commit_window=2, commit_window_seconds=4)
        swarm.register(2)  # the second peer never commits: no early close
        closer = swarm.peers[0]
        closer.commit(1, kit.digest("only"), 100, 1_000_000, kit.MECHANISM)
        refused_at: list[int] = []  # the head block at each refusal
        close_round = closer.close_round

        def close_and_record(r: int):
            try:
                return close_round(r)
            except CommitWindowOpen:
                refused_at.append(anvil.block_number())
                raise

        closer.close_round = close_and_record  # type: ignore[method-assign]

        async def off_loop(fn, *args):
            return await trio.to_thread.run_sync(lambda: fn(*args))

        async def wait_for_close():
            watcher = ChainWatcher(closer, off_loop, poll_interval=0.1, chain_timeout=30)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watcher.run)
                nursery.start_soon(
                    lambda: watch_chain(
                        swarm.w3, anvil.url, lambda: "waiting-close", interval=0.1, stall_after=0.5, nudge_every=0.3
                    )
                )
                info = await watcher.closed(1)
                nursery.cancel_scope.cancel()
            return info

        closed = trio.run(wait_for_close)
    assert closed.state.name == "CLOSED" and closed.closed_at >= closed.opened_at + 4
    assert any(block > closed.opened_block + 2 for block in refused_at), refused_at  # refused for the seconds only


def test_the_watcher_mines_only_while_the_peer_waits():
    with start_anvil(accounts=1) as anvil:
        watcher = ChainLiveness(connect(anvil.url), anvil.url, stall_after=0.0, nudge_every=0.0)
        start = anvil.block_number()
        assert watcher.check(waiting=False) == "idle"  # training, say: a quiet chain is fine
        assert anvil.block_number() == start
        assert watcher.check(waiting=True) == "nudged"
        assert anvil.block_number() == start + 1


def test_waiting_peers_share_the_nudging_rather_than_multiply_it():
    """Two peers wait on one stalled dev chain (a clock the test moves): after the first stall, one
    block per nudge interval in all, not one per peer."""
    now = [0.0]
    with start_anvil(accounts=1) as anvil:
        w3 = connect(anvil.url)
        peers = [ChainLiveness(w3, anvil.url, stall_after=3.0, nudge_every=1.0, clock=lambda: now[0]) for _ in "ab"]
        start = anvil.block_number()
        now[0] = 2.9
        assert [p.check(waiting=True) for p in peers] == ["idle", "idle"]  # not stalled yet
        now[0] = 3.0
        assert [p.check(waiting=True) for p in peers] == ["nudged", "moving"]
        for _ in range(4):
            now[0] += 1.0
            assert sorted(p.check(waiting=True) for p in peers) == ["moving", "nudged"]
        assert anvil.block_number() == start + 5


def test_a_chain_that_ticks_on_its_own_is_not_sped_up_after_one_stall():
    """`swarm up` holds its chain at a block every 1.5 s while the peers start (node/runs/ticker.py):
    slower than nudge_every, inside stall_after. One stall (a starved ticker) must not turn every
    waiting peer into a 1-s clock for the rest of the run: once the chain moves without the
    watcher, the next stall has to last stall_after again."""
    now = [0.0]
    with start_anvil(accounts=1) as anvil:
        watcher = ChainLiveness(connect(anvil.url), anvil.url, stall_after=3.0, nudge_every=1.0, clock=lambda: now[0])
        now[0] = 3.0
        assert watcher.check(waiting=True) == "nudged"  # the one stall
        for _ in range(3):  # the clock ticks every 1.5 s on its own
            anvil.mine(1)
            now[0] += 0.1
            assert watcher.check(waiting=True) == "moving"
            now[0] += 1.4
            assert watcher.check(waiting=True) == "idle"  # 1.5 s without a block: not a stall
        now[0] += 1.6
        assert watcher.check(waiting=True) == "nudged"  # 3 s without one is


def test_off_a_dev_chain_it_warns_once_and_mines_nothing(caplog):
    with start_anvil(accounts=1, chain_id=11155111) as anvil:  # a testnet's id: not ours to mine
        watcher = ChainLiveness(connect(anvil.url), anvil.url, stall_after=0.0)
        start = anvil.block_number()
        with caplog.at_level(logging.WARNING, logger="swarm.chain"):
            assert watcher.check(waiting=True) == "warned"
            assert watcher.check(waiting=True) == "idle"
        assert anvil.block_number() == start
        warnings = [r.getMessage() for r in caplog.records if r.name == "swarm.chain"]
        assert len(warnings) == 1 and "chain id 11155111 is not a local dev chain" in warnings[0]
        assert anvil.url in warnings[0] and "anvil --block-time 1" in warnings[0]
        anvil.mine(1)  # the chain moves on its own: a later stall is warned about again
        assert watcher.check(waiting=True) == "moving"
        with caplog.at_level(logging.WARNING, logger="swarm.chain"):
            assert watcher.check(waiting=True) == "warned"


def test_the_waiting_phases_are_the_peers_own():
    assert WAITING_PHASES.issubset(p.value for p in Phase)
