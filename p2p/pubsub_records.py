"""Signed peer records in py-libp2p 0.8.1's pubsub RPCs, each checked once instead of on every RPC.

py-libp2p attaches the sender's signed peer record (an Ed25519-signed envelope of its peer id and
addresses) to every pubsub RPC it sends, and the receiver verifies it and rewrites its peerstore
entry on every RPC received. A peer's record only changes when its addresses do, so nearly all of
that work repeats itself: profiled on the all-to-all exchange of 16 hosts (docs/P2P.md, "Where the
cost grew with N"), verifying records took 9.8 s and building our own (`host.get_addrs()` for
every RPC sent) 7.5 s of 110 s of CPU.

`install()` replaces the two functions inside py-libp2p's pubsub modules (their module globals; the
library is not edited):
- receiving: a record already verified *for this host* from the same peer, byte for byte, is
  accepted without verifying it again. The result of a verification depends only on those bytes and
  the peer id; the peerstore update it skips stores the same addresses again. Bounded: at most
  `MAX_REMEMBERED` records per host (least recently seen dropped), each re-verified after
  `REVERIFY_AFTER` s so the peerstore's 2-hour address TTL is refreshed. New or changed bytes go
  through the library's own check, so a forged record is refused exactly as before.
- sending: our own record's bytes are reused for `LOCAL_RECORD_TTL` s instead of recomputed from
  the listen addresses for every RPC; a changed address list reaches peers within that time.
"""

from __future__ import annotations

import collections
import time
import weakref
from typing import Any

from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub import gossipsub as _gossipsub_module
from libp2p.pubsub import pubsub as _pubsub_module
from libp2p.pubsub.pb.rpc_pb2 import RPC
from libp2p.pubsub.utils import maybe_consume_signed_record

MAX_REMEMBERED = 4096  # verified (peer, record) pairs kept per host
REVERIFY_AFTER = 600.0  # seconds; the peerstore keeps the addresses of a record for 7200 s
LOCAL_RECORD_TTL = 1.0  # seconds our own record's bytes are reused

# Keyed by the host's peerstore (one per host, several hosts per process in tests and benchmarks).
_verified: weakref.WeakKeyDictionary[Any, collections.OrderedDict[tuple[bytes, bytes], float]] = (
    weakref.WeakKeyDictionary()
)
_local: weakref.WeakKeyDictionary[Any, tuple[float, bytes]] = weakref.WeakKeyDictionary()


def consume_sender_record_once(msg: RPC, host: IHost, peer_id: ID) -> bool:
    """`maybe_consume_signed_record`, skipping records this host already verified from this peer."""
    if not msg.HasField("senderRecord"):
        return True
    peerstore = host.get_peerstore()
    remembered = _verified.setdefault(peerstore, collections.OrderedDict())
    key = (peer_id.to_bytes(), bytes(msg.senderRecord))
    now = time.monotonic()
    verified_at = remembered.get(key)
    if verified_at is not None and now - verified_at < REVERIFY_AFTER:
        remembered.move_to_end(key)
        return True
    if not maybe_consume_signed_record(msg, host, peer_id):
        remembered.pop(key, None)
        return False
    remembered[key] = now
    remembered.move_to_end(key)
    while len(remembered) > MAX_REMEMBERED:
        remembered.popitem(last=False)
    return True


def local_sender_record(host: IHost) -> tuple[bytes, bool]:
    """`env_to_send_in_RPC`, reusing the bytes for LOCAL_RECORD_TTL seconds."""
    peerstore = host.get_peerstore()
    now = time.monotonic()
    cached = _local.get(peerstore)
    if cached is not None and now - cached[0] < LOCAL_RECORD_TTL:
        return cached[1], False
    envelope, created = env_to_send_in_RPC(host)
    _local[peerstore] = (now, envelope)
    return envelope, created


def install() -> None:
    """Point py-libp2p's pubsub and gossipsub modules at the functions above (idempotent)."""
    for module in (_pubsub_module, _gossipsub_module):
        module.maybe_consume_signed_record = consume_sender_record_once  # type: ignore[attr-defined]
        module.env_to_send_in_RPC = local_sender_record  # type: ignore[attr-defined]
