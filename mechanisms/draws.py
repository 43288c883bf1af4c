"""Exact random draws from a `RandomStream`: the only randomness the mechanisms use.

Every draw starts from keystream words (32 or 64 uniform bits each) and turns them into values
whose law is known exactly: integer comparisons against integer thresholds (Bernoullis whose
probability is a known dyadic fraction), grid uniforms (an integer times a power of 2, exact in
float32), and U*, a uniform real rounded down to a float64 (`round_down_uniform_`). Mechanisms
work block by block (`BLOCK` coordinates): draw a block's words, transform them while they are in
the cache, write the block's output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import torch

from .base import scratch
from .randomness import RandomStream

# Coordinates per block: a block's float32 buffers are 256 kB, so the few a mechanism keeps stay in
# the 1-2 MB L2 cache of one core while it is transformed.
BLOCK = 1 << 16
WORD = 1 << 32


def blocks(n: int, size: int = BLOCK) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive blocks covering range(n)."""
    return ((lo, min(n, lo + size)) for lo in range(0, n, size))


def words32(stream: RandomStream, n: int, slot: int = 0) -> torch.Tensor:
    """n uniform int32 words (every value in [-2^31, 2^31) with probability 2^-32), in a reused
    per-thread buffer (`slot` tells a caller's buffers apart)."""
    return stream.fill_(scratch(n, torch.int32, slot))


def words64(stream: RandomStream, n: int, slot: int = 0) -> torch.Tensor:
    """n uniform int64 words, in a reused per-thread buffer (`slot` tells a caller's buffers apart)."""
    return stream.fill_(scratch(n, torch.int64, slot))


def bits63_(out: torch.Tensor, stream: RandomStream) -> torch.Tensor:
    """out (int64) <- 63 uniform random bits per element (a non-negative int64)."""
    return stream.fill_(out).bitwise_and_(_LOW63)


_LOW63 = torch.tensor((1 << 63) - 1)
_EXPONENT_MASK = torch.tensor(0x7FF0000000000000)  # the exponent field of a float64 (0-dim
_MANTISSA_MASK = torch.tensor((1 << 52) - 1)  # tensors: a Python int operand is slower)
_FIFTY_TWO = torch.tensor(52)
_SHIFTS = [torch.tensor(k) for k in range(64)]
_SCALES = [torch.tensor(2.0**-k, dtype=torch.float64) for k in range(64)]
# A U* whose binade draw came out 0 (R below 2^-bits) is drawn again one level down; below
# 2^-1022 (where U* is no longer exact) nothing needs it: -ln U* > 708 either way.
_NORMAL_MIN = 2.0**-1022
_MAX_DEPTH = 40  # the levels below the first have 53 bits each: 2^-2120, far below 2^-1022
# Beyond this -ln U* the sampler's U* is no longer the exact rounding of its real uniform
# (subnormals): U* < 2^-1022 happens with probability 2^-1022.
TAIL_EXPONENT = 1022.0 * math.log(2.0)


