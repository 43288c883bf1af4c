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

Sampling (docs/MECHANISMS.md, "Floating point"): Box-Muller pairs in float64 from a ChaCha20
stream, radius sqrt(2 l) with l = -ln R exact to a relative 2^-51 for every R (R = Y or 1 - Y by a
fair coin, Y = U*/2 a uniform real on (0, 1/2) rounded down to a float64, and -ln(1 - Y) from
f = -Y exactly, or 1 - Y rounded once Y >= 0.29: fine near R = 1 as well as near 0), angle 2 pi V
with V on the 2^-53 grid,
log, cos and sin the kernels' own (`kernels.normal_pair`); the noise reaches 37.6 sigma. The
released value is the SNAPPING of the exact Gaussian mechanism: the clipped update
plus the noise, rounded to a grid L (the largest power of 2 <= sigma/4) and clamped to +-K L
where every grid value is reachable from every clipped input: the output set is the grid,
whatever the input. The float computation differs from the exact snapped mechanism only when
the exact value lies within rho of a cell boundary (`float_residual_delta_per_coordinate`,
about 6e-13 per coordinate), or when a pair's radius passes 37.6 sigma (`float_residual_delta`);
both add to delta, recorded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from .base import (
    Guarantee,
    Mechanism,
    OutputSet,
    check_delta,
    check_epsilon,
    check_positive,
    check_tensor,
    check_values,
    flat_input,
    scratch,
)
from .draws import TAIL_EXPONENT, blocks, redraw_below_grid_, words64
from .randomness import PrivacyGenerator, RandomStream, mechanism_stream
from .snapping import LOG_ULPS

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
# `l2_norm` is within ~1e-6 relative of the true norm (float32 rows of 256), so a clipped
# coordinate can exceed clip_norm by that much: the snapping's reach allows 2^-16 (1.5e-5).
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


# Relative error of the sampler's noise per unit of radius, in units of 2^-53: the radius (U*:
# 2 ulps, log or log1p: 2 LOG_ULPS, sqrt: 1), the angle (grid 2 pi, 2 pi rounded, its product:
# 3 x 2 pi), cos or sin (2 LOG_ULPS, absolute), the products by sigma/L and by the radius (2).
# The kernels' functions meet each term (`kernels.normal_pair`; proof in docs/MECHANISMS.md).
NOISE_ULPS = 2.0 + 2.0 * LOG_ULPS + 1.0 + 6.0 * math.pi + 2.0 * LOG_ULPS + 2.0
_RADIUS_CUT = 12.0  # radii beyond it (probability e^-72) count as a boundary event outright


def standard_normal_pairs_(out: torch.Tensor, stream: RandomStream) -> torch.Tensor:
    """out (float64, even length 2m) <- 2m standard normals: out[i] and out[m + i] are the pair
    (r cos 2 pi V, r sin 2 pi V) of one radius r = sqrt(-2 ln R) (see the module's docstring;
    `kernels.normal_pairs`). Randomness: only `stream`."""
    from . import kernels  # numba: paid on the first draw only

    m = out.numel() // 2
    first, aux = _pair_words(stream, m)
    if kernels.normal_pairs(first, aux, _NO_UNIFORMS, out.numpy()):
        kernels.normal_pairs(first, aux, _redrawn_uniforms(first, aux, stream), out.numpy())
    return out


