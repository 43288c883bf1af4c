"""GossipSub announcements over real hosts: relayed along a line, filtered by admission."""

from __future__ import annotations

import pytest
import trio
from libp2p.peer.id import ID

from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio


async def _link_line(peers, wait_until):
    """Connect peers[i] to peers[i+1] only, then wait until each mesh holds its line neighbours."""
    for left, right in zip(peers, peers[1:]):
        await right.connect(left.addrs[0])
    for i, peer in enumerate(peers):
        neighbours = {p.peer_id for p in peers[max(0, i - 1) : i + 2] if p is not peer}
        await wait_until(lambda n=neighbours, p=peer: n <= set(p.mesh_peers()), what=f"mesh of peer {i}")


async def test_announcements_reach_all_peers_of_a_line(config, hosts, wait_until):
    # dial_discovered=False keeps the topology a line: every message must be relayed hop by hop.
    specs = [(config(dial_discovered=False), MemoryBlobStore(), None) for _ in range(5)]
    async with hosts(specs) as peers:
        await _link_line(peers, wait_until)
        for peer in peers[2:]:  # the line really is a line
            assert peers[0].peer_id not in peer.connected_peers()
        await peers[0].publish(b"round 1: digest abc")
        for peer in peers[1:]:
            with trio.fail_after(5):
                got = await peer.announcements.receive()
            assert got.peer_id == peers[0].peer_id and got.payload == b"round 1: digest abc"


async def test_announcements_from_a_non_allowed_peer_are_ignored_and_not_relayed(config, hosts, wait_until):
    outsider_cfg = config(dial_discovered=False)
    outsider = ID.from_pubkey(outsider_cfg.key_pair.public_key).to_base58()
    specs = [
        (outsider_cfg, MemoryBlobStore(), None),
        (config(dial_discovered=False), MemoryBlobStore(), lambda p: p != outsider),  # the gatekeeper
        (config(dial_discovered=False), MemoryBlobStore(), None),  # would accept the outsider itself
    ]
    async with hosts(specs) as (out, gate, far):
        await _link_line([out, gate, far], wait_until)
        await out.publish(b"let me in")
        await gate.publish(b"from a member")
        with trio.fail_after(5):
            got_far = await far.announcements.receive()
        assert got_far.peer_id == gate.peer_id and got_far.payload == b"from a member"
        await trio.sleep(1.0)  # give a wrongly relayed message time to arrive
        with pytest.raises(trio.WouldBlock):
            far.announcements.receive_nowait()
        # The gate itself never delivers the outsider's message either.
        with pytest.raises(trio.WouldBlock):
            gate.announcements.receive_nowait()
        # The outsider does hear members (admission is each receiver's own decision).
        with trio.fail_after(5):
            heard = await out.announcements.receive()
        assert heard.peer_id == gate.peer_id
