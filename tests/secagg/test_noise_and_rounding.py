"""The discrete Gaussian sampler and the stochastic rounding: laws checked against exact
probabilities with fixed seeds (tolerances from the binomial/chi-square variance), and the
rounding's coupling property on which the sensitivity bound rests."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from mechanisms.randomness import seeded_generator
from mechanisms.secagg.discrete_gaussian import DiscreteGaussian, bernoulli_exp, bernoulli_exp_ratio, uniform_below
from mechanisms.secagg.quantize import (
    centered,
    rounded_sensitivity,
    scale_for,
    stochastic_round,
    sum_mod_fits,
    wrap,
)


def stream(seed: int):
    return seeded_generator(seed).mechanism


def within(count: int, n: int, p: float, sds: float = 5.0) -> bool:
    return abs(count - n * p) <= sds * math.sqrt(n * p * (1 - p)) + 1


def test_uniform_below_is_uniform_and_in_range():
    n, m = 70_000, 7
    u = uniform_below(np.full(n, m, dtype=np.int64), stream(1))
    assert u.min() >= 0 and u.max() < m
    counts = np.bincount(u, minlength=m)
    assert all(within(int(c), n, 1 / m) for c in counts)
    with pytest.raises(ValueError):
        uniform_below(np.array([0], dtype=np.int64), stream(1))


@pytest.mark.parametrize(("a", "b"), [(0, 5), (1, 3), (3, 3), (7, 2)])
def test_bernoulli_exp_has_probability_exp_minus_a_over_b(a, b):
    n = 60_000
    draws = bernoulli_exp_ratio(np.full(n, a, dtype=np.int64), b, stream(a * 10 + b))
    assert within(int(draws.sum()), n, math.exp(-a / b))
    with pytest.raises(ValueError):
        bernoulli_exp(np.array([4], dtype=np.int64), np.array([3], dtype=np.int64), stream(0))


def test_discrete_gaussian_matches_its_exact_pmf():
    dg = DiscreteGaussian(scale=3, ratio=2)  # sigma^2 = 6
    n = 100_000
    x = dg.sample(n, stream(7))
    support = np.arange(-12, 13)
    weights = [Fraction(math.exp(-(int(k) ** 2) / 12)) for k in range(-40, 41)]
    total = float(sum(weights))
    chi2 = 0.0
    for k in support:
        p = math.exp(-(int(k) ** 2) / 12) / total
        chi2 += (int((x == k).sum()) - n * p) ** 2 / (n * p)
    # 25 cells: chi-square with 24 degrees of freedom, mean 24, sd 6.9; 60 is beyond 5 sd
    assert chi2 < 60
    assert abs(x).max() < 30


def test_large_variance_discrete_gaussian_has_its_variance():
    dg = DiscreteGaussian.covering(4.0e10)
    assert dg.variance >= 4.0e10
    n = 200_000
    x = dg.sample(n, stream(3)).astype(np.float64)
    sd = math.sqrt(dg.variance)
    assert abs(x.mean()) < 5 * sd / math.sqrt(n)
    assert abs(x.var() / dg.variance - 1) < 5 * math.sqrt(2 / n)


def test_the_largest_variance_the_sampler_accepts_samples_without_overflow():
    """2 t m just under 2^62: the Bernoulli(a / (b K)) steps never form b K (it overflowed int64
    from K = 2 on: sampling raised in the middle of a round)."""
    dg = DiscreteGaussian(scale=2**30, ratio=2**30 + 5)
    n = 4_000
    x = dg.sample(n, stream(11)).astype(np.float64)
    assert abs(x.mean()) < 5 * math.sqrt(dg.variance / n)
    assert abs(x.var() / dg.variance - 1) < 5 * math.sqrt(2 / n)


def test_stochastic_round_is_unbiased_and_moves_less_than_one():
    t = np.array([0.25, -0.25, 3.0, -7.75, 1e8 + 0.5])
    draws = np.stack([stochastic_round(t, stream(100 + i)) for i in range(4000)])
    assert (np.abs(draws - t) < 1).all()
    assert (draws[:, 2] == 3).all()
    assert within(int((draws[:, 0] == 1).sum()), 4000, 0.25)
    assert within(int((draws[:, 3] == -7).sum()), 4000, 0.25)


def test_rounding_with_the_same_uniforms_keeps_differences_within_one():
    """The coupling behind `rounded_sensitivity`: the same stream rounds x and x + v to values whose
    difference is within 1 of v in every coordinate."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1000, 50_000)
    v = rng.normal(0, 0.3, 50_000)
    d = stochastic_round(x + v, stream(5)) - stochastic_round(x, stream(5))
    assert (np.abs(d - v) < 1).all()
    assert np.linalg.norm(d) < rounded_sensitivity(float(np.linalg.norm(v)), v.size)


def test_wrap_and_centered_invert_each_other_in_range():
    x = np.array([0, 1, -1, 2**31 - 1, -(2**31)], dtype=np.int64)
    assert (centered(wrap(x, 32), 32) == x).all()
    assert (wrap(x, 32) >= 0).all() and (wrap(x, 32) < 2**32).all()


def test_scale_keeps_the_worst_case_sum_inside_the_modulus():
    s = scale_for(32, 60_000, 0.1, 15.0, 39_862)
    units = s * 0.1
    assert units == 2.0 ** round(math.log2(units))
    assert sum_mod_fits(32, 60_000, units, 15.0 * rounded_sensitivity(2 * units, 39_862))
    assert not sum_mod_fits(32, 60_000, 2 * units, 15.0 * rounded_sensitivity(4 * units, 39_862))


def test_acceptance_beyond_int64_takes_the_python_integer_path():
    """A proposal so far out that (|y| - m)^2 overflows int64 is accepted with probability
    exp(-2^80 / 12): never, and without an overflow."""
    dg = DiscreteGaussian(scale=3, ratio=2)
    y = np.array([2**40, -(2**40), 1], dtype=np.int64)
    accepted = [dg._accept(y, stream(s)) for s in range(20)]
    assert not any(a[0] or a[1] for a in accepted)
    assert any(a[2] for a in accepted)  # exp(-1/12) for y = 1


def test_bernoulli_exp_minus_one_compares_with_the_digits_of_one_over_e():
    """Bernoulli(exp(-1)) is [U < 1/e] digit word by digit word: the digits are those of 1/e
    (mpmath at 400 bits as the reference) and the frequency is exp(-1)."""
    import mpmath

    from mechanisms.secagg.discrete_gaussian import _inverse_e_digits, bernoulli_exp_one

    with mpmath.workprec(400):
        reference = int(mpmath.floor(mpmath.mpf(2) ** 252 / mpmath.e))
    assert reference == sum(_inverse_e_digits(level) << (63 * (3 - level)) for level in range(4))
    n = 200_000
    assert within(int(bernoulli_exp_one(n, stream(9)).sum()), n, math.exp(-1))
