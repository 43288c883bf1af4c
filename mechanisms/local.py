"""Per-coordinate local mechanisms (scope "coordinate": a tensor of d values costs d*eps).

Each perturb path draws one uniform u per coordinate into the output buffer (the affine part of
the first step folded into the draw: `uniform_(low, high)` costs the same as `uniform_()`) and maps
it in place through the inverse CDF of the mechanism's output law, in as few whole-tensor passes
as possible. Decisions "u < p" are read off as floor(u - p) in {-1, 0} (exact: the rounded
difference keeps its sign, and 0 falls on the "not below" side), so no boolean masks (slow on
CPU) and no torch.where. The exponential mechanism draws 53-bit uniforms into float64 blocks
instead and writes each finished block into the output (see `_BLOCK`); Laplace is the snapping
mechanism on an exact uniform U* (`round_down_uniform_`, docs/MECHANISMS.md "Floating point"),
also by blocks. Formulas cite the papers in docs/MECHANISMS.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from .base import (
    Guarantee,
    Mechanism,
    affine_,
    check_epsilon,
    check_finite,
    check_positive,
    check_tensor,
    first_violation,
    half_grid_threshold,
    interval_violation,
    points_violation,
    release_flat,
    scratch,
    uniform_draw,
)

# exp(eps) overflows a double near 709; no useful local mechanism runs there.
MAX_EPSILON = 700.0


def _epsilon(epsilon: object) -> float:
    eps = check_epsilon(epsilon)
    if eps > MAX_EPSILON:
        raise ValueError(f"epsilon must be <= {MAX_EPSILON}, got {epsilon!r}")
    return eps


# What one coordinate of a release can be: ("points", a, b) is the two values {a, b}, ("interval",
# a, b) the interval [a, b] (before the float tolerance of `release_tolerance`).
OutputSet = tuple[str, float, float]


def output_set_violation(
    y: torch.Tensor, output: OutputSet, what: str, *, scale: float = 1.0, allow_zero: bool = False
) -> str | None:
    """`release_violation` for a per-coordinate output set, its values multiplied by `scale`."""
    kind, low, high = output
    low, high = low * scale, high * scale
    if kind == "points":
        return points_violation(y, (low, high), f"{what} {{{low:.9g}, {high:.9g}}}", allow_zero=allow_zero)
    return interval_violation(y, low, high, f"{what} [{low:.9g}, {high:.9g}]", allow_zero=allow_zero)


def _output(like: torch.Tensor) -> torch.Tensor:
    return torch.empty(like.numel(), dtype=like.dtype)


# Laplace and the exponential mechanism work in float64 on blocks of this many coordinates:
# their 5-9 passes then run on 2 MB buffers that stay in cache instead of streaming 80 MB
# tensors through memory (2x faster at 10^7 coordinates). The blocks draw the uniforms in the
# same order as one whole-tensor draw, so the output does not depend on the block size.
_BLOCK = 1 << 18
_MINUS_ONE = torch.tensor(-1.0, dtype=torch.float64)


def blocks(n: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive blocks covering range(n)."""
    return ((lo, min(n, lo + _BLOCK)) for lo in range(0, n, _BLOCK))


# ---------------------------------------------------------------------------------------------
# Floating-point noise (docs/MECHANISMS.md, "Floating point"): a uniform that reaches every
# float64 binade, and the snapping mechanism's calibration and proven bound.

_EXPONENT_MASK = torch.tensor(0x7FF0000000000000)  # the exponent field of a float64 (0-dim
_MANTISSA_MASK = torch.tensor((1 << 52) - 1)  # tensors: a Python int operand is slower)
# A U* whose binade draw came out 0 (R below 2^-bits) is drawn again one level down; below
# 2^-1022 (where U* is no longer exact) nothing needs it: -ln U* > 708 either way.
_NORMAL_MIN = 2.0**-1022
_MAX_DEPTH = 40  # the levels below the first have 53 bits each: 2^-2120, far below 2^-1022
# Assumed bound on the error of torch's float64 log, in ulps of the result (Sleef's u10 and
# glibc's log are documented within 1 ulp; tests/mechanisms/test_float_noise.py measures it).
LOG_ULPS = 4.0
# Beyond this -ln U* the sampler's U* is no longer the exact rounding of its real uniform
# (subnormals): U* < 2^-1022 happens with probability 2^-1022.
TAIL_EXPONENT = 1022.0 * math.log(2.0)


def random_bits_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """out (int64) <- 63 uniform random bits per element (torch: random64() mod 2^63)."""
    return out.random_(generator=generator)


