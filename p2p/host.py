"""The swarm's libp2p host: GossipSub announcements and `/swarm/blob/4.0.0` blob exchange in verified pieces.

`open_host(config, store, allowed)` starts a py-libp2p host (TCP, Noise, Yamux; optional private
network via a pre-shared key), joins the swarm's GossipSub topic, serves blobs from `store`, keeps
the bootstrap peers connected, and closes everything when the `async with` block ends.

Admission: `allowed(peer_id)` is asked for every blob stream and every request on it (a refused
peer gets a REFUSED frame), and for every gossip message's signed source (a topic validator
rejects it, so it is neither delivered nor forwarded).
"""

from __future__ import annotations

import collections
import logging
import math
import random
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost, INetStream, ISecureTransport, ISubscriptionAPI
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service
from libp2p.tools.anyio_service.exceptions import LifecycleError

from . import pubsub_reader, pubsub_records, task_parents, wire, yamux_window
from .addresses import WILDCARDS, advertised_addrs, local_ip_addresses
from .errors import BlobNotFound, BlobNotHeld, BlobTooLarge, DigestMismatch, FetchTimeout, P2PError
from .gossip import MESH_DEGREE, swarm_gossipsub
from .have import HAVE_PROTOCOL, DirectHaves, is_cancellation
from .pieces import HolderDoesNotHold, HolderFailed, HolderLied, PieceFetch, piece_hashes
from .store import BlobStore, check_digest

log = logging.getLogger(__name__)

# Each sender's signed peer record is verified once per host, not on every pubsub RPC (p2p/pubsub_records.py).
pubsub_records.install()
# Window credit goes back once half the window is read, not after every small read (p2p/yamux_window.py).
yamux_window.install()
# A new task's parent found by a table, not by walking every task (p2p/task_parents.py).
task_parents.install()
# Gossip RPCs cut out of a per-stream buffer, not read a few bytes at a time (p2p/pubsub_reader.py).
pubsub_reader.install()

MiB = 1 << 20
_ADDR_TTL = 3600  # seconds an announced address stays in the peerstore
# Parsing multiaddrs costs about a millisecond per gossip message in py-multiaddr, and every envelope
# carries the sender's addresses: each is parsed once per sender and text, re-added to the peerstore
# after _RELEARN_AFTER s (well inside _ADDR_TTL); our own advertised list is rebuilt at most once per
# _OWN_ADDRS_TTL s (a listener added later reaches peers within that time; rebuilding it, py-libp2p's
# `get_addrs`, was 2.6% of a 16-peer swarm's event loop with a rebuild per HAVE, once a second).
_RELEARN_AFTER = 600.0
_OWN_ADDRS_TTL = 30.0
_MAX_LEARNED = 4096
_MAX_PIECE_LISTS = 256  # blobs whose piece hashes a host keeps (about 32 bytes per MiB each)
_MAX_BLAMES = 1024  # blames a host remembers (`SwarmHost.blames`)
_MAX_OPENS_PER_STREAM = 4096  # blobs one blob stream may ask for (then the client opens another)
# Idle blob streams a fetcher keeps for its next fetches (docs/P2P.md, "Blob streams are kept"): per
# holder, and in all
_IDLE_STREAMS_PER_PEER = 2
_MAX_IDLE_STREAMS = 256
_GOSSIPED_HAVES = 64  # undelivered direct HAVEs remembered, each gossiped once (`_gossip_have`)


@dataclass(frozen=True)
class Announcement:
    """An application payload published on the topic by another (allowed) peer."""

    peer_id: str
    payload: bytes


@dataclass(frozen=True)
class Blame:
    """A holder caught lying during a fetch of `digest` (what it did: `reason`), dropped from that fetch."""

    digest: str
    holder: str
    reason: str


