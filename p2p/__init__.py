"""libp2p transport: identity, gossip announcements, content-addressed blob exchange in verified pieces.
Knows nothing of models, DP or the chain: it moves bytes named by sha256 digests.

Import the submodules directly (`p2p.host`, `p2p.store`, `p2p.identity`, `p2p.errors`); the names
below are re-exported for convenience. libp2p is imported lazily so `p2p.store` stays light."""

from __future__ import annotations

from .errors import BlobNotFound, BlobNotHeld, BlobTooLarge, DigestMismatch, FetchTimeout, IdentityError, P2PError


def peer_id_from_bytes(raw: bytes) -> str:
    """The base58 peer id for the binary (multihash) form the ledger stores."""
    from .host import peer_id_from_bytes as convert

    return convert(raw)


def peer_id_to_bytes(peer_id: str) -> bytes:
    """The binary (multihash) form of a base58 peer id."""
    from .host import peer_id_to_bytes as convert

    return convert(peer_id)


__all__ = [
    "P2PError",
    "IdentityError",
    "BlobNotFound",
    "BlobNotHeld",
    "DigestMismatch",
    "BlobTooLarge",
    "FetchTimeout",
    "peer_id_from_bytes",
    "peer_id_to_bytes",
]
