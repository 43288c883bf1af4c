"""The messages of a secure-aggregation round: framed with explicit lengths, bounded before they
are parsed, and signed with Ed25519 by their sender. Nothing is pickled.

A frame is
    MAGIC (4) | kind (1) | body length (4, big-endian) | body | Ed25519 signature (64)
and the signature covers everything before it. Every body starts with the session (32 bytes:
swarm and round, `masks.session_id`) and the sender's member index (4 bytes); `open_frame` checks
the total size against the kind's bound before reading anything else, then the signature under the
key the caller holds for that sender (bound on chain to its registration), then parses the body
field by field with every length checked. A frame that fails any check raises `BadMessage`
naming the member whose signature or format does not hold.

Kinds:
- KEYS: the member's X25519 mask public key and X25519 share-encryption public key.
- SHARE: one share of one of the dealer's secrets (which: b, the self-mask seed, or s, the mask
  key), for one holder: dealer-signed, so that a revealed share can be checked by anyone.
- DEALING: for each holder, the holder's two SHARE frames encrypted with ChaCha20-Poly1305 under a
  key agreed between the dealer's and the holder's encryption keys; and SHA-256 of the self-mask
  seed, against which the reconstructed seed is checked (the mask key is checked against KEYS).
- MASKED: the masked residues, `bits` and the dimension, ceil(bits / 8) bytes per residue.
- REVEAL: the SHARE frames a survivor reveals for the unmasking (as the dealers signed them).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .masks import SESSION_BYTES
from .quantize import check_bits
from .shamir import PRIME, SHARE_BYTES, Share

MAGIC = b"SAG1"
HEADER = struct.Struct(">4sBI")
SIGNATURE_BYTES = 64
KEY_BYTES = 32
MAX_MEMBERS = 1 << 12  # members per round a frame may address
MAX_DIM = 1 << 24  # coordinates of a masked vector


class Kind(IntEnum):
    KEYS = 1
    SHARE = 2
    DEALING = 3
    MASKED = 4
    REVEAL = 5


class Secret(IntEnum):
    SELF_SEED = 1  # b_u
    MASK_KEY = 2  # the X25519 private mask key


class BadMessage(ValueError):
    """A frame that is malformed or not signed by the member it claims; `member` names it."""

    def __init__(self, member: int | None, reason: str) -> None:
        super().__init__(f"member {member}: {reason}" if member is not None else reason)
        self.member = member


_SHARE_BODY = SESSION_BYTES + 4 + 4 + 1 + 2 + SHARE_BYTES  # session, dealer, holder, secret, x, y
_SHARE_FRAME = HEADER.size + _SHARE_BODY + SIGNATURE_BYTES
_SEALED = 12 + 2 * _SHARE_FRAME + 16  # nonce, two SHARE frames, Poly1305 tag
_DEALING_ENTRY = 4 + _SEALED


def _max_body(kind: Kind) -> int:
    head = SESSION_BYTES + 4
    if kind is Kind.KEYS:
        return head + 2 * KEY_BYTES
    if kind is Kind.SHARE:
        return _SHARE_BODY
    if kind is Kind.DEALING:
        return head + 32 + 2 + MAX_MEMBERS * _DEALING_ENTRY
    if kind is Kind.MASKED:
        return head + 1 + 4 + MAX_DIM * 8
    return head + 2 + 2 * MAX_MEMBERS * _SHARE_FRAME  # REVEAL


@dataclass(frozen=True)
class Frame:
    kind: Kind
    session: bytes
    sender: int
    payload: bytes  # the body after session and sender
    raw: bytes  # the whole signed frame


def seal_frame(kind: Kind, session: bytes, sender: int, payload: bytes, key: Ed25519PrivateKey) -> bytes:
    if len(session) != SESSION_BYTES or not 0 <= sender < MAX_MEMBERS:
        raise ValueError("a frame needs a 32-byte session and a member index below 2^12")
    body = session + sender.to_bytes(4, "big") + payload
    if len(body) > _max_body(kind):
        raise ValueError(f"a {kind.name} body of {len(body)} bytes is over its bound")
    signed = HEADER.pack(MAGIC, kind, len(body)) + body
    return signed + key.sign(signed)


def open_frame(
    raw: bytes, kind: Kind, session: bytes, keys: Sequence[Ed25519PublicKey] | dict[int, Ed25519PublicKey]
) -> Frame:
    """The checked frame: its size within the kind's bound, header, session, then the signature of
    the member it names (keys[sender]); raises BadMessage otherwise."""
    if len(raw) < HEADER.size + SESSION_BYTES + 4 + SIGNATURE_BYTES:
        raise BadMessage(None, "frame too short")
    if len(raw) > HEADER.size + _max_body(kind) + SIGNATURE_BYTES:
        raise BadMessage(None, f"frame of {len(raw)} bytes over the {kind.name} bound")
    magic, got_kind, length = HEADER.unpack_from(raw)
    if magic != MAGIC or got_kind != kind or length != len(raw) - HEADER.size - SIGNATURE_BYTES:
        raise BadMessage(None, "bad header")
    body = raw[HEADER.size : HEADER.size + length]
    sender = int.from_bytes(body[SESSION_BYTES : SESSION_BYTES + 4], "big")
    if body[:SESSION_BYTES] != session:
        raise BadMessage(sender, "another session")
    key = keys.get(sender) if isinstance(keys, dict) else (keys[sender] if sender < len(keys) else None)
    if key is None:
        raise BadMessage(sender, "not a member of this round")
    try:
        key.verify(raw[-SIGNATURE_BYTES:], raw[:-SIGNATURE_BYTES])
    except InvalidSignature:
        raise BadMessage(sender, f"{kind.name} signature does not verify") from None
    return Frame(kind, session, sender, body[SESSION_BYTES + 4 :], raw)


# --------------------------------------------------------------------------------------- KEYS


def keys_message(
    session: bytes, sender: int, mask_public: bytes, cipher_public: bytes, key: Ed25519PrivateKey
) -> bytes:
    if len(mask_public) != KEY_BYTES or len(cipher_public) != KEY_BYTES:
        raise ValueError("X25519 public keys are 32 bytes")
    return seal_frame(Kind.KEYS, session, sender, mask_public + cipher_public, key)


def read_keys(frame: Frame) -> tuple[bytes, bytes]:
    """(mask public key, share-encryption public key)."""
    if len(frame.payload) != 2 * KEY_BYTES:
        raise BadMessage(frame.sender, "KEYS body has the wrong length")
    return frame.payload[:KEY_BYTES], frame.payload[KEY_BYTES:]


# -------------------------------------------------------------------------------------- SHARE


@dataclass(frozen=True)
class SignedShare:
    dealer: int
    holder: int
    secret: Secret
    share: Share
    raw: bytes  # the dealer-signed frame, as revealed


def share_message(
    session: bytes, dealer: int, holder: int, secret: Secret, share: Share, key: Ed25519PrivateKey
) -> bytes:
    payload = holder.to_bytes(4, "big") + bytes([secret]) + share.x.to_bytes(2, "big") + share.y_bytes()
    return seal_frame(Kind.SHARE, session, dealer, payload, key)


def read_share(
    raw: bytes, session: bytes, keys: Sequence[Ed25519PublicKey] | dict[int, Ed25519PublicKey]
) -> SignedShare:
    """A share checked against its dealer's signature: a tampered one raises BadMessage naming the dealer."""
    frame = open_frame(raw, Kind.SHARE, session, keys)
    p = frame.payload
    if len(p) != 4 + 1 + 2 + SHARE_BYTES:
        raise BadMessage(frame.sender, "SHARE body has the wrong length")
    holder = int.from_bytes(p[:4], "big")
    try:
        secret = Secret(p[4])
        share = Share(int.from_bytes(p[5:7], "big"), int.from_bytes(p[7:], "big"))
    except ValueError as exc:
        raise BadMessage(frame.sender, f"bad share: {exc}") from None
    if share.x != holder + 1 or share.y >= PRIME:
        raise BadMessage(frame.sender, "share point does not match its holder")
    return SignedShare(frame.sender, holder, secret, share, raw)


