"""A secure member learns that a round closed (its MASKED set final) from a view pinned at the block
its client reads at, then reads the MASKED digests at that same block. Anvil answers a call pinned
at its head from the block it is mining: the view said closed (in the block after the one asked
for), the digests read at the asked block said open, none committed, and the member acknowledged
no MASKED frame at all, not even its own (seen in the six-peer e2e run: a round aborted for want
of t acknowledgments). On a real Anvil with a real closed round; only that one answer is replayed
(the race is a few microseconds wide): the member waits until it reads at the close, and the set
it reads there holds every commit."""

from __future__ import annotations

import functools

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.chain.secure_steps import chain_steps, round_members
from node.peer.secure import SecureMember, SecureSettings
from node.protocol.secure_windows import Step
from p2p.store import MemoryBlobStore
from tests.node.chain.conftest import Swarm, digest, identity


def test_a_close_seen_in_a_view_answered_from_the_next_block_is_read_again(automine_chain):
    # a KEYS window (an eighth) long enough for the three registrations: they make the members
    swarm = Swarm(automine_chain, 4, min_peers=3, commit_window=80, secure_aggregation=True)
    swarm.register(3)
    swarm.commit_all(1, 3)
    swarm.pass_commit_window(1)
    before = swarm.reader.block_number()
    swarm.peers[0].close_round(1)
    closed = swarm.reader.round_info(1).closed_block
    assert closed > before
    client = swarm.peers[0]
    answered: list[str] = []

    async def racing(fn, *args, **kwargs):
        """The endpoint as it answered mid-block, once: the head before the close, and a view
        pinned there answered from the state the close is in."""
        if fn == client.block_number and "head" not in answered:
            answered.append("head")
            return before
        if fn == client.round_info and kwargs.get("block") == before and "view" not in answered:
            answered.append("view")
            return client.round_info(*args)
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    settings = SecureSettings(bits=32, dim=8, counted_members=1, poll=0.01)
    key = Ed25519PrivateKey.from_private_bytes(identity(0).to_bytes())
    member = SecureMember(client, None, MemoryBlobStore(), key, settings, call=racing, head=lambda: (0, 0))

    (closed_block, _), at = trio.run(member._until_closed, 1)
    assert answered == ["head", "view"]  # the racing answers were given
    assert closed_block == closed and at >= closed
    members = round_members(swarm.reader, 1)
    masked = chain_steps(swarm.reader, 1, members, at=at).digests[Step.MASKED]
    assert {members.addresses[i] for i in masked} == {swarm.accounts[i].address for i in range(3)}
    assert sorted(masked.values()) == sorted(digest(f"r1-p{i}") for i in range(3))
