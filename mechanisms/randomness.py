"""Where the draws a privacy guarantee rests on come from.

A guarantee holds only if nobody can reproduce the noise: anyone who can re-draw it subtracts
it. So every such draw (mechanism noise, coordinate sampling, DP-SGD noise and its Poisson
batches) must come from `secret_generator()`, never from a seed derived from anything public.

Why not `torch.Generator().manual_seed(secrets.randbits(64))`: torch's CPU generator is an
MT19937 whose `manual_seed` keeps only the low 32 bits of the seed (seeds k and k + 2^32 give
the same stream), and 2^32 candidate seeds are few enough to try each one against a published
blob. `secret_generator` instead fills all 624 words of the MT19937 state (19,968 bits) from the
OS CSPRNG (`secrets`), records no seed (`initial_seed()` is 0), and keeps nothing anywhere: the
state lives only inside the generator object the caller holds for one release.
"""

from __future__ import annotations

import secrets
import struct

import torch

_MT_WORDS = 624
# torch's CPU generator state (CPUGeneratorImplState, 5056 bytes): the legacy THGeneratorState
# (u64 the_initial_seed, i32 left, i32 seeded, u64 next, u64 state[624], f64 normal_x, normal_y,
# normal_rho, i32 normal_is_valid + padding), then f32 next_float_normal_sample, bool valid + padding.
_HEADER = struct.Struct("<QiiQ")
_WORDS_AT = _HEADER.size
_AFTER_WORDS = _WORDS_AT + 8 * _MT_WORDS
_STATE_BYTES = 5056


def _check_layout(state: bytes) -> None:
    """Fail closed if this torch's generator state is not the layout written above."""
    probe = torch.Generator().manual_seed(12345).get_state()
    seed, left, seeded, nxt = _HEADER.unpack_from(bytes(probe.tolist()))
    if len(state) != _STATE_BYTES or (seed, left, seeded, nxt) != (12345, 1, 1, 0):
        raise RuntimeError(
            f"torch {torch.__version__}: unexpected CPU generator state layout ({len(state)} bytes, header "
            f"{(seed, left, seeded, nxt)}); refusing to draw privacy noise from a generator that cannot be "
            "seeded from the OS CSPRNG"
        )


def secret_generator() -> torch.Generator:
    """A CPU torch.Generator whose whole MT19937 state comes from the OS CSPRNG: for every draw a
    privacy guarantee rests on. Never store, log or derive anything from it; make a fresh one per
    release."""
    generator = torch.Generator()
    state = bytearray(bytes(generator.get_state().tolist()))
    _check_layout(bytes(state))
    # left = 1, next = 0: the first draw twists the whole random state before using it.
    _HEADER.pack_into(state, 0, 0, 1, 1, 0)
    words = secrets.token_bytes(4 * _MT_WORDS)
    for i in range(_MT_WORDS):
        struct.pack_into("<Q", state, _WORDS_AT + 8 * i, int.from_bytes(words[4 * i : 4 * i + 4], "little"))
    # No cached Gaussian sample from before: clear normal_is_valid and the float cache's flag.
    struct.pack_into("<ddd", state, _AFTER_WORDS, 0.0, 0.0, 0.0)
    struct.pack_into("<i", state, _AFTER_WORDS + 24, 0)
    struct.pack_into("<f?", state, _STATE_BYTES - 8, 0.0, False)
    generator.set_state(torch.tensor(list(state), dtype=torch.uint8))
    return generator