# ------------------------------------------------------------------------------------ DEALING


def _cipher_key(private: bytes, peer_public: bytes, session: bytes, dealer: int, holder: int) -> bytes:
    shared = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    info = b"secagg share encryption" + session + dealer.to_bytes(4, "big") + holder.to_bytes(4, "big")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def seal_shares(
    session: bytes,
    dealer: int,
    holder: int,
    cipher_private: bytes,
    holder_public: bytes,
    frames: tuple[bytes, bytes],
    nonce: bytes,
) -> bytes:
    """The holder's two SHARE frames, encrypted to it (nonce: 12 fresh bytes)."""
    if any(len(f) != _SHARE_FRAME for f in frames) or len(nonce) != 12:
        raise ValueError("two SHARE frames and a 12-byte nonce")
    aead = ChaCha20Poly1305(_cipher_key(cipher_private, holder_public, session, dealer, holder))
    return nonce + aead.encrypt(nonce, frames[0] + frames[1], session)


def open_shares(
    sealed: bytes, session: bytes, dealer: int, holder: int, cipher_private: bytes, dealer_public: bytes
) -> tuple[bytes, bytes]:
    if len(sealed) != _SEALED:
        raise BadMessage(dealer, "sealed shares have the wrong length")
    aead = ChaCha20Poly1305(_cipher_key(cipher_private, dealer_public, session, dealer, holder))
    try:
        plain = aead.decrypt(sealed[:12], sealed[12:], session)
    except InvalidTag:
        raise BadMessage(dealer, "sealed shares do not decrypt") from None
    return plain[:_SHARE_FRAME], plain[_SHARE_FRAME:]


