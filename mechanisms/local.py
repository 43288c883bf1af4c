"""Per-coordinate local mechanisms (scope "coordinate": a tensor of d values costs d*eps).

Every mechanism here releases values from a finite set fixed by its parameters alone (the input
decides only the probabilities), and draws them with probabilities that are exact dyadic
fractions: keystream words compared with thresholds whose counts are computed exactly when the
mechanism is built (mechanisms/draws.py). Each states the eps those exact probabilities satisfy,
checked in rational arithmetic against a lower bound of e^eps, so floating point adds nothing to
it (docs/MECHANISMS.md, "Floating point"). The snapping Laplace and the exponential mechanism are
in mechanisms/snapping.py.

Each perturb path works block by block (draws.BLOCK coordinates): draw the block's words, turn
them and the input into the output in one pass of a compiled kernel (mechanisms/kernels.py;
PNPM on float64 and RR with k > 2: a few whole-tensor passes). Formulas cite the papers in
docs/MECHANISMS.md.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from .base import (
    Guarantee,
    Mechanism,
    OutputSet,
    check_epsilon,
    check_finite,
    check_finite_block,
    check_positive,
    check_tensor,
    check_values,
    constant,
    first_violation,
    flat_input,
    release_flat,
    scratch,
)
from .draws import WORD, blocks, exp_lower, float32_threshold, words32
from .randomness import PrivacyGenerator, RandomStream, mechanism_stream

# exp(eps) overflows a double near 709; no useful local mechanism runs there.
MAX_EPSILON = 700.0
HALF = 1 << 23  # the 24-bit grid of the two-point decisions: w >> 8 is uniform on [-2^23, 2^23)


def _epsilon(epsilon: object) -> float:
    eps = check_epsilon(epsilon)
    if eps > MAX_EPSILON:
        raise ValueError(f"epsilon must be <= {MAX_EPSILON}, got {epsilon!r}")
    return eps


def _output(like: torch.Tensor) -> torch.Tensor:
    return torch.empty(like.numel(), dtype=like.dtype)


# ---------------------------------------------------------------------------------------------
# Pure formulas of the papers (also used by tests and the audit)


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


def piecewise_variance(t: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The continuous PM's variance t^2/(z - 1) + (z + 3)/(3 (z - 1)^2) (Wang et al. 2019)."""
    z = math.exp(epsilon / 2.0)
    return t * t / (z - 1.0) + (z + 3.0) / (3.0 * (z - 1.0) ** 2)


# ---------------------------------------------------------------------------------------------
# Duchi's two-point decision on the 2^-24 grid


def duchi_steps(epsilon: float) -> int:
    """A: the largest integer with (2^23 + A) / (2^23 - A) <= e^eps, checked in rationals.

    The decision "+B iff W + 1/2 + A t >= 0" for W uniform on [-2^23, 2^23) (24 bits of a word)
    has P[+B | t] = (2^23 + floor(A t + 1/2)) / 2^24, between (2^23 - A)/2^24 at t = -1 and
    (2^23 + A)/2^24 at t = 1 for every computed A t in [-A, A]: so every output's probability
    ratio between two inputs is at most e^eps, exactly. B' = 2^23 / A makes it unbiased (up to
    the rounding of A t to the grid: |bias| <= 1/(2A))."""
    e = math.exp(epsilon)
    steps = min(HALF - 1, math.floor((e - 1.0) / (2.0 * (e + 1.0)) * 2**24))
    bound = exp_lower(epsilon)
    while steps > 0 and Fraction(HALF + steps, HALF - steps) > bound:
        steps -= 1
    if steps < 1:
        raise ValueError(f"epsilon {epsilon!r} is too small for the 2^-24 probability grid of Duchi's decision")
    return steps


