"""A commit from an account that does not own its peer id (a squatter: its registration does not
verify, so the peer id belongs to someone else or to nobody) is left out by every honest peer
before any fetch, the way a commit that breaks the privacy policy is: peers read registrations
from the chain, so they all decide alike. The rule itself (`rules.PeerIdOwners`, through
`RegistryCache.ownership`) is tried on a real Anvil in tests/node/test_disallow_admission.py and
tests/node/test_rulebook_parity.py."""

from __future__ import annotations

from node.protocol import wire
from node.protocol.policy import expected_micro
from node.rules import Verdict
from tests.node.peer.harness import (
    MECHANISM,
    SHARED,
    FakeSwarm,
    genesis_vector,
    run_virtual,
    samples_of,
    update_blob,
)

T, F = True, False


def test_a_squatters_commit_is_left_out_unfetched_by_every_honest_peer():
    async def main():
        swarm = FakeSwarm(4, min_peers=3)
        swarm.register(0, 1, 2)
        squatter, victim = swarm.members[3], swarm.members[2]
        squatter.ledger.register(victim.host.peer_id_bytes)  # the victim's public peer id, no valid signature
        blobs = [update_blob(i) for i in range(4)]
        for i in range(3):
            swarm.commit(i, blobs[i])
        # the squatter commits what the policy spends, a well-formed blob it serves itself
        digest = squatter.store.put(blobs[3])
        counts = [samples_of(3)]
        eps, record = expected_micro(SHARED.privacy, genesis_vector().numel(), counts)
        squatter.ledger.commit(1, bytes.fromhex(digest), counts[0], eps, wire.canonical(MECHANISM).encode(), record)
        swarm.members[0].ledger.close_round(1)

        asked: list[tuple[str, bytes]] = []

        def ownership(address: str, peer_id: bytes) -> Verdict | None:  # RegistryCache.ownership on a real chain
            asked.append((address, peer_id))
            return Verdict("registration", "a squatter") if address == squatter.address else None

        decided = []
        for i in range(3):
            peer = swarm.peer(i)
            peer.vetting.ownership = ownership
            agreement = await peer._agreement(1)
            decided.append(await agreement.run())
            assert agreement.blobs.malformed == [F, F, F, T] and agreement.blobs.vectors[3] is None
        assert decided == [[T, T, T, F]] * 3
        assert all(t.digest != digest for t in swarm.network.transfers)  # never fetched
        assert (squatter.address, victim.host.peer_id_bytes) in asked

    run_virtual(main)


def test_without_a_registration_check_every_commit_counts():
    """The in-memory peers (no signatures on the fake chain) keep every commit: the check is the
    runner's, wired to the registry."""

    async def main():
        swarm = FakeSwarm(3)
        swarm.register(0, 1, 2)
        for i in range(3):
            swarm.commit(i, update_blob(i))
        swarm.members[0].ledger.close_round(1)
        agreement = await swarm.peer(0)._agreement(1)
        assert await agreement.run() == [T, T, T]

    run_virtual(main)