@dataclass(frozen=True)
class HostConfig:
    """Everything a host needs. Times are seconds; sizes are bytes."""

    key_pair: KeyPair
    topic: str
    listen_addrs: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",)
    bootstrap: Sequence[str] = ()
    psk: bytes | None = None
    max_blob_size: int = 512 * MiB
    pipeline_depth: int = 8  # READs (one piece each) in flight per holder
    ask_first: bool = True  # the holder asked first gets FIRST (its SIZE and first piece at once, wire.py); False: OPEN
    parallel_providers: int = 3  # holders a fetch downloads from at once (pieces striped over them)
    request_timeout: float = 10.0
    connect_timeout: float = 5.0
    reconnect_interval: float = 2.0  # how often connected bootstrap peers are checked for a drop
    bootstrap_retry_initial: float = 0.5  # a bootstrap peer not connected is re-dialed after this ...
    bootstrap_retry_max: float = 10.0  # ... doubling after each failure up to this (reset once connected)
    hello_interval: float = 60.0  # hellos start one heartbeat in and double up to this interval
    announce_delay: float = 0.5  # fetched blobs' HAVE goes out once no fetch ran for this long ...
    announce_max_delay: float = 5.0  # ... or once the oldest queued digest waited this long
    dial_discovered: bool = True
    # HAVEs written to each connected peer on a kept stream (p2p/have.py), not gossiped: only with
    # dial_discovered, which connects every peer to every other; gossiped otherwise (relayed hop by hop)
    direct_haves: bool = True
    max_announcement_size: int = 64 * 1024
    announcement_buffer: int = 1024
    max_announcements_per_second: float = 100.0
    # digests remembered per announcing peer (LRU): one peer's flood of HAVEs evicts only its own
    # entries, never an honest provider's (a member announces a few digests per round)
    max_digests_per_provider: int = 1024
    gossip_heartbeat: float = 1.0
    # how long a server keeps a blob stream with no request open for the client's next fetch (a fetcher
    # reuses an idle stream for at most half of it): longer than a round, so a round's stream to a
    # committer carries its next round's blob too
    stream_idle_timeout: float = 60.0

    def __post_init__(self) -> None:
        if not self.topic:
            raise ValueError("topic must be a non-empty string")
        if not 0 < self.max_blob_size <= wire.MAX_BLOB:
            raise ValueError(f"max_blob_size must be in (0, {wire.MAX_BLOB}], got {self.max_blob_size}")
        if not 0 <= self.announce_delay <= self.announce_max_delay:
            raise ValueError(
                f"need 0 <= announce_delay <= announce_max_delay, got {self.announce_delay}, {self.announce_max_delay}"
            )
        if self.pipeline_depth < 1:
            raise ValueError(f"pipeline_depth must be >= 1, got {self.pipeline_depth}")
        if self.parallel_providers < 1:
            raise ValueError(f"parallel_providers must be >= 1, got {self.parallel_providers}")
        if self.psk is not None and len(self.psk) != 32:
            raise ValueError(f"psk must be 32 bytes, got {len(self.psk)}")
        for name in (
            "request_timeout",
            "connect_timeout",
            "reconnect_interval",
            "hello_interval",
            "stream_idle_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.bootstrap_retry_initial <= self.bootstrap_retry_max:
            raise ValueError(
                "need 0 < bootstrap_retry_initial <= bootstrap_retry_max, "
                f"got {self.bootstrap_retry_initial}, {self.bootstrap_retry_max}"
            )
        for addr in list(self.listen_addrs) + list(self.bootstrap):
            multiaddr.Multiaddr(addr)  # raises on a malformed address
        for addr in self.bootstrap:
            if "/p2p/" not in addr:
                raise ValueError(f"bootstrap address {addr!r} must end with /p2p/<peer id>")


def _is_wildcard(addr: multiaddr.Multiaddr) -> bool:
    """Whether a multiaddr's IP is the unspecified address (`/ip4/0.0.0.0`, `/ip6/::`)."""
    parts = str(addr).split("/")
    return len(parts) > 2 and WILDCARDS.get(parts[1]) == parts[2]


def peer_id_from_bytes(raw: bytes) -> str:
    """The base58 peer id for the binary form the ledger stores."""
    return ID(raw).to_base58()


def peer_id_to_bytes(peer_id: str) -> bytes:
    """The binary (multihash) form of a base58 peer id."""
    return ID.from_base58(peer_id).to_bytes()


class _Opened(NamedTuple):
    """The blob a blob stream's client asked for last, and what its READs may still take: each returns
    at least one byte and each byte is read once (a client reads every piece once from a holder), so
    a well-behaved client needs at most `size` READs of `size` bytes in all; the READ bound (one per
    KiB, at least one, plus 8) also stops a stream of tiny READs."""

    digest: str
    size: int
    reads_left: int
    bytes_left: int


class _KeptStream(NamedTuple):
    """A blob stream a fetcher keeps between fetches: how many OPENs it carried, and since when it is idle."""

    stream: INetStream
    opens: int
    since: float = 0.0


class SwarmHost:
    """A running host. Create it with `open_host`; do not construct directly."""

    def __init__(
        self,
        config: HostConfig,
        store: BlobStore,
        allowed: Callable[[str], bool] | None,
        libp2p_host: IHost,
        pubsub: Pubsub,
        gossipsub: GossipSub,
        nursery: trio.Nursery,
    ) -> None:
        self.config = config
        self.store = store
        self._allowed = allowed or (lambda _peer_id: True)
        self.libp2p_host = libp2p_host
        self._pubsub = pubsub
        self._gossipsub = gossipsub
        self._nursery = nursery
        self._providers: dict[str, dict[str, None]] = {}  # digest -> its providers, oldest first
        # provider -> the digests it announced, least recent first (the per-sender bound)
        self._provided_by: collections.OrderedDict[str, collections.OrderedDict[str, None]] = collections.OrderedDict()
        self._dialing: set[str] = set()
        self._announce_send, self._announce_recv = trio.open_memory_channel[Announcement](config.announcement_buffer)
        self._pending_have: dict[str, None] = {}  # fetched digests not yet announced (insertion order)
        self._have_due = trio.Event()
        self._coming: dict[str, trio.Event] = {}  # digests about to be stored (`blob_coming`), set once they are
        # digest -> (set when its fetch ends, the first provider it was given): fetches others may join (`fetch`)
        self._fetching: dict[str, tuple[trio.Event, str | None]] = {}
        self._fetches_running = 0
        self._last_fetch_done = 0.0  # trio.current_time() when the last fetch finished
        self.dropped_announcements = 0
        self.failed_bootstrap_dials = 0
        # This machine's interface addresses, read once at start when a listen address is a wildcard
        # (None otherwise): what a wildcard is replaced by in the addresses we gossip.
        self._local_ips: dict[str, list[str]] | None = None
        self._own_addrs: tuple[float, list[str]] | None = None  # (trio time, advertised_addrs)
        # sender -> (its address texts, trio time learned, the dialable multiaddrs among them)
        self._learned: collections.OrderedDict[ID, tuple[tuple[str, ...], float, list[multiaddr.Multiaddr]]] = (
            collections.OrderedDict()
        )
        self.bytes_served = 0  # blob bytes sent to other peers (piece payloads)
        self.bytes_fetched = 0  # blob bytes received from other peers (piece payloads)
        self.not_found_answers = 0  # OPENs answered NOT_FOUND (an asker too early, or asking the wrong holder)
        # digest -> (size, piece hashes) of blobs served or fetched, least recently used first
        self._piece_lists: collections.OrderedDict[str, tuple[int, bytes]] = collections.OrderedDict()
        self._hashing = trio.Lock()  # one piece list computed at a time: a blob asked for at once is hashed once
        self.blames: collections.deque[Blame] = collections.deque(maxlen=_MAX_BLAMES)  # newest last
        # holder -> blob streams kept from our earlier fetches, between requests, most recent last
        self._idle_streams: dict[str, list[_KeptStream]] = {}
        self._direct: DirectHaves | None = None
        self._gossiped_haves: collections.OrderedDict[bytes, float] = collections.OrderedDict()  # body -> when
        # gossip source -> trio time of its last message (hellos come at least every hello_interval): the
        # members a direct HAVE must not miss (`_send_have`), least recently heard first
        self._heard: collections.OrderedDict[ID, float] = collections.OrderedDict()
        if config.direct_haves and config.dial_discovered:
            self._direct = DirectHaves(
                libp2p_host,
                nursery,
                allowed=self.allowed,
                on_have=self._add_providers,
                undelivered=self._gossip_have,
                timeout=config.request_timeout,
                idle_timeout=config.stream_idle_timeout,
                max_per_second=config.max_announcements_per_second,
            )

    # ---- identity and addresses -------------------------------------------------------------
    @property
    def peer_id(self) -> str:
        return self.libp2p_host.get_id().to_base58()

    @property
    def peer_id_bytes(self) -> bytes:
        return self.libp2p_host.get_id().to_bytes()

    @property
    def addrs(self) -> list[str]:
        """The full multiaddrs the host listens on (a wildcard listener reports the wildcard)."""
        return [str(a) for a in self.libp2p_host.get_addrs()]

    @property
    def advertised_addrs(self) -> list[str]:
        """What the host tells other peers (in hellos and announcements): `addrs` with every wildcard
        (`/ip4/0.0.0.0`, `/ip6/::`), which nobody can dial, replaced by this machine's interface
        addresses, loopback last (p2p/addresses.py). Rebuilt at most every _OWN_ADDRS_TTL s."""
        now = trio.current_time()
        if self._own_addrs is None or now - self._own_addrs[0] >= _OWN_ADDRS_TTL:
            self._own_addrs = (now, advertised_addrs(self.addrs, self._local_ips or {"ip4": [], "ip6": []}))
        return list(self._own_addrs[1])

    @property
    def announcements(self) -> trio.MemoryReceiveChannel[Announcement]:
        return self._announce_recv

    def allowed(self, peer_id: str) -> bool:
        try:
            return bool(self._allowed(peer_id))
        except Exception:  # a failing registry lookup must not admit anyone
            log.exception("allowed(%s) raised; refusing", peer_id)
            return False

    def connected_peers(self) -> list[str]:
        return [p.to_base58() for p in self.libp2p_host.get_connected_peers()]

    def mesh_peers(self) -> list[str]:
        return [p.to_base58() for p in self._gossipsub.mesh.get(self.config.topic, ())]

    # ---- connections ------------------------------------------------------------------------
    async def connect(self, addr: str) -> str:
        """Dial a full multiaddr (with /p2p/<id>); returns the peer id. Raises P2PError on failure."""
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        await self._dial(info)
        return info.peer_id.to_base58()

    async def _dial(self, info: PeerInfo) -> None:
        timed_out = P2PError(f"connecting to {info.peer_id} timed out after {self.config.connect_timeout}s")
        try:
            with trio.move_on_after(self.config.connect_timeout) as deadline:
                try:
                    await self.libp2p_host.connect(info)
                except BaseExceptionGroup as group:
                    # py-libp2p's nurseries wrap our deadline's Cancelled in a group, which the cancel
                    # scope then lets through (seen with 32 hosts dialing in one process): when only
                    # Cancelled is inside and our deadline fired, it is a timeout like any other.
                    not_cancelled = group.subgroup(lambda e: not isinstance(e, (trio.Cancelled, BaseExceptionGroup)))
                    if deadline.cancel_called and not_cancelled is None:
                        raise timed_out from None
                    raise
            if deadline.cancelled_caught:
                raise timed_out
        except P2PError:
            raise
        except Exception as exc:
            raise P2PError(f"cannot connect to {info.peer_id}: {type(exc).__name__}: {exc}") from None

    async def _ensure_connected(self, peer: ID) -> None:
        if peer in self.libp2p_host.get_connected_peers():
            return
        try:
            addrs = self.libp2p_host.get_peerstore().addrs(peer)
        except Exception:
            addrs = []
        if not addrs:
            raise HolderFailed("no known address")
        try:
            await self._dial(PeerInfo(peer, addrs))
        except P2PError as exc:
            raise HolderFailed(str(exc)) from None

    async def _keep_bootstrap_connected(self) -> None:
        """Keep every bootstrap peer connected: one that is not is re-dialed after
        `bootstrap_retry_initial` s, the delay doubling after each failure up to `bootstrap_retry_max`
        and starting over once it is connected; connected ones are checked every `reconnect_interval` s.

        Why retry at all: peers started together dial their bootstrap node before it listens,
        and py-libp2p then refuses every dial of that peer for 60 s ("recently failed all addresses
        (negative cache)"), so a swarm started at once split and stalled. The negative-cache entry of a
        bootstrap peer is lifted before each retry; the backoff keeps a dead bootstrap peer cheap.
        Runs until the host's nursery is cancelled at close; each dial is bounded by connect_timeout."""
        infos = [info_from_p2p_addr(multiaddr.Multiaddr(a)) for a in self.config.bootstrap]
        infos = [i for i in infos if i.peer_id != self.libp2p_host.get_id()]
        initial, ceiling = self.config.bootstrap_retry_initial, self.config.bootstrap_retry_max
        delay = {i.peer_id: initial for i in infos}
        due = {i.peer_id: trio.current_time() for i in infos}  # when each may be dialed next

        async def redial(info: PeerInfo) -> None:
            unblock = getattr(self.libp2p_host.get_network(), "unblock_peer", None)
            if unblock is not None:  # py-libp2p's Swarm: forget the earlier failure
                unblock(info.peer_id)
            try:
                await self._dial(info)
            except P2PError as exc:
                self.failed_bootstrap_dials += 1
                due[info.peer_id] = trio.current_time() + delay[info.peer_id]
                log.debug("bootstrap dial failed (next try in %.1fs): %s", delay[info.peer_id], exc)
                delay[info.peer_id] = min(2 * delay[info.peer_id], ceiling)
            else:
                log.info("connected to bootstrap peer %s", info.peer_id)

        was_connected: set[ID] = set()
        while infos:
            now = trio.current_time()
            connected = set(self.libp2p_host.get_connected_peers())
            for info in infos:
                if info.peer_id in connected:  # a later drop is re-dialed at once, then with backoff ...
                    due[info.peer_id] = now
                    if info.peer_id in was_connected:  # ... which starts over once the link held a while
                        delay[info.peer_id] = initial  # (a peer that drops every link keeps backing off)
            was_connected = connected
            waiting = [i for i in infos if i.peer_id not in connected]
            async with trio.open_nursery() as dials:  # each dial is bounded by connect_timeout
                for info in waiting:
                    if due[info.peer_id] <= now:
                        dials.start_soon(redial, info)
            now = trio.current_time()
            next_due = min((due[i.peer_id] for i in waiting), default=now + self.config.reconnect_interval)
            await trio.sleep(min(max(next_due - now, 0.01), self.config.reconnect_interval))

    # ---- announcements ----------------------------------------------------------------------
    async def publish(self, payload: bytes) -> None:
        """Publish an application payload (signed by libp2p) to the swarm topic."""
        if len(payload) > self.config.max_announcement_size:
            raise ValueError(
                f"payload is {len(payload)} bytes, above max_announcement_size={self.config.max_announcement_size}"
            )
        await self._publish(wire.KIND_APP, payload)

    async def announce_blob(self, digest: str, *, later: bool = False) -> None:
        """Tell the topic that we hold `digest` (we must: announcing what we cannot serve is refused).

        Now (default): fetched digests still waiting for their batched announcement go out in the
        same message. `later=True`: in the next batched HAVE with the fetched ones (see
        `_announce_batches`), for a blob whose fetchers know a holder already (a committed update's
        committer, a round's participants for its aggregate): each gossip message costs the swarm
        about N x D receptions, so a peer's round announces everything in one or two messages."""
        check_digest(digest)
        if not self.store.has(digest):
            raise ValueError(f"cannot announce {digest}: it is not in this host's store")
        if later:
            self._announce_later(digest)
            return
        self._pending_have.pop(digest, None)
        batch = [digest, *list(self._pending_have)[: wire.MAX_HAVE_DIGESTS - 1]]
        for sent in batch:
            self._pending_have.pop(sent, None)
        await self._send_have(batch)

    @contextmanager
    def blob_coming(self, digest: str) -> Iterator[None]:
        """While the body runs, an OPEN for `digest` that the store does not hold yet waits for the body
        to end (at most half of `request_timeout`, so the asker still gets an answer within its own)
        instead of answering NOT_FOUND at once; then it is answered from the store: SIZE if the body
        stored the blob, NOT_FOUND if it did not (a refused commit, say).

        Why: a committer stores its update only once its commit is read back from the chain (the
        release is public only once its spend is on chain), the moment its fetchers see that commit
        too. Their first OPEN came too early, and each NOT_FOUND cost a fetcher a try of every other
        connected peer (`fetch`'s fallback) and the prefetch of that blob. Nothing is served earlier
        than before: a waiter gets the blob only once the body stored it. Nested uses of one digest
        are the outermost's."""
        check_digest(digest)
        owner = digest not in self._coming
        if owner:
            self._coming[digest] = trio.Event()
        try:
            yield
        finally:
            if owner:
                self._coming.pop(digest).set()

    def _announce_later(self, digest: str) -> None:
        """Queue a fetched digest for the next batched HAVE (see `_announce_batches`)."""
        self._pending_have[digest] = None
        self._have_due.set()

    async def _announce_batches(self) -> None:
        """Publish queued HAVEs, several digests per message.

        Why batch: every gossip message costs each of the N peers about D receptions (mesh
        duplicates), and in py-libp2p each reception costs milliseconds of CPU (docs/P2P.md,
        "Where the cost grew with N"). One HAVE per fetched blob made a round of N peers
        fetching N-1 blobs cost O(N^3) receptions; one message per peer per `announce_delay`
        keeps it O(N^2) per round. So the batch waits while fetches are still running (a peer
        fetching a round's blobs sends one HAVE at the end), but never longer than
        `_have_max_delay()`: `announce_max_delay` for a swarm of up to MESH_DEGREE peers, growing in
        proportion beyond. While a swarm fetches continuously, each peer then receives about
        MESH_DEGREE^2 / announce_max_delay HAVE copies per second whatever N is (N senders, each
        message arriving about MESH_DEGREE times); a fixed cap made it grow with N, and in one
        process with N^2 (docs/P2P.md). Runs until the host's nursery is cancelled at close."""
        while True:
            await self._have_due.wait()
            self._have_due = trio.Event()
            deadline = trio.current_time() + self._have_max_delay()
            while trio.current_time() < deadline:
                await trio.sleep(self.config.announce_delay)
                idle = trio.current_time() - self._last_fetch_done >= self.config.announce_delay
                if self._fetches_running == 0 and idle:
                    break
            while self._pending_have:
                batch = list(self._pending_have)[: wire.MAX_HAVE_DIGESTS]
                for digest in batch:
                    self._pending_have.pop(digest, None)
                try:
                    await self._send_have(batch)
                except (Exception, BaseExceptionGroup) as exc:
                    if is_cancellation(exc):
                        raise
                    # the blobs are stored; a lost HAVE only hides a provider
                    log.debug("batched HAVE publish failed: %s", exc)

    async def _send_have(self, digests: list[str]) -> None:
        """Tell the swarm we hold `digests`: straight to each connected peer where HAVEs go direct
        (p2p/have.py), and by gossip where they do not, or where a peer could not be written to (then
        every peer hears it again: the gossip copy is for the peer we could not reach)."""
        body = wire.have_body(digests)
        if self._direct is None:
            await self._publish(wire.KIND_HAVE, body)
            return
        self._direct.send(body)
        unconnected = self._unconnected_members()
        if unconnected:  # they hear it by gossip, through the peers they are connected to; and are dialed
            self._gossip_have(body)
            for peer in unconnected:
                learned = self._learned.get(peer)
                if learned is not None:
                    self._dial_unless_connected(peer, learned[2])

    def _unconnected_members(self) -> list[ID]:
        """Allowed peers heard on the topic within two `hello_interval`s (alive: a member says hello at
        least that often) that this host is not connected to: a direct HAVE does not reach them."""
        horizon = trio.current_time() - 2 * self.config.hello_interval
        connected = set(self.libp2p_host.get_connected_peers())
        return [
            peer
            for peer, at in self._heard.items()
            if at >= horizon and peer not in connected and self.allowed(peer.to_base58())
        ]

    def _gossip_have(self, body: bytes) -> None:
        """Gossip a HAVE a peer could not be written to directly: once for all the peers it fails for
        within two `request_timeout`s (how long one peer's writer may try), the last _GOSSIPED_HAVES
        bodies remembered."""
        now = trio.current_time()
        if now - self._gossiped_haves.get(body, -math.inf) < 2 * self.config.request_timeout:
            return
        self._gossiped_haves[body] = now
        self._gossiped_haves.move_to_end(body)
        while len(self._gossiped_haves) > _GOSSIPED_HAVES:
            self._gossiped_haves.popitem(last=False)

        async def publish() -> None:
            try:
                await self._publish(wire.KIND_HAVE, body)
            except (Exception, BaseExceptionGroup) as exc:  # the blobs are stored; a lost HAVE only hides a provider
                if is_cancellation(exc):
                    raise
                log.debug("gossip of an undelivered HAVE failed: %s", exc)

        with suppress(RuntimeError):  # the nursery closed: the host is shutting down, nobody to tell
            self._nursery.start_soon(publish)

    def _have_max_delay(self) -> float:
        """How long a HAVE may wait while fetches keep running (see `_announce_batches`)."""
        topic_peers = len(self._pubsub.peer_topics.get(self.config.topic, ()))
        return self.config.announce_max_delay * max(1.0, topic_peers / MESH_DEGREE)

    async def _publish(self, kind: bytes, body: bytes) -> None:
        data = wire.envelope(kind, self.advertised_addrs, body)
        with trio.fail_after(self.config.request_timeout):
            await self._pubsub.publish(self.config.topic, data)

    async def _say_hello_periodically(self) -> None:
        """Publish our addresses so peers reached only through gossip can dial us for blobs.

        Checked at intervals starting at one gossip heartbeat and doubling up to `hello_interval`: a
        newcomer's first hellos make every peer dial it. A hello goes out only when the set of topic
        peers changed since our last one (someone joined or left, so someone may not know us yet),
        and at least every `hello_interval`. Why skip the others: each hello costs the swarm about
        N*D receptions (D mesh duplicates), a few ms of CPU each in py-libp2p; a fixed short interval
        kept half a core busy at 16 peers in one process, and the doubling schedule's 4-6 hellos per
        peer in its first minute still halved the throughput of a 16-peer exchange started then
        (docs/P2P.md, "Where the cost grew with N"). Runs until the host's nursery is cancelled;
        each publish is bounded by request_timeout."""
        interval = min(self.config.gossip_heartbeat, self.config.hello_interval)
        said_to: frozenset[ID] | None = None  # the topic peers when we last said hello
        said_at = -math.inf
        await trio.sleep(interval)
        while True:
            peers = frozenset(self._pubsub.peer_topics.get(self.config.topic, ()))
            if peers != said_to or trio.current_time() - said_at >= self.config.hello_interval:
                try:
                    await self._publish(wire.KIND_HELLO, b"")
                    said_to, said_at = peers, trio.current_time()
                except (Exception, BaseExceptionGroup) as exc:  # a publish timed out: try at the next check
                    if is_cancellation(exc):
                        raise
                    log.debug("hello publish failed: %s", exc)
            await trio.sleep(interval)
            interval = min(interval * 2, self.config.hello_interval)

    def _validate_gossip(self, _forwarder: ID, msg: rpc_pb2.Message) -> bool:
        """Topic validator: accept only small messages whose signed source is us or an allowed peer."""
        if len(msg.data) > self.config.max_announcement_size + 4096:
            return False
        try:
            source = ID(msg.from_id)
        except Exception:
            return False
        return source == self.libp2p_host.get_id() or self.allowed(source.to_base58())

    async def _read_gossip(self, subscription: ISubscriptionAPI) -> None:
        """Deliver topic messages. Waits for messages without a deadline on purpose (silence is normal);
        the loop ends when the host's nursery is cancelled at close."""
        me = self.libp2p_host.get_id()
        while True:
            msg = await subscription.get()
            source = ID(msg.from_id)
            # The validator already dropped non-allowed sources; check again in case admission changed.
            if source == me or not self.allowed(source.to_base58()):
                continue
            try:
                kind, addrs, body = wire.parse_envelope(msg.data)
            except wire.WireError as exc:
                log.debug("malformed gossip from %s: %s", source, exc)
                continue
            self._heard[source] = trio.current_time()
            self._heard.move_to_end(source)
            while len(self._heard) > _MAX_LEARNED:  # bounded like learned addresses
                self._heard.popitem(last=False)
            self._learn_addrs(source, addrs)
            if kind == wire.KIND_APP:
                try:
                    self._announce_send.send_nowait(Announcement(source.to_base58(), body))
                except trio.WouldBlock:  # the node is not reading: drop rather than stall gossip
                    self.dropped_announcements += 1
            elif kind == wire.KIND_HAVE:
                try:
                    digests = wire.parse_have(body)
                except wire.WireError as exc:
                    log.debug("malformed HAVE from %s: %s", source, exc)
                    continue
                self._add_providers(source.to_base58(), digests)

    def _learn_addrs(self, source: ID, addrs: list[str]) -> None:
        self._dial_unless_connected(source, self._dialable_addrs(source, addrs))

    def _dial_unless_connected(self, source: ID, known: list[multiaddr.Multiaddr]) -> None:
        """Dial `source` at `known` in the background, with `dial_discovered`, unless it has no address,
        is connected, or is being dialed."""
        if not known:
            return
        key = source.to_base58()
        if (
            self.config.dial_discovered
            and key not in self._dialing
            and source not in self.libp2p_host.get_connected_peers()
        ):
            self._dialing.add(key)
            self._nursery.start_soon(self._dial_discovered, PeerInfo(source, known))

    def _dialable_addrs(self, source: ID, addrs: list[str]) -> list[multiaddr.Multiaddr]:
        """The addresses `source` gives for itself, minus wildcards; put in the peerstore. Parsed once per
        sender and address list (see _RELEARN_AFTER)."""
        texts, now = tuple(addrs), trio.current_time()
        cached = self._learned.get(source)
        if cached is not None and cached[0] == texts and now - cached[1] < _RELEARN_AFTER:
            self._learned.move_to_end(source)
            return cached[2]
        known: list[multiaddr.Multiaddr] = []
        for text in texts:
            try:
                info = info_from_p2p_addr(multiaddr.Multiaddr(text))
            except Exception:
                continue
            if info.peer_id == source:  # only trust addresses a peer gives for itself
                # ... and never a wildcard (older peers gossiped 0.0.0.0): nobody can dial it
                known.extend(a for a in info.addrs if not _is_wildcard(a))
        if known:
            self.libp2p_host.get_peerstore().add_addrs(source, known, _ADDR_TTL)
        self._learned[source] = (texts, now, known)
        self._learned.move_to_end(source)
        while len(self._learned) > _MAX_LEARNED:  # bounded memory: senders are admitted peers
            self._learned.popitem(last=False)
        return known

    async def _dial_discovered(self, info: PeerInfo) -> None:
        try:
            await self._dial(info)
        except P2PError as exc:
            log.debug("dial of discovered peer failed: %s", exc)
        finally:
            self._dialing.discard(info.peer_id.to_base58())

    def _add_providers(self, peer_id: str, digests: list[str]) -> None:
        for digest in digests:
            self._add_provider(digest, peer_id)

    def _add_provider(self, digest: str, peer_id: str) -> None:
        """Remember that `peer_id` holds `digest`. Bounded per sender: a peer's oldest digests
        go once it announced more than `max_digests_per_provider`, so a flood of HAVEs pushes out
        only the flooder's own entries; senders are bounded like learned addresses."""
        self._providers.setdefault(digest, {})[peer_id] = None
        mine = self._provided_by.setdefault(peer_id, collections.OrderedDict())
        mine[digest] = None
        mine.move_to_end(digest)
        self._provided_by.move_to_end(peer_id)
        while len(mine) > self.config.max_digests_per_provider:
            self._forget_provider(mine.popitem(last=False)[0], peer_id)
        while len(self._provided_by) > _MAX_LEARNED:
            gone, digests = self._provided_by.popitem(last=False)
            for old in digests:
                self._forget_provider(old, gone)

    def _forget_provider(self, digest: str, peer_id: str) -> None:
        holders = self._providers.get(digest, {})
        holders.pop(peer_id, None)
        if not holders:
            self._providers.pop(digest, None)

    def providers(self, digest: str) -> list[str]:
        """Peers that announced `digest`, oldest announcement first."""
        return list(self._providers.get(check_digest(digest), {}))

    # ---- serving blobs ----------------------------------------------------------------------
    async def _serve_blob_stream(self, stream: INetStream) -> None:
        """Serve one client's requests on `stream`: any number of blobs in turn, each an OPEN and its
        READs, until the client closes the stream, it stays silent for `stream_idle_timeout` between
        requests, it breaks the protocol, or _MAX_OPENS_PER_STREAM blobs were asked for."""
        peer = stream.muxed_conn.peer_id.to_base58()
        timeout = self.config.request_timeout
        try:
            refusal = self._refusal(peer, 0)
            if refusal:  # before reading anything
                with trio.move_on_after(timeout):
                    await wire.write_frame(stream, wire.REFUSED + refusal)
                return
            # A new stream says what it wants within request_timeout; later waits are an idle stream's.
            wait = timeout
            current: _Opened | None = None  # the blob asked for
            opens = 0
            while True:
                # Request frames are read only up to the exact size of the largest request (OPEN, 33
                # bytes): a larger declared length is refused before its body is read (FrameTooLarge).
                with trio.move_on_after(wait) as idle:
                    body = await wire.read_frame(stream, wire.MAX_REQUEST)
                if idle.cancelled_caught:
                    return
                wait = self.config.stream_idle_timeout
                if body[:1] in (wire.OPEN, wire.OPEN_FIRST):
                    opens += 1
                    refusal = self._refusal(peer, opens)
                    if refusal:
                        with trio.move_on_after(timeout):
                            await wire.write_frame(stream, wire.REFUSED + refusal)
                        return
                    current = await self._answer_open(stream, *wire.parse_open(body))
                    continue
                if current is None:
                    raise wire.WireError("expected OPEN(digest) before READ")
                refusal = self._refusal(peer, 0)  # a READ of a blob opened before the peer's removal too
                if refusal:
                    with trio.move_on_after(timeout):
                        await wire.write_frame(stream, wire.REFUSED + refusal)
                    return
                if current.reads_left <= 0:
                    raise wire.WireError(
                        f"more READs for blob {current.digest[:16]} than its {current.size} bytes need"
                    )
                current = await self._answer_read(stream, current, wire.parse_read(body))
                if current is None:
                    return
        except (wire.StreamEnded, trio.TooSlowError) as exc:
            log.debug("blob stream with %s ended: %s", peer, exc)
        except wire.WireError as exc:  # FrameTooLarge included: say why, then close without reading on
            log.info("protocol error from %s: %s", peer, exc)
            with trio.move_on_after(timeout):
                with suppress(wire.StreamEnded):
                    await wire.write_frame(stream, wire.ERROR + f"protocol error: {exc}".encode())
        finally:
            with trio.move_on_after(1.0):
                with suppress(Exception):
                    await stream.close()

    def _refusal(self, peer: str, opens: int) -> bytes:
        """Why `peer` is not served its `opens`-th blob on a stream, or a READ (`opens` 0), b"" when it
        is. Admission is checked at every request: a stream outlives changes to the allowlist."""
        if not self.allowed(peer):
            return b"peer is not admitted to this swarm"
        if opens > _MAX_OPENS_PER_STREAM:
            return f"more than {_MAX_OPENS_PER_STREAM} blobs asked for on one stream: open another".encode()
        return b""

    async def _answer_open(self, stream: INetStream, digest: str, first: bool) -> _Opened | None:
        """SIZE (with the piece list) for a blob we hold, and what its READs may take; else NOT_FOUND
        (the stream stays open for the next OPEN), and None. A blob about to be stored is waited for
        (`blob_coming`). `first` (a FIRST request): the first piece's DATA goes in the same write."""
        size = self.store.size(digest)
        coming = self._coming.get(digest) if size is None else None
        if coming is not None:
            with trio.move_on_after(self.config.request_timeout / 2):
                await coming.wait()
            size = self.store.size(digest)
        hashes = None if size is None or size > wire.MAX_BLOB else await self._piece_hashes(digest, size)
        if size is None or hashes is None:
            self.not_found_answers += 1
            with trio.fail_after(self.config.request_timeout):
                await wire.write_frame(stream, wire.NOT_FOUND + digest.encode())
            return None
        opened = _Opened(digest, size, max(1, math.ceil(size / 1024)) + 8, size)
        if not first or size == 0:
            with trio.fail_after(self.config.request_timeout):
                await wire.write_frame(stream, wire.size_response(size, hashes))
            return opened
        # FIRST: the SIZE goes in front of the first piece's answer, counted as a READ of the blob
        read = await self._answer_read(
            stream, opened, (0, min(size, wire.PIECE_SIZE)), before=(wire.size_response(size, hashes),)
        )
        if read is None:  # removed since `size` was read: as after a READ, the stream ends
            raise wire.StreamEnded(f"blob {digest[:16]} removed while it was opened")
        return read

    async def _answer_read(
        self, stream: INetStream, opened: _Opened, request: tuple[int, int], before: tuple[bytes, ...] = ()
    ) -> _Opened | None:
        """DATA for one READ of the open blob, and what its next READs may take; None (after ERROR or
        NOT_FOUND) when the stream must end. `before`: frames written ahead of the answer, in its write."""
        offset, length = request
        timeout = self.config.request_timeout
        if length == 0 or length > wire.PIECE_SIZE or offset + length > opened.size:
            why = f"bad range {offset}+{length} (size {opened.size}, pieces of at most {wire.PIECE_SIZE} bytes)"
        elif length > opened.bytes_left:  # each byte once: a client reads every piece once from a holder
            why = f"READs for more than the blob's {opened.size} bytes"
        else:
            why = ""
        if why:
            with trio.move_on_after(timeout):
                await wire.write_frame(stream, *before, wire.ERROR + why.encode())
            return None
        chunk = self.store.read(opened.digest, offset, length)
        if chunk is None or len(chunk) != length:  # removed or cut short since it was opened: not a lie of ours
            with trio.move_on_after(timeout):
                await wire.write_frame(stream, *before, wire.NOT_FOUND + b"blob removed or damaged")
            return None
        with trio.fail_after(timeout):
            await wire.write_frame(stream, *before, wire.DATA + chunk)
        self.bytes_served += len(chunk)
        return opened._replace(reads_left=opened.reads_left - 1, bytes_left=opened.bytes_left - length)

    async def _piece_hashes(self, digest: str, size: int) -> bytes | None:
        """The sha256 of each piece of a blob we hold, as SIZE declares them; None if the store no
        longer holds all of it. Kept for the last _MAX_PIECE_LISTS blobs served or fetched; otherwise
        the blob is read once (in a thread: a large blob on disk takes a while)."""
        async with self._hashing:
            known = self._piece_lists.get(digest)
            if known is None or known[0] != size:
                hashes = await trio.to_thread.run_sync(
                    piece_hashes, lambda offset, length: self.store.read(digest, offset, length), size
                )
                if hashes is None:
                    return None
                known = (size, hashes)
            self._remember_pieces(digest, *known)
            return known[1]

    def _remember_pieces(self, digest: str, size: int, hashes: bytes) -> None:
        self._piece_lists[digest] = (size, hashes)
        self._piece_lists.move_to_end(digest)
        while len(self._piece_lists) > _MAX_PIECE_LISTS:
            self._piece_lists.popitem(last=False)

    # ---- fetching blobs ---------------------------------------------------------------------
    async def fetch(
        self,
        digest: str,
        *,
        providers: list[str] | None = None,
        max_size: int | None = None,
        timeout: float = 60.0,
        announce: bool = True,
    ) -> bytes:
        """Fetch a blob by sha256 digest, verify it, store it, and (by default) announce we hold it.

        Its pieces are striped over up to `config.parallel_providers` holders at once: the first of
        `providers` (the caller's first choice, e.g. the committer), then the others of `providers`
        and the peers that announced the digest in random order (so that no single holder uploads
        every copy), then other connected peers as a last resort. Each piece is checked as it arrives
        against the piece hashes its holder declared (p2p/pieces.py): a holder caught lying is blamed
        (logged, added to `blames`) and dropped, and its pieces are asked of the others; a holder that
        fails hands its unfinished pieces to the others and the next candidate takes its place.
        A fetch of a digest already being fetched from the same first provider waits for that one
        (the holder it names is being asked), then takes the blob from the store, or fetches it
        itself in the time left if that one failed: a prefetch still running when the round closes
        serves the agreement step's fetch of the same blob from the same committer (node/peer/peer.py
        `_prefetch`), instead of being cancelled, its stream reset, and the blob asked for again. A
        fetch that names another first provider runs on its own: joining would wait on a holder it
        did not name (a committer trickling its blob to one victim would hold up every other
        holder's try, and be blamed on them).
        Raises BlobNotFound, DigestMismatch, BlobTooLarge or FetchTimeout (all P2PError)."""
        check_digest(digest)
        limit = self.config.max_blob_size if max_size is None else max_size
        if limit <= 0:
            raise ValueError(f"max_size must be positive, got {max_size}")
        deadline = trio.current_time() + timeout
        first = providers[0] if providers else None
        while (running := self._fetching.get(digest)) is not None and running[1] == first:
            with trio.move_on_at(deadline):
                await running[0].wait()
            if not running[0].is_set():
                raise FetchTimeout(f"blob {digest[:16]}: a fetch of it from {first} did not finish within {timeout}s")
        if self.store.has(digest):
            data = self.store.get(digest)
            if data is not None and len(data) <= limit:
                return data
        candidates = self._candidates(digest, providers)
        if not any(candidates):
            raise BlobNotFound(f"blob {digest[:16]}: no provider known and no peer connected")
        self._fetches_running += 1
        leading = digest not in self._fetching  # else one from another first provider runs: both go on
        if leading:
            self._fetching[digest] = (trio.Event(), first)  # what fetches naming the same first provider wait on
        try:
            data = await self._fetch_verified(digest, candidates, limit, max(0.0, deadline - trio.current_time()))
            self.store.put(data)
        finally:
            self._fetches_running -= 1
            self._last_fetch_done = trio.current_time()
            if leading:
                self._fetching.pop(digest)[0].set()
        if announce:
            self._announce_later(digest)
        return data

    async def _fetch_verified(
        self, digest: str, candidates: tuple[list[str], list[str]], limit: int, timeout: float
    ) -> bytes:
        """The blob's bytes from `candidates`, every piece and the whole checked; raises as `fetch` documents."""
        holders, fallback = candidates
        spread = max(1, min(self.config.parallel_providers, len(holders)))

        def blamed(holder: str, reason: str) -> None:
            self.blames.append(Blame(digest, holder, reason))
            log.warning("blob %s: holder %s %s; dropped from this fetch", digest[:16], holder, reason)

        fetch = PieceFetch(digest, limit, spread, blamed)
        data: bytes | None = None
        try:
            with trio.fail_after(timeout):
                async with trio.open_nursery() as nursery:
                    untried = collections.deque(holders)
                    # Holders that declared a list and stopped: finished their share, or waiting for the
                    # fetch to follow their list. Asked again when it does and pieces wait.
                    idle: dict[str, None] = {}
                    active = 0

                    async def run(peer: str) -> None:
                        nonlocal active
                        try:
                            await self._fetch_from(peer, fetch)
                            idle[peer] = None
                        except HolderFailed as exc:
                            fetch.fail(peer, exc)
                        finally:
                            active -= 1
                            fetch.changed.set()

                    while True:
                        if fetch.complete:
                            data = fetch.finish()  # None: the followed list was refuted, its holders blamed
                            if data is not None:
                                break
                            continue
                        # One holder until a list is followed (its answer may be refused); then up to
                        # parallel_providers while pieces wait to be handed out.
                        spreading = self.config.parallel_providers if fetch.pending else 0
                        wanted = 1 if fetch.current is None else spreading
                        ready = collections.deque(p for p in idle if fetch.follows(p))
                        while active < wanted and (ready or untried):
                            peer = ready.popleft() if ready else untried.popleft()
                            idle.pop(peer, None)
                            active += 1
                            nursery.start_soon(run, peer)
                        if active == 0 and fallback:  # every known holder failed: ask the others
                            untried.extend(fallback)
                            fallback = []
                            continue
                        if active == 0:
                            break  # every candidate failed, lied or finished, and pieces are missing
                        await fetch.changed.wait()
                        fetch.changed = trio.Event()
                    nursery.cancel_scope.cancel()  # complete: stop holders still waiting on duplicates
        except trio.TooSlowError:
            raise FetchTimeout(
                f"blob {digest[:16]}: fetch did not finish within {timeout}s ({fetch.received} bytes received; "
                f"blamed: {self._describe(fetch.blamed)}; failures: {self._describe(fetch.failures)})"
            ) from None
        if data is None:
            if fetch.declared and not fetch.claims:
                raise BlobTooLarge(
                    f"blob {digest[:16]} is {max(fetch.declared.values())} bytes, above the limit of {limit}"
                )
            if fetch.blamed:
                raise DigestMismatch(
                    f"blob {digest[:16]}: no holder served bytes that hash to it (blamed: "
                    f"{self._describe(fetch.blamed)}; failures: {self._describe(fetch.failures)}); nothing stored"
                )
            not_held = bool(fetch.failures) and fetch.not_held == fetch.failures.keys()
            raise (BlobNotHeld if not_held else BlobNotFound)(
                f"blob {digest[:16]}: no provider served it ({self._describe(fetch.failures)})"
            )
        assert fetch.current is not None
        self._remember_pieces(digest, fetch.current.size, fetch.current.hashes)
        return data

    @staticmethod
    def _describe(failures: dict[str, str]) -> str:
        return "; ".join(f"{p[-8:]}: {r}" for p, r in failures.items()) or "none"

    def _candidates(self, digest: str, providers: list[str] | None) -> tuple[list[str], list[str]]:
        """Whom to ask: (holders, fallback). Holders: the caller's first provider, then the caller's
        other providers and the peers that announced the digest, shuffled (load spreads over holders
        instead of every fetcher asking the same second one). Fallback, asked only once every holder
        failed: the other connected peers, shuffled (most will answer NOT_FOUND)."""
        me = self.peer_id
        explicit = list(dict.fromkeys(providers or []))
        first, rest = explicit[:1], list(dict.fromkeys(explicit[1:] + self.providers(digest)))
        random.shuffle(rest)
        holders = [p for p in dict.fromkeys(first + rest) if p != me and self.allowed(p)]
        fallback = [p for p in self.connected_peers() if p not in holders and p != me and self.allowed(p)]
        random.shuffle(fallback)
        return holders, fallback

    async def _fetch_from(self, peer: str, fetch: PieceFetch) -> None:
        """Declare `peer`'s piece list to `fetch`, then fetch pieces from it while the fetch follows
        that list and pieces are left to ask for.

        Raises HolderLied when its answer contradicts its own list or the digest, HolderFailed with
        what went wrong otherwise; the pieces it had not delivered go back to the others (pieces
        already received are kept). The stream is kept for the next fetch from `peer` when this one
        ends between requests (`_end_blob_stream`), and reset or closed otherwise."""
        timeout = self.config.request_timeout
        try:
            peer_id = ID.from_base58(peer)
        except Exception:
            raise HolderFailed("malformed peer id") from None
        await self._ensure_connected(peer_id)
        stream: INetStream | None = None
        opens = 0  # OPENs sent on the stream, this fetch's included
        in_flight: collections.deque[int] = collections.deque()
        reusable = False  # the stream is between requests: the next fetch may use it
        # The holder asked while no piece list is followed yet is the only one asked, and wants the
        # first piece: FIRST brings it with the SIZE (wire.py), a request and an answer fewer per blob.
        first = fetch.current is None and self.config.ask_first
        try:
            with trio.fail_after(timeout):
                stream, opens, answer = await self._open_blob(peer_id, fetch.digest, first=first)
            if answer[:1] == wire.NOT_FOUND:
                reusable = True
                raise HolderDoesNotHold(f"not found: {answer[1:200].decode('utf-8', 'replace')}")
            size, hashes = wire.parse_size(answer)
            unasked = first and size > 0  # piece 0's DATA is on its way behind the SIZE
            if unasked:
                in_flight.append(0)  # a stream ended before it arrives is reset, not kept
            fetch.declare(peer, size, hashes)  # raises on a size above the limit or a provably false list
            claim = fetch.claims[peer]
            if unasked:
                fetch.arriving(peer, 0)
            while fetch.follows(peer) and not fetch.complete:
                while len(in_flight) < self.config.pipeline_depth:
                    index = fetch.take(peer, len(in_flight))
                    if index is None:
                        break
                    in_flight.append(index)
                    with trio.fail_after(timeout):
                        await wire.write_frame(stream, wire.read_request(*claim.range(index)))
                if not in_flight:
                    reusable = True
                    return
                index = in_flight[0]
                with trio.fail_after(timeout):
                    body = await wire.read_frame(stream)
                if body[:1] != wire.DATA:
                    wire.raise_status(body, "DATA")
                length = claim.range(index)[1]
                if len(body) - 1 != length:
                    raise HolderLied(f"sent {len(body) - 1} bytes for piece {index} of {length} bytes")
                self.bytes_fetched += length
                # raises HolderLied on a wrong piece, which stays in flight: given back below, asked of others
                fetch.deliver(peer, index, memoryview(body)[1:])
                in_flight.popleft()
            reusable = not in_flight
        except trio.TooSlowError:
            raise HolderFailed(f"no answer within {timeout}s") from None
        except (wire.StreamEnded, wire.WireError) as exc:
            raise HolderFailed(str(exc)) from None
        except HolderFailed:
            raise
        except Exception as exc:  # new_stream's failures: protocol not supported, connection lost
            raise HolderFailed(f"{type(exc).__name__}: {exc}") from None
        finally:
            fetch.give_back(peer, in_flight)
            if stream is not None:
                await self._end_blob_stream(peer, _KeptStream(stream, opens), reusable=reusable, reset=bool(in_flight))

    async def _open_blob(self, peer_id: ID, digest: str, *, first: bool) -> tuple[INetStream, int, bytes]:
        """A blob stream to `peer_id` on which `digest` was asked for (FIRST if `first`, else OPEN), the
        OPENs sent on it so far, and the holder's answer (SIZE, NOT_FOUND, ...). Takes a stream kept from
        an earlier fetch when there is one; a kept stream the holder has since closed (idle, or its
        connection gone) is ended and the next one, or a new stream, is tried."""
        peer = peer_id.to_base58()
        while (kept := await self._take_kept_stream(peer)) is not None:
            answer = await self._ask_open(kept.stream, digest, kept=True, first=first)
            if answer is not None:
                return kept.stream, kept.opens + 1, answer
        stream = await self.libp2p_host.new_stream(peer_id, [TProtocol(wire.BLOB_PROTOCOL)])
        answer = await self._ask_open(stream, digest, kept=False, first=first)
        assert answer is not None  # a new stream's failures raise
        return stream, 1, answer

    async def _ask_open(self, stream: INetStream, digest: str, *, kept: bool, first: bool) -> bytes | None:
        """The holder's answer to OPEN (or FIRST) `digest` on `stream`. On any failure the stream is
        ended; the failure is raised, but for a kept stream that ended (None: the holder closed it meanwhile)."""
        try:
            await wire.write_frame(stream, wire.open_request(digest, first=first))
            return await wire.read_frame(stream)
        except BaseException as exc:
            await _end_stream(stream, reset=True)
            if kept and isinstance(exc, wire.StreamEnded):
                return None
            raise

    async def _take_kept_stream(self, peer: str) -> _KeptStream | None:
        """The most recently kept idle stream to `peer` still within half of `stream_idle_timeout`
        (older ones are ended: a holder with the same setting may be closing them), or None."""
        kept = self._idle_streams.get(peer, [])
        while kept:
            taken = kept.pop()
            if not kept:
                del self._idle_streams[peer]
            if trio.current_time() - taken.since < self.config.stream_idle_timeout / 2:
                return taken
            await _end_stream(taken.stream, reset=True)
        return None

    async def _end_blob_stream(self, peer: str, used: _KeptStream, *, reusable: bool, reset: bool) -> None:
        """Keep `used.stream` for the next fetch from `peer` (when `reusable` and the bounds allow: a
        full pool first ends the streams too old to be used), or end it: reset when requests are
        unanswered, so the holder stops sending at once, closed otherwise."""
        if reusable and self._idle_stream_count() >= _MAX_IDLE_STREAMS:
            # Together, within the one second one reset may take: stalled connections do not add up.
            async with trio.open_nursery() as nursery:
                for old in self._expired_streams():
                    nursery.start_soon(partial(_end_stream, old, reset=True))
        kept = self._idle_streams.setdefault(peer, [])
        room = len(kept) < _IDLE_STREAMS_PER_PEER and self._idle_stream_count() < _MAX_IDLE_STREAMS
        if reusable and room and used.opens < _MAX_OPENS_PER_STREAM:
            kept.append(_KeptStream(used.stream, used.opens, trio.current_time()))
            return
        if not kept:
            del self._idle_streams[peer]
        await _end_stream(used.stream, reset=reset)

    def _expired_streams(self) -> list[INetStream]:
        """Remove and return the kept streams too old to be used (of every holder)."""
        now, limit = trio.current_time(), self.config.stream_idle_timeout / 2
        expired = []
        for peer, kept in list(self._idle_streams.items()):
            expired += [k.stream for k in kept if now - k.since >= limit]
            kept[:] = [k for k in kept if now - k.since < limit]
            if not kept:
                del self._idle_streams[peer]
        return expired

    def _idle_stream_count(self) -> int:
        return sum(len(kept) for kept in self._idle_streams.values())


async def _end_stream(stream: INetStream, *, reset: bool) -> None:
    """Reset or close `stream`, within a second. Shielded: a holder cancelled because the others
    completed the blob still ends its stream."""
    with trio.move_on_after(1.0) as cleanup:
        cleanup.shield = True
        with suppress(Exception):
            await (stream.reset() if reset else stream.close())


def _security_options(key_pair: KeyPair) -> dict[TProtocol, ISecureTransport]:
    """Noise only: py-libp2p's defaults also offer plaintext, which a swarm must never accept."""
    return {NOISE_PROTOCOL_ID: NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)}


