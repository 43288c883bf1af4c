"""Masks that hide a member's residues and cancel in the sum (Bonawitz et al., CCS 2017).

Member u (index in the round's ordered member list) sends
    y_u = x_u + PRG(b_u) + sum over v != u of sign(u, v) PRG(s_uv)   (mod 2^bits),
sign(u, v) = +1 if u < v else -1, so every pairwise mask appears once with each sign and the
pairwise masks of any two members who both send cancel exactly in the sum. b_u is a fresh 32-byte
self-mask seed; s_uv = s_vu is agreed by X25519 between u's and v's mask keys and stretched by
HKDF-SHA256 to 32 bytes, bound to the session (swarm and round) and the ordered pair. PRG is
ChaCha20 keyed with the full 32-byte seed (`mechanisms.randomness.RandomStream`), one nonce per
purpose: no folding of the seed into a 32-bit generator.

Unmasking the sum of the members S whose vectors arrived: subtract PRG(b_u) for u in S (b_u
rebuilt from shares) and, for each member v that dropped after the keys were fixed, add back
sign(u, v) PRG(s_uv) for u in S (s_uv rebuilt from v's reconstructed mask key and u's public key).
For a member in S the pairwise seeds are never revealed, so its y_u stays masked.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from mechanisms.randomness import RandomStream

from .quantize import add_mod, check_bits, sub_mod, wrap

Ints = npt.NDArray[np.int64]
SEED_BYTES = 32
SESSION_BYTES = 32


def session_id(swarm: bytes, round_number: int) -> bytes:
    """What binds every seed and message to one swarm (its genesis digest) and one round."""
    return hashlib.sha256(b"secagg session" + swarm + round_number.to_bytes(8, "big")).digest()


@dataclass(frozen=True)
class MaskKey:
    """A member's X25519 key pair for pairwise masks (the private half is Shamir-shared)."""

    private: bytes

    @classmethod
    def generate(cls) -> MaskKey:
        return cls(X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()))

    @property
    def public(self) -> bytes:
        key = X25519PrivateKey.from_private_bytes(self.private)
        return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def pair_seed(private: bytes, peer_public: bytes, session: bytes, u: int, v: int) -> bytes:
    """s_uv: X25519(private, peer_public) through HKDF-SHA256, bound to the session and the
    unordered pair {u, v} (both ends derive the same 32 bytes)."""
    shared = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    lo, hi = sorted((u, v))
    info = b"secagg pair mask" + session + lo.to_bytes(4, "big") + hi.to_bytes(4, "big")
    return HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=None, info=info).derive(shared)


def expand(seed: bytes, dim: int, bits: int, purpose: str) -> Ints:
    """dim uniform residues mod 2^bits from ChaCha20 keyed with `seed` (32 bytes)."""
    check_bits(bits)
    words = RandomStream(seed, f"secagg {purpose}").fill_(torch.empty(dim, dtype=torch.int64)).numpy()
    return wrap(words, bits)


def new_self_seed() -> bytes:
    return os.urandom(SEED_BYTES)


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
    dim = len(residues)
    y = add_mod(residues, expand(self_seed, dim, bits, "self"), bits)
    for v, public in publics.items():
        if v == member:
            continue
        pairwise = expand(pair_seed(mask_key.private, public, session, member, v), dim, bits, "pair")
        y = add_mod(y, pairwise, bits) if member < v else sub_mod(y, pairwise, bits)
    return y


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
    if set(self_seeds) != set(survivors):
        raise ValueError("need the self-mask seed of every member whose vector is summed, and no other")
    if set(dropped_keys) & set(survivors) or not set(dropped_keys) <= set(publics) - set(survivors):
        raise ValueError("dropped members are those with keys and no vector")
    if set(publics) - set(survivors) - set(dropped_keys):
        raise ValueError("every member with keys and no vector needs its reconstructed mask key")
    dim = len(masked[survivors[0]])
    total = np.zeros(dim, dtype=np.int64)
    for u in survivors:
        total = add_mod(total, masked[u], bits)
        total = sub_mod(total, expand(self_seeds[u], dim, bits, "self"), bits)
    for v, key in dropped_keys.items():
        for u in survivors:
            pairwise = expand(pair_seed(key.private, publics[u], session, u, v), dim, bits, "pair")
            # u added +PRG(s_uv) when u < v: take it away, else give back what u took
            total = sub_mod(total, pairwise, bits) if u < v else add_mod(total, pairwise, bits)
    return total


def check_key_matches(key: MaskKey, public: bytes) -> bool:
    """Whether a reconstructed mask key is the one whose public half the member advertised."""
    return key.public == public