def round_down_uniform_(
    out: torch.Tensor,
    bits: torch.Tensor,
    extra: torch.Tensor,
    extra_bits: int,
    generator: torch.Generator | None,
    depth: int = 0,
) -> torch.Tensor:
    """out (float64) <- U*, a uniform real R on (0, 1) rounded DOWN to a float64 (Mironov 2012's
    U*: each double d with probability next(d) - d).

    `bits` (int64) holds 63 random bits (`random_bits_`): its low 52 become the significand, its
    top 11 and the `extra_bits` (<= 42) random bits in the low end of `extra` (int64, independent
    of `bits`) form an integer h of 11 + extra_bits bits; h 2^-(11 + extra_bits), a uniform on
    that grid, has the binade of R: [2^-j, 2^(1-j)) with probability 2^-j. Both buffers are used
    as scratch. h = 0 (R below the grid, probability 2^-(11 + extra_bits)) is drawn again one
    level down (R = 2^-(11 + extra_bits) R'), from fresh draws.

    A 53-bit uniform (torch's float64 `uniform_`) cannot go below 2^-53, so -ln of it stops at
    36.7 and its gaps widen toward 0; U* has relative spacing 2^-52 in every binade:
    U* <= R < U* (1 + 2^-52), so -ln U* is within 2^-52 of the exact -ln R (down to 2^-1022).
    Randomness: only `generator`.
    """
    grid = 11 + extra_bits
    ob = out.view(torch.int64)
    torch.bitwise_right_shift(bits, 52, out=ob)
    extra.bitwise_or_(ob.bitwise_left_shift_(extra_bits))  # h < 2^53: exact as a float64
    out.copy_(extra).mul_(2.0**-grid)  # h 2^-grid: exact
    ob.bitwise_and_(_EXPONENT_MASK).bitwise_or_(bits.bitwise_and_(_MANTISSA_MASK))
    if depth < _MAX_DEPTH and out.numel() and float(out.min()) < _NORMAL_MIN:  # h = 0 somewhere
        idx = torch.nonzero(out < _NORMAL_MIN).view(-1)
        k = idx.numel()
        more = random_bits_(torch.empty(k, dtype=torch.int64), generator)
        deeper = round_down_uniform_(
            torch.empty(k, dtype=torch.float64),
            random_bits_(torch.empty(k, dtype=torch.int64), generator),
            more.bitwise_right_shift_(21),
            42,
            generator,
            depth + 1,
        )
        out[idx] = deeper.mul_(2.0**-grid)  # exact while normal
    return out


def smallest_power_of_two_at_least(x: float) -> float:
    """The smallest power of 2 >= x > 0 (exact, via the binary exponent)."""
    mantissa, exponent = math.frexp(x)  # x = mantissa 2^exponent, mantissa in [1/2, 1)
    return x if mantissa == 0.5 else math.ldexp(1.0, exponent)


def _round_up(x: float) -> float:
    return math.nextafter(x, math.inf)


def snap_error(steps: int) -> float:
    """rho: a bound, in grid units L, on |v - w| for the snapping mechanism's computed v and the
    exact v' = (t - D)/L + S c T_R with T_R = -ln R (R the real uniform U* rounds) over every
    draw where either lies within the outer grid point plus 1 (|T| <= (2 steps + 3)/c):
    2^-52 from U* <= R < U*(1 + 2^-52), LOG_ULPS ulps of the log (relative 2^-52 each) on
    c T <= 2 steps + 3, and one rounding (2^-53 relative) in each of t - D, c S LOG(U*) and the
    sum, on values <= steps, 2 steps + 3 and steps + 1 (the scaling by 1/L is exact)."""
    return 2.0**-52 * ((LOG_ULPS + 1.0) * (2 * steps + 3) + 1.0)


def snap_bound(scale: float, snap: float, steps: int) -> float:
    """The eps the float64 snapping mechanism (as `Laplace.perturb` computes it) satisfies for
    inputs in [-1, 1], noise scale b = `scale`, grid L = `snap`, outer grid point `steps` L:

        eps' = (2/b)(1 + 2^-52) + 32 rho,   rho = snap_error(steps).

    Proof sketch (docs/MECHANISMS.md): the computed v is within rho of the exact Laplace value
    v' (same R, S, phi), so the output k satisfies v' in [k - 1/2 - rho, k + 1/2 + rho] and is k
    whenever v' is in [k - 1/2 + rho, k + 1/2 - rho] (ends: the clamped tails, likewise). The
    exact v' is the Laplace mechanism, 2/b-DP for any event; shrinking a cell of width 1 by rho
    at each end loses at most a factor 1 + 4 rho e^(1/c) / (1 - 2 rho) <= 1 + 30 rho of its
    probability under a Laplace of scale c = b/L > 1/2 (log-density 1/c-Lipschitz). Every R
    below 2^-1022 (where U* is no longer exact) saturates the clamp either way (checked in
    `snapping_calibration`). 2/b itself is rounded: (1 + 2^-52) covers it. Rounded up."""
    rho = snap_error(steps)
    return _round_up(_round_up(2.0 / scale) * (1.0 + 2.0**-52) + 32.0 * rho)


