"""A flood of HAVE announcements cannot push an honest provider out of a peer's provider table:
the table is bounded per announcing peer, so the flooder evicts only its own entries."""

from __future__ import annotations

import hashlib

import pytest

from p2p import wire
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio


async def test_a_have_flood_evicts_only_the_flooders_own_digests(config, hosts, wait_until):
    specs = [(config(dial_discovered=False), MemoryBlobStore(), None) for _ in range(3)]
    async with hosts(specs) as (honest, flooder, receiver):
        for other in (honest, flooder):
            await other.connect(receiver.addrs[0])
        for other in (honest, flooder):
            await wait_until(lambda o=other: o.peer_id in set(receiver.mesh_peers()), what="mesh")
        honest_digest = honest.store.put(b"an honest peer's committed update")
        await honest.announce_blob(honest_digest)
        await wait_until(lambda: honest.peer_id in receiver.providers(honest_digest), what="honest HAVE")

        cap = receiver.config.max_digests_per_provider
        flood = [hashlib.sha256(b"junk %d" % i).hexdigest() for i in range(4 * wire.MAX_HAVE_DIGESTS)]
        for start in range(0, len(flood), wire.MAX_HAVE_DIGESTS):  # four HAVEs of 1,024 digests
            await flooder._publish(wire.KIND_HAVE, wire.have_body(flood[start : start + wire.MAX_HAVE_DIGESTS]))
        await wait_until(lambda: flooder.peer_id in receiver.providers(flood[-1]), what="the last flood HAVE")

        assert receiver.providers(honest_digest) == [honest.peer_id]
        remembered = [d for d in flood if receiver.providers(d)]
        assert len(remembered) == cap and remembered == flood[-cap:]  # the flooder's newest only
