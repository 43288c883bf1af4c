"""Every mechanism is exact in floating point: what it can output does not depend on its input
(beyond what its definition releases), and its probabilities are the ones its eps is stated for.

The real `perturb` runs on prepared keystream words (`ReplayStream`) that enumerate every value
the mechanism reads from a word (all 2^24 values of a 24-bit draw; the 32-bit words only ever
enter through a comparison with a threshold, so a word on each side of it stands for all), and
each output's probability is then an exact count over those words: the tests compare the sets
of outputs of neighbouring inputs and bound every output's probability ratio by e^eps in
rational arithmetic. Where a draw has too many bits to enumerate (the float64 uniforms of the
exponential and Gaussian mechanisms), words are built to reach every output cell from the
extreme inputs instead: every cell is reachable from every input, and the clamp takes the rest.

Measured on the implementation before this one (float32 inverse CDFs on torch's 2^-24 uniforms,
every one of them run through its perturb): PNPM eps 1 gave outputs for w = 0.0123 that
w = -0.0123 cannot produce with probability 0.43 (eps 2: 0.46), PM eps 1 (t = 0.3 vs -0.2) 0.59
and HM eps 2 0.53: the support checks below fail on it.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import mechanisms as M
from mechanisms.draws import BLOCK, WORD, exp_lower, float32_count_below
from mechanisms.local import CELLS, HALF
from tests.mechanisms.replay import replay

ALL24 = torch.arange(-(1 << 23), 1 << 23, dtype=torch.int32)  # every 24-bit draw W


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tests stream 2^24 coordinates through cheap passes: one thread is faster than two
    contended ones."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def blockwise(*parts: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """The words of a mechanism that reads len(parts) words per coordinate block by block: each
    block's words are part 0's for the block, then part 1's, ... (lengths: multiples of block)."""
    return torch.stack([p.view(-1, block) for p in parts], dim=1).reshape(-1)


def below(threshold: float) -> int:
    """An int32 word whose float32 is below `threshold` (the largest one)."""
    return float32_count_below(threshold) - 2**31 - 1


def at_or_above(threshold: float) -> int:
    return float32_count_below(threshold) - 2**31


def two_point_counts(y: torch.Tensor) -> dict[float, int]:
    """How many outputs are the largest value and how many the smallest (every output must be
    one of them)."""
    high, low = float(y.max()), float(y.min())
    counts = {high: int((y == high).sum()), low: int((y == low).sum())}
    assert sum(counts.values()) == y.numel() or high == low
    return counts


def grid_counts(y: torch.Tensor, values: tuple[float, float, int], extra: tuple[float, ...] = ()) -> dict[float, int]:
    """How many outputs are each grid value (by index) and each of the `extra` points; every
    output must be one of them (to float rounding of the grid's values)."""
    first, step, n = values
    special = torch.zeros_like(y, dtype=torch.bool)
    found: dict[float, int] = {}
    for point in extra:
        hit = y == point
        special |= hit
        if int(hit.sum()):
            found[point] = int(hit.sum())
    on_grid = y[~special] if extra else y
    index = ((on_grid - first) / step).round_()  # in the output's dtype: the index is < 2^11
    if on_grid.numel():
        assert float((on_grid - (first + index * step)).abs().max()) <= 8 * 2.0**-23 * abs(first)
    histogram = torch.bincount(index.long(), minlength=n)
    assert histogram.numel() == n
    found.update({float(k): int(c) for k, c in enumerate(histogram.tolist()) if c})
    return found


def max_ratio(laws: list[dict[float, Fraction]]) -> Fraction:
    """The largest P[y | a] / P[y | b] over outputs y and pairs of inputs (all laws must share
    their support: asserted)."""
    support = set(laws[0])
    for law in laws:
        assert set(law) == support, "an output possible under one input is impossible under another"
    return max(max(law[y] for law in laws) / min(law[y] for law in laws) for y in support)


