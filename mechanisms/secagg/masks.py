"""Masks that hide a member's residues and cancel in the sum (Bonawitz et al., CCS 2017).

Member u (index in the round's ordered member list) sends
    y_u = x_u + PRG(b_u) + sum over v != u of sign(u, v) PRG(s_uv)   (mod 2^bits),
sign(u, v) = +1 if u < v else -1, so every pairwise mask appears once with each sign and the
pairwise masks of any two members who both send cancel exactly in the sum. b_u is a fresh 32-byte
self-mask seed; s_uv = s_vu is agreed by X25519 between u's and v's mask keys and stretched by
HKDF-SHA256 to 32 bytes, bound to the session (swarm and round) and the ordered pair. PRG is
ChaCha20 keyed with the full 32-byte seed, counter 0 and a 96-bit nonce per purpose (the
construction of `mechanisms.randomness.RandomStream`): no folding of the seed into a 32-bit
generator.

Unmasking the sum of the members S whose vectors arrived: subtract PRG(b_u) for u in S (b_u
rebuilt from shares) and, for each member v that dropped after the keys were fixed, add back
sign(u, v) PRG(s_uv) for u in S (s_uv rebuilt from v's reconstructed mask key and u's public key).
For a member in S the pairwise seeds are never revealed, so its y_u stays masked.

Speed: a mask is drawn as 32-bit words when bits <= 32 (64-bit otherwise, reinterpreted as int64:
the same residue mod 2^64), low `bits` bits kept, and the masks of a vector are accumulated in
int64 without a reduction per term: 2^bits divides 2^64, so one final `wrap` gives the residue mod
2^bits even after int64 wrap-around. (Adding uint64 words to int64 would go through float64 and
lose the low bits.)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from .quantize import check_bits, wrap

Ints = npt.NDArray[np.int64]
SEED_BYTES = 32
SESSION_BYTES = 32


def session_id(swarm: bytes, round_number: int, *, chain_id: int, ledger: bytes) -> bytes:
    """What binds every seed and message to one swarm (its genesis digest), one deployment of its
    ledger (the chain's id and the contract's 20-byte address: two deployments of one genesis
    share no session) and one round."""
    if len(ledger) != 20 or not 0 <= chain_id < 2**256:
        raise ValueError("a session needs a 20-byte ledger address and a chain id in 0..2^256 - 1")
    return hashlib.sha256(
        b"secagg session"
        + hashlib.sha256(swarm).digest()
        + chain_id.to_bytes(32, "big")
        + ledger
        + round_number.to_bytes(8, "big")
    ).digest()


@dataclass(frozen=True)
class MaskKey:
    """An X25519 key pair (the mask key, whose private half is Shamir-shared, or the key that
    encrypts shares to their holders)."""

    private: bytes

    @classmethod
    def generate(cls) -> MaskKey:
        return cls(X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))

    @property
    def public(self) -> bytes:
        return self.loaded().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def loaded(self) -> X25519PrivateKey:
        """The key object (loading costs as much as one agreement: load once for many)."""
        return X25519PrivateKey.from_private_bytes(self.private)


def pair_seed(private: bytes, peer_public: bytes, session: bytes, u: int, v: int) -> bytes:
    """s_uv: X25519(private, peer_public) through HKDF-SHA256, bound to the session and the
    unordered pair {u, v} (both ends derive the same 32 bytes)."""
    return _pair_seed(X25519PrivateKey.from_private_bytes(private), peer_public, session, u, v)


def _pair_seed(key: X25519PrivateKey, peer_public: bytes, session: bytes, u: int, v: int) -> bytes:
    shared = key.exchange(X25519PublicKey.from_public_bytes(peer_public))
    lo, hi = sorted((u, v))
    info = b"secagg pair mask" + session + lo.to_bytes(4, "big") + hi.to_bytes(4, "big")
    return HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=None, info=info).derive(shared)


_NONCES = {p: hashlib.blake2b(f"secagg {p}".encode(), digest_size=12).digest() for p in ("self", "pair")}


def _words(seed: bytes, dim: int, bits: int, purpose: str) -> npt.NDArray[np.uint32] | npt.NDArray[np.int64]:
    """dim uniform words from ChaCha20 keyed with `seed`: unsigned 32-bit if bits <= 32, else
    64-bit read as int64 (two's complement: the same residue mod 2^64, and int64 + int64 stays in
    integers where int64 + uint64 would be computed in float64)."""
    dtype = np.dtype("<u4") if bits <= 32 else np.dtype("<i8")
    out = np.empty(dim, dtype=dtype)
    encryptor = Cipher(algorithms.ChaCha20(seed, bytes(4) + _NONCES[purpose]), mode=None).encryptor()
    encryptor.update_into(bytes(out.nbytes), out.data.cast("B"))
    return out


def expand(seed: bytes, dim: int, bits: int, purpose: str) -> Ints:
    """dim uniform residues mod 2^bits from ChaCha20 keyed with `seed` (32 bytes)."""
    check_bits(bits)
    return wrap(_words(seed, dim, bits, purpose).astype(np.int64), bits)


def new_self_seed() -> bytes:
    return os.urandom(SEED_BYTES)


class MaskSum:
    """An int64 accumulator of masks mod 2^bits: add or subtract PRG expansions, wrap once."""

    def __init__(self, start: Ints, bits: int) -> None:
        self.bits = check_bits(bits)
        self.total = np.array(start, dtype=np.int64, copy=True)

    def add(self, seed: bytes, purpose: str, sign: int) -> None:
        words = _words(seed, len(self.total), self.bits, purpose)
        if sign > 0:
            np.add(self.total, words, out=self.total)
        else:
            np.subtract(self.total, words, out=self.total)

    def residues(self) -> Ints:
        return wrap(self.total, self.bits)


def mask(
    residues: Ints,
    member: int,
    mask_key: MaskKey,
    publics: Mapping[int, bytes],
    self_seed: bytes,
    session: bytes,
    bits: int,
) -> Ints:
    """y_u: `residues` under the self-mask and one pairwise mask per other member of `publics`
    (member index -> X25519 public key, the round's key set; `member` itself is skipped)."""
    total = MaskSum(residues, bits)
    total.add(self_seed, "self", +1)
    key = mask_key.loaded()
    for v, public in publics.items():
        if v != member:
            total.add(_pair_seed(key, public, session, member, v), "pair", +1 if member < v else -1)
    return total.residues()


def unmask(
    masked: Mapping[int, Ints],
    self_seeds: Mapping[int, bytes],
    dropped_keys: Mapping[int, MaskKey],
    publics: Mapping[int, bytes],
    session: bytes,
    bits: int,
) -> Ints:
    """The sum of the residues of the members in `masked` (their y_u), given their self-mask
    seeds and the reconstructed mask keys of the members that had keys in `publics` but sent no
    vector (`dropped_keys`)."""
    survivors = sorted(masked)
    if not survivors:
        raise ValueError("no masked vector to unmask")
    if set(self_seeds) != set(survivors):
        raise ValueError("need the self-mask seed of every member whose vector is summed, and no other")
    if set(dropped_keys) & set(survivors) or not set(dropped_keys) <= set(publics) - set(survivors):
        raise ValueError("dropped members are those with keys and no vector")
    if set(publics) - set(survivors) - set(dropped_keys):
        raise ValueError("every member with keys and no vector needs its reconstructed mask key")
    total = MaskSum(_sum(masked[u] for u in survivors), bits)
    for u in survivors:
        total.add(self_seeds[u], "self", -1)
    for v, dropped in dropped_keys.items():
        key = dropped.loaded()
        for u in survivors:
            # u added +PRG(s_uv) when u < v: take it away, else give back what u took
            total.add(_pair_seed(key, publics[u], session, u, v), "pair", -1 if u < v else +1)
    return total.residues()


def _sum(vectors: Iterable[Ints]) -> Ints:
    """The int64 sum of residues below 2^62 (exact mod 2^bits after a wrap, whatever the count)."""
    total: Ints | None = None
    for y in vectors:
        total = np.array(y, dtype=np.int64, copy=True) if total is None else np.add(total, y, out=total)
    if total is None:
        raise ValueError("nothing to sum")
    return total


def check_key_matches(key: MaskKey, public: bytes) -> bool:
    """Whether a reconstructed mask key is the one whose public half the member advertised."""
    return key.public == public
