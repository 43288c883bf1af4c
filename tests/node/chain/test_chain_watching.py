"""The cheap reads a waiting peer polls (issue 15, item 3): the block number past web3's
middleware, and whether the ledger emitted anything in a range of blocks; on a real Anvil."""

from __future__ import annotations

from node.chain.anvil import start_anvil
from node.chain.client import head_block


def test_activity_says_when_and_only_when_the_ledger_emitted_an_event(kit):
    with start_anvil(accounts=3) as anvil:  # automine: one block per transaction, none otherwise
        swarm = kit.Swarm(anvil, 3, min_peers=1, commit_window=50, attest_window=50)
        swarm.register(1)
        ledger = swarm.peers[0]
        start = ledger.block_number()
        assert start == swarm.w3.eth.block_number == head_block(swarm.w3)
        assert not ledger.activity(start + 1, start)  # an empty range

        anvil_mine = swarm.w3.provider.make_request("evm_mine", [])  # a block without ledger events
        assert "result" in anvil_mine
        quiet = ledger.block_number()
        assert quiet == start + 1 and not ledger.activity(start + 1, quiet)

        ledger.commit(1, kit.digest("one"), 100, 1_000_000, kit.MECHANISM)  # emits Committed
        busy = ledger.block_number()
        assert busy == quiet + 1
        assert ledger.activity(busy, busy) and ledger.activity(start + 1, busy)
