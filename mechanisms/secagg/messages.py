"""The messages of a secure-aggregation round: framed with explicit lengths, bounded before they
are parsed, and signed with Ed25519 by their sender. Nothing is pickled.

A frame is
    MAGIC (4) | kind (1) | body length (4, big-endian) | body | Ed25519 signature (64)
and the signature covers everything before it. Every body starts with the session (32 bytes:
swarm and round, `masks.session_id`) and the sender's member index (4 bytes); `open_frame` checks
the total size against the kind's bound before reading anything else, then the signature under the
key the caller holds for that sender (bound on chain to its registration), then the body is parsed
field by field with every length checked. A frame that fails any check raises `BadMessage`
naming the member whose signature or format does not hold (None when the frame names nobody).

Kinds (member indices and counts are 2 bytes inside bodies):
- KEYS: the member's X25519 mask public key, its X25519 share-encryption public key (its side of
  every SEALED frame it deals) and, for each member index 0..k-1, an X25519 public key of its
  own for the shares that member deals to it (its side as a holder: one key per (holder, dealer)
  pair, so that a COMPLAINT reveals the private half of one pair and nothing else).
- DEALING (public, archived): SHA-256 of the dealer's self-mask seed and, for each holder, a hash
  commitment to each of the holder's two shares (`commitment`), so that a revealed share can be
  checked later by anyone against what the dealer signed.
- SEALED (dealer to one holder): the holder's two shares (value and 16-byte salt each) under
  ChaCha20-Poly1305 with a key agreed between the dealer's share-encryption key and the holder's
  pair key for that dealer.
- MASKED: the masked residues, `bits` and the dimension, ceil(bits / 8) bytes per residue.
- REVEAL: the openings (dealer, which secret, value, salt) a survivor reveals for the unmasking.
- COMPLAINT: per dealer the holder accuses of sealing it bad shares, the holder's private key of
  that (holder, dealer) pair, so that anyone can open the dealer's SEALED frame for the holder
  (`complaints`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

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

MAGIC = b"SAG2"
HEADER = struct.Struct(">4sBI")
SIGNATURE_BYTES = 64
KEY_BYTES = 32
DIGEST_BYTES = 32
SALT_BYTES = 16
NONCE_BYTES = 12
TAG_BYTES = 16
MAX_MEMBERS = 1 << 12  # members per round a frame may address
MAX_DIM = 1 << 24  # coordinates of a masked vector


class Kind(IntEnum):
    KEYS = 1
    DEALING = 2
    SEALED = 3
    MASKED = 4
    REVEAL = 5
    COMPLAINT = 6


class Secret(IntEnum):
    SELF_SEED = 1  # b_u
    MASK_KEY = 2  # the X25519 private mask key


class BadMessage(ValueError):
    """A frame that is malformed or not signed by the member it claims; `member` names it."""

    def __init__(self, member: int | None, reason: str) -> None:
        super().__init__(f"member {member}: {reason}" if member is not None else reason)
        self.member = member


_OPENING = SHARE_BYTES + SALT_BYTES  # a share's value and its commitment's salt
_COMMITTED_HOLDER = 2 + 2 * DIGEST_BYTES  # holder, commitment to each of its two shares
_SEALED = 2 + NONCE_BYTES + 2 * _OPENING + TAG_BYTES  # holder, nonce, two openings, Poly1305 tag
_REVEALED = 2 + 1 + _OPENING  # dealer, secret, value and salt
_COMPLAINED = 2 + KEY_BYTES  # dealer, the holder's private key of the pair
_KEYS_FIXED = 2 * KEY_BYTES + 2  # mask and share-encryption keys, the count of pair keys
_HEAD = SESSION_BYTES + 4


def _max_body(kind: Kind) -> int:
    if kind is Kind.KEYS:
        return _HEAD + _KEYS_FIXED + MAX_MEMBERS * KEY_BYTES  # a pair key per member index
    if kind is Kind.COMPLAINT:
        return _HEAD + 2 + MAX_MEMBERS * _COMPLAINED
    if kind is Kind.DEALING:
        return _HEAD + DIGEST_BYTES + 2 + MAX_MEMBERS * _COMMITTED_HOLDER
    if kind is Kind.SEALED:
        return _HEAD + _SEALED
    if kind is Kind.MASKED:
        return _HEAD + 1 + 4 + MAX_DIM * 8
    return _HEAD + 2 + MAX_MEMBERS * _REVEALED  # REVEAL: at most one opening per member


def max_frame_bytes(kind: Kind) -> int:
    """The largest frame of `kind` that can open: what a transport refuses before reading more."""
    return HEADER.size + _max_body(kind) + SIGNATURE_BYTES


def max_complaint_bytes(members: int) -> int:
    """The largest COMPLAINT frame among `members` (one entry per dealer, at most MAX_MEMBERS):
    the bound the contract's `complain` takes, for the registrations ever made."""
    return HEADER.size + _HEAD + 2 + min(members, MAX_MEMBERS) * _COMPLAINED + SIGNATURE_BYTES


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