def test_float32_thresholds_count_exactly():
    """float32_count_below against a brute-force conversion of every int32 word near the
    threshold (the words far from it convert far from it)."""
    for threshold in (-1.5e9, -2147483392.0, -7.0, 0.0, 123456789.0, 2.0**31):
        count = float32_count_below(threshold)
        edge = count - 2**31
        window = torch.arange(max(edge - 4096, -(2**31)), min(edge + 4096, 2**31), dtype=torch.int64)
        below_ = window.to(torch.float32) < threshold
        assert bool(below_[window < edge].all()) and not bool(below_[window >= edge].any())


@pytest.mark.parametrize("name, eps", [("duchi", 0.05), ("ldp-fl", 4.0)])
def test_duchi_decisions_are_exact(name, eps):
    """Every 24-bit draw W through the real perturb, for inputs across the domain: the outputs are
    +-B' for every input, P[+B' | t] = (2^23 + floor(A t + 1/2))/2^24 exactly (2^23 +- A at the
    ends), and every output's probability ratio between two inputs is at most e^eps."""
    mech = M.get(name, epsilon=eps, **({"radius": 0.5, "center": 0.25} if name == "ldp-fl" else {}))
    steps = M.local.duchi_steps(eps)
    laws = []
    for t in (-1.0, 0.37, 1.0):
        x = torch.full((ALL24.numel(),), t if name == "duchi" else 0.25 + 0.5 * t)
        c = two_point_counts(mech.perturb(x, generator=replay(ALL24 << 8)))
        assert len(c) == 2
        plus = c[max(c)]
        assert plus == HALF + math.floor(steps * t + 0.5)
        laws.append({y: Fraction(k, 2**24) for y, k in c.items()})
    assert max_ratio(laws) <= exp_lower(eps)
    assert max_ratio(laws) == Fraction(HALF + steps, HALF - steps)


@pytest.mark.parametrize("eps", [1.0])
def test_pnpm_output_set_is_the_same_for_w_and_minus_w(eps):
    """Outputs S fl(|w| M): every magnitude the draw can give (all 2^23 values of J's low 23 bits)
    with a flip word on each side of the threshold: w and -w give exactly the same multiset of
    float32 outputs, and each output's probability ratio is (1 - q)/q <= e^eps, q = (T + 2^30)/2^31
    counted exactly."""
    mech = M.get("pnpm", epsilon=eps)
    j = torch.arange(1 << 23, dtype=torch.int32)
    n = j.numel()
    flips = torch.tensor([2 * mech.threshold - 1, 2 * mech.threshold], dtype=torch.int32)  # (F >> 1) < T, = T
    q = Fraction(mech.threshold + (1 << 30), 1 << 31)
    assert (1 - q) / q <= exp_lower(eps) and q == Fraction(mech.flip_probability)
    for w in (0.0123, 3.0e-7):
        outputs = {}
        for sign in (1.0, -1.0):
            ys = []
            for f in flips:
                words = blockwise(torch.full((n,), int(f), dtype=torch.int32), j)
                ys.append(mech.perturb(torch.full((n,), sign * w), generator=replay(words)))
            outputs[sign] = torch.cat(ys)
        plus, minus = outputs[1.0], outputs[-1.0]
        assert torch.equal(torch.sort(plus).values, torch.sort(minus).values)
        assert int((plus > 0).sum()) == n  # one flip word flips, the other keeps: half each
        assert bool((plus.abs() >= w * (1 - 2**-23)).all()) and bool(
            (plus.abs() <= w * mech.bound * (1 + 2**-22)).all()
        )