def dealing_message(
    session: bytes, dealer: int, self_seed_digest: bytes, sealed: dict[int, bytes], key: Ed25519PrivateKey
) -> bytes:
    if len(self_seed_digest) != 32 or len(sealed) > MAX_MEMBERS:
        raise ValueError("a 32-byte digest and at most 2^12 holders")
    parts = [self_seed_digest, len(sealed).to_bytes(2, "big")]
    for holder in sorted(sealed):
        if len(sealed[holder]) != _SEALED:
            raise ValueError("sealed shares have a fixed length")
        parts += [holder.to_bytes(4, "big"), sealed[holder]]
    return seal_frame(Kind.DEALING, session, dealer, b"".join(parts), key)


def read_dealing(frame: Frame) -> tuple[bytes, dict[int, bytes]]:
    """(SHA-256 of the dealer's self-mask seed, holder -> sealed shares)."""
    p = frame.payload
    if len(p) < 34:
        raise BadMessage(frame.sender, "DEALING body too short")
    count = int.from_bytes(p[32:34], "big")
    if count > MAX_MEMBERS or len(p) != 34 + count * _DEALING_ENTRY:
        raise BadMessage(frame.sender, "DEALING body has the wrong length")
    sealed: dict[int, bytes] = {}
    for i in range(count):
        at = 34 + i * _DEALING_ENTRY
        holder = int.from_bytes(p[at : at + 4], "big")
        if holder in sealed:
            raise BadMessage(frame.sender, "DEALING names a holder twice")
        sealed[holder] = p[at + 4 : at + _DEALING_ENTRY]
    return p[:32], sealed


# ------------------------------------------------------------------------------------- MASKED


def masked_message(
    session: bytes, sender: int, residues: npt.NDArray[np.int64], bits: int, key: Ed25519PrivateKey
) -> bytes:
    check_bits(bits)
    width = (bits + 7) // 8
    values = np.asarray(residues, dtype=np.int64)
    if values.ndim != 1 or values.size > MAX_DIM or (values.size and (values.min() < 0 or values.max() >= 1 << bits)):
        raise ValueError("residues are a vector of values in [0, 2^bits)")
    data = values.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :width].tobytes()
    payload = bytes([bits]) + values.size.to_bytes(4, "big") + data
    return seal_frame(Kind.MASKED, session, sender, payload, key)


def read_masked(frame: Frame, bits: int, dim: int) -> npt.NDArray[np.int64]:
    """The masked residues, checked against the round's bits and dimension."""
    p = frame.payload
    width = (bits + 7) // 8
    if len(p) != 5 + dim * width or p[0] != bits or int.from_bytes(p[1:5], "big") != dim:
        raise BadMessage(frame.sender, "MASKED vector has the wrong bits, dimension or length")
    padded = np.zeros((dim, 8), dtype=np.uint8)
    padded[:, :width] = np.frombuffer(p, dtype=np.uint8, offset=5).reshape(dim, width)
    values = padded.reshape(-1).view("<u8").astype(np.int64)
    if dim and int(values.max()) >= 1 << bits:
        raise BadMessage(frame.sender, "MASKED residue out of range")
    return values


# ------------------------------------------------------------------------------------- REVEAL


def reveal_message(session: bytes, sender: int, shares: Sequence[bytes], key: Ed25519PrivateKey) -> bytes:
    if len(shares) > 2 * MAX_MEMBERS or any(len(s) != _SHARE_FRAME for s in shares):
        raise ValueError("a reveal carries SHARE frames, at most two per member")
    return seal_frame(Kind.REVEAL, session, sender, len(shares).to_bytes(2, "big") + b"".join(shares), key)


def read_reveal(frame: Frame) -> list[bytes]:
    """The SHARE frames a survivor revealed (each still to be checked with `read_share`)."""
    p = frame.payload
    if len(p) < 2:
        raise BadMessage(frame.sender, "REVEAL body too short")
    count = int.from_bytes(p[:2], "big")
    if count > 2 * MAX_MEMBERS or len(p) != 2 + count * _SHARE_FRAME:
        raise BadMessage(frame.sender, "REVEAL body has the wrong length")
    return [p[2 + i * _SHARE_FRAME : 2 + (i + 1) * _SHARE_FRAME] for i in range(count)]