def open_frame(raw: bytes, kind: Kind, session: bytes, keys: Mapping[int, Ed25519PublicKey]) -> Frame:
    """The checked frame: its size within the kind's bound, header, session, then the signature of
    the member it names (keys[sender]); raises BadMessage otherwise."""
    if not isinstance(raw, bytes):
        raise BadMessage(None, "a frame is bytes")
    if len(raw) < HEADER.size + _HEAD + SIGNATURE_BYTES:
        raise BadMessage(None, "frame too short")
    if len(raw) > HEADER.size + _max_body(kind) + SIGNATURE_BYTES:
        raise BadMessage(None, f"frame of {len(raw)} bytes over the {kind.name} bound")
    magic, got_kind, length = HEADER.unpack_from(raw)
    if magic != MAGIC or got_kind != kind or length != len(raw) - HEADER.size - SIGNATURE_BYTES:
        raise BadMessage(None, "bad header")
    body = raw[HEADER.size : HEADER.size + length]
    sender = int.from_bytes(body[SESSION_BYTES:_HEAD], "big")
    if body[:SESSION_BYTES] != session:
        raise BadMessage(sender, "another session")
    key = keys.get(sender)
    if key is None:
        raise BadMessage(sender, "not a member of this round")
    try:
        key.verify(raw[-SIGNATURE_BYTES:], raw[:-SIGNATURE_BYTES])
    except InvalidSignature:
        raise BadMessage(sender, f"{kind.name} signature does not verify") from None
    return Frame(kind, session, sender, body[_HEAD:], raw)


def frame_digest(raw: bytes) -> bytes:
    """SHA-256 of a frame's bytes, signature included: what the chain holds for each frame a step
    admits. An archive's frames are checked against these before `unmask.verify_round`: a frame
    its own sender re-signed after the others acted on it opens, and the sum cannot tell."""
    return hashlib.sha256(raw).digest()


def _index(data: bytes) -> int:
    return int.from_bytes(data, "big")


def _counted(frame: Frame, fixed: int, item: int) -> int:
    """The count of a body laid out as `fixed` bytes, a 2-byte count, then that many items of
    `item` bytes (at most MAX_MEMBERS), checked against the body's length before anything else
    is read from it; BadMessage naming the sender otherwise."""
    p, kind = frame.payload, frame.kind.name
    if len(p) < fixed + 2:
        raise BadMessage(frame.sender, f"{kind} body too short")
    count = _index(p[fixed : fixed + 2])
    if count > MAX_MEMBERS or len(p) != fixed + 2 + count * item:
        raise BadMessage(frame.sender, f"{kind} body has the wrong length")
    return count


# --------------------------------------------------------------------------------------- KEYS


class Keys(NamedTuple):
    """A KEYS frame's keys: the mask key, the share-encryption key the member deals with, and
    pairs[d]: the key dealer d seals this member's shares to."""

    mask: bytes
    cipher: bytes
    pairs: tuple[bytes, ...]