def _snapping_grid(epsilon: float, snap: float) -> tuple[float, float, int]:
    """(b, L, steps) for the noise scale b = 2/epsilon on the grid L: the outer grid point at
    least 1 + 32 b from 0 (the clamp binds with probability <= e^-32 / 2), as far as exactness
    allows (every draw with -ln U* > TAIL_EXPONENT must land beyond it, like the exact law)."""
    scale = 2.0 / epsilon
    c = scale / snap
    inner = math.ceil(1.0 / snap) + 1  # |t/L - phi| <= 1/L + 1/2 stays below it
    steps = math.ceil((1.0 + 32.0 * scale) / snap) + 1
    # saturation: from any input >= -inner (> -steps), noise c T >= 2 steps + 1 lands past the
    # outer point (rho and the log's error are far inside the 2^-40 margin), for all T beyond
    # TAIL_EXPONENT
    most = math.floor((TAIL_EXPONENT * c * (1.0 - 2.0**-40) - 1.0) / 2.0)
    steps = min(steps, most)
    if steps < inner + 1:
        raise ValueError(f"epsilon {epsilon!r} is too large for the float64 snapping mechanism")
    return scale, snap, steps


def snapping_calibration(epsilon: float) -> tuple[float, float, int]:
    """(b, L, steps) for `Laplace`: L the smallest power of 2 >= 2/epsilon (Mironov's Lambda for
    the requested scale) and the smallest noise scale b whose proven bound `snap_bound` is at
    most `epsilon`: the floating-point excess (~1e-12) is paid by a slightly larger b, so b
    exceeds L by at most that much when 2/epsilon is a power of 2 (c = b/L in (1/2, 1 + 1e-11],
    which the proof allows)."""
    snap = smallest_power_of_two_at_least(2.0 / epsilon)
    target = epsilon
    for _ in range(64):
        scale, snap, steps = _snapping_grid(target, snap)
        bound = snap_bound(scale, snap, steps)
        if bound <= epsilon:
            return scale, snap, steps
        target -= (bound - epsilon) + 4.0 * math.ulp(epsilon) + (bound - 2.0 / scale)
        if not target > epsilon / 2:
            break
    raise ValueError(f"epsilon {epsilon!r} is too small for the float64 snapping mechanism's floating-point bound")


def snapping_variance(scale: float, snap: float) -> float:
    """Var of the dithered snapped Laplace output: 2 b^2 + L^2/12. Exact for a continuous dither
    and no clamp; the 11-bit dither moves it by at most L^2 2^-20 and the clamp (binding with
    probability <= e^-32/2) by less than 2^-40 b^2."""
    return 2.0 * scale * scale + snap * snap / 12.0


# ---------------------------------------------------------------------------------------------
# Pure formulas (also used by tests and the audit)


def duchi_bound(epsilon: float) -> float:
    """B = (e^eps + 1) / (e^eps - 1): Duchi, Jordan, Wainwright (2013/2018), one dimension."""
    return (math.exp(epsilon) + 1.0) / math.expm1(epsilon)


def piecewise_bound(epsilon: float) -> float:
    """C = (z + 1) / (z - 1), z = e^(eps/2): Wang et al., ICDE 2019, the Piecewise Mechanism."""
    z = math.exp(epsilon / 2.0)
    return (z + 1.0) / (z - 1.0)


def pnpm_bound(epsilon: float) -> float:
    """C = (e^eps + 3) / (e^eps - 1): the PNPM paper, eq. (2)."""
    return (math.exp(epsilon) + 3.0) / math.expm1(epsilon)


def pnpm_t_variance(epsilon: float) -> float:
    """Var[t*] = 4 (e^eps + 1/3) / (e^eps - 1)^2: the PNPM paper, Lemma 1."""
    e = math.exp(epsilon)
    return 4.0 * (e + 1.0 / 3.0) / (e - 1.0) ** 2


def hybrid_pm_probability(epsilon: float) -> float:
    """HM runs PM w.p. 1 - e^(-eps/2) when eps > 0.61, else Duchi (Wang et al. 2019, Sec. III-C)."""
    return -math.expm1(-epsilon / 2.0) if epsilon > 0.61 else 0.0


def duchi_variance(t: torch.Tensor, epsilon: float) -> torch.Tensor:
    return duchi_bound(epsilon) ** 2 - t * t


def piecewise_variance(t: torch.Tensor, epsilon: float) -> torch.Tensor:
    z = math.exp(epsilon / 2.0)
    return t * t / (z - 1.0) + (z + 3.0) / (3.0 * (z - 1.0) ** 2)


# ---------------------------------------------------------------------------------------------


