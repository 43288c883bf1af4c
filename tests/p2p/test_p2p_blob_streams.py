"""Blob streams are kept: one `/swarm/blob/4.0.0` stream carries a fetcher's successive blobs from one
holder (docs/P2P.md, "Blob streams are kept"), between real hosts on 127.0.0.1. What is checked: the
reuse itself, a kept stream the holder closed or the connection lost, admission checked at every OPEN,
the bounds (blobs per stream, kept streams per holder), and a hostile client's requests on a stream."""

from __future__ import annotations

import os

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

import p2p.host
from p2p import wire
from p2p.errors import BlobNotFound, BlobNotHeld
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio
MiB = 1 << 20


class StreamLog:
    """Counts the blob streams a holder serves: those opened, and those whose handler returned."""

    def __init__(self, holder) -> None:
        self.opened = 0
        self.ended = 0
        self.changed = trio.Event()

        async def handler(stream) -> None:
            self.opened += 1
            try:
                await holder._serve_blob_stream(stream)
            finally:
                self.ended += 1
                self.changed.set()
                self.changed = trio.Event()

        holder.libp2p_host.set_stream_handler(TProtocol(wire.BLOB_PROTOCOL), handler)

    async def wait_ended(self, count: int) -> None:
        with trio.fail_after(10):
            while self.ended < count:
                await self.changed.wait()


def kept(fetcher, holder) -> int:
    return len(fetcher._idle_streams.get(holder.peer_id, []))


async def test_one_stream_carries_a_fetchers_successive_blobs_and_a_miss(config, hosts):
    blobs = [os.urandom(40_000), os.urandom(2 * MiB + 5), os.urandom(1)]
    holder_store = MemoryBlobStore()
    digests = [holder_store.put(b) for b in blobs]
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, fetcher):
        log = StreamLog(holder)
        await fetcher.connect(holder.addrs[0])
        for digest, blob in zip(digests[:2], blobs[:2]):
            assert await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30) == blob
            assert kept(fetcher, holder) == 1
        # NOT_FOUND leaves the stream open; the only holder asked said it does not hold it: "not held"
        with pytest.raises(BlobNotHeld, match="not found"):
            await fetcher.fetch("ab" * 32, providers=[holder.peer_id], timeout=30)
        assert await fetcher.fetch(digests[2], providers=[holder.peer_id], timeout=30) == blobs[2]
        assert (log.opened, log.ended, kept(fetcher, holder)) == (1, 0, 1)
        assert not fetcher.blames


async def test_a_kept_stream_the_holder_closed_or_lost_is_replaced_without_blame(config, hosts):
    blobs = [os.urandom(30_000) for _ in range(3)]
    holder_store = MemoryBlobStore()
    digests = [holder_store.put(b) for b in blobs]
    # The holder closes a stream idle for 0.3 s; the fetcher would keep it for 30 s.
    async with hosts([(config(stream_idle_timeout=0.3), holder_store, None), (config(), MemoryBlobStore(), None)]) as (
        holder,
        fetcher,
    ):
        log = StreamLog(holder)
        await fetcher.connect(holder.addrs[0])
        assert await fetcher.fetch(digests[0], providers=[holder.peer_id], timeout=30) == blobs[0]
        await log.wait_ended(1)  # the holder closed the idle stream
        assert kept(fetcher, holder) == 1  # which the fetcher does not know yet
        assert await fetcher.fetch(digests[1], providers=[holder.peer_id], timeout=30) == blobs[1]
        assert log.opened == 2 and kept(fetcher, holder) == 1
        # The connection goes, with the kept stream on it: the next fetch dials again.
        await fetcher.libp2p_host.disconnect(ID.from_base58(holder.peer_id))
        assert await fetcher.fetch(digests[2], providers=[holder.peer_id], timeout=30) == blobs[2]
        assert log.opened == 3
        assert not fetcher.blames


async def test_admission_is_checked_at_every_open_of_a_kept_stream(config, hosts):
    blobs = [os.urandom(20_000) for _ in range(2)]
    holder_store = MemoryBlobStore()
    digests = [holder_store.put(b) for b in blobs]
    admitted = {"yes": True}
    async with hosts(
        [(config(), holder_store, lambda _peer: admitted["yes"]), (config(), MemoryBlobStore(), None)]
    ) as (holder, fetcher):
        log = StreamLog(holder)
        await fetcher.connect(holder.addrs[0])
        assert await fetcher.fetch(digests[0], providers=[holder.peer_id], timeout=30) == blobs[0]
        admitted["yes"] = False  # e.g. removed from the allowlist while its stream is kept
        with pytest.raises(BlobNotFound, match="refused: peer is not admitted") as refused:
            await fetcher.fetch(digests[1], providers=[holder.peer_id], timeout=30)
        assert not isinstance(refused.value, BlobNotHeld)  # a refusal is no "not held (yet)"
        await log.wait_ended(1)
        assert log.opened == 1 and not fetcher.store.has(digests[1])


