"""HAVEs go straight to each connected peer on a kept stream (p2p/have.py), gossip only where a peer
cannot be written to; what a hostile sender can do with the stream is bounded: its frames are read at
the receiver's rate, a malformed one ends its stream and nothing else, a disallowed sender is not heard."""

from __future__ import annotations

import hashlib
import math
import struct

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from p2p import wire
from p2p.have import HAVE_PROTOCOL, MAX_HAVE_FRAME, is_cancellation
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio


def _gossiped_kinds(host) -> list[bytes]:
    """Record the kind of every gossip message `host` publishes from now on."""
    kinds: list[bytes] = []
    publish = host._publish

    async def recording(kind: bytes, body: bytes) -> None:
        kinds.append(kind)
        await publish(kind, body)

    host._publish = recording
    return kinds


async def _connected(hosts_, wait_until) -> None:
    """Every host connected to every other (each dials what it hears of: wait for the hellos' work)."""
    for other in hosts_[1:]:
        await other.connect(hosts_[0].addrs[0])
    for host in hosts_:
        others = {h.peer_id for h in hosts_ if h is not host}
        await wait_until(lambda h=host, o=others: o <= set(h.connected_peers()), what="a complete graph")


async def test_a_have_reaches_every_connected_peer_without_gossip(config, hosts, wait_until):
    specs = [(config(), MemoryBlobStore(), None) for _ in range(3)]
    async with hosts(specs) as opened:
        await _connected(opened, wait_until)
        a, b, c = opened
        kinds = _gossiped_kinds(a)
        digest = a.store.put(b"a committed update")
        await a.announce_blob(digest)
        for other in (b, c):
            await wait_until(lambda o=other: o.providers(digest) == [a.peer_id], what="the direct HAVE")
        streams = [other._direct._in[_id(a)] for other in (b, c)]
        fetched = a.store.put(b"a fetched blob")
        await a.announce_blob(fetched, later=True)  # the batched path goes direct too
        for other in (b, c):
            await wait_until(lambda o=other: a.peer_id in o.providers(fetched), what="the batched HAVE")
        assert wire.KIND_HAVE not in kinds
        assert a._direct.sent == 4 and b._direct.received == 2 and c._direct.received == 2
        assert [other._direct._in[_id(a)] for other in (b, c)] == streams  # the same streams, kept


def _id(host) -> ID:
    return ID.from_base58(host.peer_id)


async def test_peers_that_cannot_be_written_to_hear_it_by_gossip_published_once(config, hosts, wait_until):
    """Two peers do not speak the HAVE protocol (they gossip theirs, no handler): the HAVE `a` could not
    write to either goes by gossip once and reaches both; `b` hears it directly as well. The next HAVE
    does not try them again (one failure per peer, not one per HAVE)."""
    specs = [(config(), MemoryBlobStore(), None), (config(), MemoryBlobStore(), None)]
    specs += [(config(direct_haves=False), MemoryBlobStore(), None) for _ in range(2)]
    async with hosts(specs) as opened:
        await _connected(opened, wait_until)
        a, b, *old = opened
        for other in (b, *old):
            await wait_until(lambda o=other: o.peer_id in set(a.mesh_peers()), what="mesh")
        kinds = _gossiped_kinds(a)
        digest = a.store.put(b"an update")
        await a.announce_blob(digest)
        for other in old:
            await wait_until(lambda o=other: o.providers(digest) == [a.peer_id], what="the gossiped HAVE")
        assert b.providers(digest) == [a.peer_id] and kinds == [wire.KIND_HAVE]
        assert set(a._direct._failing) == {_id(o) for o in old} and a._direct.sent == 1
        failed_at = dict(a._direct._failing)
        again = a.store.put(b"the next one")
        await a.announce_blob(again)
        for other in (b, *old):
            await wait_until(lambda o=other: o.providers(again) == [a.peer_id], what="the next HAVE")
        assert kinds == [wire.KIND_HAVE] * 2 and a._direct._failing == failed_at  # not tried again


async def test_a_member_this_host_is_not_connected_to_hears_it_by_gossip(config, hosts, wait_until):
    """`c` advertises an address nobody can dial (a peer behind a NAT, say), so `a` hears its hellos
    through `b` and cannot connect: a HAVE of `a` reaches it by gossip, `b` directly."""
    specs = [(config(), MemoryBlobStore(), None), (config(), MemoryBlobStore(), None)]
    specs.append((config(dial_discovered=False), MemoryBlobStore(), None))
    async with hosts(specs) as (a, b, c):
        dead = f"/ip4/127.0.0.1/tcp/1/p2p/{c.peer_id}"  # the fault: an address nothing listens on
        c._own_addrs = (math.inf, [dead])
        await a.connect(b.addrs[0])
        await c.connect(b.addrs[0])
        for x, y in ((a, b), (b, a), (c, b), (b, c)):
            await wait_until(lambda x=x, y=y: y.peer_id in set(x.mesh_peers()), what="mesh")
        await wait_until(lambda: _id(c) in a._heard, what="c's hello through b")
        assert c.peer_id not in a.connected_peers()
        kinds = _gossiped_kinds(a)
        digest = a.store.put(b"an update")
        await a.announce_blob(digest)
        await wait_until(lambda: c.providers(digest) == [a.peer_id], what="the gossiped HAVE")
        assert b.providers(digest) == [a.peer_id] and kinds == [wire.KIND_HAVE] and a._direct.sent == 1


