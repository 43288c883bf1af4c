"""The Gaussian mechanism on a whole clipped update (scope "vector").

Calibration: the analytic Gaussian mechanism of Balle & Wang (ICML 2018), Theorem 8: adding
N(0, sigma^2) to a function of L2 sensitivity D is (eps, delta)-DP iff
    Phi(D/(2 sigma) - eps sigma/D) - e^eps Phi(-D/(2 sigma) - eps sigma/D) <= delta.
We solve that exact condition by bisection with math.erfc only. The classic
sigma = sqrt(2 ln(1.25/delta)) D / eps (Dwork & Roth, Thm A.1) is proven only for eps < 1 and is
offered for comparison there.

Neighbouring relation: LOCAL. The peer's update is clipped to L2 norm S and any two clipped
updates are neighbours, so the sensitivity is D = 2S. `noise_multiplier` z follows opacus'
convention sigma = z * S; the (eps, delta) stated are for D = 2S, i.e. a unit noise z/2.

Sampling: float64 Box-Muller on U* (`local.round_down_uniform_`, a uniform real rounded down to a
double: it reaches every binade), so the noise reaches 37.6 sigma. torch's float32 `normal_`
(24-bit uniforms) never goes past 5.77 sigma, and its float64 one past 8.57 sigma; a noise cut at
R sigma lets a shift of D sigmas be seen with probability Phi(D - R) in one coordinate (8.2e-5 at
5.77 sigma and z = 1, D = 2) and up to exp(-(R - D)^2/2) for a Box-Muller pair (8.3e-4).
`float_residual_delta` bounds what is left at 37.6 sigma; `guarantee` and
`accounting.cumulative_spend` add it to delta.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .base import (
    Guarantee,
    Mechanism,
    check_delta,
    check_epsilon,
    check_positive,
    check_tensor,
    interval_violation,
    scratch,
)
from .local import TAIL_EXPONENT, blocks, random_bits_, round_down_uniform_

_SQRT2 = math.sqrt(2.0)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / _SQRT2)


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """The smallest delta for which N(0, sigma^2) noise is (eps, delta)-DP (Balle & Wang, Thm 8)."""
    s = sigma / sensitivity
    first = _phi(1.0 / (2.0 * s) - epsilon * s)
    tail = _phi(-1.0 / (2.0 * s) - epsilon * s)
    second = math.exp(epsilon + math.log(tail)) if tail > 0.0 else 0.0
    return max(first - second, 0.0)


def _bisect_decreasing(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """Smallest x in [lo, hi] (to float precision) with f(x) <= target, f decreasing; returns the
    upper end of the final bracket so the answer is always on the safe side."""
    while f(hi) > target:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            raise ValueError("calibration diverged: parameters out of any useful range")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest sigma making the Gaussian mechanism (eps, delta)-DP, any eps > 0 (Balle & Wang 2018).
    Reference: eps 1, delta 1e-5 -> 3.731; eps 0.5 -> 7.032 (sensitivity 1)."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    sensitivity = check_positive(sensitivity, "sensitivity")
    unit = _bisect_decreasing(lambda s: analytic_gaussian_delta(s, epsilon), delta, 1e-6, 1.0)
    return unit * sensitivity


def analytic_gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest eps for which N(0, sigma^2) noise is (eps, delta)-DP (inverse of the above)."""
    sigma = check_positive(sigma, "sigma")
    delta = check_delta(delta)
    sensitivity = check_positive(sensitivity, "sensitivity")
    if analytic_gaussian_delta(sigma, 1e-12, sensitivity) <= delta:
        return 1e-12
    return _bisect_decreasing(lambda e: analytic_gaussian_delta(sigma, e, sensitivity), delta, 1e-12, 1.0)


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """sigma = sqrt(2 ln(1.25/delta)) * D / eps (Dwork & Roth 2014, Thm A.1): valid only for eps < 1."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    if epsilon >= 1.0:
        raise ValueError(
            f"epsilon must be < 1 for the classic Gaussian formula (got {epsilon!r}); use analytic_gaussian_sigma"
        )
    return math.sqrt(2.0 * math.log(1.25 / delta)) * check_positive(sensitivity, "sensitivity") / epsilon


# Beyond this radius (in sigmas) the sampler's radius is not the exact Box-Muller one: U* is the
# exact rounding of its real uniform only above 2^-1022 (sqrt(2 * 1022 ln 2) = 37.64, with a margin).
TAIL_RADIUS = math.sqrt(2.0 * TAIL_EXPONENT) * (1.0 - 2.0**-40)
# A release has at most 2^62 Box-Muller pairs (a tensor has fewer than 2^63 elements).
MAX_PAIRS = 2.0**62
# The largest finite radius (in sigmas) the sampler can draw at all: U* >= 2^-1074 (the smallest
# subnormal; below 2^-1022 with probability 2^-1022), sqrt(2 * 1074 ln 2) = 38.587, rounded up.
# (U* = 0, after 40 levels of redraws, would give an infinite value: refused as non-finite anyway.)
MAX_RADIUS = 38.6
# `l2_norm` is within ~1e-6 relative of the true norm (float32 rows of 256), so a clipped
# coordinate can exceed clip_norm by that much: the release check allows 2^-16 (1.5e-5).
CLIP_SLACK = 1.0 + 2.0**-16
# exp(-r^2/2) is convex in r^2 on [0, D^2] when r/D exceeds (3 + sqrt 5)/2 = 2.618.
_CONVEX_RATIO = 2.62


def float_residual_delta(sigma: float, sensitivity: float) -> float:
    """The delta the float64 sampler adds to the exact Gaussian mechanism's, per release.

    The sampler draws pairs of coordinates by Box-Muller from one radius r (in sigmas), exact
    (up to float rounding of the noise values) while r < R = TAIL_RADIUS and arbitrary beyond.
    For neighbours x, x' whose difference puts D_p (in sigmas, sum of D_p^2 <= D^2, D =
    sensitivity / sigma) on pair p, an output can be impossible from x', or come from an inexact
    draw, only if some pair with D_p > 0 has r >= R - D_p; outside that event both laws are the
    exact Gaussian's. So delta grows by at most sum_p P[r_p >= R - D_p] = sum_p exp(-(R - D_p)^2/2)
    (r^2/2 is exponential). That is convex in D_p^2 when R >= 2.62 D, so it is largest with all of
    D on one pair: exp(-(R - D)^2/2) + (pairs - 1) exp(-R^2/2); otherwise each term is at most
    exp(-(R - D)^2/2). Pairs <= MAX_PAIRS. Rounded up; 1 when D >= R.
    At z = 1 (D = 2): 1.5e-276. The same bound gives 8.3e-4 for torch's float32 normal_ (R = 5.77;
    the one-coordinate tail Phi(D - R) alone is 8.2e-5) and 4.2e-10 for its float64 normal_
    (R = 8.57).
    """
    d = check_positive(sensitivity, "sensitivity") / check_positive(sigma, "sigma")
    r = TAIL_RADIUS
    if d >= r:
        return 1.0
    shell = math.exp(-0.5 * (r - d) ** 2)
    tail = 2.0**-1021  # >= exp(-R^2/2) = 2^-1022 (1 + 2^-39)
    residual = shell + MAX_PAIRS * tail if r >= _CONVEX_RATIO * d else MAX_PAIRS * shell
    return min(1.0, math.nextafter(residual * (1.0 + 2.0**-40), math.inf))


def add_gaussian_noise(
    x: torch.Tensor, scale: float, sigma: float, out: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """out <- scale * x + N(0, sigma^2) per coordinate (x, out flat, of one dtype).

    Box-Muller: coordinates i and i + m of each block (m = ceil(block / 2)) share the radius
    sigma sqrt(-2 ln U*) and the angle 2 pi V: r cos and r sin. U* (`round_down_uniform_`) is
    exact in every binade, so the radius reaches TAIL_RADIUS sigma (37.6) instead of the 5.77 of
    torch's float32 `normal_` (24-bit uniforms); -2 ln U* is taken in float64. The angle has the
    precision of the output: V on a 2^-24 grid with float32 cos/sin for float32 outputs (as
    torch's own float32 normal_), 2^-53 and float64 for float64 outputs. Randomness: only
    `generator` (two 63-bit draws per pair).
    """
    dtype = out.dtype
    angle_bits = 24 if dtype == torch.float32 else 53
    extra_bits = min(42, 63 - angle_bits)  # the rest of the angle's draw extends U*'s binade draw
    for lo, hi in blocks(x.numel()):
        k = hi - lo
        m = (k + 1) // 2
        bits = random_bits_(scratch(m, torch.int64, 0), generator)
        aux = random_bits_(scratch(m, torch.int64, 1), generator)
        extra = torch.bitwise_right_shift(aux, angle_bits, out=scratch(m, torch.int64, 2))
        u = round_down_uniform_(scratch(m, torch.float64, 0), bits, extra, extra_bits, generator)
        radius = scratch(m, dtype, 1).copy_(u.log_().mul_(-2.0)).sqrt_().mul_(sigma)
        theta = scratch(m, dtype, 2).copy_(aux.bitwise_and_((1 << angle_bits) - 1))  # exact
        theta.mul_(2.0 * math.pi * 2.0**-angle_bits)
        z = scratch(k, dtype, 3)
        torch.mul(torch.cos(theta, out=z[:m]), radius, out=z[:m])
        torch.mul(torch.sin(theta[: k - m], out=z[m:]), radius[: k - m], out=z[m:])
        torch.add(z, x[lo:hi], alpha=scale, out=out[lo:hi])
    return out


_NORM_ROW = 256


def l2_norm(flat: torch.Tensor) -> float:
    """The L2 norm of a flat tensor, accurate where it matters for clipping.

    A float32 norm of 10^7 values is off by up to ~4e-4 (measured), and asking for a float64
    norm copies the whole tensor to float64 (as slow as drawing the noise). Rows of 256 values
    are reduced in the input dtype (short sums, small error) and the row results are summed in
    float64: relative error about sqrt(256) x 2^-24 per row at worst (~1e-7 for a single row, ~1e-10
    measured on 10^7 values, where row errors average out), one pass over the data.
    """
    if flat.numel() == 0:
        return 0.0
    whole = flat.numel() // _NORM_ROW * _NORM_ROW
    rows = torch.linalg.vector_norm(flat[:whole].view(-1, _NORM_ROW), dim=1).double()
    tail = torch.linalg.vector_norm(flat[whole:], dtype=torch.float64)
    return math.sqrt(float(rows.square().sum()) + float(tail) ** 2)


class Gaussian(Mechanism):
    """Clip the whole tensor to L2 norm S, add N(0, sigma^2) to every coordinate.

    Build with clip_norm and either noise_multiplier z (sigma = z S; `delta`, default 1e-5, is the
    delta at which the per-release eps is stated) or (epsilon, delta) (sigma from the analytic
    calibration at sensitivity 2S).
    """

    name = "gaussian"
    release_check = (
        "every coordinate lies within clip_norm + 38.6 sigma (the clipped update plus the sampler's "
        "largest radius), up to float rounding; inside it the noise cannot be told from the update "
        "without it, so a raw update passes"
    )

    def __init__(
        self,
        clip_norm: float,
        noise_multiplier: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> None:
        self.clip_norm = check_positive(clip_norm, "clip_norm")
        if (noise_multiplier is None) == (epsilon is None):
            raise ValueError("give exactly one of noise_multiplier or epsilon (with delta)")
        if noise_multiplier is not None:
            self.noise_multiplier = check_positive(noise_multiplier, "noise_multiplier")
            self.delta = check_delta(1e-5 if delta is None else delta)
            self._given_epsilon: float | None = None
            self.sigma = self.noise_multiplier * self.clip_norm
            self.epsilon = analytic_gaussian_epsilon(self.sigma, self.delta, self.sensitivity)
        else:
            if delta is None:
                raise ValueError("delta is required with epsilon")
            self.epsilon = self._given_epsilon = check_epsilon(epsilon)
            self.delta = check_delta(delta)
            self.sigma = analytic_gaussian_sigma(self.epsilon, self.delta, self.sensitivity)
            self.noise_multiplier = self.sigma / self.clip_norm

    @property
    def sensitivity(self) -> float:
        return 2.0 * self.clip_norm

    @property
    def bound(self) -> float:
        """Every coordinate of an output lies in [-bound, bound]: a clipped coordinate (|x_i| <= S,
        with `l2_norm`'s slack) plus a Box-Muller value (at most MAX_RADIUS sigma)."""
        return self.clip_norm * CLIP_SLACK + MAX_RADIUS * self.sigma

    def release_violation(self, y: torch.Tensor) -> str | None:
        bound = self.bound
        return interval_violation(y, -bound, bound, f"within gaussian's bound [{-bound:.9g}, {bound:.9g}]")

    @property
    def residual_delta(self) -> float:
        """What the float64 sampler adds to delta per release (`float_residual_delta`)."""
        return float_residual_delta(self.sigma, self.sensitivity)

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        flat = check_tensor(x)
        norm = l2_norm(flat)
        scale = min(1.0, self.clip_norm / norm) if norm > 0 else 1.0
        return add_gaussian_noise(flat, scale, self.sigma, torch.empty_like(flat), generator).view(x.shape)

    def perturb_independent(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Each element as a one-coordinate update: clip to [-S, S], add N(0, sigma^2)."""
        flat = check_tensor(x).clamp(-self.clip_norm, self.clip_norm)
        return add_gaussian_noise(flat, 1.0, self.sigma, torch.empty_like(flat), generator).view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(check_tensor(x), self.sigma**2).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        residual = self.residual_delta
        return Guarantee(
            self.epsilon,
            self.delta + residual,
            "value",
            "vector",
            f"gaussian: the whole tensor, clipped to L2 norm {self.clip_norm:g}, is "
            f"({self.epsilon:.6g}, {self.delta:g} + {residual:.3g})-LDP per release (sigma {self.sigma:.6g}, "
            "analytic calibration, sensitivity 2*clip_norm; + the float64 sampler's residual delta, "
            "noise cut at 37.6 sigma)",
            residual,
        )

    def params(self) -> dict[str, object]:
        if self._given_epsilon is not None:
            return {"name": self.name, "clip_norm": self.clip_norm, "epsilon": self._given_epsilon, "delta": self.delta}
        return {
            "name": self.name,
            "clip_norm": self.clip_norm,
            "noise_multiplier": self.noise_multiplier,
            "delta": self.delta,
        }