async def test_a_stream_carries_at_most_the_bound_of_blobs_and_the_fetcher_opens_another(config, hosts, monkeypatch):
    monkeypatch.setattr(p2p.host, "_MAX_OPENS_PER_STREAM", 2)
    blobs = [os.urandom(10_000) for _ in range(5)]
    holder_store = MemoryBlobStore()
    digests = [holder_store.put(b) for b in blobs]
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, fetcher):
        log = StreamLog(holder)
        await fetcher.connect(holder.addrs[0])
        for digest, blob in zip(digests, blobs):
            assert await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30) == blob
        assert log.opened == 3  # 2 + 2 + 1 blobs
        await log.wait_ended(2)
        # A client that ignores the bound is refused at its third OPEN.
        stream = await fetcher.libp2p_host.new_stream(ID.from_base58(holder.peer_id), [TProtocol(wire.BLOB_PROTOCOL)])
        with trio.fail_after(5):
            for _ in range(2):
                await wire.write_frame(stream, wire.open_request(digests[0]))
                assert wire.parse_size(await wire.read_frame(stream))[0] == 10_000
            await wire.write_frame(stream, wire.open_request(digests[0]))
            answer = await wire.read_frame(stream)
        assert answer[:1] == wire.REFUSED and b"more than 2 blobs asked for on one stream" in answer


async def test_kept_streams_per_holder_are_bounded(config, hosts):
    blobs = [os.urandom(200_000) for _ in range(6)]
    holder_store = MemoryBlobStore()
    digests = [holder_store.put(b) for b in blobs]
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, fetcher):
        log = StreamLog(holder)
        await fetcher.connect(holder.addrs[0])
        got: dict[str, bytes] = {}

        async def one(digest: str) -> None:
            got[digest] = await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30)

        async with trio.open_nursery() as nursery:
            for digest in digests:
                nursery.start_soon(one, digest)
        assert got == dict(zip(digests, blobs))
        assert kept(fetcher, holder) <= p2p.host._IDLE_STREAMS_PER_PEER
        await log.wait_ended(log.opened - kept(fetcher, holder))  # the others were closed


async def test_hostile_requests_on_one_stream_are_refused_and_the_holder_serves_on(config, hosts):
    one_byte, two_kib = os.urandom(1), os.urandom(2048)
    holder_store = MemoryBlobStore()
    digest, two_kib_digest = holder_store.put(one_byte), holder_store.put(two_kib)
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, client):
        await client.connect(holder.addrs[0])
        holder_id = ID.from_base58(holder.peer_id)

        async def exchange(*requests: bytes) -> list[bytes]:
            stream = await client.libp2p_host.new_stream(holder_id, [TProtocol(wire.BLOB_PROTOCOL)])
            answers = []
            with trio.fail_after(5):
                for request in requests:
                    await wire.write_frame(stream, request)
                    answers.append(await wire.read_frame(stream))
                with pytest.raises(wire.StreamEnded):  # every exchange below ends with the holder closing
                    await wire.read_frame(stream)
            return answers

        # A READ before any OPEN.
        (answer,) = await exchange(wire.read_request(0, 1))
        assert answer[:1] == wire.ERROR and b"expected OPEN(digest) before READ" in answer
        # An OPEN-typed frame of a READ's length, and a READ-typed frame of an OPEN's length.
        (answer,) = await exchange(wire.OPEN + bytes(12))
        assert answer[:1] == wire.ERROR and b"expected OPEN(digest)" in answer
        size, *_, answer = await exchange(wire.open_request(digest), wire.READ + bytes(32))
        assert size[:1] == wire.SIZE and answer[:1] == wire.ERROR and b"expected READ(offset, length)" in answer
        # The same byte read twice: each byte of a blob is served once per OPEN.
        answers = await exchange(wire.open_request(digest), wire.read_request(0, 1), wire.read_request(0, 1))
        assert answers[1] == wire.DATA + one_byte
        assert answers[2][:1] == wire.ERROR and b"READs for more than the blob's 1 bytes" in answers[2]
        # More READs of a 2 KiB blob than its bound (one per KiB, at least 1, + 8), each a new byte: the 11th.
        answers = await exchange(wire.open_request(two_kib_digest), *[wire.read_request(i, 1) for i in range(11)])
        assert answers[0][:1] == wire.SIZE and [a[1:] for a in answers[1:11]] == [two_kib[i : i + 1] for i in range(10)]
        assert answers[11][:1] == wire.ERROR and b"more READs for blob" in answers[11]
        # A new OPEN restarts both for its blob, on the same stream; the holder keeps serving.
        stream = await client.libp2p_host.new_stream(holder_id, [TProtocol(wire.BLOB_PROTOCOL)])
        with trio.fail_after(5):
            for _ in range(3):
                await wire.write_frame(stream, wire.open_request(two_kib_digest))
                assert wire.parse_size(await wire.read_frame(stream))[0] == 2048
                for offset, length in [(0, 1000), (1000, 1), *[(1001 + i, 1) for i in range(7)], (1008, 1040)]:
                    await wire.write_frame(stream, wire.read_request(offset, length))
                    assert await wire.read_frame(stream) == wire.DATA + two_kib[offset : offset + length]
        assert await client.fetch(digest, providers=[holder.peer_id], timeout=30) == one_byte
