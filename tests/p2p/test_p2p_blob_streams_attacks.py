"""Attacks on kept blob streams (docs/P2P.md, "Blob streams are kept"), between real hosts on 127.0.0.1:
a peer taken off the allowlist while it holds an answered OPEN, a fetch cancelled mid-READ, a holder's
answers out of turn, and a host closing while others keep streams to it."""

from __future__ import annotations

import os

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2p import wire
from p2p.errors import BlobNotFound
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio
MiB = 1 << 20


async def test_a_peer_taken_off_the_allowlist_is_not_served_reads_of_a_blob_it_opened(config, hosts):
    blob = os.urandom(MiB)
    holder_store = MemoryBlobStore()
    digest = holder_store.put(blob)
    admitted = {"yes": True}
    async with hosts(
        [(config(), holder_store, lambda _peer: admitted["yes"]), (config(), MemoryBlobStore(), None)]
    ) as (holder, client):
        await client.connect(holder.addrs[0])
        stream = await client.libp2p_host.new_stream(ID.from_base58(holder.peer_id), [TProtocol(wire.BLOB_PROTOCOL)])
        with trio.fail_after(5):
            await wire.write_frame(stream, wire.open_request(digest))
            assert wire.parse_size(await wire.read_frame(stream))[0] == MiB
            admitted["yes"] = False  # removed from the allowlist; its stream stays open
            await wire.write_frame(stream, wire.read_request(0, MiB))
            answer = await wire.read_frame(stream)
        served_before = holder.bytes_served
        # Without a check at every READ, a peer removed after its OPEN would read on (the whole blob).
        assert answer[:1] == wire.REFUSED, f"refused peer got {answer[:1]!r} ({served_before} bytes served)"


async def test_a_holder_closes_promptly_while_a_fetcher_keeps_a_stream_to_it(config, hosts):
    blob = os.urandom(50_000)
    holder_store = MemoryBlobStore()
    digest = holder_store.put(blob)
    async with hosts([(config(), MemoryBlobStore(), None)]) as (fetcher,):
        # The holder waits up to 60 s for a kept stream's next request; closing it must not.
        async with hosts([(config(stream_idle_timeout=60.0), holder_store, None)]) as (holder,):
            await fetcher.connect(holder.addrs[0])
            assert await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30) == blob
            assert len(fetcher._idle_streams[holder.peer_id]) == 1
            closing_from = trio.current_time()
        assert trio.current_time() - closing_from < 10
        # The fetcher's kept stream to the closed holder is no blame, and a later fetch fails as a miss.
        with pytest.raises(BlobNotFound):
            await fetcher.fetch("cd" * 32, providers=[holder.peer_id], timeout=10)
        assert not fetcher.blames


async def test_a_fetch_cancelled_mid_read_leaves_no_stream_that_answers_out_of_turn(config, hosts):
    """Two holders of an 8 MiB blob: when it completes, the slower one is cancelled with READs in
    flight. Its stream must not be kept (a DATA left on it would answer the next OPEN): the next
    fetches from that holder alone succeed, with no failure or blame."""
    big = os.urandom(8 * MiB)
    small = [os.urandom(30_000) for _ in range(3)]
    stores = [MemoryBlobStore(), MemoryBlobStore()]
    big_digest = [store.put(big) for store in stores][0]
    small_digests = [stores[1].put(b) for b in small]
    specs = [
        (config(), stores[0], None),
        (config(), stores[1], None),
        (config(parallel_providers=2), MemoryBlobStore(), None),
    ]
    async with hosts(specs) as (first, second, fetcher):
        for holder in (first, second):
            await fetcher.connect(holder.addrs[0])
        assert await fetcher.fetch(big_digest, providers=[first.peer_id, second.peer_id], timeout=60) == big
        for digest, blob in zip(small_digests, small):
            assert await fetcher.fetch(digest, providers=[second.peer_id], timeout=30) == blob
        assert not fetcher.blames and fetcher.bytes_fetched >= len(big) + sum(map(len, small))
        assert 1 <= len(fetcher._idle_streams[second.peer_id]) <= 2
