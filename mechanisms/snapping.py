"""The snapping mechanism (Mironov, CCS 2012) and what is built on it: Laplace noise and the
exponential mechanism whose outputs lie on a grid fixed by their parameters alone.

A float sampler's reachable values depend on its input in the low bits (Mironov's attack);
snapping rounds them away. Both mechanisms here compute a float64 value within a proven rho of
the exact mechanism's value for the same real uniform (U*, `draws.round_down_uniform_`: a
uniform real rounded down to a float64, which reaches every binade), then round it to a grid and
clamp it to a range that do not depend on the input. The exact mechanism's output snapped to the
grid is eps-DP (post-processing); the float computation differs from it only when the exact value
lies within rho of a cell boundary, which moves each cell's probability by a factor within
1 +- lambda; the noise scale is calibrated so that eps, this excess included, is what the
mechanism states (docs/MECHANISMS.md, "Floating point").
"""

from __future__ import annotations

import math

import torch

from .base import Guarantee, OutputSet, flat_input, scratch
from .draws import TAIL_EXPONENT, blocks, redraw_below_grid_, words64
from .local import _output, _PureLocal
from .randomness import PrivacyGenerator, mechanism_stream

# Bound on the error of the float64 log and exp the snapping bounds use, in ulps of the result:
# assumed for torch's log (Laplace; Sleef's u10 and glibc's are documented within 1 ulp), proven
# within 3 for the kernels' own exp and series log (the exponential mechanism: docs/MECHANISMS.md;
# its table log above eps_run 1.38 is within 2^-53 (0.4 + 2.4 |ln d|), which times b < 2.9 is
# below the 2 LOG_ULPS units of 2^-53 that `exponential_error` allows it); measured by
# tests/mechanisms/test_float_noise.py and test_kernel_functions.py.
LOG_ULPS = 4.0


# ---------------------------------------------------------------------------------------------
# Laplace


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
        "every coordinate is on the dithered snapping grid (step L/2048) within "
        "[-(steps + 1/2) L, (steps + 1/2) L], the snapping mechanism's clamp (about 1 + 32 b, b = 2/eps), "
        "up to float rounding (every point of it is a possible output of every input)"
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
        # |k| <= steps and phi = (j + 1/2)/2048 - 1/2: (k + phi) L, exact in float64, rounded once
        # into the output: a grid of step L/2048 (every point of it possible from every input)
        step = self.snap / 2048.0
        return OutputSet(grid=(-self.bound + step / 2.0, step, (2 * self.steps + 1) * 2048))

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        t = flat_input(x)
        stream, out = mechanism_stream(generator), _output(t)
        snap, steps, c = self.snap, float(self.steps), self.scale / self.snap
        from . import kernels  # numba: paid on the first perturb only

        t_np, out_np = t.numpy(), out.numpy()
        for lo, hi in blocks(t.numel()):
            n = hi - lo
            # raw words (the kernels drop their top bits): U*'s, then the sign, dither and binade's
            bits, aux = words64(stream, n, 0).numpy(), words64(stream, n, 1).numpy()
            u = scratch(n, torch.float64, 0)
            if kernels.round_down_uniform53(bits, aux, u.numpy()):  # h = 0: probability 2^-53 each
                redraw_below_grid_(u, 53, stream)
            log_u = u.log_()  # torch's (Sleef's vectorized) log: the function LOG_ULPS bounds
            args = (out_np[lo:hi], 1.0 / snap, snap, c, steps)
            if not kernels.laplace(aux, log_u.numpy(), t_np[lo:hi], *args):  # see `Duchi.perturb`
                kernels.laplace(aux, log_u.numpy(), self._block(t[lo:hi]).numpy(), *args)
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


# ---------------------------------------------------------------------------------------------
# The exponential mechanism, snapped

EXPONENTIAL_GRID = 2.0**-10  # output step: 2049 values from -1 to 1
_LAMBDA_LIMIT = 0.25


def exponential_error(scale: float) -> float:
    """rho: a bound on |y - y'| for the computed sample y of `Exponential.perturb` (noise scale
    b = `scale`) and the exact inverse CDF y' at the real uniform R that the 53-bit draw u rounds
    down (u <= R < u + 2^-53).

    In units of 2^-53: the grid term |y(u) - y(R)| <= 2^-53 / min density <= 2^-53 2b e^(2/b);
    before the log, h = exp(-t/b), c h, c/h, the masses (at most 2), s = u total - left and 1 - |s|
    are each within 16 + 2/b units of their exact values (LOG_ULPS for exp, 2 |t/b| <= 2/b for its
    rounded argument, one per rounding after), and the log amplifies an absolute error by
    1/(1 - |s|) <= e^(2/b); its own error is LOG_ULPS units of |log| <= 2/b; times b (the table
    log above eps_run 1.38, `kernels.log_table64`: 0.4 + 2.4 |log| units, times b < 2.9 at most
    6 < 2 LOG_ULPS); plus 4 units for the product, the sum with t and the clamp. So
    rho <= 2^-53 ((2b + 16 b + 2) e^(2/b) + 2 LOG_ULPS + 4), doubled."""
    b = scale
    if 2.0 / b > 700.0:
        return math.inf
    return 2.0 * 2.0**-53 * ((18.0 * b + 2.0) * math.exp(2.0 / b) + 2.0 * LOG_ULPS + 4.0)


