"""From a member's float gradient sum to integers modulo 2^bits, and back from the aggregate.

`stochastic_round(t, stream)` returns ceil(t' - U / 2^32) per coordinate, with t' = floor(t 2^32) / 2^32
(t on a 2^-32 grid, exactly: scaling a float64 by a power of two and flooring are exact) and U a
uniform 32-bit integer from the stream: floor(t') or floor(t') + 1, the latter with probability
frac(t') (unbiased to 2^-32). All of it in int64 arithmetic on t' 2^32 and U.

Why this form: with the same U, rounding is monotone and moves every coordinate by less than one,
so for two inputs t, t' the rounded difference d satisfies |d_i - (t'_i - t_i)| < 1 + 2^-32, and
||d||_2 < ||t' - t||_2 + sqrt(dim) (1 + 2^-32). Rounding is a mixture over U of such
deterministic maps, and Renyi divergence is jointly quasi-convex, so the noisy rounded sum is as
private as a noisy sum whose sensitivity is that bound (`rounded_sensitivity`). Nothing here
needs the conditional rounding of Kairouz, Liu and Steinke (2021): the bound is deterministic.

`wrap` maps integers into Z_{2^bits} (stored as int64 in [0, 2^bits)); `centered` lifts a sum
back to [-2^(bits-1), 2^(bits-1)). No information is lost when the true sum lies in that range:
`scale_for` picks the scale so that it does, except for a noise tail of `TAIL_SIGMAS` standard
deviations (a wrap there harms the model, never the privacy: the sum is post-processed).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import torch

from mechanisms.randomness import RandomStream

Ints = npt.NDArray[np.int64]
FRACTION_BITS = 32
MAX_BITS = 62  # the sum of a few members' residues stays inside int64
MAX_INPUT = float(1 << 30)  # |t| below this: t 2^32 < 2^62
TAIL_SIGMAS = 12.0  # noise beyond this many standard deviations may wrap (probability ~ 1e-32 a coordinate)


def check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 8 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in [8, {MAX_BITS}], got {bits!r}")
    return bits


def stochastic_round(t: npt.NDArray[np.float64], stream: RandomStream) -> Ints:
    """Unbiased randomized rounding of each coordinate of `t` (float64, |t| < 2^30) to an integer:
    ceil(t' - U / 2^32), as the module docstring says."""
    t = np.asarray(t, dtype=np.float64)
    if t.size and not (np.isfinite(t).all() and float(np.abs(t).max()) < MAX_INPUT):
        raise ValueError(f"stochastic_round takes finite values below 2^30 in magnitude, got max {np.abs(t).max()}")
    fixed = np.floor(t * float(1 << FRACTION_BITS)).astype(np.int64)  # exact: a power-of-two scaling
    u = stream.fill_(torch.empty(t.size, dtype=torch.int64)).numpy() & np.int64((1 << FRACTION_BITS) - 1)
    # ceil(x / 2^32) = -floor(-x / 2^32), with an arithmetic shift for the floor
    return -((u.reshape(t.shape) - fixed) >> FRACTION_BITS)


def rounded_sensitivity(sensitivity: float, dim: int) -> float:
    """The l2 sensitivity of the rounded vector given that of the scaled float vector (see the
    module docstring): sensitivity + sqrt(dim) (1 + 2^-32), rounded up."""
    return math.nextafter(sensitivity + math.sqrt(dim) * (1 + 2.0**-FRACTION_BITS), math.inf)


def wrap(x: Ints, bits: int) -> Ints:
    """x modulo 2^bits, in [0, 2^bits)."""
    return np.bitwise_and(np.asarray(x, dtype=np.int64), np.int64((1 << check_bits(bits)) - 1))


def add_mod(a: Ints, b: Ints, bits: int) -> Ints:
    return wrap(np.asarray(a, dtype=np.int64) + np.asarray(b, dtype=np.int64), bits)


def sub_mod(a: Ints, b: Ints, bits: int) -> Ints:
    return wrap(np.asarray(a, dtype=np.int64) - np.asarray(b, dtype=np.int64), bits)


def centered(x: Ints, bits: int) -> Ints:
    """The representative of x (mod 2^bits) in [-2^(bits-1), 2^(bits-1))."""
    x = wrap(x, bits)
    half = np.int64(1 << (bits - 1))
    return np.where(x >= half, x - np.int64(1 << bits), x)


def scale_for(bits: int, max_records: int, clip: float, noise_std_per_unit: float, dim: int) -> float:
    """The largest power-of-two multiple s of 1/clip (so that s clip = 2^k) for which the aggregate
    of `max_records` clipped gradients, plus rounding, plus noise out to TAIL_SIGMAS standard
    deviations, stays inside [-2^(bits-1), 2^(bits-1)), coordinate by coordinate.

    A coordinate of the sum is at most max_records x s clip (each clipped gradient's coordinate
    is at most clip), each member's rounding adds less than 1 (at most max_records members), and
    the noise's standard deviation is noise_std_per_unit x (the rounded sensitivity at scale s),
    where noise_std_per_unit is sigma / sensitivity (the noise multiplier)."""
    check_bits(bits)
    if max_records < 1 or not clip > 0 or not noise_std_per_unit > 0 or dim < 1:
        raise ValueError("scale_for needs max_records >= 1, clip > 0, noise_std_per_unit > 0, dim >= 1")
    for k in range(bits - 1, -1, -1):
        units = float(1 << k)  # s clip
        if sum_mod_fits(bits, max_records, units, noise_std_per_unit * rounded_sensitivity(2 * units, dim)):
            return units / clip
    raise ValueError(f"{bits} bits cannot hold a sum of {max_records} records with this noise")


def sum_mod_fits(bits: int, max_records: int, units: float, noise_std: float) -> bool:
    """Whether max_records gradients of `units` per coordinate at most, one rounding (< 1) per
    record at most, and TAIL_SIGMAS x noise_std stay inside [-2^(bits-1), 2^(bits-1)), each
    member's own sum staying below MAX_INPUT."""
    total = max_records * units + max_records + TAIL_SIGMAS * noise_std
    return total < float(1 << (bits - 1)) and max_records * units < MAX_INPUT
