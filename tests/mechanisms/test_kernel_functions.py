"""The kernels' own log, exp, cos and sin (mechanisms/kernels.py; docs/MECHANISMS.md, "The
kernels' own log, exp, cos and sin"): measured against mpmath at 40 digits on inputs that reach
every reduction case (every cell of the table log), within the bounds the written error analysis
proves and the mechanisms' float bounds assume (LOG_ULPS for log and exp, NOISE_ULPS for a
Gaussian pair), the table log's premises checked exactly; and the laws the new noise paths
sample, at fixed seeds, within 5 standard errors of the closed forms."""

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from numba import njit

import mechanisms as M
from mechanisms import gaussian as G
from mechanisms import kernels as K
from mechanisms import snapping as S
from mechanisms.randomness import seeded_generator

Z = 5.0
UNIT = 2.0**-53
PROVEN = 3.0  # the written bound of the series log and exp_pair64, relative, in units of 2^-53
# the written bound of log_table64: |LOG(x) - ln x| <= 2^-53 (TABLE_ABSOLUTE + TABLE_RELATIVE |ln x|)
TABLE_ABSOLUTE, TABLE_RELATIVE = 0.4, 2.4
mpmath.mp.dps = 40


@njit(error_model="numpy")
def _logs(x, out):
    for i in range(x.size):
        f, e = K.log_parts(x[i])
        out[i] = K.log1p_reduced(f, e)


@njit(error_model="numpy")
def _table_logs(x, out):
    for i in range(x.size):
        out[i] = K.log_table64(x[i])


@njit(error_model="numpy")
def _exps(x, up, down):
    for i in range(x.size):
        up[i], down[i] = K.exp_pair64(x[i])


@njit(error_model="numpy")
def _narrow(x, f, up, down, log1p):
    for i in range(x.size):
        up[i], down[i] = K.exp_pair_reduced(x[i])
    for i in range(f.size):
        log1p[i] = K.log1p_narrow(f[i])


@njit(error_model="numpy")
def _pairs(first, aux, u, cos, sin):
    for i in range(first.size):
        cos[i], sin[i] = K.normal_pair(first[i], aux[i], u[i])


def _relative(values: np.ndarray, exact: list) -> float:
    """The largest |value - exact| / |exact|, in units of 2^-53 (exact 0: the error itself)."""
    worst = 0.0
    for v, e in zip(values.tolist(), exact):
        error = abs(mpmath.mpf(v) - e)
        worst = max(worst, float(error / abs(e)) if e != 0 else float(error) / UNIT)
    return worst / UNIT if worst < 1.0 else worst


def _log_inputs() -> np.ndarray:
    rng = np.random.default_rng(3)
    near_one = 1.0 + rng.uniform(-(2.0**-6), 2.0**-6, 3000)
    edges = [2.0**-1022, 1.0, 2.0, 0.5, math.sqrt(0.5), math.sqrt(2.0), math.nextafter(1.0, 0.0)]
    edges += [math.nextafter(1.0, 2.0), math.nextafter(math.sqrt(2.0), 0.0), 2.0**-53, 1.0 - 2.0**-53]
    binades = np.ldexp(rng.uniform(1.0, 2.0, 3000), rng.integers(-1022, 0, 3000))
    return np.concatenate([near_one, np.array(edges), binades, rng.uniform(0.5, 2.0, 3000)])


def test_series_log_is_within_its_proven_bound():
    """The Gaussian's log (`log1p_reduced` on `log_parts`), every reduction case: x = 2^e (1 + f)
    with 1 + f on both sides of sqrt 2, x next to 1 (where ln x -> 0: the relative bound is the
    hard one), powers of 2, the smallest normal."""
    x = _log_inputs()
    out = np.empty_like(x)
    _logs(x, out)
    worst = _relative(out, [mpmath.log(mpmath.mpf(v)) for v in x.tolist()])
    assert worst <= PROVEN <= S.LOG_ULPS


def test_table_log_premises_hold_exactly():
    """What the written bound of `log_table64` rests on: in every cell, |z/c_i - 1| (z times the
    rounded 1/c_i, less 1, a monotone function of z: its edges bound it) at most 2^-9; every
    table log within 2^-55 + 2^-130 of -ln(1/c_i); LN2 within 0.21 x 2^-53 of ln 2; 0.6875 and
    the edges as the kernel's bit arithmetic makes them. And its use: times b < 2/NARROW_SPAN
    (the kernel it serves), at most the 2 LOG_ULPS units that `exponential_error` allows."""
    edges = K.LOG_CELL_EDGES
    assert edges[0] == 0.6875 and edges[-1] == 1.375 and len(edges) == K.LOG_INVERSES.size + 1 == 257
    for i, inverse in enumerate(K.LOG_INVERSES.tolist()):
        for z in (edges[i], edges[i + 1]):
            assert abs(Fraction(float(z)) * Fraction(inverse) - 1) <= Fraction(1, 2**9)
        exact = -mpmath.log(mpmath.mpf(inverse))
        assert abs(mpmath.mpf(float(K.LOG_VALUES[i])) - exact) <= mpmath.mpf(2) ** -55 + mpmath.mpf(2) ** -130
    assert abs(mpmath.mpf(K._LN2) - mpmath.log(2)) <= 0.21 * UNIT
    assert TABLE_ABSOLUTE * 2.0 / K.NARROW_SPAN + TABLE_RELATIVE * 2.0 <= 2.0 * S.LOG_ULPS


