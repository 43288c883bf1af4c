"""HAVEs written straight to each connected peer on a kept `/swarm/have/1.0.0` stream, instead of gossip.

Why: a HAVE published on the topic reaches each of N peers about MESH_DEGREE times (mesh duplicates),
and every copy costs a gossip RPC written and read, a yamux frame, a Noise message and a signature
check: about 75 RPCs each way per peer and round at 16 peers, a third of a peer's protocol CPU with the
rest of gossip (docs/SCALING.md, "Per task, counted"). Written to each connected peer, it costs one
frame each way per peer. Every peer dials each peer it hears of (`HostConfig.dial_discovered`), so the
swarm's connections close into a complete graph and "each connected peer" is everyone; where a member
is heard but not connected the host gossips the HAVE too (`SwarmHost._send_have`), and a host that does
not dial what it hears of keeps gossiping its HAVEs (a line or a star needs the relaying).

What a receiver may conclude is unchanged: a HAVE is the sender's claim that it holds the digests,
attributed to the peer at the other end of the Noise-authenticated connection (as a gossip HAVE is to
its signed source), and it only adds a provider to ask. A sender can tell some peers and not others,
which moves only whom each asks and how long it waits (as serving only some peers could before),
never which blobs it may vote (docs/NODE.md, "Withholding").

Frames: `u32 big-endian length || 1 to MAX_HAVE_DIGESTS digests of 32 bytes` (wire.have_body), one per
HAVE, the stream kept open between them. A receiver reads frames as they come (py-libp2p's yamux does not
hold a sender to its window, so leaving bytes unread would buffer a flood without bound), takes at most
`max_per_second` a second from one peer, whatever the streams they came on (a token bucket per sender;
the rest are read and dropped), asks `allowed` before and after each, keeps one stream per peer (a
newer one replaces the older), and ends a stream silent for `idle_timeout`; the sender opens a new
stream when its kept one is older than half of that, or failed. One writer task per peer, for as long
as the peer stays connected, allowed and writable; it never dials.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from contextlib import suppress

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from . import wire

log = logging.getLogger(__name__)

HAVE_PROTOCOL = "/swarm/have/1.0.0"
MAX_HAVE_FRAME = wire.MAX_HAVE_DIGESTS * wire.DIGEST_SIZE
_QUEUED_PER_PEER = 64  # HAVEs waiting for one peer's writer; more go by gossip (a peer that reads nothing)
_MAX_SENDERS = 1024  # senders whose read budget is remembered (admitted peers: the registry bounds them)


class DirectHaves:
    """One host's direct HAVEs: `send` queues a HAVE for every allowed connected peer, one writer task per
    peer (in `nursery`) writes it; `serve` is the protocol's handler, each HAVE read handed to
    `on_have(peer_id, digests)`. A HAVE that cannot be written to a peer (its queue full, the peer
    failing or gone, no stream within `timeout`, a write failing twice) goes to `undelivered(body)`:
    the host gossips it. A peer that failed both tries is written to again only after `idle_timeout`
    (a peer without the protocol, or one that reads nothing, costs one failure, not one per HAVE)."""

    def __init__(
        self,
        libp2p_host: IHost,
        nursery: trio.Nursery,
        *,
        allowed: Callable[[str], bool],
        on_have: Callable[[str, list[str]], None],
        undelivered: Callable[[bytes], None],
        timeout: float,
        idle_timeout: float,
        max_per_second: float,
    ) -> None:
        self._host = libp2p_host
        self._nursery = nursery
        self._allowed = allowed
        self._on_have = on_have
        self._undelivered = undelivered
        self._timeout = timeout
        self._idle_timeout = idle_timeout
        self._rate = max_per_second
        self._outboxes: dict[ID, trio.MemorySendChannel[bytes]] = {}  # peer -> its writer's queue
        self._failing: dict[ID, float] = {}  # peer -> when both tries to write to it last failed
        self._in: dict[ID, INetStream] = {}  # peer -> the stream we read its HAVEs from
        # peer -> (frames it may still send now, when that was counted): a token bucket per sender, not
        # per stream (a new stream per frame would refill it), the least recently used forgotten first
        self._budgets: collections.OrderedDict[ID, tuple[float, float]] = collections.OrderedDict()
        self.sent = 0  # frames written
        self.received = 0  # frames read and taken
        self.dropped = 0  # frames read over a sender's budget, not taken

    def connected(self, peer: ID) -> bool:
        return peer in self._host.get_connected_peers()

    def send(self, body: bytes) -> None:
        """Queue the HAVE `body` for every allowed connected peer; never waits (a caller about to post
        to the chain must not be held up by a slow peer)."""
        wire.parse_have(body)  # a malformed HAVE is the caller's bug: never on the wire
        me, now = self._host.get_id(), trio.current_time()
        for peer in self._host.get_connected_peers():
            if peer == me or not self._allowed(peer.to_base58()):
                continue
            if now - self._failing.get(peer, -math.inf) < self._idle_timeout:
                self._undelivered(body)
                continue
            self._failing.pop(peer, None)
            outbox = self._outboxes.get(peer)
            if outbox is None:
                outbox, inbox = trio.open_memory_channel[bytes](_QUEUED_PER_PEER)
                self._outboxes[peer] = outbox
                self._nursery.start_soon(self._writer, peer, outbox, inbox)
            try:
                outbox.send_nowait(body)
            except (trio.WouldBlock, trio.BrokenResourceError):
                self._undelivered(body)

    async def _writer(
        self, peer: ID, outbox: trio.MemorySendChannel[bytes], inbox: trio.MemoryReceiveChannel[bytes]
    ) -> None:
        """The one writer of `peer`'s HAVEs, one frame each, on a kept stream; the stream is ended after
        half of `idle_timeout` without a HAVE (the receiver may be closing it) and opened again for the
        next. Ends when the peer is gone (idle and not connected), no longer allowed, or failing; what
        is still queued then goes to `undelivered`."""
        stream: INetStream | None = None
        try:
            while True:
                with trio.move_on_after(self._idle_timeout / 2) as idle:
                    body = await inbox.receive()
                if idle.cancelled_caught:
                    if stream is not None:
                        await _reset(stream)
                    stream = None
                    if not self.connected(peer):
                        return
                    continue
                if not self.connected(peer) or not self._allowed(peer.to_base58()):
                    self._undelivered(body)  # never dial from here: a gone peer is the dialer's business
                    return
                stream = await self._write(peer, stream, body)
                if stream is None:
                    if self.connected(peer):  # failing, not gone: not tried again for a while
                        self._failing[peer] = trio.current_time()
                    return
        finally:
            if self._outboxes.get(peer) is outbox:
                del self._outboxes[peer]
            outbox.close()
            with suppress(trio.WouldBlock, trio.EndOfChannel):
                while True:
                    self._undelivered(inbox.receive_nowait())
            inbox.close()
            if stream is not None:
                await _reset(stream)

    async def _write(self, peer: ID, stream: INetStream | None, body: bytes) -> INetStream | None:
        """Write `body` to `peer` on `stream`, or on a new stream when there is none or writing failed
        (while the peer is connected: never a dial); the stream to keep, or None once both tries failed
        or the peer is gone (then `undelivered`)."""
        for _ in range(2):
            try:
                with trio.fail_after(self._timeout):
                    if stream is None:
                        if not self.connected(peer):  # new_stream would dial it: the dialer's business
                            break
                        stream = await self._host.new_stream(peer, [TProtocol(HAVE_PROTOCOL)])
                    await wire.write_frame(stream, body)
            except (Exception, BaseExceptionGroup) as exc:
                # new_stream's and the write's failures, our deadline (TooSlowError), py-libp2p's groups;
                # only cancellation propagates
                if is_cancellation(exc):
                    raise
                log.debug("direct HAVE to %s failed: %s: %s", peer, type(exc).__name__, exc)
                if stream is not None:
                    await _reset(stream)
                stream = None
                continue
            self.sent += 1
            return stream
        self._undelivered(body)
        return None

    async def serve(self, stream: INetStream) -> None:
        """Read one peer's HAVEs until it closes the stream, breaks the protocol, is no longer allowed,
        opens a newer stream, or stays silent for `idle_timeout`. Frames are read as they come (the muxer
        does not hold a sender to its window: py-libp2p 0.8.1's yamux only logs an overrun and buffers
        it); those past the sender's budget, `max_per_second` a second and as many at once, are dropped."""
        peer = stream.muxed_conn.peer_id
        older = self._in.get(peer)
        self._in[peer] = stream
        if older is not None:
            await _reset(older)
        try:
            while self._in.get(peer) is stream and self._allowed(peer.to_base58()):
                with trio.move_on_after(self._idle_timeout) as idle:
                    body = await wire.read_frame(stream, MAX_HAVE_FRAME)
                if idle.cancelled_caught or not self._allowed(peer.to_base58()):
                    break
                digests = wire.parse_have(body)
                if not self._take(peer):
                    self.dropped += 1
                    continue
                self.received += 1
                self._on_have(peer.to_base58(), digests)
        except wire.StreamEnded as exc:
            log.debug("HAVE stream from %s ended: %s", peer, exc)
        except wire.WireError as exc:  # FrameTooLarge, a body that is not whole digests
            log.info("protocol error on the HAVE stream from %s: %s", peer, exc)
        finally:
            if self._in.get(peer) is stream:
                del self._in[peer]
            await _reset(stream)

    def _take(self, peer: ID) -> bool:
        """Whether `peer` may have one more frame taken now (its token bucket: `max_per_second` a
        second, at most that many at once)."""
        now = trio.current_time()
        tokens, at = self._budgets.pop(peer, (self._rate, now))
        tokens = min(self._rate, tokens + (now - at) * self._rate)
        taken = tokens >= 1.0
        self._budgets[peer] = (tokens - 1.0 if taken else tokens, now)
        while len(self._budgets) > _MAX_SENDERS:
            self._budgets.popitem(last=False)
        return taken


def is_cancellation(exc: BaseException) -> bool:
    """Whether `exc` is trio's Cancelled or a group holding nothing else, to be re-raised by a loop that
    otherwise logs its failures: py-libp2p wraps a connection torn down mid-call in exception groups, and
    a task in the host's nursery that let one through would end the host."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(lambda e: not isinstance(e, (trio.Cancelled, BaseExceptionGroup))) is None
    return isinstance(exc, trio.Cancelled)


async def _reset(stream: INetStream) -> None:
    """Reset `stream` within a second, shielded (a cancelled reader still ends its stream)."""
    with trio.move_on_after(1.0) as cleanup:
        cleanup.shield = True
        with suppress(Exception):
            await stream.reset()