def keys_message(
    session: bytes,
    sender: int,
    mask_public: bytes,
    cipher_public: bytes,
    pair_publics: Sequence[bytes],
    key: Ed25519PrivateKey,
) -> bytes:
    """pair_publics[d]: the public key dealer d is to seal the sender's shares to, for d in 0..k-1."""
    if any(len(public) != KEY_BYTES for public in (mask_public, cipher_public, *pair_publics)):
        raise ValueError("X25519 public keys are 32 bytes")
    if len(pair_publics) > MAX_MEMBERS:
        raise ValueError(f"a KEYS frame covers at most {MAX_MEMBERS} members")
    payload = mask_public + cipher_public + len(pair_publics).to_bytes(2, "big") + b"".join(pair_publics)
    return seal_frame(Kind.KEYS, session, sender, payload, key)


def keys_frame_size(covered: int) -> int:
    """The size of a KEYS frame with pair keys for `covered` members."""
    return HEADER.size + _HEAD + _KEYS_FIXED + covered * KEY_BYTES + SIGNATURE_BYTES


def read_keys(frame: Frame) -> Keys:
    p = frame.payload
    _counted(frame, 2 * KEY_BYTES, KEY_BYTES)
    pairs = tuple(p[at : at + KEY_BYTES] for at in range(_KEYS_FIXED, len(p), KEY_BYTES))
    return Keys(p[:KEY_BYTES], p[KEY_BYTES : 2 * KEY_BYTES], pairs)


# ----------------------------------------------------------------------- shares and openings


class Opening(NamedTuple):
    """One share of one of a dealer's secrets, with the salt of its commitment. A tuple, not a
    checked dataclass: a round parses n^2 of them (the readers check every field, and
    `_opening_bytes` checks what is sent)."""

    dealer: int
    holder: int
    secret: Secret
    y: int
    salt: bytes

    @property
    def share(self) -> Share:
        return Share(self.holder + 1, self.y)

    def commitment(self, session: bytes) -> bytes:
        """SHA-256 over the domain, session, dealer, holder, secret, value and salt: binding (a
        holder cannot open it to another value) and, with the 128-bit salt, hiding."""
        return hashlib.sha256(
            b"secagg share"
            + session
            + self.holder.to_bytes(2, "big")
            + self.dealer.to_bytes(2, "big")
            + _SECRET_BYTE[self.secret]
            + _opening_bytes(self)
        ).digest()


_SECRET_BYTE = {Secret.SELF_SEED: bytes([Secret.SELF_SEED]), Secret.MASK_KEY: bytes([Secret.MASK_KEY])}
_SECRET_OF = {int(s): s for s in Secret}


def _opening_bytes(o: Opening) -> bytes:
    if not (0 <= o.dealer < MAX_MEMBERS and 0 <= o.holder < MAX_MEMBERS and 0 <= o.y < PRIME):
        raise ValueError("an opening has member indices below 2^12 and a field element")
    if len(o.salt) != SALT_BYTES:
        raise ValueError(f"a salt is {SALT_BYTES} bytes")
    return o.y.to_bytes(SHARE_BYTES, "big") + o.salt


def _read_opening(data: bytes, dealer: int, holder: int, secret: Secret, blame: int) -> Opening:
    y = _index(data[:SHARE_BYTES])
    if y >= PRIME:
        raise BadMessage(blame, "share value outside the field")
    return Opening(dealer, holder, secret, y, data[SHARE_BYTES:_OPENING])


# ------------------------------------------------------------------------------------ DEALING


@dataclass(frozen=True)
class Dealing:
    """What a dealer publishes: the digest of its self-mask seed and, per holder, the commitments
    to that holder's share of each secret."""

    dealer: int
    seed_digest: bytes
    commitments: Mapping[int, tuple[bytes, bytes]]  # holder -> (self-seed share, mask-key share)

    def commitment(self, holder: int, secret: Secret) -> bytes | None:
        pair = self.commitments.get(holder)
        return None if pair is None else pair[0 if secret is Secret.SELF_SEED else 1]