def _pair_words(stream: RandomStream, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit words per pair: the first's sign bit is the coin (R = Y or 1 - Y) and its other
    63 bits U*'s significand and binade; the second's low 53 bits the angle V and its top 10 more
    of U*'s binade."""
    return words64(stream, m, 0).numpy(), words64(stream, m, 1).numpy()


_NO_UNIFORMS = np.empty(0, dtype=np.float64)


def _redrawn_uniforms(first: np.ndarray, aux: np.ndarray, stream: RandomStream) -> np.ndarray:
    """The pairs' U*, those below 2^-1022 (their binade draw was 0: probability 2^-21 per pair)
    drawn again one level down from the next words (`draws.redraw_below_grid_`)."""
    from . import kernels

    u = scratch(first.size, torch.float64, 0)
    kernels.pair_uniforms(first, aux, u.numpy())
    return redraw_below_grid_(u, 21, stream).numpy()


def add_gaussian_noise(
    x: torch.Tensor, scale: float, sigma: float, out: torch.Tensor, stream: RandomStream
) -> torch.Tensor:
    """out <- scale * x + N(0, sigma^2) per coordinate, in floating point, not snapped (x, out
    flat, of one dtype): DP-SGD's noise (node/learning/train.py). The sampler is the Gaussian
    mechanism's (`standard_normal_pairs_`); its tail residual is `float_residual_delta`."""
    for lo, hi in blocks(x.numel()):
        n = hi - lo
        z = standard_normal_pairs_(scratch(n + n % 2, torch.float64, 3), stream)[:n]
        noise = scratch(n, out.dtype, 4).copy_(z.mul_(sigma))
        torch.add(noise, x[lo:hi], alpha=scale, out=out[lo:hi])
    return out


def float_residual_delta_per_coordinate(sigma: float, grid: float, clip_norm: float) -> float:
    """The delta the snapped float sampler adds per released coordinate, beyond the tail.

    In grid units (s = sigma/L): the computed v = fl(w + noise) is within rho(r) = 2^-53 (NOISE_ULPS
    s r + |w| + s r + 1) of the exact w + s r cos(2 pi Theta) (the noise's errors scale with the
    radius r, |w| <= clip_norm/L (1 + 2^-16)), so the output differs from the exact snapped
    mechanism's only if the exact value lies within rho(r) of a half-integer. With r <= 12 (else
    counted whole: e^-72), that needs the exact value, a Gaussian of density <= f = 1/(s sqrt(2 pi))
    per grid unit, within rho(12) of a half-integer: probability <= 2 rho(12) (1 + 2 f) (a unimodal
    density summed over windows one unit apart is at most its integral plus twice its maximum).
    A release of d coordinates: the exact snapped mechanism's law except on an event of
    probability <= d times this, which adds to its delta. Rounded up."""
    s = sigma / grid
    w = clip_norm / grid * CLIP_SLACK
    rho = 2.0**-53 * (NOISE_ULPS * s * _RADIUS_CUT + w + s * _RADIUS_CUT + 1.0)
    density = 1.0 / (s * math.sqrt(2.0 * math.pi))
    bound = math.exp(-(_RADIUS_CUT**2) / 2.0) + 2.0 * rho * (1.0 + 2.0 * density)
    return math.nextafter(bound * (1.0 + 2.0**-40), math.inf)


def snapping_grid(sigma: float, clip_norm: float) -> tuple[float, int]:
    """(L, K) of the snapped Gaussian: L the largest power of 2 <= sigma/4 (the grid adds L^2/12
    <= sigma^2/192 of variance); outputs are clamped to +-K L, K the largest with (K + 1/2) L +
    S (1 + 2^-16) <= TAIL_RADIUS sigma, so that every grid value up to it is reachable from every
    clipped input by noise the sampler draws exactly (below 37.6 sigma). Refuses a noise too small
    for that (K below S/L + 1: noise_multiplier below about 0.054)."""
    grid = power_of_two_at_most(sigma / 4.0)
    steps = math.floor((TAIL_RADIUS * sigma - clip_norm * CLIP_SLACK) / grid - 0.5)
    if steps < math.ceil(clip_norm * CLIP_SLACK / grid) + 1:
        raise ValueError(
            f"noise sigma {sigma:g} is too small against clip_norm {clip_norm:g} for the snapped Gaussian: its "
            "noise must reach twice the clip norm (noise_multiplier >= about 0.054; below that the sampler's "
            "tail residual delta is 1 anyway)"
        )
    return grid, steps


def power_of_two_at_most(x: float) -> float:
    """The largest power of 2 <= x > 0 (exact, via the binary exponent)."""
    mantissa, exponent = math.frexp(x)  # x = mantissa 2^exponent, mantissa in [1/2, 1)
    return math.ldexp(1.0, exponent - 1)


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
        "every coordinate is a multiple of the grid L (the largest power of 2 <= sigma/4) within "
        "+-K L, the snapping clamp (about 36.6 sigma), up to float rounding; every such value is "
        "possible from every input, so a raw update on the grid passes"
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
        self.grid, self.steps = snapping_grid(self.sigma, self.clip_norm)

    @property
    def sensitivity(self) -> float:
        return 2.0 * self.clip_norm

    @property
    def bound(self) -> float:
        """Every coordinate of an output lies in [-bound, bound]: K L."""
        return self.steps * self.grid

    def output_set(self) -> OutputSet:
        return OutputSet(grid=(-self.bound, self.grid, 2 * self.steps + 1))

    def release_violation(self, y: torch.Tensor) -> str | None:
        return self.output_set().violation(y, "on gaussian's grid")

    @property
    def residual_delta(self) -> float:
        """What the float64 sampler adds to delta per release, the tail (`float_residual_delta`)."""
        return float_residual_delta(self.sigma, self.sensitivity)

    @property
    def residual_delta_per_coordinate(self) -> float:
        """What the snapped float sampler adds per coordinate (`float_residual_delta_per_coordinate`)."""
        return float_residual_delta_per_coordinate(self.sigma, self.grid, self.clip_norm)

    def _snap(self, flat: torch.Tensor, scale: float, stream: RandomStream) -> torch.Tensor:
        """clamp(round(scale x / L + noise / L), -K, K) L, per coordinate, in float64; rounded
        once into the output dtype."""
        from . import kernels  # numba: paid on the first perturb only

        grid, steps, out = self.grid, float(self.steps), torch.empty_like(flat)
        flat_np, out_np = flat.numpy(), out.numpy()
        args = (self.sigma / grid, scale / grid, steps, grid)
        for lo, hi in blocks(flat.numel()):
            first, aux = _pair_words(stream, (hi - lo + 1) // 2)
            if kernels.gaussian_snap(first, aux, _NO_UNIFORMS, flat_np[lo:hi], out_np[lo:hi], *args):
                u = _redrawn_uniforms(first, aux, stream)
                kernels.gaussian_snap(first, aux, u, flat_np[lo:hi], out_np[lo:hi], *args)
        return out

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        flat = flat_input(x)
        norm = l2_norm(flat)  # one pass; NaN or inf anywhere makes it non-finite
        if not math.isfinite(norm):  # NaN or inf in x (ValueError), or float32 rows that overflowed
            norm = float(torch.linalg.vector_norm(check_values(flat), dtype=torch.float64))
        scale = min(1.0, self.clip_norm / norm) if norm > 0 else 1.0
        return self._snap(flat, scale, mechanism_stream(generator)).view(x.shape)

    def perturb_independent(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        """Each element as a one-coordinate update: clip to [-S, S], add N(0, sigma^2), snap."""
        flat = check_tensor(x).clamp(-self.clip_norm, self.clip_norm)
        return self._snap(flat, 1.0, mechanism_stream(generator)).view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(check_tensor(x), self.sigma**2 + self.grid**2 / 12.0).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        residual, per_coordinate = self.residual_delta, self.residual_delta_per_coordinate
        return Guarantee(
            self.epsilon,
            self.delta + residual,
            "value",
            "vector",
            f"gaussian: the whole tensor, clipped to L2 norm {self.clip_norm:g}, is "
            f"({self.epsilon:.6g}, {self.delta:g} + {residual:.3g} + d x {per_coordinate:.3g})-LDP per release "
            f"of d coordinates (sigma {self.sigma:.6g}, analytic calibration, sensitivity 2*clip_norm; snapped "
            f"to a grid of {self.grid:g}; + the float64 sampler's residual delta)",
            residual,
            per_coordinate,
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
