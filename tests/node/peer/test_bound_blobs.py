"""A blob belongs to one round and one committer (rule "binding", node/rules.py): a member that
re-commits its own blob of an earlier round, or another member's, pays the eps on chain but every
honest peer leaves the blob out after fetching it, as it leaves out a malformed one. Real `Peer`s
on the fakes, in trio's virtual time; tests/node/test_rulebook_parity.py shows the same on a real
chain, through the vetting and through `swarm verify`."""

from __future__ import annotations

from tests.node.peer.harness import FakeSwarm, digest_of, run_virtual, update_blob

T, F = True, False


def test_a_replayed_or_copied_blob_is_left_out_by_every_honest_peer():
    async def main():
        swarm = FakeSwarm(4)
        swarm.register(0, 1, 2, 3)
        round1 = [update_blob(i, r=1) for i in range(4)]
        for i, data in enumerate(round1):
            swarm.commit(i, data, r=1)
        swarm.members[0].ledger.close_round(1)
        for i in range(3):
            swarm.members[i].ledger.attest_flags(1, digest_of(round1, [T] * 4), [T] * 4)

        swarm.commit(0, update_blob(0, r=2), r=2)
        swarm.commit(1, update_blob(1, r=2), r=2)
        swarm.commit(2, round1[2], r=2)  # its own round-1 blob again: its eps paid twice, no new work
        swarm.commit(3, round1[0], r=2)  # member 0's round-1 blob, under its own account
        swarm.members[0].ledger.close_round(2)

        for i in range(2):
            agreement = await swarm.peer(i)._agreement(2)
            assert await agreement.run() == [T, T, F, F]
            for j, why in ((2, "round '1'"), (3, f"committer '{swarm.members[0].address}'")):
                left_out = agreement.blobs.left_out[j]
                assert left_out is not None and "replayed or copied" in left_out and why in left_out, left_out

    run_virtual(main)