async def _hang_up(libp2p_host: IHost, timeout: float) -> None:
    """Close every connection and listener of a host that is shutting down.

    py-libp2p's `run()` stops the network's tasks at exit but leaves its TCP connections open, so peers
    never saw a closed host leave (in one process not at all; in another only when that process
    exited) and kept it in their meshes. Shielded, so that a host whose scope was cancelled (killed)
    hangs up too; bounded by `timeout`."""
    with trio.CancelScope(deadline=trio.current_time() + timeout, shield=True):
        with suppress(Exception):
            await libp2p_host.close()


@asynccontextmanager
async def open_host(
    config: HostConfig, store: BlobStore, allowed: Callable[[str], bool] | None = None
) -> AsyncIterator[SwarmHost]:
    """Run a host for the duration of the block (trio). See the module docstring."""
    listen = [multiaddr.Multiaddr(a) for a in config.listen_addrs]
    libp2p_host = new_host(
        key_pair=config.key_pair,
        sec_opt=_security_options(config.key_pair),
        listen_addrs=listen,
        psk=config.psk.hex() if config.psk is not None else None,
    )
    # Mesh settings and why (degree, backoffs, fixed heartbeat, no GRAFT flood): p2p/gossip.py.
    gossipsub = swarm_gossipsub(config.gossip_heartbeat, config.max_announcements_per_second)
    pubsub = Pubsub(libp2p_host, gossipsub, strict_signing=True)
    body_finished = False
    body_error: BaseException | None = None
    instead: BaseException | None = None  # raised in place of the host's exit error (a shutdown race)
    try:
        async with libp2p_host.run(listen_addrs=listen):
            try:
                async with background_trio_service(pubsub), background_trio_service(gossipsub):
                    with trio.fail_after(config.connect_timeout):
                        await pubsub.wait_until_ready()
                    async with trio.open_nursery() as nursery:
                        host = SwarmHost(config, store, allowed, libp2p_host, pubsub, gossipsub, nursery)
                        if any(_is_wildcard(a) for a in listen):
                            # Interface addresses, once: getaddrinfo may block (a thread, bounded).
                            with trio.move_on_after(config.connect_timeout):
                                host._local_ips = await trio.to_thread.run_sync(
                                    local_ip_addresses,
                                    abandon_on_cancel=True,  # type: ignore[call-arg]  # trio-stubs predate it
                                )
                        libp2p_host.set_stream_handler(TProtocol(wire.BLOB_PROTOCOL), host._serve_blob_stream)
                        if host._direct is not None:
                            libp2p_host.set_stream_handler(TProtocol(HAVE_PROTOCOL), host._direct.serve)
                        pubsub.set_topic_validator(config.topic, host._validate_gossip, False)
                        subscription = await pubsub.subscribe(config.topic)
                        nursery.start_soon(host._read_gossip, subscription)
                        nursery.start_soon(host._keep_bootstrap_connected)
                        nursery.start_soon(host._say_hello_periodically)
                        nursery.start_soon(host._announce_batches)
                        try:
                            yield host
                            body_finished = True
                        except BaseException as exc:
                            body_error = exc
                            raise
                        finally:
                            nursery.cancel_scope.cancel()
                            host._announce_send.close()
            finally:
                await _hang_up(libp2p_host, config.connect_timeout)
    except (Exception, BaseExceptionGroup) as exc:
        # py-libp2p 0.8.1 races at shutdown: a stream arriving while its services stop spawns a
        # task into a closed nursery ("Nursery is closed to new arrivals", LifecycleError). Once
        # the caller's work is done such an error cannot affect it: log it instead of failing.
        # Under load it arrives grouped with the Cancelled of our own nursery's cancel (a 16-host
        # benchmark died of it); a Cancelled dropped here comes back at the caller's next checkpoint
        # if its scope really is cancelled. Anything else (KeyboardInterrupt, ...) propagates.
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(
            lambda e: not isinstance(e, (Exception, trio.Cancelled, BaseExceptionGroup))
        ):
            raise
        if not body_finished:
            instead = _without_shutdown_race(exc, body_error)
            if instead is None:
                raise
            log.warning("libp2p raised while shutting down after the host's body failed (ignored): %r", exc)
        else:
            log.warning("libp2p raised while shutting down (ignored, the host's work was done): %r", exc)
    if instead is not None:
        raise instead  # outside the handler: its own __cause__ and __context__ (what to fund) are kept


def _is_shutdown_race(exc: BaseException) -> bool:
    """py-libp2p 0.8.1's shutdown race: a task started in a nursery or service that is stopping."""
    return isinstance(exc, LifecycleError) or (isinstance(exc, RuntimeError) and "closed to new arrivals" in str(exc))


def _without_shutdown_race(exc: BaseException, body_error: BaseException | None) -> BaseException | None:
    """What to raise instead of `exc`, the host's exit error after its body raised `body_error`:
    `exc` without the shutdown races in it, or the body's own error where a race took its place
    (an unfunded node once said "Nursery is closed to new arrivals" instead of what to fund).
    None: raise `exc` as it is (no race in it, or the body was cancelled: a background task's
    error, in `exc`, is the cause then)."""
    if body_error is None or isinstance(body_error, trio.Cancelled):
        return None
    if not isinstance(exc, BaseExceptionGroup):
        return body_error if _is_shutdown_race(exc) else None
    race, rest = exc.split(_is_shutdown_race)
    if race is None:
        return None
    if rest is None or not rest.subgroup(lambda e: not isinstance(e, (trio.Cancelled, BaseExceptionGroup))):
        return body_error  # the races and our own cancel only: the body's error is what happened
    return rest
