"""The addresses a host gossips: never a wildcard (`/ip4/0.0.0.0`, `/ip6/::`), which no
other host can dial; a wildcard listener advertises this machine's interface addresses instead.
Tests bind loopback only: the replacement is checked on the pure function, the host's envelope on
loopback listeners (and a wildcard another peer sends is dropped by the receiver)."""

from __future__ import annotations

import pytest
import trio
from libp2p.peer.id import ID

from p2p import wire
from p2p.addresses import advertised_addrs, is_loopback, local_ip_addresses
from p2p.host import SwarmHost
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio

PEER = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"


def test_wildcards_become_interface_addresses_loopback_last():
    local = {"ip4": ["192.0.2.7", "127.0.0.1"], "ip6": ["2001:db8::7", "::1"]}
    addrs = [f"/ip4/0.0.0.0/tcp/4001/p2p/{PEER}", f"/ip6/::/tcp/4002/p2p/{PEER}", "/ip4/10.0.0.1/tcp/9"]
    assert advertised_addrs(addrs, local) == [
        f"/ip4/192.0.2.7/tcp/4001/p2p/{PEER}",
        f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}",
        f"/ip6/2001:db8::7/tcp/4002/p2p/{PEER}",
        f"/ip6/::1/tcp/4002/p2p/{PEER}",
        "/ip4/10.0.0.1/tcp/9",
    ]
    assert advertised_addrs(["/ip4/127.0.0.1/tcp/5"], {"ip4": [], "ip6": []}) == ["/ip4/127.0.0.1/tcp/5"]
    assert advertised_addrs([f"/ip4/0.0.0.0/tcp/1/p2p/{PEER}"], {"ip4": [], "ip6": []}) == []
    found = local_ip_addresses()
    assert found["ip4"][-1] == "127.0.0.1" and "0.0.0.0" not in found["ip4"] and "::" not in found["ip6"]
    assert is_loopback("/ip4/127.0.0.1/tcp/1") and not is_loopback("/ip4/192.0.2.7/tcp/1")


def _gossiped_addrs(receiver: SwarmHost, sender: SwarmHost) -> list[list[str]]:
    """The address lists of every envelope from `sender` that `receiver` holds in its message cache:
    the bytes as they came over the wire, before the receiver filters anything."""
    gossip = receiver._gossipsub
    sender_id = ID.from_base58(sender.peer_id)
    found = []
    for mid in gossip.mcache.window(receiver.config.topic):
        msg = gossip.mcache.get(mid)
        if msg is not None and ID(msg.from_id) == sender_id:
            found.append(wire.parse_envelope(msg.data)[1])
    return found


async def test_host_gossips_its_listen_addresses_and_ignores_wildcards(config, hosts, wait_until):
    async with hosts([(config(), MemoryBlobStore(), None), (config(), MemoryBlobStore(), None)]) as (a, b):
        assert a.advertised_addrs == a.addrs  # nothing to replace on 127.0.0.1
        await b.connect(a.addrs[0])
        await wait_until(lambda: a.peer_id in b.mesh_peers() and b.peer_id in a.mesh_peers(), what="mesh")
        await a.publish(b"here")
        with trio.fail_after(10):
            await b.announcements.receive()
        assert a.addrs in _gossiped_addrs(b, a)
        # An (older) peer that gossips a wildcard next to a real address: only the real one is kept.
        port = a.addrs[0].split("/")[4]
        wildcard = f"/ip4/0.0.0.0/tcp/{port}/p2p/{a.peer_id}"
        await a._pubsub.publish(a.config.topic, wire.envelope(wire.KIND_APP, [wildcard, a.addrs[0]], b"old"))
        with trio.fail_after(10):
            assert (await b.announcements.receive()).payload == b"old"
        known = [str(m) for m in b.libp2p_host.get_peerstore().addrs(ID.from_base58(a.peer_id))]
        assert known and not any("/0.0.0.0/" in m for m in known), known


async def test_gossiped_addresses_parsed_once_per_list_and_changes_learned(config, hosts):
    """Every envelope carries its sender's addresses; a host parses a sender's list once (py-multiaddr
    costs about a millisecond per message) and learns a changed list at once."""
    async with hosts([(config(dial_discovered=False), MemoryBlobStore(), None) for _ in range(3)]) as (a, b, c):
        source = ID.from_base58(a.peer_id)
        first = b._dialable_addrs(source, a.addrs)
        assert [str(m) for m in first] == [s.rsplit("/p2p/", 1)[0] for s in a.addrs]
        assert b._dialable_addrs(source, list(a.addrs)) is first, "the same list is not parsed again"
        moved = f"/ip4/127.0.0.1/tcp/4999/p2p/{a.peer_id}"
        after = b._dialable_addrs(source, [moved])
        assert [str(m) for m in after] == ["/ip4/127.0.0.1/tcp/4999"]
        known = {str(m) for m in b.libp2p_host.get_peerstore().addrs(source)}
        assert "/ip4/127.0.0.1/tcp/4999" in known
        # Addresses given for another peer are still dropped, cached or not.
        for _ in range(2):
            assert b._dialable_addrs(source, [f"/ip4/127.0.0.1/tcp/4998/p2p/{c.peer_id}"]) == []
        assert "/ip4/127.0.0.1/tcp/4998" not in {str(m) for m in b.libp2p_host.get_peerstore().addrs(source)}
