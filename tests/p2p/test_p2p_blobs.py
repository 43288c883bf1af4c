"""Blob exchange in verified pieces over `/swarm/blob/4.0.0` between real hosts on 127.0.0.1 (lying
holders: tests/p2p/test_p2p_pieces.py)."""

from __future__ import annotations

import hashlib
import os

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2p import wire
from p2p.errors import BlobNotFound, BlobTooLarge, DigestMismatch, P2PError
from p2p.host import SwarmHost, open_host
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio
MiB = 1 << 20


async def test_64mb_blob_fetched_intact_and_served_onwards(config, hosts, wait_until):
    data = os.urandom(64 * MiB)
    holder_store = MemoryBlobStore()
    digest = holder_store.put(data)
    async with hosts(
        [(config(), holder_store, None), (config(), MemoryBlobStore(), None), (config(), MemoryBlobStore(), None)]
    ) as (holder, fetcher, third):
        await fetcher.connect(holder.addrs[0])
        got = await fetcher.fetch(digest, providers=[holder.peer_id], timeout=60)
        assert hashlib.sha256(got).hexdigest() == digest and got == data
        assert fetcher.store.get(digest) == data
        # The fetcher announced it and now serves the blob itself.
        await third.connect(fetcher.addrs[0])
        again = await third.fetch(digest, providers=[fetcher.peer_id], max_size=64 * MiB, timeout=60)
        assert again == data


async def test_blob_striped_over_three_holders_each_serving_part(config, hosts):
    data = os.urandom(24 * MiB)
    holder_stores = [MemoryBlobStore() for _ in range(3)]
    digest = holder_stores[0].put(data)
    for store in holder_stores[1:]:
        store.put(data)
    # 2 pieces in flight per holder: 24 pieces handed out on demand, so no holder can take them all
    # before the others have answered OPEN.
    fetcher_cfg = config(pipeline_depth=2)
    async with hosts(
        [(config(), store, None) for store in holder_stores] + [(fetcher_cfg, MemoryBlobStore(), None)]
    ) as (
        *holders,
        fetcher,
    ):
        for holder in holders:
            await fetcher.connect(holder.addrs[0])
        got = await fetcher.fetch(digest, providers=[h.peer_id for h in holders], timeout=60)
        assert got == data and fetcher.store.get(digest) == data
        served = [h.bytes_served for h in holders]
        assert all(0 < n < len(data) for n in served), served
        assert sum(served) >= len(data) and fetcher.bytes_fetched >= len(data)


async def test_holder_killed_mid_transfer_the_others_finish(config, hosts, stores):
    data = os.urandom(32 * MiB)
    # The host reads the blob once to hash its pieces when first asked, then serves: killed once it
    # served 2 MiB.
    doomed = stores["counting"](signal_after=len(data) + 2 * MiB)
    others = [MemoryBlobStore(), MemoryBlobStore()]
    digest = doomed.put(data)
    for store in others:
        store.put(data)
    fetcher_cfg = config(request_timeout=2.0, pipeline_depth=2)
    async with hosts([(config(), s, None) for s in others] + [(fetcher_cfg, MemoryBlobStore(), None)]) as (
        *survivors,
        fetcher,
    ):
        fetched_when_killed: list[int] = []
        async with trio.open_nursery() as nursery:
            doomed_hosts: list[SwarmHost] = []

            async def run_doomed_holder(task_status=trio.TASK_STATUS_IGNORED):
                with trio.CancelScope() as scope:
                    async with open_host(config(), doomed, None) as holder:
                        doomed_hosts.append(holder)
                        task_status.started(scope)
                        await trio.sleep_forever()

            kill_scope = await nursery.start(run_doomed_holder)

            async def kill_when_2mb_served():
                await doomed.threshold_reached.wait()
                fetched_when_killed.append(fetcher.bytes_fetched)
                kill_scope.cancel()  # the whole host shuts down: listener, connections, streams

            nursery.start_soon(kill_when_2mb_served)
            (doomed_host,) = doomed_hosts
            await fetcher.connect(doomed_host.addrs[0])
            for holder in survivors:
                await fetcher.connect(holder.addrs[0])
            providers = [doomed_host.peer_id] + [h.peer_id for h in survivors]
            got = await fetcher.fetch(digest, providers=providers, timeout=60)
        assert got == data and fetcher.store.has(digest)
        assert fetched_when_killed and fetched_when_killed[0] < len(data), "the holder must die mid-transfer"
        assert 0 < doomed_host.bytes_served < len(data)
        assert sum(h.bytes_served for h in survivors) >= len(data) - doomed_host.bytes_served
        assert not fetcher.blames  # a holder that dies lied about nothing


