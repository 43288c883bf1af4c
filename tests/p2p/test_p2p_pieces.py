"""Per-piece hashes: a lying holder among honest ones never stops a fetch, and it is named.

Real hosts on 127.0.0.1. The liar is always asked first (the caller's first provider), the worst
case: before per-piece hashes a blob over one piece striped over it and two honest holders failed its
digest every time and nobody was blamed."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import pytest
import trio
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol

from p2p import wire
from p2p.pieces import piece_hashes
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio
MiB = 1 << 20


def true_hashes_wrong_bytes(blobs: dict[str, bytes], served: list[int]) -> Callable[[INetStream], Awaitable[None]]:
    """A blob stream handler that declares each blob's true piece hashes and serves its pieces with
    one byte flipped (counted in `served`): a liar that copies the honest list."""

    async def serve(stream: INetStream) -> None:
        try:
            with trio.fail_after(10):
                digest, first = wire.parse_open(await wire.read_frame(stream, wire.OPEN_SIZE))
                data = blobs[digest]
                hashes = piece_hashes(lambda offset, length: data[offset : offset + length], len(data))
                assert hashes is not None
                await wire.write_frame(stream, wire.size_response(len(data), hashes))
                if first:  # its first piece, flipped, with the SIZE
                    piece = data[: wire.PIECE_SIZE]
                    await wire.write_frame(stream, wire.DATA + bytes([piece[0] ^ 0xFF]) + piece[1:])
                    served.append(len(piece))
                while True:
                    offset, length = wire.parse_read(await wire.read_frame(stream, wire.READ_SIZE))
                    piece = data[offset : offset + length]
                    await wire.write_frame(stream, wire.DATA + bytes([piece[0] ^ 0xFF]) + piece[1:])
                    served.append(length)
        except (wire.StreamEnded, wire.WireError, trio.TooSlowError):
            pass  # the fetcher dropped us
        finally:
            with trio.move_on_after(1):
                await stream.close()

    return serve


@pytest.mark.parametrize("liar_kind", ["declares its own bytes' hashes", "declares the true hashes"])
async def test_one_lying_holder_of_three_never_stops_a_4mib_fetch_and_is_named(liar_kind, config, hosts, stores):
    blobs = [os.urandom(4 * MiB) for _ in range(10)]
    honest_stores = [MemoryBlobStore(), MemoryBlobStore()]
    liar_store = stores["corrupting"]() if liar_kind == "declares its own bytes' hashes" else MemoryBlobStore()
    for store in [liar_store, *honest_stores]:
        digests = [store.put(blob) for blob in blobs]
    async with hosts(
        [(config(), liar_store, None)]
        + [(config(), store, None) for store in honest_stores]
        + [(config(), MemoryBlobStore(), None)]
    ) as (liar, *honest, fetcher):
        served_by_liar: list[int] = []
        if liar_kind == "declares the true hashes":
            handler = true_hashes_wrong_bytes(dict(zip(digests, blobs)), served_by_liar)
            liar.libp2p_host.set_stream_handler(TProtocol(wire.BLOB_PROTOCOL), handler)
        for holder in [liar, *honest]:
            await fetcher.connect(holder.addrs[0])
        for digest, blob in zip(digests, blobs):
            got = await fetcher.fetch(digest, providers=[liar.peer_id] + [h.peer_id for h in honest], timeout=30)
            assert got == blob and fetcher.store.get(digest) == blob
            (blame,) = [b for b in fetcher.blames if b.digest == digest]
            assert blame.holder == liar.peer_id
            if liar_kind == "declares the true hashes":  # caught at its first piece
                assert blame.reason.startswith("served piece ") and "not matching the hash it declared" in blame.reason
            else:  # its list is not the blob's: seen once the blob is in, whichever list came in first
                assert blame.reason in (
                    "declared piece hashes that are not the blob's",  # the honest holders' list was followed
                    "served pieces matching its piece hashes that together do not hash to the digest",  # its own
                )
        assert [b.holder for b in fetcher.blames] == [liar.peer_id] * len(blobs)
        assert sum(h.bytes_served for h in honest) >= len(blobs) * 4 * MiB
        if liar_kind == "declares the true hashes":
            assert served_by_liar  # it was asked for pieces, and none of them was kept


class _SizeLyingStore(MemoryBlobStore):
    """Declares one piece more than it holds and serves it as zeros, its piece hashes matching (a
    faulty or lying peer)."""

    def size(self, digest):
        size = super().size(digest)
        return None if size is None else size + MiB

    def read(self, digest, offset, length):
        held = super().read(digest, offset, length)
        return None if held is None else held + bytes(length - len(held))


async def test_a_holder_declaring_another_size_is_blamed_and_the_honest_one_serves(config, hosts):
    data = os.urandom(2 * MiB)
    liar_store, honest_store = _SizeLyingStore(), MemoryBlobStore()
    digest = liar_store.put(data)
    honest_store.put(data)
    # One holder at a time, the liar first: its list is followed until its pieces, all in, refute it.
    async with hosts(
        [
            (config(), liar_store, None),
            (config(), honest_store, None),
            (config(parallel_providers=1), MemoryBlobStore(), None),
        ]
    ) as (liar, honest, fetcher):
        await fetcher.connect(liar.addrs[0])
        await fetcher.connect(honest.addrs[0])
        got = await fetcher.fetch(digest, providers=[liar.peer_id, honest.peer_id], timeout=30)
        assert got == data and fetcher.store.get(digest) == data
        assert [(b.holder, b.reason) for b in fetcher.blames] == [
            (liar.peer_id, "served pieces matching its piece hashes that together do not hash to the digest")
        ]
        # The honest holder served only what the liar's list did not share: the two pieces differ
        # from the liar's only in the size, so they were kept.
        assert liar.bytes_served == 3 * MiB and honest.bytes_served == 0


async def test_a_one_piece_liar_is_refused_before_any_byte(config, hosts, stores):
    data = os.urandom(MiB)
    liar_store, honest_store = stores["corrupting"](), MemoryBlobStore()
    digest = liar_store.put(data)
    honest_store.put(data)
    async with hosts(
        [(config(), liar_store, None), (config(), honest_store, None), (config(), MemoryBlobStore(), None)]
    ) as (liar, honest, fetcher):
        for holder in (liar, honest):
            await fetcher.connect(holder.addrs[0])
        assert await fetcher.fetch(digest, providers=[liar.peer_id, honest.peer_id], timeout=30) == data
        assert [(b.holder, b.reason) for b in fetcher.blames] == [
            (liar.peer_id, "declared a blob of one piece whose hash is not the digest")
        ]
        assert liar.bytes_served == 0 and fetcher.bytes_fetched == len(data)


def test_a_size_answer_must_carry_one_hash_per_piece():
    hashes = bytes(32 * 3)
    assert wire.parse_size(wire.size_response(2 * MiB + 1, hashes)) == (2 * MiB + 1, hashes)
    for size in (2 * MiB, 3 * MiB + 1):  # two pieces, four pieces
        body = wire.SIZE + size.to_bytes(8, "big") + hashes
        with pytest.raises(wire.WireError, match="piece hashes"):
            wire.parse_size(body)
    assert wire.parse_size(wire.size_response(0, b"")) == (0, b"")


async def test_an_empty_blob_has_no_pieces_and_is_fetched(config, hosts):
    holder_store = MemoryBlobStore()
    digest = holder_store.put(b"")
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, fetcher):
        await fetcher.connect(holder.addrs[0])
        assert await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30) == b""
        assert fetcher.store.has(digest) and not fetcher.blames