def _pm_law(
    mech: M.Mechanism, law: M.local.PiecewiseGrid, t: float, everywhere: int, skipped: int = 0
) -> dict[float, Fraction]:
    """P[y | t] of the grid PM (or HM's PM branch, given it), exactly: the all-branch's cells from
    every W (branch word `everywhere`), the window's from every W at t."""
    n = ALL24.numel()
    x = torch.full((n,), t)
    branches = {}
    for branch in (everywhere, at_or_above(law.threshold)):
        words = blockwise(torch.full((n,), branch, dtype=torch.int32), ALL24 << 8)
        branches[branch] = grid_counts(mech.perturb(x, generator=replay(words)), law.values)
    all_counts, window_counts = branches[everywhere], branches[at_or_above(law.threshold)]
    alpha = Fraction(float32_count_below(law.threshold) - skipped, WORD - skipped)
    assert len(all_counts) == CELLS and set(all_counts.values()) == {2**24 // CELLS}
    assert set(window_counts) <= set(all_counts) and max(window_counts.values()) <= law.window_count
    first, step, _ = law.values
    return {
        first + k * step: alpha * Fraction(all_counts[k], 2**24)
        + (1 - alpha) * Fraction(window_counts.get(k, 0), 2**24)
        for k in all_counts
    }


@pytest.mark.parametrize("eps", [1.0])
def test_pm_is_exact_on_its_grid(eps):
    """Every 24-bit position draw through the real perturb, in each branch: all 1024 grid values
    are possible from every input, and each one's probability ratio between inputs (alpha'/N +
    (1 - alpha') count/2^24, alpha' counted from the threshold) is at most e^eps."""
    mech = M.get("pm", epsilon=eps)
    inputs = (-1.0, 0.3, 1.0)
    laws = [_pm_law(mech, mech.law, t, below(mech.law.threshold)) for t in inputs]
    assert max_ratio(laws) <= exp_lower(eps)
    for t, law in zip(inputs, laws, strict=True):  # unbiased up to the grid
        assert sum(law.values()) == 1
        mean = sum(y * p for y, p in law.items())
        assert abs(float(mean) - t) <= mech.law.scale * 2.0**-10


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_hm_is_exact(eps):
    """HM's three branches (Duchi, PM over all cells, PM's window), each enumerated: the union of
    outputs is the same for every input and every output's ratio is at most e^eps."""
    mech = M.get("hm", epsilon=eps)
    duchi_words = float32_count_below(mech.duchi_threshold)
    p_duchi = Fraction(duchi_words, WORD)
    laws = []
    for t in (-1.0, 1.0):
        n = ALL24.numel()
        words = blockwise(torch.full((n,), below(mech.duchi_threshold), dtype=torch.int32), ALL24 << 8)
        y = mech.perturb(torch.full((n,), t), generator=replay(words))
        duchi = {v: p_duchi * Fraction(k, 2**24) for v, k in two_point_counts(y).items()}
        law = dict(duchi)
        if mech.law is not None:
            pm = _pm_law(mech, mech.law, t, at_or_above(mech.duchi_threshold), duchi_words)
            for y, p in pm.items():
                law[y] = law.get(y, Fraction(0)) + (1 - p_duchi) * p
        laws.append(law)
    assert max_ratio(laws) <= exp_lower(eps)


def test_rr_categories_are_exact():
    """k = 2: flip iff float32(word) < threshold, exactly `other` words (brute force near it);
    k = 3: the words at each boundary K + j c land in the categories on either side of it."""
    rr2 = M.get("rr", epsilon=1.0, k=2)
    flips = float32_count_below(rr2.flip_threshold)
    assert flips == rr2.other and Fraction(rr2.keep, rr2.other) <= exp_lower(1.0)
    words = torch.tensor([below(rr2.flip_threshold), at_or_above(rr2.flip_threshold)], dtype=torch.int32)
    y = rr2.perturb(torch.tensor([0.0, 0.0]), generator=replay(words))
    assert y.tolist() == [1.0, 0.0]
    rr3 = M.get("rr", epsilon=1.0, k=3)
    assert rr3.keep + 2 * rr3.other == WORD and Fraction(rr3.keep, rr3.other) <= exp_lower(1.0)
    edges = [rr3.keep + j * rr3.other for j in range(3)]  # unsigned words: keep below K, then j = 0, 1
    unsigned = [e + d for e in edges for d in (-1, 0)]
    words = torch.tensor([u - 2**31 for u in unsigned if u < WORD], dtype=torch.int64).to(torch.int32)
    y = rr3.perturb(torch.zeros(words.numel()), generator=replay(words))
    assert y.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0][: words.numel()]


def _exponential_word(u: float) -> int:
    """The int64 word whose 53-bit uniform (bits 10..62, shifted down) is u's grid value."""
    return int(u * 2**53) << 10


