"""One member's input to a round, and the round's result from the aggregate (before masking and
after unmasking: `masks` adds and removes what hides the input; the arithmetic here is the same
in `swarm simulate` and in a swarm).

encode: residues = (round(scale x gradient_sum) + N_Z(0, sigma^2 / h)) mod 2^bits, the rounding's
uniforms from one ChaCha20 stream and the noise from another (`mechanisms.randomness`: secret in a
peer, seeded only in a simulation that says so). decode: the sum of every member's residues mod
2^bits, lifted to [-2^(bits-1), 2^(bits-1)) and divided by scale x records, is the noisy mean
clipped gradient of the union.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from mechanisms.randomness import RandomStream

from .policy import SecAggPolicy
from .quantize import TAIL_SIGMAS, add_mod, centered, stochastic_round, wrap

Ints = npt.NDArray[np.int64]


def encode(
    policy: SecAggPolicy,
    gradient_sum: npt.NDArray[np.float64],
    rounding: RandomStream,
    noise: RandomStream,
    *,
    add_noise: bool = True,
) -> Ints:
    """The member's residues mod 2^bits. `add_noise` False is what a member that skips its noise
    sends (the guarantee then rests on the others: `SecAggPolicy.dropout_fraction`)."""
    gradient_sum = np.asarray(gradient_sum, dtype=np.float64)
    if gradient_sum.shape != (policy.dim,):
        raise ValueError(f"a member's gradient sum has {policy.dim} coordinates, got shape {gradient_sum.shape}")
    rounded = stochastic_round(gradient_sum * policy.scale, rounding)
    if add_noise:
        rounded = rounded + policy.local_noise.sample(policy.dim, noise)
    return wrap(rounded, policy.bits)


def sum_residues(residues: list[Ints], bits: int) -> Ints:
    """The members' residues added mod 2^bits."""
    if not residues:
        raise ValueError("no residues to sum")
    total = wrap(residues[0], bits)
    for r in residues[1:]:
        total = add_mod(total, r, bits)
    return total


def decode(policy: SecAggPolicy, total: Ints, records: int) -> npt.NDArray[np.float64]:
    """The noisy mean clipped gradient from the aggregate of `records` records."""
    if records < 1:
        raise ValueError(f"records must be >= 1, got {records}")
    return centered(total, policy.bits).astype(np.float64) / (policy.scale * records)


def norm_bound(policy: SecAggPolicy, records: int, members: int) -> float:
    """An l2 norm that the centered aggregate of `members` honest members holding `records`
    records in all does not reach but in a negligible tail: their clipped sums (records x clip x
    scale), one rounding per member (< sqrt(dim) each), and the summed noise, at most its standard
    deviation x (sqrt(dim) + TAIL_SIGMAS) (the norm of a Gaussian vector passes that with
    probability below exp(-TAIL_SIGMAS^2 / 2); the discrete Gaussian is sub-Gaussian with the
    same parameter, Canonne, Kamath and Steinke 2020)."""
    if records < 1 or members < 1:
        raise ValueError("records and members must be >= 1")
    noise_std = math.sqrt(members * policy.local_noise.variance)
    root = math.sqrt(policy.dim)
    return records * policy.clip * policy.scale + members * root + noise_std * (root + TAIL_SIGMAS)


def within_norm_bound(policy: SecAggPolicy, total: Ints, records: int, members: int) -> bool:
    """Whether an unmasked aggregate could have come from honest members (`norm_bound`): what
    replaces a robust aggregation rule, which cannot run on masked vectors. A member sending
    arbitrary residues can still move the sum anywhere inside this ball, but no further."""
    lifted = centered(total, policy.bits).astype(np.float64)
    return float(np.linalg.norm(lifted)) <= norm_bound(policy, records, members)
