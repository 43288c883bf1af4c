"""Where every draw a privacy guarantee rests on comes from: ChaCha20 keystreams.

A guarantee holds only if nobody can reproduce or predict the noise: anyone who can re-draw it
subtracts it. So every such draw (a mechanism's noise and coordinate sampling, DP-SGD's noise, its
Poisson batches and its augmentation) comes from a `PrivacyGenerator`: ChaCha20 (RFC 8439; the
`cryptography` package, i.e. OpenSSL) keyed with 32 bytes from the OS (`os.urandom`), a fresh key
per release (`secret_generator()`), never stored, logged or derived from anything public.

Why not torch's CPU generator: it is an MT19937, which is not a CSPRNG. Its state is a linear
function of its outputs, so an observer who knows a few hundred outputs (one PNPM release of a
known update is plenty) solves for the state and then predicts every draw, backwards as well as
forwards, whatever seeded it. ChaCha20's keystream reveals nothing about its key or its other
blocks.

One key, one stream per purpose (`PURPOSES`, each its own 96-bit ChaCha20 nonce): the mechanism's
draws never share keystream with DP-SGD's noise, its Poisson masks or its augmentation, so what
one of them exposes says nothing about another. Each stream hands out fresh bytes in order, never
the same bytes twice.

`seeded_generator(seed)` derives the key from a public seed instead: reproducible, and so public.
Only a simulation or a test may use it, and it must say so (its noise can be re-drawn by anyone).
"""

from __future__ import annotations

import hashlib
import os
import threading

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

PURPOSES = ("mechanism", "dpsgd-noise", "poisson", "augment")
KEY_BYTES = 32
# ChaCha20's block counter is 32 bits: 2^32 blocks of 64 bytes per (key, nonce) before it would
# wrap. A release draws a few hundred MB at most; refuse long before the counter could wrap.
MAX_STREAM_BYTES = 1 << 37
_ZEROS = threading.local()


def _zeros(size: int) -> bytes:
    """`size` zero bytes (cached per thread): the keystream is ChaCha20's encryption of zeros."""
    cache: dict[int, bytes] | None = getattr(_ZEROS, "cache", None)
    if cache is None:
        cache = _ZEROS.cache = {}
    zeros = cache.get(size)
    if zeros is None:
        if len(cache) > 16:
            cache.clear()
        zeros = cache[size] = bytes(size)
    return zeros


class RandomStream:
    """One ChaCha20 keystream: uniform random bytes, handed out in order, each once."""

    __slots__ = ("_encryptor", "purpose", "drawn")

    def __init__(self, key: bytes, purpose: str) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a stream key is {KEY_BYTES} bytes, got {len(key)}")
        # cryptography's 16-byte ChaCha20 nonce: a 32-bit little-endian block counter (0), then
        # the 96-bit nonce, here the purpose's own
        nonce = bytes(4) + hashlib.blake2b(purpose.encode(), digest_size=12).digest()
        self._encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
        self.purpose = purpose
        self.drawn = 0

    def fill_(self, out: torch.Tensor) -> torch.Tensor:
        """Overwrite the bytes of `out` (a contiguous CPU tensor) with the next keystream bytes:
        every bit uniform and independent of every other draw."""
        if out.device.type != "cpu" or not out.is_contiguous():
            raise ValueError("a keystream fills contiguous CPU tensors only")
        size = out.nbytes
        if size == 0:
            return out
        self.drawn += size
        if self.drawn > MAX_STREAM_BYTES:
            raise RuntimeError(f"more than {MAX_STREAM_BYTES} bytes from one {self.purpose} stream")
        # the tensor's own bytes (a flat byte view of its memory: a few us per call, paid per block)
        array = (out.detach() if out.requires_grad else out).numpy()
        self._encryptor.update_into(_zeros(size), array.reshape(-1).data.cast("B"))
        return out

    def below(self, bound: int) -> int:
        """A uniform integer in [0, bound), exactly (rejection from 64-bit words)."""
        if not 0 < bound <= 1 << 63:
            raise ValueError(f"bound must lie in [1, 2^63], got {bound}")
        limit = (1 << 64) - (1 << 64) % bound  # accept words below a multiple of bound
        word = torch.empty(1, dtype=torch.int64)
        while True:
            value = int(self.fill_(word)[0]) & ((1 << 64) - 1)
            if value < limit:
                return value % bound

    def __repr__(self) -> str:  # never the key
        return f"RandomStream({self.purpose!r}, {self.drawn} bytes drawn)"


class PrivacyGenerator:
    """The draws of one release: one ChaCha20 stream per purpose under one key.

    `mechanism` feeds `Mechanism.perturb`, `dpsgd_noise` DP-SGD's Gaussian noise, `poisson` its
    Poisson batches, `augment` its crops and flips. `secret` says whether the key came from the OS
    (a real release) or from a public seed (a simulation or a test: reproducible by anyone)."""

    __slots__ = ("secret", "mechanism", "dpsgd_noise", "poisson", "augment")

    def __init__(self, key: bytes, *, secret: bool) -> None:
        self.secret = secret
        self.mechanism, self.dpsgd_noise, self.poisson, self.augment = (RandomStream(key, p) for p in PURPOSES)

    def __repr__(self) -> str:
        return f"PrivacyGenerator({'secret' if self.secret else 'seeded: public'})"


def secret_generator() -> PrivacyGenerator:
    """Fresh ChaCha20 streams keyed from the OS CSPRNG: for every draw a privacy guarantee rests
    on. Make one per release; never store, log or derive anything from it."""
    return PrivacyGenerator(os.urandom(KEY_BYTES), secret=True)


def seeded_generator(seed: int) -> PrivacyGenerator:
    """Streams keyed from a public seed (SHA-256 of it): reproducible, so NOT private. For a
    simulation that says its noise is reproducible, an audit, a benchmark or a test."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return PrivacyGenerator(hashlib.sha256(f"public seed {seed}".encode()).digest(), secret=False)


def mechanism_stream(generator: PrivacyGenerator | None) -> RandomStream:
    """The stream a mechanism draws from: the generator's, or a fresh secret one when none is given."""
    return (generator if generator is not None else secret_generator()).mechanism
