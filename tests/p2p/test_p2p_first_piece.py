"""FIRST: an OPEN that brings the blob's first piece with its SIZE (p2p/wire.py; docs/P2P.md, "One
request for a small blob"), between real hosts on 127.0.0.1. What is checked: the answer on the wire
(SIZE and the first piece's DATA, nothing for an empty blob, NOT_FOUND alone for a blob not held), that
the piece counts as read (one OPEN reads at most the blob's size: asking it again is refused), that a fetch of a
one-piece blob costs the holder one answer, and that multi-piece and lying holders fetch as before."""

from __future__ import annotations

import collections
import hashlib
import os
from typing import Any

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2p import wire
from p2p.pieces import HolderFailed, HolderLied, PieceFetch, piece_hashes
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio
MiB = 1 << 20


class CountedWrites:
    """The holder's side of a blob stream, counting the writes its answers take (a real stream under it)."""

    def __init__(self, stream: Any, writes: list[int]) -> None:
        self._stream = stream
        self._writes = writes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def write(self, data: bytes) -> None:
        self._writes.append(len(data))
        await self._stream.write(data)


async def test_first_answers_size_and_first_piece_and_counts_it_as_read(config, hosts):
    small, large, empty = os.urandom(3000), os.urandom(2 * MiB + 500), b""
    holder_store = MemoryBlobStore()
    d_small, d_large, d_empty = (holder_store.put(b) for b in (small, large, empty))
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, client):
        await client.connect(holder.addrs[0])
        holder_id = ID.from_base58(holder.peer_id)
        stream = await client.libp2p_host.new_stream(holder_id, [TProtocol(wire.BLOB_PROTOCOL)])
        with trio.fail_after(10):
            # A one-piece blob: SIZE, then the whole blob, unasked.
            await wire.write_frame(stream, wire.open_request(d_small, first=True))
            assert wire.parse_size(await wire.read_frame(stream))[0] == 3000
            assert await wire.read_frame(stream) == wire.DATA + small
            # A blob not held: NOT_FOUND alone, and the stream serves on.
            await wire.write_frame(stream, wire.open_request("ab" * 32, first=True))
            assert (await wire.read_frame(stream))[:1] == wire.NOT_FOUND
            # An empty blob: SIZE alone (no piece to bring); the next request is answered on its own.
            await wire.write_frame(stream, wire.open_request(d_empty, first=True))
            assert wire.parse_size(await wire.read_frame(stream)) == (0, b"")
            # Three pieces: the first comes with the SIZE, the others are READ as before.
            await wire.write_frame(stream, wire.open_request(d_large, first=True))
            size, hashes = wire.parse_size(await wire.read_frame(stream))
            assert (size, len(hashes)) == (len(large), 3 * wire.DIGEST_SIZE)
            assert await wire.read_frame(stream) == wire.DATA + large[:MiB]
            for offset, length in [(MiB, MiB), (2 * MiB, 500)]:
                await wire.write_frame(stream, wire.read_request(offset, length))
                assert await wire.read_frame(stream) == wire.DATA + large[offset : offset + length]
            # A plain OPEN still brings the SIZE alone.
            await wire.write_frame(stream, wire.open_request(d_small))
            assert wire.parse_size(await wire.read_frame(stream))[0] == 3000
            await wire.write_frame(stream, wire.read_request(0, 3000))
            assert await wire.read_frame(stream) == wire.DATA + small
            # The first piece counts as read: a client asking it again is refused (each byte once per OPEN).
            await wire.write_frame(stream, wire.open_request(d_small, first=True))
            assert wire.parse_size(await wire.read_frame(stream))[0] == 3000
            assert await wire.read_frame(stream) == wire.DATA + small
            await wire.write_frame(stream, wire.read_request(0, 1))
            answer = await wire.read_frame(stream)
            assert answer[:1] == wire.ERROR and b"READs for more than the blob's 3000 bytes" in answer
            with pytest.raises(wire.StreamEnded):
                await wire.read_frame(stream)
        assert await client.fetch(d_small, providers=[holder.peer_id], timeout=30) == small  # serving on


async def test_a_one_piece_blob_costs_its_holder_one_answer_per_fetch(config, hosts):
    blobs = [os.urandom(30_000) for _ in range(5)]
    holder_store = MemoryBlobStore()
    digests = [holder_store.put(b) for b in blobs]
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, fetcher):
        writes: list[int] = []

        async def handler(stream: Any) -> None:
            await holder._serve_blob_stream(CountedWrites(stream, writes))

        holder.libp2p_host.set_stream_handler(TProtocol(wire.BLOB_PROTOCOL), handler)
        await fetcher.connect(holder.addrs[0])
        for digest, blob in zip(digests, blobs):
            assert await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30) == blob
        # One write per blob (its SIZE and its one piece together); two answers, SIZE then DATA, before.
        assert len(writes) == len(blobs)
        assert all(w > 30_000 for w in writes) and holder.bytes_served == 5 * 30_000