def test_table_log_is_within_its_proven_bound():
    """Every cell of `log_table64` (its lower edge, the float below its upper edge, a point
    inside) in the binades of the exponential mechanism's d = 1 - |s| (down to e^-25.1 at its
    largest eps) and at both ends of the normal range, x next to 1 on both sides, random
    binades: within 2^-53 (0.4 + 2.4 |ln x|) of ln x."""
    rng = np.random.default_rng(9)
    edges = K.LOG_CELL_EDGES
    z = np.concatenate(
        [edges[:-1], np.nextafter(edges[1:], 0.0), edges[:-1] + rng.uniform(0.0, 1.0, 256) * np.diff(edges)]
    )
    scales = np.ldexp(1.0, np.array([-1021, -36, -1, 0, 1022]))
    near_one = 1.0 + rng.uniform(-(2.0**-8), 2.0**-8, 500)
    spread = np.ldexp(rng.uniform(1.0, 2.0, 1000), rng.integers(-1021, 1023, 1000))
    x = np.concatenate([np.outer(scales, z).ravel(), near_one, np.exp(-rng.uniform(0.0, 25.1, 1000)), spread])
    x = np.concatenate([x, [1.0, math.nextafter(1.0, 0.0), math.nextafter(1.0, 2.0), 2.0**-1022]])
    out = np.empty_like(x)
    _table_logs(x, out)
    worst = 0.0
    for v, got in zip(x.tolist(), out.tolist()):
        exact = mpmath.log(mpmath.mpf(v))
        bound = UNIT * (TABLE_ABSOLUTE + TABLE_RELATIVE * abs(exact))
        worst = max(worst, float(abs(mpmath.mpf(got) - exact) / bound))
    assert worst <= 1.0, f"{worst:.3f} of the bound"


def test_exp_pair64_is_within_its_proven_bound():
    """e^x and e^-x over the exponential mechanism's range (|x| = |t|/b <= 14 at eps 55; the bound
    holds to 700), next to the reduction's cell edges (x near (k + 1/2) ln 2) and at 0."""
    rng = np.random.default_rng(4)
    halves = (np.arange(-40, 40) + 0.5) * math.log(2.0)
    x = np.concatenate([rng.uniform(-1.0, 1.0, 3000), rng.uniform(-700.0, 700.0, 3000), halves, [0.0, -0.0]])
    up, down = np.empty_like(x), np.empty_like(x)
    _exps(x, up, down)
    assert _relative(up, [mpmath.exp(mpmath.mpf(v)) for v in x.tolist()]) <= PROVEN
    assert _relative(down, [mpmath.exp(-mpmath.mpf(v)) for v in x.tolist()]) <= PROVEN
    assert up[-1] == down[-1] == 1.0


def test_narrow_exp_and_log1p_are_within_their_proven_bounds():
    """The exponential mechanism's functions for eps_run <= 1.38 (`kernels.exponential_narrow`):
    e^x, e^-x for |x| <= 0.345 without the reduction, ln(1 + f) for f in [-1/2, 0] (down to f
    tiny, where the relative bound is the hard one)."""
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.uniform(-0.345, 0.345, 4000), [0.345, -0.345, 0.0, 2.0**-30]])
    f = -np.concatenate(
        [rng.uniform(0.0, 0.5, 3000), np.ldexp(rng.uniform(0.5, 1.0, 1000), -rng.integers(1, 60, 1000))]
    )
    f = np.concatenate([f, [-0.5, -(2.0**-53)]])
    up, down, log1p = np.empty_like(x), np.empty_like(x), np.empty_like(f)
    _narrow(x, f, up, down, log1p)
    assert _relative(up, [mpmath.exp(mpmath.mpf(v)) for v in x.tolist()]) <= PROVEN
    assert _relative(down, [mpmath.exp(-mpmath.mpf(v)) for v in x.tolist()]) <= PROVEN
    assert _relative(log1p, [mpmath.log1p(mpmath.mpf(v)) for v in f.tolist()]) <= PROVEN
    # the span's promises: |t/b| <= span/2 <= 0.3466 (ln 2 / 2) and the masses 1 - e^-span < 1/2
    assert math.log(2.0) > K.NARROW_SPAN and 1.0 - math.exp(-K.NARROW_SPAN) < 0.5