def test_exponential_reaches_every_cell_from_the_extreme_inputs():
    """For t = -1 and t = 1, a uniform placed at the exact CDF of each of the 2049 grid cells'
    centres (a cell is [y - h/2, y + h/2] in [-1, 1]) lands in that cell through the real perturb:
    every output is possible from every input."""
    mech = M.get("exponential", epsilon=2.0)
    h = M.snapping.EXPONENTIAL_GRID
    b = 4.0 / mech.run_epsilon
    grid = torch.arange(-1.0, 1.0 + h / 2, h, dtype=torch.float64)
    targets = grid.clamp(-1 + h / 4, 1 - h / 4)  # inside the edge cells, which are half as wide
    for t in (-1.0, 1.0):
        mass = torch.where(
            targets < t,
            torch.exp(-(t - targets) / b) - math.exp(-(t + 1) / b),
            (1 - math.exp(-(t + 1) / b)) + (1 - torch.exp(-(targets - t) / b)),
        )
        total = (1 - math.exp(-(t + 1) / b)) + (1 - math.exp(-(1 - t) / b))
        words = torch.tensor([_exponential_word(float(u)) for u in (mass / total)], dtype=torch.int64)
        y = mech.perturb(torch.full((grid.numel(),), t), generator=replay(words))
        assert torch.equal(y.double(), grid)


def _u_star_words(u: float, extra_bits: int) -> tuple[int, int, list[int]]:
    """Words that make `round_down_uniform_` return exactly u (a float64 >= 2^-1022): the first
    level's (its 63-bit word, its extra bits), then (more, bits) for each level below: a level
    whose binade bits are all 0 goes down 2^-(11 + extra bits), the next ones by 2^-53."""
    grid, deeper = 11 + extra_bits, []
    value, level_bits, extra_of_level = u, grid, extra_bits
    chain = []
    while value < 2.0**-level_bits:
        chain.append(level_bits)
        value *= 2.0**level_bits
        level_bits, extra_of_level = 53, 42
    mantissa, exponent = math.frexp(value)  # value in [2^(exponent-1), 2^exponent)
    h = 1 << (level_bits - (1 - exponent))
    bits = ((h >> extra_of_level) << 52) | int((mantissa * 2.0 - 1.0) * 2**52)
    extra = h & ((1 << extra_of_level) - 1)
    if not chain:
        return bits, extra, []
    for _ in chain[1:]:
        deeper += [0, 0]  # more, bits: h = 0 again
    deeper += [extra << 21, bits]
    return 0, 0, deeper


def _gaussian_words(noise_sigmas: float) -> torch.Tensor:
    """The words making the sampler's first coordinate r cos(theta) = `noise_sigmas` (theta = 0,
    or pi for a negative value): R = exp(-r^2/2), the coin picks R = U*/2 or 1 - U*/2."""
    r = abs(noise_sigmas)
    big_r = math.exp(-r * r / 2.0)
    coin = big_r < 0.5
    bits, extra, deeper = _u_star_words(2.0 * big_r if coin else 2.0 * (1.0 - big_r), 10)
    first = bits | (-(1 << 63) if coin else 0)
    angle = 0 if noise_sigmas >= 0 else 1 << 52  # V = 1/2: theta = pi
    return torch.tensor([first, (extra << 53) | angle, *deeper], dtype=torch.int64)


@pytest.mark.parametrize("z", [0.06, 1.0, 3.0])
def test_gaussian_reaches_every_clamped_cell_from_the_extreme_inputs(z):
    """Snapped Gaussian: outputs are k L, |k| <= K, for every input; and for a clipped coordinate
    at +S and at -S, words built for noise landing on the outermost cells (and a few inside) give
    exactly those cells: every grid value is reachable from both extremes (the clamp takes the
    rest)."""
    mech = M.get("gaussian", clip_norm=1.0, noise_multiplier=z)
    grid, steps, sigma = mech.grid, mech.steps, mech.sigma
    for x in (1.0, -1.0):
        for k in (-steps, -steps + 1, -1, 0, 1, steps - 1, steps):
            noise = (k * grid - x) / sigma
            words = _gaussian_words(noise)
            y = mech.perturb(torch.tensor([x, 0.0]), generator=replay(words))
            assert float(y[0]) == k * grid, (x, k, float(y[0]) / grid)
    y = mech.perturb(torch.randn(10_000) * 10)
    index = y.double() / grid
    assert torch.equal(index, index.round()) and float(index.abs().max()) <= steps