async def test_peer_serving_wrong_bytes_gives_digest_error_and_stores_nothing(config, hosts, stores):
    liar_store = stores["corrupting"]()
    digest = liar_store.put(os.urandom(3 * MiB))
    fetcher_store = MemoryBlobStore()
    async with hosts([(config(), liar_store, None), (config(), fetcher_store, None)]) as (liar, fetcher):
        await fetcher.connect(liar.addrs[0])
        # Its piece hashes match the bytes it serves: only the whole blob's hash gives it away.
        with pytest.raises(DigestMismatch, match=f"{liar.peer_id[-8:]}: served pieces .* nothing stored"):
            await fetcher.fetch(digest, providers=[liar.peer_id], timeout=30)
        assert not fetcher_store.has(digest) and fetcher_store.digests() == []
        assert [b.holder for b in fetcher.blames] == [liar.peer_id]


async def test_requests_above_the_size_limit_are_refused(config, hosts):
    holder_store = MemoryBlobStore()
    digest = holder_store.put(os.urandom(2 * MiB))
    fetcher_store = MemoryBlobStore()
    async with hosts([(config(), holder_store, None), (config(max_blob_size=MiB), fetcher_store, None)]) as (
        holder,
        fetcher,
    ):
        await fetcher.connect(holder.addrs[0])
        # Client side: the declared size is above the limit, so no chunk is even requested.
        with pytest.raises(BlobTooLarge, match="above the limit"):
            await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30)
        with pytest.raises(BlobTooLarge):
            await fetcher.fetch(digest, providers=[holder.peer_id], max_size=MiB // 2, timeout=30)
        assert not fetcher_store.has(digest)
        # Server side: a READ larger than a 1 MiB piece gets an ERROR frame, not data.
        stream = await fetcher.libp2p_host.new_stream(ID.from_base58(holder.peer_id), [TProtocol(wire.BLOB_PROTOCOL)])
        with trio.fail_after(5):
            await wire.write_frame(stream, wire.open_request(digest))
            assert wire.parse_size(await wire.read_frame(stream))[0] == 2 * MiB
            await wire.write_frame(stream, wire.read_request(0, 2 * MiB))
            answer = await wire.read_frame(stream)
        assert answer[:1] == wire.ERROR and b"pieces of at most 1048576 bytes" in answer


async def test_non_allowed_peer_is_refused_on_the_stream_path(config, hosts):
    holder_store = MemoryBlobStore()
    digest = holder_store.put(os.urandom(MiB))
    outsider_cfg = config()
    outsider = ID.from_pubkey(outsider_cfg.key_pair.public_key).to_base58()
    async with hosts(
        [
            (config(), holder_store, lambda p: p != outsider),
            (outsider_cfg, MemoryBlobStore(), None),
            (config(), MemoryBlobStore(), None),
        ]
    ) as (holder, out, member):
        await out.connect(holder.addrs[0])
        with pytest.raises(BlobNotFound, match="refused"):
            await out.fetch(digest, providers=[holder.peer_id], timeout=30)
        assert not out.store.has(digest)
        await member.connect(holder.addrs[0])
        assert await member.fetch(digest, providers=[holder.peer_id], timeout=30) == holder_store.get(digest)


async def test_fetch_finds_providers_through_announcements(config, hosts, wait_until):
    """A peer that only hears an announcement (never given an address) dials the holder and fetches."""
    holder_store = MemoryBlobStore()
    digest = holder_store.put(os.urandom(MiB))
    async with hosts(
        [(config(), MemoryBlobStore(), None), (config(), holder_store, None), (config(), MemoryBlobStore(), None)]
    ) as (hub, holder, seeker):
        await holder.connect(hub.addrs[0])
        await seeker.connect(hub.addrs[0])
        await wait_until(lambda: hub.peer_id in seeker.mesh_peers() and hub.peer_id in holder.mesh_peers())
        await holder.announce_blob(digest)
        await wait_until(lambda: holder.peer_id in seeker.providers(digest), what="provider announcement")
        assert await seeker.fetch(digest, timeout=30) == holder_store.get(digest)
        with pytest.raises(BlobNotFound):
            await seeker.fetch("ab" * 32, providers=[hub.peer_id], timeout=30)


async def test_reconnects_to_bootstrap_after_a_drop(config, hosts, wait_until):
    async with hosts([(config(), MemoryBlobStore(), None)]) as (boot,):
        async with hosts([(config(bootstrap=[boot.addrs[0]]), MemoryBlobStore(), None)]) as (peer,):
            await wait_until(lambda: boot.peer_id in peer.connected_peers(), what="first bootstrap dial")
            await peer.libp2p_host.disconnect(ID.from_base58(boot.peer_id))
            await wait_until(lambda: boot.peer_id not in peer.connected_peers(), what="drop")
            await wait_until(lambda: boot.peer_id in peer.connected_peers(), what="reconnect")


async def test_private_network_psk(config, hosts):
    psk = bytes(range(32))
    holder_store = MemoryBlobStore()
    digest = holder_store.put(b"members only")
    async with hosts(
        [
            (config(psk=psk), holder_store, None),
            (config(psk=psk), MemoryBlobStore(), None),
            (config(psk=bytes(32)), MemoryBlobStore(), None),
        ]
    ) as (holder, member, stranger):
        await member.connect(holder.addrs[0])
        assert await member.fetch(digest, providers=[holder.peer_id], timeout=10) == b"members only"
        with pytest.raises(P2PError, match="cannot connect|timed out"):
            await stranger.connect(holder.addrs[0])
        assert holder.peer_id not in stranger.connected_peers()


async def test_oversized_request_frames_are_refused_unread_and_the_host_keeps_serving(config, hosts):
    """Requests are at most 33 bytes (OPEN; a READ is 13): a frame declaring more is refused with ERROR
    at once, before its body is read, and the stream is closed; other requests are still served."""
    holder_store = MemoryBlobStore()
    data = os.urandom(MiB)
    digest = holder_store.put(data)
    # A long request_timeout on the holder: had it waited for the declared body, no answer within 5 s.
    async with hosts(
        [
            (config(request_timeout=30.0), holder_store, None),
            (config(), MemoryBlobStore(), None),
            (config(), MemoryBlobStore(), None),
        ]
    ) as (holder, attacker, member):
        await attacker.connect(holder.addrs[0])
        holder_id = ID.from_base58(holder.peer_id)

        async def refused(header_length: int, body: bytes, after_open: bool) -> bytes:
            stream = await attacker.libp2p_host.new_stream(holder_id, [TProtocol(wire.BLOB_PROTOCOL)])
            with trio.fail_after(5):
                if after_open:
                    await wire.write_frame(stream, wire.open_request(digest))
                    assert wire.parse_size(await wire.read_frame(stream))[0] == MiB
                await stream.write(header_length.to_bytes(4, "big") + body)  # body shorter than declared
                answer = await wire.read_frame(stream)
                with pytest.raises(wire.StreamEnded):  # closed after the refusal
                    await wire.read_frame(stream)
            return answer

        assert (wire.OPEN_SIZE, wire.READ_SIZE, wire.MAX_REQUEST) == (33, 13, 33)
        # The old 1 MiB frame limit, and a frame one byte above an OPEN.
        for declared in (wire.MAX_FRAME, wire.OPEN_SIZE + 1):
            answer = await refused(declared, wire.open_request(digest), after_open=False)
            assert answer[:1] == wire.ERROR and f"frame of {declared} bytes exceeds the limit of 33".encode() in answer
        # After a valid OPEN (a stream carries further OPENs), a frame one byte above an OPEN.
        answer = await refused(wire.OPEN_SIZE + 1, wire.read_request(0, 1024), after_open=True)
        assert answer[:1] == wire.ERROR and b"frame of 34 bytes exceeds the limit of 33" in answer
        # The holder keeps serving: the same peer over the same connection, and another peer.
        assert await attacker.fetch(digest, providers=[holder.peer_id], timeout=30) == data
        await member.connect(holder.addrs[0])
        assert await member.fetch(digest, providers=[holder.peer_id], timeout=30) == data