def round_down_uniform_(
    out: torch.Tensor,
    bits: torch.Tensor,
    extra: torch.Tensor,
    extra_bits: int,
    stream: RandomStream,
    depth: int = 0,
) -> torch.Tensor:
    """out (float64) <- U*, a uniform real R on (0, 1) rounded DOWN to a float64 (Mironov 2012's
    U*: each double d with probability next(d) - d).

    `bits` (int64) holds 63 random bits (`bits63_`): its low 52 become the significand, its top 11
    and the `extra_bits` (<= 42) random bits in the low end of `extra` (int64, independent of
    `bits`) form an integer h of 11 + extra_bits bits; h 2^-(11 + extra_bits), a uniform on that
    grid, has the binade of R: [2^-j, 2^(1-j)) with probability 2^-j. Both buffers are used as
    scratch. h = 0 (R below the grid, probability 2^-(11 + extra_bits)) is drawn again one level
    down (R = 2^-(11 + extra_bits) R'), from fresh draws.

    U* has relative spacing 2^-52 in every binade: U* <= R < U* (1 + 2^-52), so -ln U* is within
    2^-52 of the exact -ln R (down to 2^-1022). Randomness: only `stream`.
    """
    grid = 11 + extra_bits
    ob = out.view(torch.int64)
    torch.bitwise_right_shift(bits, _FIFTY_TWO, out=ob)
    extra.bitwise_or_(ob.bitwise_left_shift_(_SHIFTS[extra_bits]))  # h < 2^53: exact as a float64
    out.copy_(extra).mul_(_SCALES[grid])  # h 2^-grid: exact
    ob.bitwise_and_(_EXPONENT_MASK).bitwise_or_(bits.bitwise_and_(_MANTISSA_MASK))
    if out.numel() and float(out.amin()) < _NORMAL_MIN:  # h = 0 somewhere
        redraw_below_grid_(out, grid, stream, depth)
    return out


def redraw_below_grid_(out: torch.Tensor, grid: int, stream: RandomStream, depth: int = 0) -> torch.Tensor:
    """The second part of `round_down_uniform_`: each U* of `out` below 2^-1022 (its h was 0:
    R below the 2^-grid grid) drawn again one level down, from fresh draws (two words each, in
    the order of the coordinates), R = 2^-grid R'. Up to `_MAX_DEPTH` levels."""
    if depth >= _MAX_DEPTH:
        return out
    idx = torch.nonzero(out < _NORMAL_MIN).view(-1)
    k = idx.numel()
    more = bits63_(torch.empty(k, dtype=torch.int64), stream)
    deeper = round_down_uniform_(
        torch.empty(k, dtype=torch.float64),
        bits63_(torch.empty(k, dtype=torch.int64), stream),
        more.bitwise_right_shift_(21),
        42,
        stream,
        depth + 1,
    )
    out[idx] = deeper.mul_(2.0**-grid)  # exact while normal
    return out


# ---------------------------------------------------------------------------------------------
# Exact probabilities: e^eps bounded from below, and thresholds on int32 words.


def exp_lower(epsilon: float) -> Fraction:
    """A rational number <= e^epsilon (math.exp is within 1 ulp; two ulps down is below it)."""
    return Fraction(math.nextafter(math.nextafter(math.exp(epsilon), 0.0), 0.0))


def float32_count_below(threshold: float) -> int:
    """How many int32 words w have float32(w) < threshold (float32 rounds to nearest, ties to
    even: the conversion torch applies to an int32 tensor in float32 arithmetic)."""
    t = np.float32(threshold)
    if t <= np.float32(-(2.0**31)):
        return 0
    if t > np.float32(2.0**31):
        return WORD
    centre = int(t)
    window = np.arange(max(centre - 512, -(2**31)), min(centre + 512, 2**31), dtype=np.int64)
    above = np.nonzero(window.astype(np.float32) >= t)[0]
    first = int(window[above[0]]) if above.size else 2**31  # the smallest w with float32(w) >= t
    return first + 2**31


def float32_threshold(count: int) -> tuple[float, int]:
    """(T, c): the smallest float32 T with c = float32_count_below(T) >= count, so that for a
    uniform int32 word w, P[float32(w) - T < 0] = c / 2^32 exactly (the difference of two float32
    values rounds to 0 only when they are equal, and keeps its sign otherwise)."""
    if not 0 <= count <= WORD:
        raise ValueError(f"count must lie in [0, 2^32], got {count}")
    if count == 0:  # no word is below -2^31
        return -(2.0**31), 0
    t = np.float32(count - 2**31)
    while float32_count_below(float(t)) < count:
        t = np.nextafter(t, np.float32(np.inf))
    while True:
        lower = np.nextafter(t, np.float32(-np.inf))
        if float32_count_below(float(lower)) < count:
            break
        t = lower
    return float(t), float32_count_below(float(t))