async def test_a_striped_fetch_asks_first_of_one_holder_and_reads_the_rest_from_all(config, hosts):
    blob = os.urandom(6 * MiB)
    stores = [MemoryBlobStore() for _ in range(3)]
    digest = [s.put(blob) for s in stores][0]
    peers = [(config(), s, None) for s in stores] + [(config(), MemoryBlobStore(), None)]
    async with hosts(peers) as (*holders, fetcher):
        for holder in holders:
            await fetcher.connect(holder.addrs[0])
        got = await fetcher.fetch(digest, providers=[h.peer_id for h in holders], timeout=60)
        assert got == blob
        served = [h.bytes_served for h in holders]
        assert sum(served) >= len(blob) and served[0] >= MiB  # the first holder brought piece 0 unasked
        assert sum(1 for s in served if s) >= 2  # and the pieces after it were striped


def test_a_piece_outstanding_at_a_blamed_holder_goes_back_to_be_handed_out():
    """A holder dropped for a lie no longer holds any piece of the fetch: a piece outstanding at it
    (a duplicate's other taker aside) waits to be handed out again (`pending`, which makes the fetch
    start an idle holder: p2p/host.py `_fetch_verified`), whether or not the liar's own fetch gave it
    back. Found by an attacker's review: a liar, then a duplicate taker that stalls, made a fetch fail
    although an honest holder held every piece; `_fetch_from` also keeps a piece whose delivery raised
    in flight now, so the liar gives it back."""
    blob = os.urandom(3 * MiB)
    hashes = piece_hashes(lambda offset, length: blob[offset : offset + length], len(blob))
    assert hashes is not None
    blamed: list[str] = []
    fetch = PieceFetch(hashlib.sha256(blob).hexdigest(), 8 * MiB, 3, lambda holder, _why: blamed.append(holder))
    fetch.declare("honest", len(blob), hashes)
    fetch.arriving("honest", 0)  # FIRST: piece 0 comes with the honest holder's SIZE
    fetch.declare("liar", len(blob), hashes)
    fetch.declare("staller", len(blob), hashes)
    assert [fetch.take("liar", 0), fetch.take("staller", 0)] == [1, 2]
    fetch.deliver("honest", 0, memoryview(blob[:MiB]))
    fetch.deliver("staller", 2, memoryview(blob[2 * MiB :]))
    assert fetch.take("staller", 0) == 1  # the end of the fetch: a duplicate of the liar's piece
    assert fetch.take("honest", 0) is None  # two holders have it: the honest one goes idle
    with pytest.raises(HolderLied):
        fetch.deliver("liar", 1, memoryview(bytes(MiB)))
    fetch.fail("liar", HolderLied("served piece 1 not matching the hash it declared for it"))
    assert blamed == ["liar"] and not fetch.pending  # the staller still has it
    fetch.give_back("staller", collections.deque([1]))  # then fails: the piece is nobody's
    fetch.fail("staller", HolderFailed("no answer within 3.0s"))
    assert list(fetch.pending) == [1] and fetch.take("honest", 0) == 1
    fetch.deliver("honest", 1, memoryview(blob[MiB : 2 * MiB]))
    assert fetch.complete and fetch.finish() == blob


async def test_a_blob_cut_short_on_disk_is_answered_not_found_not_with_short_data(config, hosts, tmp_path):
    """A holder whose file was truncated after the OPEN (a full disk, an operator) says so: short DATA
    would make an honest holder look like a liar to the fetcher (HolderLied, blamed with proof)."""
    from p2p.store import DiskBlobStore

    blob = os.urandom(2 * MiB + 500)
    holder_store = DiskBlobStore(tmp_path / "holder")
    digest = holder_store.put(blob)
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, client):
        await client.connect(holder.addrs[0])
        stream = await client.libp2p_host.new_stream(ID.from_base58(holder.peer_id), [TProtocol(wire.BLOB_PROTOCOL)])
        with trio.fail_after(10):
            await wire.write_frame(stream, wire.open_request(digest))
            assert wire.parse_size(await wire.read_frame(stream))[0] == len(blob)
            with open(holder_store._path(digest), "r+b") as fh:
                fh.truncate(MiB + 10)
            await wire.write_frame(stream, wire.read_request(0, MiB))
            assert await wire.read_frame(stream) == wire.DATA + blob[:MiB]
            await wire.write_frame(stream, wire.read_request(MiB, MiB))
            assert await wire.read_frame(stream) == wire.NOT_FOUND + b"blob removed or damaged"
