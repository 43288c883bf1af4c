"""Yamux window credit goes back once half the window is consumed, not after every small read
(p2p/yamux_window.py): small messages cost no WINDOW_UPDATE frames, and a transfer many windows long
still completes (the sender is never left waiting for credit)."""

from __future__ import annotations

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.stream_muxer.yamux import yamux

from p2p import wire, yamux_window
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio

PROTOCOL = TProtocol("/swarm/test-window/1.0.0")
SMALL, SMALL_COUNT = 60, 1500  # 1,500 frames of 64 bytes: 96,000 bytes, under half a 256 KiB window
BIG = 4 << 20  # 16 default windows


async def test_small_reads_send_no_window_update_and_big_transfers_finish(config, hosts, monkeypatch):
    updates: list[int] = []
    library_update = yamux.YamuxStream.send_window_update

    async def counting_update(self, increment, skip_lock=False):
        updates.append(increment)
        await library_update(self, increment, skip_lock=skip_lock)

    monkeypatch.setattr(yamux.YamuxStream, "send_window_update", counting_update)
    async with hosts([(config(), MemoryBlobStore(), None) for _ in range(2)]) as (sender, receiver):
        assert yamux.YamuxStream._auto_tune_and_send_window_update is yamux_window.send_window_update_at_half
        small_read, received = trio.Event(), bytearray()
        big_seen = trio.Event()

        async def handler(stream):
            for _ in range(SMALL_COUNT):
                assert len(await wire.read_frame(stream)) == SMALL
            small_read.set()
            while len(received) < BIG:
                received.extend(await stream.read(1 << 16))
            big_seen.set()

        receiver.libp2p_host.set_stream_handler(PROTOCOL, handler)
        await sender.connect(receiver.addrs[0])
        with trio.fail_after(30):
            stream = await sender.libp2p_host.new_stream(ID.from_base58(receiver.peer_id), [PROTOCOL])
            for i in range(SMALL_COUNT):
                await wire.write_frame(stream, bytes([i % 256]) * SMALL)
            await small_read.wait()
        # py-libp2p's own rule sent one update per read here (two reads per frame: ~3,000).
        assert updates == [], f"{len(updates)} window updates for {SMALL_COUNT} small frames"

        payload = bytes(range(256)) * (BIG // 256)
        with trio.fail_after(60):
            await stream.write(payload)
            await big_seen.wait()
            await stream.close()
        assert bytes(received) == payload
        # Credit came back in steps of at least half a window (py-libp2p grows the window as it goes):
        # at most one update per 128 KiB read, and enough credit for most of the 4 MiB.
        assert 1 <= len(updates) <= BIG // (1 << 17), updates
        assert min(updates) >= 1 << 17, updates
        assert sum(updates) >= BIG // 2, updates