class _PureLocal(Mechanism):
    """Shared parts of the pure-eps per-coordinate mechanisms on the domain [-1, 1]."""

    protects = "value"
    domain = "[-1, 1]"

    def __init__(self, epsilon: float, clip: bool = False) -> None:
        self.epsilon = _epsilon(epsilon)
        if not isinstance(clip, bool):
            raise ValueError(f"clip must be True or False, got {clip!r}")
        self.clip = clip

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        return check_tensor(x, low=-1.0, high=1.0, clip=self.clip)

    def params(self) -> dict[str, object]:
        return {"name": self.name, "epsilon": self.epsilon, "clip": self.clip}

    def output_set(self) -> OutputSet | None:
        """The values one output coordinate can take (None: every real, nothing to check)."""
        return None

    def release_violation(self, y: torch.Tensor) -> str | None:
        output = self.output_set()
        if output is None:
            return None
        return output_set_violation(y, output, f"in {self.name}(eps {self.epsilon:g})'s output set")

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(
            self.epsilon,
            0.0,
            "value",
            "coordinate",
            f"{self.name}: eps={self.epsilon:g}-LDP for each coordinate's value in "
            f"{self.domain}; a tensor of d coordinates costs d*eps",
        )


def _duchi_slope(epsilon: float) -> float:
    """k in P[+B] = 1/2 + k t."""
    e = math.exp(epsilon)
    return (e - 1.0) / (2.0 * (e + 1.0))