def duchi_exact_bound(epsilon: float) -> float:
    """B' = 2^23 / A (`duchi_steps`): the two outputs +-B' of the exact-grid Duchi mechanism;
    B' >= B, and B'/B - 1 < 2^-23 / k, k = (e - 1)/(2(e + 1))."""
    return float(HALF) / duchi_steps(epsilon)


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

    def _block(self, t: torch.Tensor, spare: int = 6) -> torch.Tensor:
        """One block of the input, checked (finite, in [-1, 1]) or clamped into scratch `spare`."""
        out = scratch(t.numel(), t.dtype, spare) if self.clip else None
        return check_values(t, low=-1.0, high=1.0, clip=self.clip, out=out)

    def params(self) -> dict[str, object]:
        return {"name": self.name, "epsilon": self.epsilon, "clip": self.clip}

    def output_set(self) -> OutputSet | None:
        """The values one output coordinate can take (None: every real, nothing to check)."""
        return None

    def release_violation(self, y: torch.Tensor) -> str | None:
        output = self.output_set()
        if output is None:
            return None
        return output.violation(y, f"in {self.name}(eps {self.epsilon:g})'s output set")

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


class Duchi(_PureLocal):
    """Duchi et al.: output +-B' with P[+B'] = 1/2 + t/(2B') on the 2^-24 grid (`duchi_steps`);
    unbiased, Var = B'^2 - t^2. B' is the paper's B = (e+1)/(e-1) up to the grid (< 2^-23/k)."""

    name = "duchi"
    release_check = "every coordinate is -B' or +B' (B' = 2^23/A, the paper's (e^eps + 1)/(e^eps - 1) on the grid)"

    def __init__(self, epsilon: float, clip: bool = False) -> None:
        super().__init__(epsilon, clip)
        self.steps = duchi_steps(self.epsilon)
        self.bound = float(HALF) / self.steps

    def output_set(self) -> OutputSet:
        return OutputSet(points=(-self.bound, self.bound))

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        t = flat_input(x)
        stream, out = mechanism_stream(generator), _output(t)
        from . import kernels  # numba: paid on the first perturb only

        t_np, out_np = t.numpy(), out.numpy()
        for lo, hi in blocks(t.numel()):
            words, args = words32(stream, hi - lo).numpy(), (out_np[lo:hi], 2.0 * self.steps, self.bound)
            if not kernels.duchi(words, t_np[lo:hi], *args):  # outside [-1, 1]: refuse, or clip and redo
                kernels.duchi(words, self._block(t[lo:hi]).numpy(), *args)
        return out.view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        t = self._input(x)
        return (self.bound**2 - t * t).view(x.shape)


