"""The vetting room's committer histories (node/peer/vetting.py): after one read, rounds whose
whole set the peer saw extend them without asking the chain, and the verdicts stay those of a
vetter that reads every history afresh."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from node.chain.errors import LedgerError
from node.peer.vetting import Vetter
from node.rules import Verdict
from tests.node.peer.harness import SHARED, FakeSwarm, genesis_vector, run_virtual, update_blob

D = genesis_vector().numel()


async def inline_call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def counting_reads(ledger: Any) -> list[str]:
    """The addresses whose histories `ledger.commit_history` is asked for from now on."""
    reads: list[str] = []
    history = ledger.commit_history
    ledger.commit_history = lambda address, from_block=None: reads.append(address) or history(address, from_block)
    return reads


def finalize(swarm: FakeSwarm, r: int, voters: list[int]) -> None:
    ledger = swarm.members[voters[0]].ledger
    ledger.close_round(r)
    flags = [True] * len(ledger.commitments(r))
    for i in voters:
        swarm.members[i].ledger.attest_flags(r, bytes([r]) * 32, flags)


def test_histories_extend_from_seen_rounds_without_reads_and_agree_with_a_fresh_vetter():
    async def main():
        swarm = FakeSwarm(3, min_peers=2)
        swarm.register(0, 1, 2)
        ledger = swarm.members[0].ledger
        vetter = Vetter(swarm.members[0].ledger, SHARED, D, me=ledger.account.address, call=inline_call)
        vetter.ledger = reader = swarm.members[0].ledger.__class__(swarm.chain, ledger.account.address)
        reads = counting_reads(reader)  # the vetter's reads only (the scripted commits read histories too)

        for i in range(3):
            swarm.commit(i, update_blob(i, 1), r=1)
        finalize(swarm, 1, [0, 1])
        assert [(await vetter.vet(1, c))[1] for c in ledger.commitments(1)] == [None] * 3
        assert len(reads) == 2  # the two others' histories, once each
        vetter.closed_round(1, ledger.commitments(1))

        for i in (0, 1):  # member 2 sits round 2 out
            swarm.commit(i, update_blob(i, 2), r=2)
        await trio.sleep(swarm.chain.params.commit_window + 1)  # the window ends without member 2
        finalize(swarm, 2, [0, 1])
        assert [(await vetter.vet(2, c))[1] for c in ledger.commitments(2)] == [None, None]
        assert len(reads) == 2  # round 1's set extends member 1's history
        vetter.closed_round(2, ledger.commitments(2))

        for i in (1, 2):
            swarm.commit(i, update_blob(i, 3), r=3)
        # member 2's history is [round 1, round 3]: a count too many or too few would refuse its
        # eps record (PNPM spends one step per round), so None is the right count
        assert [(await vetter.vet(3, c))[1] for c in ledger.commitments(3)] == [None, None]
        assert len(reads) == 2

        fresh = Vetter(swarm.members[1].ledger, SHARED, D, me=swarm.members[1].address, call=inline_call)
        for r in (1, 2, 3):
            for c in ledger.commitments(r):
                assert (await fresh.vet(r, c))[1] == (await vetter.vet(r, c))[1]

    run_virtual(main)


def test_a_round_not_seen_whole_is_read_from_the_chain():
    async def main():
        swarm = FakeSwarm(2)
        swarm.register(0, 1)
        ledger = swarm.members[0].ledger
        vetter = Vetter(swarm.members[0].ledger, SHARED, D, me=ledger.account.address, call=inline_call)
        vetter.ledger = reader = swarm.members[0].ledger.__class__(swarm.chain, ledger.account.address)
        reads = counting_reads(reader)  # the vetter's reads only (the scripted commits read histories too)
        for r in (1, 2, 3):
            for i in (0, 1):
                swarm.commit(i, update_blob(i, r), r=r)
            if r == 1:
                assert (await vetter.vet(1, ledger.commitments(1)[1]))[1] is None
            if r < 3:
                finalize(swarm, r, [0, 1])
            await trio.sleep(1)  # the next round's commits in a later block, as on a chain
        assert len(reads) == 1
        # round 2's set was never noted (say, a round this peer followed): member 1's history
        # through round 3 is read, and holds its round-2 commit (else its eps record is refused)
        assert (await vetter.vet(3, ledger.commitments(3)[1]))[1] is None
        assert len(reads) == 2
        # the next round follows on: nothing in between to know
        finalize(swarm, 3, [0, 1])
        for i in (0, 1):
            swarm.commit(i, update_blob(i, 4), r=4)
        assert (await vetter.vet(4, ledger.commitments(4)[1]))[1] is None
        assert len(reads) == 2

    run_virtual(main)


def test_a_squatter_is_left_out_even_when_its_history_cannot_be_read():
    """Rules 1 to 3 run in one call off the loop, the committer's history read first: a failing
    history read must not turn a squatter's commit (rule 1) into an error of the round's vetting,
    and must still raise for a committer that owns its peer id (its rules 2-3 cannot be decided)."""

    async def main():
        swarm = FakeSwarm(3)
        swarm.register(0, 1, 2)
        ledger = swarm.members[0].ledger
        squatters = {swarm.members[1].address}

        def ownership(address: str, peer_id: bytes) -> Verdict | None:
            return Verdict("registration", "not its peer id") if address in squatters else None

        vetter = Vetter(ledger, SHARED, D, me=ledger.account.address, call=inline_call, ownership=ownership)
        vetter.ledger = reader = ledger.__class__(swarm.chain, ledger.account.address)

        def unreadable(address: str, from_block: int | None = None) -> list:
            raise LedgerError("eth_getLogs: block range too large")

        reader.commit_history = unreadable
        for i in (1, 2):
            swarm.commit(i, update_blob(i, 1), r=1)
        squatter, honest = ledger.commitments(1)
        assert (await vetter.vet(1, squatter))[1] == Verdict("registration", "not its peer id")
        with pytest.raises(LedgerError, match="range too large"):
            await vetter.vet(1, honest)

    run_virtual(main)