async def _have_stream(sender, receiver):
    return await sender.libp2p_host.new_stream(ID.from_base58(receiver.peer_id), [TProtocol(HAVE_PROTOCOL)])


def _flood(n: int) -> list[str]:
    return [hashlib.sha256(b"junk %d" % i).hexdigest() for i in range(n)]


async def _read_all(receiver, n: int, wait_until) -> None:
    await wait_until(lambda: receiver._direct.received + receiver._direct.dropped >= n, timeout=30.0, what="all read")


@pytest.mark.parametrize("streams", ["one", "one per frame"])
async def test_a_flood_is_taken_at_the_receivers_rate(config, hosts, wait_until, streams):
    """A sender writing 40 frames as fast as it can, on one stream or a new stream for each (a newer
    stream replaces the older: the budget is the sender's, not the stream's), has them read and at most
    `max_announcements_per_second` (5) a second taken, 5 at once: the rest dropped."""
    specs = [(config(), MemoryBlobStore(), None), (config(max_announcements_per_second=5.0), MemoryBlobStore(), None)]
    async with hosts(specs) as (flooder, receiver):
        await _connected([flooder, receiver], wait_until)
        flood = _flood(40)
        start = trio.current_time()
        if streams == "one":
            await wire.write_frame(await _have_stream(flooder, receiver), *[wire.have_body([d]) for d in flood])
        else:  # each frame on a stream of its own, the next as soon as the receiver read it
            for i, digest in enumerate(flood):
                await wire.write_frame(await _have_stream(flooder, receiver), wire.have_body([digest]))
                await _read_all(receiver, i + 1, wait_until)
        await _read_all(receiver, len(flood), wait_until)
        taken = receiver._direct.received
        assert 5 <= taken <= 5 + 5.0 * (trio.current_time() - start) + 1e-6
        assert taken < len(flood) and len([d for d in flood if receiver.providers(d)]) == taken


async def test_a_sender_ignoring_the_window_is_read_not_buffered(config, hosts, wait_until):
    """py-libp2p's yamux buffers whatever a sender writes past the window: the receiver reads 8 MiB of
    frames as they come (at 5 frames a second that would take 51 s), taking 5 and dropping the rest."""
    specs = [(config(), MemoryBlobStore(), None), (config(max_announcements_per_second=5.0), MemoryBlobStore(), None)]
    async with hosts(specs) as (flooder, receiver):
        await _connected([flooder, receiver], wait_until)
        stream = await _have_stream(flooder, receiver)
        frame = wire.have_body(_flood(wire.MAX_HAVE_DIGESTS))
        for _ in range(256):
            stream.muxed_stream.send_window = 1 << 40  # the attack: write on past the receiver's window
            await wire.write_frame(stream, frame)
        await _read_all(receiver, 256, wait_until)
        assert 5 <= receiver._direct.received < 256


async def test_an_idle_stream_is_ended_and_the_next_have_opens_another(config, hosts, wait_until):
    specs = [(config(stream_idle_timeout=1.0), MemoryBlobStore(), None) for _ in range(2)]
    async with hosts(specs) as (a, b):
        await _connected([a, b], wait_until)
        first = a.store.put(b"first")
        await a.announce_blob(first)
        await wait_until(lambda: b.providers(first) == [a.peer_id], what="the first HAVE")
        stream = b._direct._in[_id(a)]
        await wait_until(lambda: _id(a) not in b._direct._in, what="the idle stream ended")
        second = a.store.put(b"second")
        await a.announce_blob(second)
        await wait_until(lambda: b.providers(second) == [a.peer_id], what="the second HAVE")
        assert b._direct._in[_id(a)] is not stream and a._direct.sent == 2


async def test_a_peer_that_reconnects_has_one_writer_and_hears_the_next_have(config, hosts, wait_until):
    """Cut off, `b` is a member `a` heard and is not connected to: `a`'s next HAVE dials it (and is
    gossiped, to nobody here); once connected again the same writer carries the HAVE after."""
    specs = [(config(), MemoryBlobStore(), None) for _ in range(2)]
    async with hosts(specs) as (a, b):
        await _connected([a, b], wait_until)
        first = a.store.put(b"first")
        await a.announce_blob(first)
        await wait_until(lambda: b.providers(first) == [a.peer_id], what="the first HAVE")
        writer = a._direct._outboxes[_id(b)]
        await wait_until(lambda: _id(b) in a._heard, what="a hello of b's")  # a member, heard on the topic
        await a.libp2p_host.disconnect(_id(b))
        await wait_until(lambda: b.peer_id not in a.connected_peers(), what="disconnected")
        await a.announce_blob(a.store.put(b"while cut off"))
        await wait_until(lambda: b.peer_id in a.connected_peers(), what="dialed again")
        third = a.store.put(b"third")
        await a.announce_blob(third)
        await wait_until(lambda: b.providers(third) == [a.peer_id], what="the HAVE after the reconnection")
        assert a._direct._outboxes == {_id(b): writer}


