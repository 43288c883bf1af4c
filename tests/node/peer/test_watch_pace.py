"""The chain watcher paces its polls by the blocks it sees: a few reads of the head per block on a
slow chain (what a hosted endpoint counts and rate-limits), unchanged on a fast local one."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from node.peer.watch import POLLS_PER_BLOCK, ChainWatcher
from tests.node.peer.fakes import FakeChain, FakeLedger


class CountingLedger(FakeLedger):
    def __init__(self, chain: FakeChain) -> None:
        super().__init__(chain, "0x" + "11" * 20)
        self.head_reads = 0

    def block_number(self) -> int:
        self.head_reads += 1
        return super().block_number()


def head_reads_per_block(block_time: float, blocks: int) -> float:
    async def main() -> float:
        ledger = CountingLedger(FakeChain(genesis_digest=b"\x02" * 32, min_peers=1, block_time=block_time))

        async def call(fn: Any, *args: Any) -> Any:
            return fn(*args)

        watcher = ChainWatcher(ledger, call, poll_interval=0.1, chain_timeout=3600)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.run)
            await trio.sleep(block_time * 3)  # the watcher learns the pace
            before, start = ledger.head_reads, ledger.chain.block_number()
            await trio.sleep(block_time * blocks)
            per_block = (ledger.head_reads - before) / (ledger.chain.block_number() - start)
            nursery.cancel_scope.cancel()
        return per_block

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_slow_chain_is_read_a_few_times_per_block():
    # Sepolia's 12 s: without the pacing, 2 s at 0.1 s and 10 s at 0.5 s after each (eventful) block, 40 reads
    assert head_reads_per_block(12.0, 20) <= POLLS_PER_BLOCK + 1


def test_a_fast_local_chain_is_read_as_before():
    # 0.25 s blocks: the 0.1 s poll interval stands (2 to 3 reads a block)
    assert 2 <= head_reads_per_block(0.25, 40) <= 3