def dealing_message(
    session: bytes,
    dealer: int,
    seed_digest: bytes,
    commitments: Mapping[int, tuple[bytes, bytes]],
    key: Ed25519PrivateKey,
) -> bytes:
    if len(seed_digest) != DIGEST_BYTES or len(commitments) > MAX_MEMBERS:
        raise ValueError("a 32-byte digest and at most 2^12 holders")
    parts = [seed_digest, len(commitments).to_bytes(2, "big")]
    for holder in sorted(commitments):
        b, s = commitments[holder]
        if len(b) != DIGEST_BYTES or len(s) != DIGEST_BYTES:
            raise ValueError("commitments are 32 bytes")
        parts += [holder.to_bytes(2, "big"), b, s]
    return seal_frame(Kind.DEALING, session, dealer, b"".join(parts), key)


def read_dealing(frame: Frame) -> Dealing:
    p = frame.payload
    count = _counted(frame, DIGEST_BYTES, _COMMITTED_HOLDER)
    commitments: dict[int, tuple[bytes, bytes]] = {}
    for i in range(count):
        at = DIGEST_BYTES + 2 + i * _COMMITTED_HOLDER
        holder = _index(p[at : at + 2])
        if holder in commitments:
            raise BadMessage(frame.sender, "DEALING names a holder twice")
        commitments[holder] = (p[at + 2 : at + 34], p[at + 34 : at + 66])
    return Dealing(frame.sender, p[:DIGEST_BYTES], commitments)


# ------------------------------------------------------------------------------------- SEALED


def _cipher_key(private: X25519PrivateKey, peer_public: bytes, session: bytes, dealer: int, holder: int) -> bytes:
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    info = b"secagg share encryption" + session + dealer.to_bytes(4, "big") + holder.to_bytes(4, "big")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def sealed_message(
    session: bytes,
    openings: tuple[Opening, Opening],
    cipher_private: X25519PrivateKey,
    holder_public: bytes,
    nonce: bytes,
    key: Ed25519PrivateKey,
) -> bytes:
    """The holder's two openings (self seed, then mask key) encrypted to it: `cipher_private` the
    dealer's share-encryption key, `holder_public` the holder's pair key for this dealer (its KEYS
    frame); nonce: 12 fresh bytes."""
    b, s = openings
    if (b.secret, s.secret) != (Secret.SELF_SEED, Secret.MASK_KEY) or (b.dealer, b.holder) != (s.dealer, s.holder):
        raise ValueError("a SEALED message carries one holder's self-seed and mask-key shares")
    if len(nonce) != NONCE_BYTES:
        raise ValueError("a 12-byte nonce")
    aead = ChaCha20Poly1305(_cipher_key(cipher_private, holder_public, session, b.dealer, b.holder))
    holder = b.holder.to_bytes(2, "big")
    sealed = nonce + aead.encrypt(nonce, _opening_bytes(b) + _opening_bytes(s), session + holder)
    return seal_frame(Kind.SEALED, session, b.dealer, holder + sealed, key)


def read_sealed(
    frame: Frame, holder: int, pair_private: X25519PrivateKey, dealer_public: bytes
) -> tuple[Opening, Opening]:
    """The two openings a dealer sealed for `holder` (not yet checked against the commitments),
    opened with the holder's private key of the (holder, dealer) pair: the holder's own, or the
    one its COMPLAINT revealed."""
    p = frame.payload
    if len(p) != _SEALED or _index(p[:2]) != holder:
        raise BadMessage(frame.sender, "SEALED body has the wrong length or holder")
    aead = ChaCha20Poly1305(_cipher_key(pair_private, dealer_public, frame.session, frame.sender, holder))
    try:
        plain = aead.decrypt(p[2 : 2 + NONCE_BYTES], p[2 + NONCE_BYTES :], frame.session + p[:2])
    except InvalidTag:
        raise BadMessage(frame.sender, "sealed shares do not decrypt") from None
    return (
        _read_opening(plain[:_OPENING], frame.sender, holder, Secret.SELF_SEED, frame.sender),
        _read_opening(plain[_OPENING:], frame.sender, holder, Secret.MASK_KEY, frame.sender),
    )