def _duchi_(y: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """In place: y = u - 1/2 - k t in (-1, 1) (so floor(y) is -1 iff u < 1/2 + k t) -> `high`
    if y < 0 else `low` (y == 0 is "not below": `low`, as the definition's strict <)."""
    y.floor_()
    return affine_(y, low - high, low)


class Duchi(_PureLocal):
    """Duchi et al.: output +-B with P[+B] = 1/2 + t (e-1) / (2(e+1)); unbiased, Var = B^2 - t^2."""

    name = "duchi"
    release_check = "every coordinate is -B or +B, B = (e^eps + 1)/(e^eps - 1), up to float rounding"

    def output_set(self) -> OutputSet:
        bound = duchi_bound(self.epsilon)
        return ("points", -bound, bound)

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        t = self._input(x)
        y = uniform_draw(_output(t), -0.5, 0.5, generator)  # u - 1/2, exact
        y.sub_(t, alpha=_duchi_slope(self.epsilon))
        bound = duchi_bound(self.epsilon)
        return _duchi_(y, -bound, bound).view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        return duchi_variance(self._input(x), self.epsilon).view(x.shape)


def _piecewise_constants(epsilon: float) -> tuple[float, float, float, float, float]:
    """Inverse CDF of PM as F^-1(u) = -C + k1 u + k2 clamp(u - a(t), 0, m).

    Density is p_low on [-C, l(t)), p_high on [l(t), r(t)], p_low on (r(t), C]; the CDF reaches
    a(t) = (t + 1) / (2(z + 1)) at l(t) and a(t) + m, m = z/(z+1), at r(t).
    """
    z = math.exp(epsilon / 2.0)
    c = (z + 1.0) / (z - 1.0)
    p_low = 1.0 / ((z + 1.0) * (c + 1.0))
    p_high = z / ((z + 1.0) * (c - 1.0))
    return c, 1.0 / p_low, 1.0 / p_high - 1.0 / p_low, 1.0 / (2.0 * (z + 1.0)), z / (z + 1.0)


def _piecewise_(v: torch.Tensor, t: torch.Tensor, epsilon: float, s: torch.Tensor) -> torch.Tensor:
    """In place: v = k1 u - C + delta (u uniform on [0, 1), delta below) -> F^-1(u), the PM output.

    F^-1(u) = -C + k1 u + k2 clamp(u - a(t), 0, m) with a(t) = alpha (1 + t). In units of v,
    k1 clamp(u - a(t), 0, m) = clamp(v - k1 alpha t, -d + delta, k1 m - d + delta) + d - delta
    with d = C - k1 alpha, and with r = k2 / k1 the output is
    v - delta + r (clamp(...) + d - delta): choosing delta = r d / (1 + r) makes the constant
    vanish, so F^-1(u) = v + r clamp(v - k1 alpha t, delta - d, k1 m - d + delta): three passes.
    The caller clamps the result to [-C, C] (rounding can step an ulp outside).
    """
    c, k1, k2, alpha, m = _piecewise_constants(epsilon)
    r, d = k2 / k1, c - k1 * alpha
    delta = r * d / (1.0 + r)
    torch.sub(v, t, alpha=k1 * alpha, out=s)
    s.clamp_(delta - d, k1 * m - d + delta)
    return v.add_(s, alpha=r)


def _piecewise_draw_range(epsilon: float) -> tuple[float, float]:
    """[low, high) of v = k1 u - C + delta for u uniform on [0, 1) (see _piecewise_)."""
    c, k1, k2, alpha, _ = _piecewise_constants(epsilon)
    r, d = k2 / k1, c - k1 * alpha
    delta = r * d / (1.0 + r)
    return -c + delta, -c + k1 + delta


class Piecewise(_PureLocal):
    """Wang et al. (ICDE 2019) Piecewise Mechanism: output in [-C, C], unbiased."""

    name = "pm"
    release_check = (
        "every coordinate lies in [-C, C], C = (z + 1)/(z - 1), z = e^(eps/2), up to float rounding "
        "(every point of it is a possible output of every input: a raw update within it passes)"
    )

    def output_set(self) -> OutputSet:
        bound = piecewise_bound(self.epsilon)
        return ("interval", -bound, bound)

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        t = self._input(x)
        low, high = _piecewise_draw_range(self.epsilon)
        v = uniform_draw(_output(t), low, high, generator)
        c = piecewise_bound(self.epsilon)
        return _piecewise_(v, t, self.epsilon, scratch(t.numel(), t.dtype, 0)).clamp_(-c, c).view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        return piecewise_variance(self._input(x), self.epsilon).view(x.shape)


class Hybrid(_PureLocal):
    """Wang et al. (ICDE 2019) Hybrid Mechanism: PM w.p. 1 - e^(-eps/2) if eps > 0.61, else Duchi.

    One uniform u decides and drives both branches: [0, p) gives +B, [p, p + beta) runs PM on
    v = (u - p) / beta, [p + beta, 1) gives -B, where p = (1 - beta)(1/2 + k t) is the Duchi
    probability of +B scaled to the Duchi branch.
    """

    name = "hm"
    release_check = (
        "eps <= 0.61 (Duchi only): every coordinate is -B or +B; above, every coordinate is in "
        "Duchi's {-B, B} or PM's [-C, C], i.e. in [-C, C] since B < C; up to float rounding"
    )

    def output_set(self) -> OutputSet:
        if hybrid_pm_probability(self.epsilon) == 0.0:
            bound = duchi_bound(self.epsilon)
            return ("points", -bound, bound)
        # the Duchi branch's +-B lies inside PM's [-C, C] (B < C for every eps > 0)
        bound = piecewise_bound(self.epsilon)
        return ("interval", -bound, bound)

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        t = self._input(x)
        bound = duchi_bound(self.epsilon)
        k = _duchi_slope(self.epsilon)
        beta = hybrid_pm_probability(self.epsilon)
        if beta == 0.0:
            y = uniform_draw(_output(t), -0.5, 0.5, generator)
            return _duchi_(y.sub_(t, alpha=k), -bound, bound).view(x.shape)
        c, k1, k2, alpha, _ = _piecewise_constants(self.epsilon)
        n = t.numel()
        # z = (u - p) / beta; below 0 is +B, in [0, 1) is PM at v = z, 1 and above is -B
        offset = -(1.0 - beta) / (2.0 * beta)
        z = uniform_draw(_output(t), offset, offset + 1.0 / beta, generator)
        z.sub_(t, alpha=(1.0 - beta) * k / beta).clamp_(-1.0, 1.0)
        branch = torch.floor(z, out=scratch(n, t.dtype, 1))  # -1: +B, 0: PM, 1: -B
        z.clamp_(min=0.0)  # v for PM (0 or 1 outside it: PM(0) = -C, PM(1) = C)
        low, _ = _piecewise_draw_range(self.epsilon)
        affine_(z, k1, low)
        _piecewise_(z, t, self.epsilon, scratch(n, t.dtype, 0))
        # -C - (B + C)(-1) = B and C - (B + C) = -B
        return z.add_(branch, alpha=-(bound + c)).clamp_(-c, c).view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        t = self._input(x)
        beta = hybrid_pm_probability(self.epsilon)
        # Both branches are unbiased, so the mixture's variance is the mixture of variances.
        return (beta * piecewise_variance(t, self.epsilon) + (1.0 - beta) * duchi_variance(t, self.epsilon)).view(
            x.shape
        )


class LDPFL(Mechanism):
    """Sun, Qian, Chen (IJCAI 2021): clamp w to [c - r, c + r], then Duchi on (w - c)/r, rescaled.

    Output c +- r B; unbiased for the clamped weight; Var = r^2 B^2 - (w - c)^2.
    """

    name = "ldp-fl"
    release_check = "every coordinate is c - rB or c + rB, B = (e^eps + 1)/(e^eps - 1), up to float rounding"

    def __init__(self, epsilon: float, center: float = 0.0, radius: float = 1.0) -> None:
        self.epsilon = _epsilon(epsilon)
        self.center = check_finite(center, "center")
        self.radius = check_positive(radius, "radius")

    def release_violation(self, y: torch.Tensor) -> str | None:
        bound = self.radius * duchi_bound(self.epsilon)
        # the same two doubles `perturb` rounds into the output dtype
        output = ("points", self.center - bound, self.center + bound)
        return output_set_violation(y, output, f"in ldp-fl(eps {self.epsilon:g})'s output set")

    def _clamped(self, x: torch.Tensor) -> torch.Tensor:
        w = check_tensor(x)
        return w.clamp(self.center - self.radius, self.center + self.radius)

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        w = check_tensor(x)
        c, r = self.center, self.radius
        shifted = scratch(w.numel(), w.dtype, 0)
        # the paper's clamp (without it eps does not hold), on w - c so that the Duchi threshold
        # below keeps the precision of the uniform even when |c| >> r
        if c == 0.0:
            torch.clamp(w, -r, r, out=shifted)
        else:
            torch.sub(w, c, out=shifted).clamp_(-r, r)
        y = uniform_draw(_output(w), -0.5, 0.5, generator)
        y.sub_(shifted, alpha=_duchi_slope(self.epsilon) / r)  # u - 1/2 - k (w - c) / r
        bound = r * duchi_bound(self.epsilon)
        return _duchi_(y, c - bound, c + bound).view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        w = self._clamped(x)
        return ((self.radius * duchi_bound(self.epsilon)) ** 2 - (w - self.center) ** 2).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(
            self.epsilon,
            0.0,
            "value",
            "coordinate",
            f"ldp-fl: eps={self.epsilon:g}-LDP for each weight clamped to "
            f"[{self.center - self.radius:g}, {self.center + self.radius:g}]; "
            "a tensor of d weights costs d*eps",
        )

    def params(self) -> dict[str, object]:
        return {"name": self.name, "epsilon": self.epsilon, "center": self.center, "radius": self.radius}


class PNPM(Mechanism):
    """Positive and Negative Piecewise Mechanism (the PNPM paper's Algorithm 2, see
    docs/MECHANISMS.md), applied as w <- |w| * PNPM(w / |w|) (its Algorithm 1, line 20).

    t = sign(w); t* is uniform on the same-sign interval ([1, C] for t = 1) w.p. e/(e+1), else on
    the opposite one; C = (e+3)/(e-1). Unbiased; Var = w^2 * 4(e + 1/3)/(e-1)^2.
    PROTECTS THE SIGN ONLY: |output| lies in [|w|, C|w|], so weights of different magnitude have
    disjoint output supports, and w = 0 is released exactly. No finite eps holds for the value.
    """

    name = "pnpm"
    release_check = (
        "nothing: the output |w| t*, t* in [-C, -1] U [1, C], can be any real number when |w| is "
        "unknown, so neither the magnitudes nor the signs of a release can be checked"
    )

    def __init__(self, epsilon: float) -> None:
        self.epsilon = _epsilon(epsilon)

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        w = check_tensor(x)
        e = math.exp(self.epsilon)
        c = pnpm_bound(self.epsilon)
        q = half_grid_threshold(1.0 / (e + 1.0), w.dtype)  # P[sign flip] = 1/(e+1); q < 1/2
        k_flip, k_keep = (c - 1.0) / q, (c - 1.0) / (1.0 - q)
        # s = u - q < 0 (probability q) flips the sign: t* = -1 + k_flip s on [-C, -1); else
        # t* = 1 + k_keep s on (1, C]. With L = leaky_relu(s, k_flip/k_keep) that is
        # t* = k_keep L + sign(s), and since t*(-1) = -t*(+1) for the same u,
        # out = |w| t*(sign w) = w t*(+1) = w (k_keep L + sign(s)).
        # s is drawn directly: low = -q and high = 1 - q are floats with high - low == 1 in the
        # dtype, so s = u - q rounded once, never 0 (q is between grid points), sign exact.
        s = uniform_draw(_output(w), -q, 1.0 - q, generator)
        jump = torch.sign(s, out=scratch(w.numel(), w.dtype, 0))
        torch.nn.functional.leaky_relu_(s, k_flip / k_keep)
        torch.add(jump, s, alpha=k_keep, out=s)
        return s.mul_(w).view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        w = check_tensor(x)
        return (w * w * pnpm_t_variance(self.epsilon)).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(
            self.epsilon,
            0.0,
            "sign",
            "coordinate",
            f"pnpm: eps={self.epsilon:g}-LDP for the SIGN of each weight only; the "
            "magnitude |w| is released up to a factor in [1, C] and w = 0 exactly, so "
            "there is no finite eps for the weight's value",
        )

    def params(self) -> dict[str, object]:
        return {"name": self.name, "epsilon": self.epsilon}


class Laplace(_PureLocal):
    """Laplace mechanism on [-1, 1] (sensitivity 2) as Mironov's snapping mechanism (CCS 2012,
    Section 5.2), with a subtractive dither that keeps it unbiased.

    Per coordinate: k = clamp(round((t - D + b S |LOG(U*)|) / L), -steps, steps), output
    (k + phi) L, where b is the noise scale, S a fair sign, U* a uniform real on (0, 1) rounded
    down to a float64 (`round_down_uniform_`), L = `snap` the smallest power of 2 >= 2/epsilon,
    phi = (j + 1/2)/2048 - 1/2 a dither (j: 11 random bits) and D = phi L. Given phi this is the
    snapping mechanism on the input t - D: the output lies on a grid L apart, so the low bits of the float
    noise (whose set of reachable values depends on t: Mironov's attack) are rounded away, and
    the noise cannot be cut short (U* reaches every float64 binade). `snap_bound` gives the
    proven eps of the float computation; b is calibrated so that this bound, floating-point
    excess included, is at most the requested epsilon. Unbiased (the dither); Var = 2 b^2 +
    L^2 / 12 (`variance`).
    """

    name = "laplace"
    domain = "[-1, 1]"
    release_check = (
        "every coordinate lies in [-(steps + 1/2) L, (steps + 1/2) L], the snapping mechanism's clamp "
        "(about 1 + 32 b, b = 2/eps), up to float rounding (every point of it is a possible output of "
        "every input, up to the grid: a raw update within it passes)"
    )

    def __init__(self, epsilon: float, clip: bool = False) -> None:
        super().__init__(epsilon, clip)
        self.scale, self.snap, self.steps = snapping_calibration(self.epsilon)
        self.float_excess = snap_bound(self.scale, self.snap, self.steps) - 2.0 / self.scale

    @property
    def bound(self) -> float:
        """Every output lies in [-bound, bound] (the outer grid point plus the dither)."""
        return (self.steps + 0.5) * self.snap

    def output_set(self) -> OutputSet:
        # |k| <= steps and |phi| < 1/2: (k + phi) L, exact in float64, rounded once into the output
        return ("interval", -self.bound, self.bound)

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        t = self._input(x)
        out = _output(t)
        snap, steps, c = self.snap, float(self.steps), self.scale / self.snap
        for lo, hi in blocks(t.numel()):
            n = hi - lo
            bits = random_bits_(scratch(n, torch.int64, 0), generator)
            # aux: the sign and the dither in its low 12 bits, 42 more binade bits in bits 21..62
            aux = random_bits_(scratch(n, torch.int64, 1), generator)
            extra = torch.bitwise_right_shift(aux, 21, out=scratch(n, torch.int64, 2))
            noise = round_down_uniform_(scratch(n, torch.float64, 0), bits, extra, 42, generator).log_()
            # w uniform on 0..4095, s = w - 2047.5: sign(s) is a fair sign S and |s| - 1/2 = j is
            # uniform on 0..2047 and independent of it; the dither is phi = (j + 1/2)/2048 - 1/2
            s = scratch(n, torch.float64, 1).copy_(aux.bitwise_and_(4095)).sub_(2047.5)
            noise.copysign_(s)  # S LOG(U*): the Laplace noise over b
            neg_phi = affine_(s.abs_(), -1.0 / 2048.0, 0.5)  # -phi = 1/2 - |s|/2048: exact
            v = scratch(n, torch.float64, 2).copy_(t[lo:hi])  # mixed-dtype ops are slow
            torch.add(neg_phi, v, alpha=1.0 / snap, out=v)  # t/L - phi (t/L exact)
            v.add_(noise, alpha=c).clamp_(-steps, steps).round_()  # k: snapped, in units of L
            torch.sub(v, neg_phi, out=v)  # k + phi: exact
            torch.mul(v, snap, out=out[lo:hi])  # (k + phi) L rounded once into the output
        return out.view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        t = self._input(x)
        return torch.full_like(t, snapping_variance(self.scale, self.snap)).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(
            self.epsilon,
            0.0,
            "value",
            "coordinate",
            f"laplace: eps={self.epsilon:g}-LDP for each coordinate's value in {self.domain} "
            f"(snapping mechanism, Mironov 2012: noise scale {self.scale:.17g}, grid {self.snap:g}, "
            f"outputs in [-{self.bound:g}, {self.bound:g}]; the bound includes the floating-point "
            f"excess {self.float_excess:.3g}); a tensor of d coordinates costs d*eps",
        )


class Exponential(_PureLocal):
    """Exponential mechanism (McSherry & Talwar 2007) on the output range [-1, 1] with utility
    -|t - y| (sensitivity 2): density proportional to exp(-eps |t - y| / 4), a Laplace truncated
    to [-1, 1]. Biased toward 0 near the edges; variance in closed form below.
    """

    name = "exponential"
    release_check = (
        "every coordinate lies in [-1, 1] (the output range; every point of it is possible for "
        "every input, so a raw update within it passes)"
    )

    def output_set(self) -> OutputSet:
        return ("interval", -1.0, 1.0)

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        t = self._input(x)
        b = 4.0 / self.epsilon
        c = math.exp(-1.0 / b)
        out = _output(t)
        for lo, hi in blocks(t.numel()):
            n = hi - lo
            u = uniform_draw(scratch(n, torch.float64, 0), 0.0, 1.0, generator)
            tb = scratch(n, torch.float64, 1).copy_(t[lo:hi])
            # masses over b: left of t 1 - c h, right of t 1 - c / h, with c = exp(-1/b) and
            # h = exp(-t/b): ONE exp per coordinate, float64 so the masses resolve the uniform
            h = torch.mul(tb, -1.0 / b, out=scratch(n, torch.float64, 2)).exp_()
            neg_left = torch.add(_MINUS_ONE, h, alpha=c, out=scratch(n, torch.float64, 3))
            total = affine_(h.reciprocal_(), -c, 1.0).sub_(neg_left)
            s = torch.addcmul(neg_left, u, total, out=u)  # signed mass from t over b: < 0 goes left
            # |s| < 1 in exact arithmetic; the clamp keeps a rounding at huge eps from a NaN
            distance = affine_(torch.abs(s, out=total), -1.0, 1.0).clamp_(min=0.0).log_()
            distance.copysign_(s)  # signed distance from t over b: sign(s) |log(1 - |s|)|
            torch.add(tb, distance, alpha=b, out=distance).clamp_(-1.0, 1.0)
            out[lo:hi].copy_(distance)
        return out.view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        t = self._input(x).to(torch.float64)
        b = 4.0 / self.epsilon

        def moments(length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """Integrals of s^k exp(-s/b) over [0, length], k = 0, 1, 2."""
            g = torch.exp(-length / b)
            l_b = length / b
            return (b * (1 - g), b**2 * (1 - g * (1 + l_b)), b**3 * (2 - g * (l_b * l_b + 2 * l_b + 2)))

        l0, l1, l2 = moments(1.0 + t)
        r0, r1, r2 = moments(1.0 - t)
        z = l0 + r0
        mean_offset = (r1 - l1) / z
        var = (l2 + r2) / z - mean_offset**2
        return var.to(x.dtype).view(x.shape)


class RandomizedResponse(Mechanism):
    """k-ary randomized response (Warner 1965; k = 2 is binary): inputs are categories 0..k-1
    stored as floats; keep w.p. e/(e + k - 1), else one of the other k - 1 uniformly.
    """

    name = "rr"
    release_check = "every coordinate is an integer category 0..k-1"

    def __init__(self, epsilon: float, k: int = 2) -> None:
        self.epsilon = _epsilon(epsilon)
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"k must be an integer >= 2, got {k!r}")
        self.k = k

    def release_violation(self, y: torch.Tensor) -> str | None:
        flat = release_flat(y)
        if isinstance(flat, str):
            return flat
        if self.k > 2 ** (24 if flat.dtype == torch.float32 else 53):
            return None  # categories beyond the dtype's integers: `perturb`'s rounding is not exact
        top = float(self.k - 1)
        return first_violation(
            flat,
            lambda b: ~((b >= 0.0) & (b <= top) & (b == torch.round(b))),
            f"an integer category in 0..{self.k - 1}",
        )

    def keep_probability(self) -> float:
        e = math.exp(self.epsilon)
        return e / (e + self.k - 1)

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        v = check_tensor(x, low=0.0, high=float(self.k - 1))
        k = self.k
        frac = torch.frac(v, out=scratch(v.numel(), v.dtype, 0))
        if bool(frac.any()):
            raise ValueError(f"x must hold integer categories 0..{k - 1}")
        e = math.exp(self.epsilon)
        # shift = 0 if u < keep, else 1 + floor((u - keep)/other) in 1..k-1; keep/other = e, so
        # 1 + (u - keep)/other = u/other + 1 - e is drawn directly
        other = 1.0 / (e + k - 1)
        shift = uniform_draw(_output(v), 1.0 - e, 1.0 - e + 1.0 / other, generator)
        shift.floor_().clamp_(0.0, k - 1.0)
        if k == 2:  # (v + shift) mod 2 = |v - shift| for v, shift in {0, 1}
            return shift.sub_(v).abs_().view(x.shape)
        # (v + shift) mod k = y - k floor(y / k) for y = v + shift in [0, 2k - 2]
        shift.add_(v)
        wraps = torch.div(shift, k, out=frac).floor_()
        return shift.add_(wraps, alpha=-k).view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        v = check_tensor(x, low=0.0, high=float(self.k - 1)).to(torch.float64)
        keep = self.keep_probability()
        other = (1.0 - keep) / (self.k - 1)
        total = self.k * (self.k - 1) / 2.0
        total_sq = (self.k - 1) * self.k * (2 * self.k - 1) / 6.0
        mean = keep * v + other * (total - v)
        second = keep * v * v + other * (total_sq - v * v)
        return (second - mean * mean).to(x.dtype).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(
            self.epsilon,
            0.0,
            "value",
            "coordinate",
            f"rr: eps={self.epsilon:g}-LDP for each coordinate's category in "
            f"0..{self.k - 1}; a tensor of d coordinates costs d*eps",
        )

    def params(self) -> dict[str, object]:
        return {"name": self.name, "epsilon": self.epsilon, "k": self.k}