class LDPFL(Mechanism):
    """Sun, Qian, Chen (IJCAI 2021): clamp w to [c - r, c + r], then Duchi on (w - c)/r, rescaled.

    Output c +- r B' (Duchi's exact-grid B'); unbiased for the clamped weight; Var = r^2 B'^2 - (w - c)^2.
    """

    name = "ldp-fl"
    release_check = "every coordinate is c - rB' or c + rB' (B' Duchi's exact-grid bound), up to float rounding"

    def __init__(self, epsilon: float, center: float = 0.0, radius: float = 1.0) -> None:
        self.epsilon = _epsilon(epsilon)
        self.center = check_finite(center, "center")
        self.radius = check_positive(radius, "radius")
        self.steps = duchi_steps(self.epsilon)
        self.bound = self.radius * HALF / self.steps
        self._center, self._radius = torch.tensor(self.center), torch.tensor(self.radius)  # float64 0-dim

    def release_violation(self, y: torch.Tensor) -> str | None:
        output = OutputSet(points=(self.center - self.bound, self.center + self.bound))
        return output.violation(y, f"in ldp-fl(eps {self.epsilon:g})'s output set")

    def _scaled_(self, s: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """s <- (w - c)/r clamped to [-1, 1]: the paper's clamp (without it eps does not hold), on
        w - c so that the decision keeps its precision even when |c| >> r."""
        if self.center == 0.0:  # w - 0 is w, bit for bit: one pass less
            return torch.div(w, self._radius, out=s).clamp_(-1.0, 1.0)
        return torch.sub(w, self._center, out=s).div_(self._radius).clamp_(-1.0, 1.0)

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        w = flat_input(x)
        stream, out = mechanism_stream(generator), _output(w)
        from . import kernels  # numba: paid on the first perturb only

        w_np, out_np, steps2 = w.numpy(), out.numpy(), 2.0 * self.steps
        for lo, hi in blocks(w.numel()):
            words = words32(stream, hi - lo).numpy()
            if not kernels.ldp_fl(words, w_np[lo:hi], out_np[lo:hi], self.center, self.radius, steps2, self.bound):
                check_values(w[lo:hi])  # inf or NaN: say so
        return out.view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        w = check_tensor(x)
        s = self._scaled_(torch.empty_like(w), w)
        return (self.bound**2 - (self.radius * s) ** 2).view(x.shape)

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


# ---------------------------------------------------------------------------------------------
# PNPM: a sign from an exact Bernoulli, a magnitude from a grid that does not depend on the input


def pnpm_flip_threshold(epsilon: float) -> int:
    """T: flip the sign iff (F >> 1) < T for a uniform int32 word F (F >> 1 is uniform on
    [-2^30, 2^30)), which happens with probability q = (T + 2^30)/2^31 >= 1/(e^eps + 1) exactly,
    so that (1 - q)/q <= e^eps."""
    needed = math.ceil(Fraction(1 << 31) / (exp_lower(epsilon) + 1))  # of the 2^31 values of F >> 1
    if 2 * needed >= 1 << 31:
        raise ValueError(f"epsilon {epsilon!r} is too small for PNPM's 2^-31 sign grid")
    return needed - (1 << 30)


_MANTISSA23 = torch.tensor((1 << 23) - 1, dtype=torch.int32)
_EXPONENT32 = 0x7F800000  # a float32's exponent field: all ones for inf and NaN


class PNPM(Mechanism):
    """Positive and Negative Piecewise Mechanism (the PNPM paper's Algorithm 2, see
    docs/MECHANISMS.md), applied as w <- |w| * PNPM(w / |w|) (its Algorithm 1, line 20).

    t* = S M: the sign S is sign(w) w.p. 1 - q and -sign(w) w.p. q, q = 1/(e+1) on the 2^-31 grid
    (`pnpm_flip_threshold`, from one word); the magnitude M is uniform on [1, C'] (the midpoints of
    2^23 cells, from another word), C' = 2/(1 - 2q) - 1, the paper's C = (e+3)/(e-1) for the grid's
    q, so E[t*] = 1 and Var[t*] = (C'-1)^2/12 + ((C'+1)/2)^2 - 1 (the paper's 4(e + 1/3)/(e-1)^2
    at q = 1/(e+1)). This is the paper's law:
    given the sign, t* is uniform on [1, C] or [-C, -1] alike. Output S fl(|w| M): M's values do
    not depend on w, and IEEE rounding is symmetric, so w and -w have the same output set.
    PROTECTS THE SIGN ONLY: |output| lies in [|w|, C'|w|], so weights of different magnitude have
    disjoint output supports, and w = 0 is released exactly. No finite eps holds for the value.
    """

    name = "pnpm"
    release_check = (
        "nothing: the output |w| t*, t* in [-C, -1] U [1, C], can be any real number when |w| is "
        "unknown, so neither the magnitudes nor the signs of a release can be checked"
    )

    def __init__(self, epsilon: float) -> None:
        self.epsilon = _epsilon(epsilon)
        self.threshold = pnpm_flip_threshold(self.epsilon)
        self.flip_probability = (self.threshold + (1 << 30)) / (1 << 31)
        self.bound = 2.0 / (1.0 - 2.0 * self.flip_probability) - 1.0  # C'
        # M = 1 + (C' - 1)(j + 1/2) 2^-23 for j the low 23 bits of J: the midpoints of 2^23 cells
        # of [1, C'], so E[M] = (1 + C')/2 exactly; as the float32 f = 1 + j 2^-23 (J's bits
        # under a float32 1.0's exponent), M = (C' - 1) f + 2 - C' + (C' - 1) 2^-24
        self._slope = self.bound - 1.0
        self._offset = 2.0 - self.bound + self._slope * 2.0**-24

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        w = flat_input(x)
        stream, out = mechanism_stream(generator), _output(w)
        if w.dtype != torch.float32:  # float64: the same law, computed without the float32 tricks
            return self._perturb64(w, stream, out).view(x.shape)
        from . import kernels  # numba: paid on the first perturb only

        slope, offset, threshold = np.float32(self._slope), np.float32(self._offset), np.int32(self.threshold)
        w_np, out_np = w.numpy(), out.numpy()
        w_bits, seen = w_np.view(np.int32), 0
        for lo, hi in blocks(w.numel()):
            words = words32(stream, 2 * (hi - lo)).numpy()  # the flip words, then the magnitude words
            exponents = kernels.pnpm32(words, w_np[lo:hi], w_bits[lo:hi], out_np[lo:hi], slope, offset, threshold)
            seen = max(seen, exponents)
        if seen == _EXPONENT32:  # inf or NaN in w, and no output is returned: check the input itself
            check_values(w)
        return out.view(x.shape)

    def _perturb64(self, w: torch.Tensor, stream: RandomStream, out: torch.Tensor) -> torch.Tensor:
        offset = constant(1.0 + self._slope * 2.0**-24, torch.float64)
        threshold = constant(self.threshold, torch.int32)
        for lo, hi in blocks(w.numel()):
            n = hi - lo
            words = words32(stream, 2 * n)
            flip, magnitude = words[:n], words[n:].bitwise_and_(_MANTISSA23)
            m = torch.add(offset, magnitude, alpha=self._slope * 2.0**-23, out=scratch(n, torch.float64, 1))
            sign = flip.bitwise_right_shift_(1).sub_(threshold).bitwise_right_shift_(31)  # -1: flip
            m.mul_(torch.add(constant(1.0, torch.float64), sign, alpha=2.0, out=scratch(n, torch.float64, 2)))
            torch.mul(m, check_finite_block(w[lo:hi]), out=out[lo:hi])
        return out

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        w = check_tensor(x)
        c = self.bound
        t_variance = (c - 1.0) ** 2 / 12.0 + ((c + 1.0) / 2.0) ** 2 - 1.0
        return (w * w * t_variance).view(x.shape)

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


# ---------------------------------------------------------------------------------------------
# PM on a grid: a mixture of "uniform over all cells" and "uniform over a window around t"

CELLS = 1 << 10  # PM's output grid: 1024 cells over [-C', C']
# The window position is computed in float32 from at most 4 roundings of values below CELLS
# (in cells): it is within 4 * 2^-24 * CELLS = 2^-12 cell of its exact value.
_POSITION_ERROR = 4.0 * 2.0**-24 * CELLS


class PiecewiseGrid:
    """The exact law of `Piecewise`: PM (Wang et al. 2019) with its output snapped to N = CELLS cells.

    PM's density is e^eps times higher on a window of width (C - 1) around t than elsewhere on
    [-C, C]: a mixture of "uniform over [-C, C]" (probability alpha) and "uniform over the window".
    Here: with probability alpha' (an int32 word in a range of float32 thresholds, an exact count
    of the 2^32 words) the cell is uniform over all N (the top bits of a 24-bit word J);
    otherwise it is floor(x + m U) for U = J/2^24, a window of m = round(N/(z + 1)) cells starting
    at x = (N - m)(t + 1)/2 (PM's window fraction (C - 1)/(2C) = 1/(z + 1)). The window position is
    computed in float32 within 2^-12 cell of its exact value, monotone in J, so a window cell gets
    at most `window_count` of the 2^24 values of J; alpha' is the smallest the thresholds allow
    with 1 + (1 - alpha') N window_count / (alpha' 2^24) <= e^eps (rationals): every cell's
    probability is at least alpha'/N and at most e^eps times that, for every t. Output value of
    cell k: c (k + 1/2 - N/2), c = 2/((1 - alpha')(N - m)), unbiased.

    `skipped` words (those with float32(word) below a threshold counting them, for HM's Duchi
    branch) are left out: alpha' is then the share of the others that go to "uniform over all".
    """

    def __init__(self, epsilon: float, skipped: int = 0) -> None:
        z = math.exp(epsilon / 2.0)
        n = CELLS
        self.window = max(1, min(n - 1, round(n / (z + 1.0))))
        m = self.window
        self.window_count = math.floor((1.0 + 3.0 * _POSITION_ERROR) * 2**24 / m) + 2
        excess = exp_lower(epsilon) - 1  # the ratio's excess over 1
        alpha = 1 / (1 + excess * Fraction(2**24, n * self.window_count))
        self.threshold, count = float32_threshold(skipped + math.ceil(alpha * (WORD - skipped)))
        if not (skipped < count < WORD):
            raise ValueError(f"epsilon {epsilon!r} is outside what PM's grid can realise")
        self.alpha = (count - skipped) / (WORD - skipped)
        self.scale = 2.0 / ((1.0 - self.alpha) * (n - m))

    @property
    def values(self) -> tuple[float, float, int]:
        """(first, step, count) of the output grid."""
        return (self.scale * (0.5 - CELLS / 2), self.scale, CELLS)

    def kernel_constants(self) -> tuple[np.float32, np.float32, np.float32, float, float]:
        """What `kernels.pm` computes a cell and its value with: the cell is "uniform over all"
        (floor(N/2 + W 2^-14), exact) iff float32(branch word) < threshold, else the window's
        floor(fma((N - m)/2, t, fma(m 2^-24, W, N/2))) clamped to [0, N - 1], in float32 (two
        fused roundings: the position bound `_POSITION_ERROR` counts four); then first + step cell.
        Returns (m 2^-24, (N - m)/2, threshold) as float32, (first, step) as float64."""
        first, step, _ = self.values
        m = self.window
        return np.float32(m * 2.0**-24), np.float32((CELLS - m) / 2.0), np.float32(self.threshold), first, step

    def variance(self, t: torch.Tensor) -> torch.Tensor:
        """Var of the output for inputs t (float64): the mixture's, with a continuous U (the
        2^24 grid of U moves it by less than 2^-20 relative)."""
        n, m, a = CELLS, self.window, self.alpha
        x = (n - m) * (t + 1.0) / 2.0
        frac = x - torch.floor(x)
        mean_all, var_all = (n - 1) / 2.0, (n * n - 1) / 12.0
        mean_window = x + (m - 1) / 2.0
        var_window = (m * m - 1) / 12.0 + frac * (1.0 - frac)
        var = a * var_all + (1 - a) * var_window + a * (1 - a) * (mean_all - mean_window) ** 2
        return self.scale**2 * var


class Piecewise(_PureLocal):
    """Wang et al. (ICDE 2019) Piecewise Mechanism on a grid of 1024 output values over
    [-C', C'] (`PiecewiseGrid`): exactly eps-LDP, unbiased."""

    name = "pm"
    release_check = (
        "every coordinate is one of PM's 1024 grid values in [-C', C'] (C' about (z + 1)/(z - 1), "
        "z = e^(eps/2)), up to float rounding (every one is possible from every input: a raw update "
        "passes only where it happens to sit on the grid)"
    )

    def __init__(self, epsilon: float, clip: bool = False) -> None:
        super().__init__(epsilon, clip)
        self.law = PiecewiseGrid(self.epsilon)

    def output_set(self) -> OutputSet:
        return OutputSet(grid=self.law.values)

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        t = flat_input(x)
        stream, out = mechanism_stream(generator), _output(t)
        from . import kernels  # numba: paid on the first perturb only

        grid, fused = self.law.kernel_constants(), out.dtype == torch.float32
        t_np, out_np = t.numpy(), out.numpy()
        for lo, hi in blocks(t.numel()):
            words = words32(stream, 2 * (hi - lo)).numpy()  # the branch words, then the position words
            if not kernels.pm(words, t_np[lo:hi], out_np[lo:hi], *grid, fused):  # see `Duchi.perturb`
                kernels.pm(words, self._block(t[lo:hi]).numpy(), out_np[lo:hi], *grid, fused)
        return out.view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        t = self._input(x)
        return self.law.variance(t.to(torch.float64)).to(t.dtype).view(x.shape)


class Hybrid(_PureLocal):
    """Wang et al. (ICDE 2019) Hybrid Mechanism: PM w.p. beta = 1 - e^(-eps/2) if eps > 0.61,
    else Duchi; here the grid PM (`PiecewiseGrid`) and the exact-grid Duchi, mixed with
    probability beta' on the 2^-32 grid. Each branch is exactly eps-LDP and the mixture weights
    do not depend on the input, so the mixture is too; unbiased, as both branches are.

    Two words per coordinate: U picks the branch (Duchi iff float32(U) < a threshold; within PM,
    "uniform over all" iff below PM's own threshold), J drives the branch taken (Duchi's
    decision, or PM's position): J serves one branch only, so both see it uniform."""

    name = "hm"
    release_check = (
        "eps <= 0.61 (Duchi only): every coordinate is -B' or +B'; above, every coordinate is "
        "Duchi's +-B' or one of PM's 1024 grid values; up to float rounding"
    )

    def __init__(self, epsilon: float, clip: bool = False) -> None:
        super().__init__(epsilon, clip)
        self.steps = duchi_steps(self.epsilon)
        self.bound = float(HALF) / self.steps
        beta = hybrid_pm_probability(self.epsilon)
        self.duchi_threshold, duchi_words = float32_threshold(round((1.0 - beta) * WORD))
        self.pm_probability = 1.0 - duchi_words / WORD
        self.law = PiecewiseGrid(self.epsilon, skipped=duchi_words) if duchi_words < WORD else None

    def output_set(self) -> OutputSet:
        if self.law is None:
            return OutputSet(points=(-self.bound, self.bound))
        return OutputSet(points=(-self.bound, self.bound), grid=self.law.values)

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        t = flat_input(x)
        stream, out = mechanism_stream(generator), _output(t)
        from . import kernels  # numba: paid on the first perturb only

        # no PM branch (eps <= 0.61): a NaN threshold, which no word is below
        grid = (
            self.law.kernel_constants()
            if self.law is not None
            else (np.float32(0), np.float32(0), np.float32("nan"), 0.0, 0.0)
        )
        steps2, duchi_threshold = 2.0 * self.steps, np.float32(self.duchi_threshold)
        fused, t_np, out_np = out.dtype == torch.float32, t.numpy(), out.numpy()
        for lo, hi in blocks(t.numel()):
            words = words32(stream, 2 * (hi - lo)).numpy()  # the branch words U, then the drive words J
            args = (out_np[lo:hi], steps2, self.bound, duchi_threshold, *grid, fused)
            if not kernels.hm(words, t_np[lo:hi], *args):  # see `Duchi.perturb`
                kernels.hm(words, self._block(t[lo:hi]).numpy(), *args)
        return out.view(x.shape)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        t = self._input(x)
        duchi = self.bound**2 - t.to(torch.float64) ** 2
        if self.law is None:
            return duchi.to(t.dtype).view(x.shape)
        beta = self.pm_probability
        # both branches are unbiased: the mixture's variance is the mixture of the variances
        pm = self.law.variance(t.to(torch.float64))
        return (beta * pm + (1.0 - beta) * duchi).to(t.dtype).view(x.shape)


# ---------------------------------------------------------------------------------------------
# Randomized response


class RandomizedResponse(Mechanism):
    """k-ary randomized response (Warner 1965; k = 2 is binary): inputs are categories 0..k-1
    stored as floats; keep w.p. K/2^32, else each of the other k - 1 w.p. c/2^32, with integers
    K + (k - 1) c = 2^32, c >= 2^32/(e^eps + k - 1), so K/c <= e^eps exactly (k = 2: c is the
    count of a float32 threshold, `draws.float32_threshold`)."""

    name = "rr"
    release_check = "every coordinate is an integer category 0..k-1"
    MAX_K = 1 << 20

    def __init__(self, epsilon: float, k: int = 2) -> None:
        self.epsilon = _epsilon(epsilon)
        if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= self.MAX_K:
            raise ValueError(f"k must be an integer >= 2 and <= {self.MAX_K}, got {k!r}")
        self.k = k
        bound = exp_lower(self.epsilon)
        if k == 2:  # flip iff float32(word) < threshold: exactly `other` of the words
            self.flip_threshold, self.other = float32_threshold(math.ceil(Fraction(WORD) / (bound + 1)))
        else:
            self.flip_threshold, self.other = math.nan, math.ceil(Fraction(WORD) / (bound + k - 1))
        self.keep = WORD - (k - 1) * self.other
        if not (self.keep > 0 and Fraction(self.keep, self.other) <= bound and self.other <= bound * self.keep):
            raise ValueError(f"epsilon {epsilon!r} is too small for randomized response's 2^-32 grid")

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
        return self.keep / WORD

    def _shift(self, words: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """out (float64) <- 0 (keep) or 1 + j, j = floor((U - K)/c) for U = word + 2^31 >= K: each
        other category from exactly c of the 2^32 words. The float64 quotient of integers below
        2^32 floors exactly (it is at least 1/c from the next integer up)."""
        torch.add(constant(float(2**31 - self.keep), torch.float64), words, out=out)
        return out.div_(self.other).floor_().add_(1.0).clamp_(0.0, self.k - 1.0)

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        v = flat_input(x)
        stream, out = mechanism_stream(generator), _output(v)
        if self.k == 2:
            return self._perturb_binary(v, stream, out).view(x.shape)
        for lo, hi in blocks(v.numel()):
            block = self._categories(v[lo:hi])
            shift = self._shift(words32(stream, hi - lo), scratch(hi - lo, torch.float64, 1))
            shift.add_(block)  # (v + shift) mod k for v + shift in [0, 2k - 2]
            wraps = torch.div(shift, self.k).floor_()
            out[lo:hi].copy_(shift.add_(wraps, alpha=-self.k))
        return out.view(x.shape)

    def _categories(self, block: torch.Tensor) -> torch.Tensor:
        """`block` if it holds integer categories 0..k-1 (ValueError otherwise)."""
        block = check_values(block, low=0.0, high=float(self.k - 1))
        # frac >= 0 on the checked non-negative block: one reduction (any() is about 7x slower)
        if float(torch.frac(block, out=scratch(block.numel(), block.dtype, 6)).amax()) > 0.0:
            raise ValueError(f"x must hold integer categories 0..{self.k - 1}")
        return block

    def _perturb_binary(self, v: torch.Tensor, stream: RandomStream, out: torch.Tensor) -> torch.Tensor:
        """k = 2: out = |v - flip|, flip iff float32(word) < the threshold (`kernels.binary_rr`)."""
        from . import kernels  # numba: paid on the first perturb only

        v_np, out_np, threshold = v.numpy(), out.numpy(), np.float32(self.flip_threshold)
        for lo, hi in blocks(v.numel()):
            if not kernels.binary_rr(words32(stream, hi - lo).numpy(), v_np[lo:hi], out_np[lo:hi], threshold):
                self._categories(v[lo:hi])  # a value that is not 0 or 1: say which
        return out

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        v = check_tensor(x, low=0.0, high=float(self.k - 1)).to(torch.float64)
        keep = self.keep_probability()
        other = self.other / WORD
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