SEALED_FRAME_BYTES = HEADER.size + _HEAD + _SEALED + SIGNATURE_BYTES  # every SEALED frame's exact size


def dealing_bundle(dealing: bytes, sealed: Mapping[int, bytes]) -> bytes:
    """What a dealer publishes at R1, one blob whose digest goes on chain: its DEALING frame, then
    the SEALED frame of every holder (by holder), each of `SEALED_FRAME_BYTES`. A holder finds its
    own shares in the blob the chain names, and nobody else can open them."""
    if any(len(frame) != SEALED_FRAME_BYTES for frame in sealed.values()):
        raise ValueError("a SEALED frame of the wrong size")
    return dealing + b"".join(sealed[h] for h in sorted(sealed))


def max_bundle_bytes() -> int:
    return max_frame_bytes(Kind.DEALING) + MAX_MEMBERS * SEALED_FRAME_BYTES


def split_bundle(raw: bytes, dealer: int) -> tuple[bytes, dict[int, bytes]]:
    """The DEALING frame and holder -> SEALED frame of a dealing bundle, by sizes alone (each frame
    is opened and checked by its reader); BadMessage naming `dealer` if the sizes do not add up or
    a holder appears twice."""
    if len(raw) > max_bundle_bytes() or len(raw) < HEADER.size:
        raise BadMessage(dealer, "dealing bundle of impossible size")
    _, _, length = HEADER.unpack_from(raw)
    end = HEADER.size + length + SIGNATURE_BYTES
    rest = len(raw) - end
    if length > _max_body(Kind.DEALING) or rest < 0 or rest % SEALED_FRAME_BYTES:
        raise BadMessage(dealer, "dealing bundle does not split into a DEALING frame and SEALED frames")
    sealed: dict[int, bytes] = {}
    for start in range(end, len(raw), SEALED_FRAME_BYTES):
        frame = raw[start : start + SEALED_FRAME_BYTES]
        holder = _index(frame[HEADER.size + _HEAD : HEADER.size + _HEAD + 2])
        if holder in sealed:
            raise BadMessage(dealer, f"dealing bundle holds two SEALED frames for member {holder}")
        sealed[holder] = frame
    return raw[:end], sealed


def split_bundles(
    bundles: Mapping[int, bytes],
) -> tuple[dict[int, bytes], dict[int, dict[int, bytes]], dict[int, str]]:
    """`split_bundle` for each dealer -> bundle: its DEALING frame, its holder -> SEALED frame,
    and the dealers whose bundle does not split (named, left out of both)."""
    dealings: dict[int, bytes] = {}
    sealed: dict[int, dict[int, bytes]] = {}
    faults: dict[int, str] = {}
    for dealer, raw in sorted(bundles.items()):
        try:
            dealings[dealer], sealed[dealer] = split_bundle(raw, dealer)
        except BadMessage as exc:
            faults[dealer] = str(exc)
    return dealings, sealed, faults


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