async def test_a_malformed_frame_ends_only_its_own_stream(config, hosts, wait_until):
    specs = [(config(), MemoryBlobStore(), None) for _ in range(3)]
    async with hosts(specs) as opened:
        await _connected(opened, wait_until)
        attacker, receiver, honest = opened
        for frame in (
            struct.pack(">I", 33) + b"\x00" * 33,  # not whole digests
            struct.pack(">I", 0),  # no digest
            struct.pack(">I", MAX_HAVE_FRAME + 32),  # above the limit: refused before its body
        ):
            stream = await _have_stream(attacker, receiver)
            await stream.write(frame)
            with trio.fail_after(10):  # the receiver ends the stream: the read sees its end
                with pytest.raises(wire.StreamEnded):
                    await wire.read_frame(stream)
        digest = honest.store.put(b"still heard")
        await honest.announce_blob(digest)
        await wait_until(lambda: receiver.providers(digest) == [honest.peer_id], what="the honest HAVE")
        again = attacker.store.put(b"the attacker, well-behaved now")
        await attacker.announce_blob(again)
        await wait_until(lambda: receiver.providers(again) == [attacker.peer_id], what="a new stream heard")
        assert attacker.peer_id in receiver.connected_peers()  # its streams ended, not its connection


async def test_a_newer_stream_replaces_the_older_and_a_disallowed_sender_is_not_heard(config, hosts, wait_until):
    banned: set[str] = set()
    specs = [(config(), MemoryBlobStore(), None), (config(), MemoryBlobStore(), lambda p: p not in banned)]
    async with hosts(specs) as (sender, receiver):
        await _connected([sender, receiver], wait_until)
        first, second = await _have_stream(sender, receiver), await _have_stream(sender, receiver)
        with trio.fail_after(10):
            with pytest.raises(wire.StreamEnded):
                await wire.read_frame(first)  # reset once the second arrived: one stream per peer
        one = hashlib.sha256(b"one").hexdigest()
        await wire.write_frame(second, wire.have_body([one]))
        await wait_until(lambda: receiver.providers(one) == [sender.peer_id], what="the second stream's HAVE")
        banned.add(sender.peer_id)
        two = hashlib.sha256(b"two").hexdigest()
        with pytest.raises(wire.StreamEnded):  # the next frame is read, the sender asked, the stream ended
            with trio.fail_after(10):
                await wire.write_frame(second, wire.have_body([two]))
                await wire.read_frame(second)
        assert receiver.providers(two) == []


async def test_a_group_from_libp2p_is_a_failed_write_not_the_hosts_end(config, hosts, wait_until):
    """py-libp2p wraps a connection torn down mid-negotiation in exception groups (a fault a test cannot
    time for real, so `new_stream` raises one here): the writer counts a failure, the HAVE goes by
    gossip, the host lives on; only a group of nothing but cancellation would be re-raised."""
    specs = [(config(), MemoryBlobStore(), None) for _ in range(2)]
    async with hosts(specs) as (a, b):
        await _connected([a, b], wait_until)
        await wait_until(lambda: b.peer_id in set(a.mesh_peers()), what="mesh")

        cancelled = await _a_cancelled()  # a task of libp2p's own cancelled beside the failure

        async def torn_down(*_args, **_kwargs):
            raise BaseExceptionGroup("connection torn down", [OSError("reset by peer"), cancelled])

        a.libp2p_host.new_stream = torn_down
        digest = a.store.put(b"an update")
        await a.announce_blob(digest)
        await wait_until(lambda: b.providers(digest) == [a.peer_id], what="the gossiped HAVE")
        assert _id(b) in a._direct._failing and a._direct.sent == 0


async def _a_cancelled() -> trio.Cancelled:
    """A real trio.Cancelled, caught from a scope cancelled for the purpose."""
    caught: list[trio.Cancelled] = []
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            caught.append(exc)
            raise
    return caught[0]


async def test_only_cancellation_counts_as_cancellation():
    cancelled = await _a_cancelled()
    assert is_cancellation(cancelled)
    assert is_cancellation(BaseExceptionGroup("", [cancelled, BaseExceptionGroup("", [cancelled])]))
    assert not is_cancellation(BaseExceptionGroup("", [cancelled, OSError()]))
    assert not is_cancellation(ExceptionGroup("", [OSError()]))
    assert not is_cancellation(trio.TooSlowError())