def exponential_excess(epsilon: float, scale: float) -> float:
    """ln((1 + lambda)/(1 - lambda)), lambda = (4 rho/h) e^(eps (h + rho)/4): how much the
    snapped float mechanism's probability ratio can exceed the exact one's (a cell of width
    w >= h/2 widened or shrunk by rho at both ends changes its mass by a factor within
    1 +- 2 rho/w times the density ratio across w + rho, at most e^(eps (w + rho)/4))."""
    rho, h = exponential_error(scale), EXPONENTIAL_GRID
    if not rho < h / 16.0:
        return math.inf
    lam = 4.0 * rho / h * math.exp(epsilon * (h + rho) / 4.0)
    if not lam < _LAMBDA_LIMIT:
        return math.inf
    return math.log1p(lam) - math.log1p(-lam)


def exponential_calibration(epsilon: float) -> float:
    """The epsilon the exact mechanism is run at (noise scale 4/eps_run) so that eps_run plus
    `exponential_excess` is at most `epsilon`."""
    excess = exponential_excess(epsilon, 4.0 / epsilon)
    run = epsilon - excess
    while run > epsilon / 2 and run + exponential_excess(epsilon, 4.0 / run) > epsilon:
        run -= excess + math.ulp(epsilon)
    if not (run > epsilon / 2 and run + exponential_excess(epsilon, 4.0 / run) <= epsilon):
        raise ValueError(f"epsilon {epsilon!r} is too large for the float64 exponential mechanism")
    return run


class Exponential(_PureLocal):
    """Exponential mechanism (McSherry & Talwar 2007) on the output range [-1, 1] with utility
    -|t - y| (sensitivity 2): density proportional to exp(-eps |t - y| / 4), a Laplace truncated
    to [-1, 1]; its output rounded to the grid of step 2^-10 (2049 values). Run at eps_run
    (`exponential_calibration`) so that the float64 computation's excess is inside eps.
    Biased toward 0 near the edges; variance in closed form below (of the unsnapped law; the
    grid adds at most h^2/4 + h E|y - t|)."""

    name = "exponential"
    release_check = (
        "every coordinate is on the grid of step 2^-10 in [-1, 1] (every one is possible for "
        "every input, so a raw update on the grid passes)"
    )

    def __init__(self, epsilon: float, clip: bool = False) -> None:
        super().__init__(epsilon, clip)
        self.run_epsilon = exponential_calibration(self.epsilon)

    def output_set(self) -> OutputSet:
        count = round(2.0 / EXPONENTIAL_GRID) + 1
        return OutputSet(grid=(-1.0, EXPONENTIAL_GRID, count))

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        t = flat_input(x)
        stream, out = mechanism_stream(generator), _output(t)
        b = 4.0 / self.run_epsilon
        c = math.exp(-1.0 / b)
        from . import kernels  # numba: paid on the first perturb only

        t_np, out_np = t.numpy(), out.numpy()
        # eps_run <= 1.38: the same arithmetic without the reductions its range does not need
        kernel = kernels.exponential_narrow if 2.0 / b <= kernels.NARROW_SPAN else kernels.exponential
        for lo, hi in blocks(t.numel()):
            # u: 53 of each word's bits. The masses over b: left of t 1 - c h, right of t
            # 1 - c / h, with c = exp(-1/b) and h = exp(-t/b): ONE exp per coordinate, float64 so
            # that the masses resolve the uniform; exp and log: the kernels' own (`kernels.exp_pair64`,
            # `kernels.log_table64`), within what `exponential_error` assumes
            words, args = words64(stream, hi - lo).numpy(), (out_np[lo:hi], b, c, EXPONENTIAL_GRID)
            if not kernel(words, t_np[lo:hi], *args):  # outside [-1, 1]: see `Duchi.perturb`
                kernel(words, self._block(t[lo:hi]).numpy(), *args)
        return out.view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        t = self._input(x).to(torch.float64)
        b = 4.0 / self.run_epsilon

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

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(
            self.epsilon,
            0.0,
            "value",
            "coordinate",
            f"exponential: eps={self.epsilon:g}-LDP for each coordinate's value in {self.domain} "
            f"(snapped to a 2^-10 grid; run at eps {self.run_epsilon:.17g}, the floating-point excess "
            "inside eps); a tensor of d coordinates costs d*eps",
        )