def masked_frame_size(bits: int, dim: int) -> int:
    """The exact size of a round's MASKED frame: checked before a peer's bytes are opened."""
    return HEADER.size + _HEAD + 5 + dim * ((check_bits(bits) + 7) // 8) + SIGNATURE_BYTES


def read_masked(frame: Frame, bits: int, dim: int) -> npt.NDArray[np.int64]:
    """The masked residues, checked against the round's bits and dimension."""
    p = frame.payload
    width = (bits + 7) // 8
    if len(p) != 5 + dim * width or p[0] != bits or _index(p[1:5]) != dim:
        raise BadMessage(frame.sender, "MASKED vector has the wrong bits, dimension or length")
    if width in (1, 2, 4, 8):
        values = np.frombuffer(p, dtype=f"<u{width}", offset=5).astype(np.int64)
    else:
        padded = np.zeros((dim, 8), dtype=np.uint8)
        padded[:, :width] = np.frombuffer(p, dtype=np.uint8, offset=5).reshape(dim, width)
        values = padded.reshape(-1).view("<u8").astype(np.int64)
    if dim and (int(values.max()) >= 1 << bits or int(values.min()) < 0):
        raise BadMessage(frame.sender, "MASKED residue out of range")
    return values


# ------------------------------------------------------------------------------------- REVEAL


def reveal_message(session: bytes, sender: int, openings: Sequence[Opening], key: Ed25519PrivateKey) -> bytes:
    dealers = [o.dealer for o in openings]
    if len(set(dealers)) != len(dealers) or any(o.holder != sender for o in openings):
        raise ValueError("a reveal carries the sender's own shares, at most one per dealer")
    parts = [len(openings).to_bytes(2, "big")]
    parts += [o.dealer.to_bytes(2, "big") + bytes([o.secret]) + _opening_bytes(o) for o in openings]
    return seal_frame(Kind.REVEAL, session, sender, b"".join(parts), key)


def read_reveal(frame: Frame, max_openings: int = MAX_MEMBERS) -> list[Opening]:
    """The openings a survivor revealed (each still to be checked against its dealer's commitment);
    more than `max_openings` (the round's dealers) are refused before any is parsed."""
    p = frame.payload
    count = _counted(frame, 0, _REVEALED)
    if count > max_openings:
        raise BadMessage(frame.sender, f"REVEAL carries {count} openings, the round has {max_openings} dealers")
    openings, holder = [], frame.sender
    for at in range(2, len(p), _REVEALED):
        dealer, secret, y = _index(p[at : at + 2]), _SECRET_OF.get(p[at + 2]), _index(p[at + 3 : at + 3 + SHARE_BYTES])
        if secret is None or dealer >= MAX_MEMBERS or y >= PRIME:
            raise BadMessage(holder, "REVEAL names an unknown secret or member, or a value outside the field")
        openings.append(Opening(dealer, holder, secret, y, p[at + 3 + SHARE_BYTES : at + _REVEALED]))
    if len({o.dealer for o in openings}) != count:
        raise BadMessage(holder, "REVEAL names a dealer twice")
    return openings


# ---------------------------------------------------------------------------------- COMPLAINT


def complaint_message(session: bytes, sender: int, revealed: Mapping[int, bytes], key: Ed25519PrivateKey) -> bytes:
    """revealed: dealer -> the sender's X25519 private key of the (sender, dealer) pair."""
    if len(revealed) > MAX_MEMBERS or any(not 0 <= d < MAX_MEMBERS or len(k) != KEY_BYTES for d, k in revealed.items()):
        raise ValueError("a complaint names dealers below 2^12, with a 32-byte key each")
    parts = [len(revealed).to_bytes(2, "big")]
    parts += [d.to_bytes(2, "big") + revealed[d] for d in sorted(revealed)]
    return seal_frame(Kind.COMPLAINT, session, sender, b"".join(parts), key)


def read_complaint(frame: Frame, max_dealers: int = MAX_MEMBERS) -> dict[int, bytes]:
    """Dealer -> the revealed private key, each still to be checked against the sender's KEYS
    frame; more dealers than `max_dealers` (the round's) are refused before any is parsed."""
    p = frame.payload
    count = _counted(frame, 0, _COMPLAINED)
    if count > max_dealers:
        raise BadMessage(frame.sender, f"COMPLAINT names {count} dealers, the round has {max_dealers}")
    revealed = {_index(p[at : at + 2]): p[at + 2 : at + _COMPLAINED] for at in range(2, len(p), _COMPLAINED)}
    if len(revealed) != count:
        raise BadMessage(frame.sender, "COMPLAINT names a dealer twice")
    return revealed