def test_full_exponential_kernel_needs_no_guard_at_its_extremes():
    """The full kernel (eps_run > 1.38) reads its log from a table and has no guard for d = 0:
    at eps 2 and the largest eps, the extreme draws (u = 0 and u = 1 - 2^-53) from the extreme
    inputs, where d = 1 - |s| is smallest (e^(-2/b), e^-25 at eps 50) or 1, give the grid's
    ends as the exact inverse CDF does."""
    for eps in (2.0, 50.0):
        mech = M.get("exponential", epsilon=eps)
        b = 4.0 / mech.run_epsilon
        assert 2.0 / b > K.NARROW_SPAN
        words = np.array([0, ((1 << 53) - 1) << 10] * 2, dtype=np.int64)
        t = np.array([-1.0, -1.0, 1.0, 1.0], dtype=np.float32)
        out = np.empty(4, dtype=np.float32)
        assert K.exponential(words, t, out, b, math.exp(-1.0 / b), S.EXPONENTIAL_GRID)
        assert out.tolist() == [-1.0, 1.0, -1.0, 1.0]


def test_gaussian_pair_is_within_the_noise_budget():
    """A pair's r cos 2 pi V and r sin 2 pi V against their exact values for R (Y = U*/2, or 1 - Y)
    and V = j 2^-53 as drawn: within (NOISE_ULPS - 2 - 2 pi) 2^-53 r, the budget less the terms for
    U* and V's grid (which compare with the real uniforms, not the drawn ones). Words reach all
    three branches of ln R (coin set; coin clear with Y below and above 1 - sqrt(1/2)), all eight
    octants and U* from 2^-1022 to 1."""
    rng = np.random.default_rng(5)
    m = 4000
    first = rng.integers(-(2**63), 2**63, m, dtype=np.int64)
    aux = rng.integers(-(2**63), 2**63, m, dtype=np.int64)
    u = np.concatenate(
        [rng.uniform(0.0, 1.0, m - 200), np.ldexp(rng.uniform(0.5, 1.0, 200), -rng.integers(1, 1022, 200))]
    )
    cos, sin = np.empty(m), np.empty(m)
    _pairs(first, aux, u, cos, sin)
    budget = (G.NOISE_ULPS - 2.0 - 2.0 * math.pi) * UNIT
    worst = 0.0
    for a, b, v, c, s in zip(first.tolist(), aux.tolist(), u.tolist(), cos.tolist(), sin.tolist()):
        y = mpmath.mpf(v) / 2
        radius = mpmath.sqrt(-2 * (mpmath.log(y) if a < 0 else mpmath.log1p(-y)))
        angle = 2 * mpmath.pi * mpmath.mpf(b & ((1 << 53) - 1)) / 2**53
        error = max(abs(c - radius * mpmath.cos(angle)), abs(s - radius * mpmath.sin(angle)))
        worst = max(worst, float(error / radius))
    assert worst <= budget, f"{worst / UNIT:.2f} units against {budget / UNIT:.2f}"


@pytest.mark.parametrize(("t", "eps"), [(0.3, 1.0), (-0.9, 8.0)])
def test_exponential_law_at_fixed_seed(t, eps):
    """The snapped truncated Laplace: P[y <= q] for cell edges q against the closed form of the
    density exp(-eps_run |y - t| / 4) on [-1, 1] (rounding to the 2^-10 grid: y <= k h iff the
    exact value is below (k + 1/2) h), 5 standard errors of a proportion at n = 200,000."""
    mech = M.get("exponential", epsilon=eps)
    b = 4.0 / mech.run_epsilon
    n = 200_000
    y = mech.perturb(torch.full((n,), t), generator=seeded_generator(21)).double()

    def cdf(q: float) -> float:  # of the unsnapped law, for q in [-1, 1]
        left, right = b * (1 - math.exp(-(1 + t) / b)), b * (1 - math.exp(-(1 - t) / b))
        if q <= t:
            return b * (math.exp(-(t - q) / b) - math.exp(-(1 + t) / b)) / (left + right)
        return (left + b * (1 - math.exp(-(q - t) / b))) / (left + right)

    h = S.EXPONENTIAL_GRID
    for k in (-900, -500, -100, 0, 200, 307, 600, 1000):
        p = cdf(min((k + 0.5) * h, 1.0))
        count = int((y <= k * h).sum())
        assert abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p)) + 1, (k, count, n * p)


def test_new_noise_paths_keep_the_release_checks():
    """What the kernels release passes the release check; the same values moved off the grid do
    not (all by half a grid step, or one by a third of one), for the Gaussian and the exponential
    mechanism."""
    x = torch.randn(5000, generator=torch.Generator().manual_seed(6)) * 0.01
    for mech in (
        M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0),
        M.get("exponential", epsilon=1.0),
    ):
        step = mech.grid if isinstance(mech, G.Gaussian) else S.EXPONENTIAL_GRID
        y = mech.perturb(x, generator=seeded_generator(7))
        assert mech.release_violation(y) is None
        assert mech.release_violation(y + step / 2) is not None
        moved = y.clone()
        moved[17] += step / 3
        assert mech.release_violation(moved) is not None
