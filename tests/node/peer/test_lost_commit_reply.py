"""A commit that was mined although its reply was lost (the resend then reads "nonce too low", a
plain LedgerError): the peer finds its own digest on chain and goes on as a committer: stores,
serves and attests its blob, so the round is not left with a participant that never votes."""

from __future__ import annotations

import math
from typing import Any

import trio

from node.chain.errors import LedgerError
from node.chain.records import RoundState
from node.peer import peer as peer_module
from tests.node.peer.harness import FakeSwarm, run_virtual

T = True
# the pauses of a read-back between its first and its last read (1.4 s)
READ_BACK_PAUSES = sum(peer_module.CONFIRM_PAUSE * 2**i for i in range(peer_module.CONFIRM_READS - 1))


async def run_peers(peers: list[Any]) -> list[Any]:
    """Every peer's whole run, side by side in one trio loop."""
    outcomes: list[Any] = [None] * len(peers)

    async def one(i: int) -> None:
        outcomes[i] = await peers[i].run()

    async with trio.open_nursery() as nursery:
        for i in range(len(peers)):
            nursery.start_soon(one, i)
    return outcomes


def test_a_commit_mined_behind_a_lost_reply_is_served_and_attested():
    async def main():
        swarm = FakeSwarm(3)
        ledger = swarm.members[2].ledger
        real_commit = ledger.commit

        def commit_then_lose_the_reply(*args: Any) -> dict[str, int]:
            real_commit(*args)
            raise LedgerError("nonce too low: the first send was mined, its reply lost")

        ledger.commit = commit_then_lose_the_reply  # the fault: a reply lost after the chain took the commit
        peers = [swarm.peer(i) for i in range(3)]
        outcomes = await run_peers(peers)

        info = swarm.members[0].ledger.round_info(1)
        assert info.state is RoundState.FINALIZED
        (lossy,) = outcomes[2]
        assert lossy.committed and lossy.included == [T, T, T], lossy
        assert all(o[0].included == [T, T, T] for o in outcomes)
        digest = next(c.digest.hex() for c in ledger.commitments(1) if c.peer == swarm.members[2].address)
        assert swarm.members[2].store.get(digest) is not None  # stored and served
        assert peers[2].spending.commits == 1

    run_virtual(main)


def test_a_refused_commit_is_still_a_refusal():
    """The lookup must not turn a real refusal into a commit: nothing on chain, nothing stored."""

    async def main():
        swarm = FakeSwarm(3, min_peers=2)
        ledger = swarm.members[2].ledger

        def refuse(*args: Any) -> dict[str, int]:
            raise LedgerError("refused")

        ledger.commit = refuse
        peers = [swarm.peer(i) for i in range(3)]
        outcomes = await run_peers(peers)
        (refused,) = outcomes[2]
        assert not refused.committed and peers[2].spending.commits == 0
        assert swarm.members[2].address not in swarm.members[0].ledger.participants(1)

    run_virtual(main)


def test_a_commit_read_back_waits_for_the_reads_to_reach_its_block():
    """A peer whose reads are pinned at a head that lags the chain (a loaded peer takes pushed heads
    late) cannot read its commit back at once: the read-back waits until the ledger reads at the
    receipt's block, rather than calling a mined commit unconfirmed (the peer then neither served
    nor attested its blob, and the others waited a fetch timeout for it)."""

    async def main():
        swarm = FakeSwarm(3)  # blocks of 1 s
        ledger = swarm.members[2].ledger
        real_block, real_commitments = ledger.block_number, ledger.commitments
        lag = math.ceil(2 * READ_BACK_PAUSES) + 1  # blocks: longer than the read-back's own pauses

        def lagging_block() -> int:
            return max(0, real_block() - lag)

        def lagging_commitments(r: int) -> list[Any]:
            return [c for c in real_commitments(r) if c.block_number <= lagging_block()]

        ledger.block_number, ledger.commitments = lagging_block, lagging_commitments
        await trio.sleep(lag)  # past block 0, which no lag can hide
        peers = [swarm.peer(i) for i in range(3)]
        outcomes = await run_peers(peers)

        (lagging,) = outcomes[2]
        assert lagging.committed and lagging.included == [T, T, T], lagging
        assert all(o[0].included == [T, T, T] for o in outcomes)
        assert peers[2].spending.commits == 1

    run_virtual(main)
