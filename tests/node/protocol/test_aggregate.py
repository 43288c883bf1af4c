"""Aggregation: exact values, the same bits under every permutation, robustness to an outlier.

Bit-for-bit checks here rest on the design (node/protocol/aggregate.py): fedavg and trimmed-mean
are integer fixed-point sums with one final rounding, median sorts and averages two floats in
float64, krum returns one input; none reduces floats in an order a CPU's vector kernel picks.
Exact reference values are small multiples of powers of two, so the reference's own elementwise
IEEE arithmetic is exact too. The robustness checks are statistical, with tolerances derived
from the noise level (their float rounding is below 1e-6, their margins above 7e-3)."""

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

from node.protocol.aggregate import RULES, aggregate, aggregate_digest

D = 2_000


def inputs(n=6, seed=0, d=D):
    g = torch.Generator().manual_seed(seed)
    vectors = [torch.randn(d, generator=g) * 0.1 for _ in range(n)]
    vectors[0][:10] = -0.0  # signed zeros must not leak the input order
    vectors[1][:10] = 0.0
    vectors[2] = vectors[3].clone()  # duplicates: ties in sorts and in krum scores
    weights = [int(w) for w in torch.randint(1, 500, (n,), generator=g)]
    return vectors, weights


@pytest.mark.parametrize("rule", RULES)
def test_same_bits_under_permutations(rule):
    vectors, weights = inputs()
    reference = aggregate_digest(aggregate(rule, vectors, weights, trim_ratio=0.2, krum_f=1))
    rng = np.random.default_rng(0)
    perms = [tuple(rng.permutation(len(vectors))) for _ in range(8)] + [tuple(reversed(range(len(vectors))))]
    for perm in perms:
        out = aggregate(rule, [vectors[i] for i in perm], [weights[i] for i in perm], trim_ratio=0.2, krum_f=1)
        assert out.dtype == torch.float32 and out.shape == (D,)
        assert aggregate_digest(out) == reference, f"{rule} differs under permutation {perm}"


def test_fedavg_is_exact_when_the_mean_is_representable():
    # Values on a 2^-10 grid and weights summing to a power of two: the exact mean is a float32.
    a = torch.tensor([0.5, -1.25, 3.0, 1024.0])
    b = torch.tensor([0.25, 0.75, -3.0, -1024.0])
    out = aggregate("fedavg", [a, b], [3, 1])
    assert torch.equal(out, (3 * a + b) / 4)  # exact on both sides: every intermediate is a float32


def test_fedavg_matches_rational_mean_within_quantization():
    vectors, weights = inputs(n=5, seed=1)
    out = aggregate("fedavg", vectors, weights)
    total = sum(weights)
    for j in range(0, D, 97):
        exact = sum(Fraction(float(v[j])) * w for v, w in zip(vectors, weights)) / total
        # Quantization 2^-41 per input (scale 2^40) plus one float32 rounding of the result.
        tolerance = Fraction(1, 2**40) + abs(exact) * Fraction(1, 2**23)
        assert abs(Fraction(float(out[j])) - exact) <= tolerance


def test_fedavg_handles_large_values_by_coarser_scale():
    big = [torch.full((4,), 3e6), torch.full((4,), -1e6)]
    assert torch.equal(aggregate("fedavg", big, [1, 1]), torch.full((4,), 1e6))  # integers: exact
    with pytest.raises(ValueError, match="too large for exact fixed-point"):
        aggregate("fedavg", [torch.full((2,), 3e38)], [1000])


def test_median_and_trimmed_mean_values():
    # exact: midpoints and means of small integers (halves, quarters) are floats, in any order
    rows = [torch.tensor([1.0, 5.0]), torch.tensor([3.0, -1.0]), torch.tensor([2.0, 100.0]), torch.tensor([4.0, 0.0])]
    assert aggregate("median", rows, [1] * 4).tolist() == [2.5, 2.5]
    assert aggregate("median", rows[:3], [1] * 3).tolist() == [2.0, 5.0]
    # trim 0.25 of 4 = 1 value off each end: mean of the middle two.
    assert aggregate("trimmed-mean", rows, [1] * 4, trim_ratio=0.25).tolist() == [2.5, 2.5]
    assert aggregate("trimmed-mean", rows, [1] * 4, trim_ratio=0.0).tolist() == [2.5, 26.0]
    # any ratio > 0 drops at least one value at each end of three or more, so that one extreme
    # value never reaches the mean (floor(0.1 x 4) alone is 0); two values cannot be trimmed
    assert aggregate("trimmed-mean", rows, [1] * 4, trim_ratio=0.1).tolist() == [2.5, 2.5]
    assert aggregate("trimmed-mean", rows[:3], [1] * 3, trim_ratio=0.1).tolist() == [2.0, 5.0]
    assert aggregate("trimmed-mean", rows[:2], [1] * 2, trim_ratio=0.1).tolist() == [2.0, 2.0]
    extreme = torch.tensor([2.0**20 - 1, -(2.0**20 - 1)])
    for n in range(4, 30):  # one extreme member among n - 1 equal values moves nothing
        honest = [torch.tensor([1.0, -3.0])] * (n - 1)
        assert aggregate("trimmed-mean", [*honest, extreme], [1] * n, trim_ratio=0.1).tolist() == [1.0, -3.0]


def test_krum_returns_one_input_bit_for_bit():
    vectors, weights = inputs(n=6, seed=2)
    out = aggregate("krum", vectors, weights, krum_f=1)
    assert any(torch.equal(out, v) for v in vectors)


@pytest.mark.parametrize("rule,tolerance", [("median", 0.05), ("trimmed-mean", 0.05), ("krum", 0.12)])
def test_robust_rules_resist_one_scaled_outlier(rule, tolerance):
    # Honest peers: a common vector plus N(0, 0.05^2) noise per coordinate. The honest mean is
    # off the common vector by ~0.05/sqrt(4) = 0.025 per coordinate; the coordinate median of
    # 5 (one outlier) stays within ~2 noise stds of it; krum picks one honest vector, whose RMS
    # distance to the common vector is 0.05 (tolerance 0.12 > 2 std).
    g = torch.Generator().manual_seed(3)
    common = torch.randn(D, generator=g)
    honest = [common + 0.05 * torch.randn(D, generator=g) for _ in range(4)]
    outlier = -50.0 * common
    vectors = honest[:2] + [outlier] + honest[2:]
    honest_mean = torch.stack(honest).mean(0)
    rms = lambda v: float((v - honest_mean).pow(2).mean().sqrt())  # noqa: E731
    out = aggregate(rule, vectors, [100] * 5, trim_ratio=0.2, krum_f=1)
    assert rms(out) < tolerance  # seen: median 0.022, trimmed-mean 0.019, krum 0.043
    assert rms(aggregate("fedavg", vectors, [100] * 5)) > 5  # the plain mean is dragged away


def test_errors():
    v = torch.zeros(3)
    with pytest.raises(ValueError, match="empty list"):
        aggregate("fedavg", [], [])
    with pytest.raises(ValueError, match=r"vectors\[1\] has shape \(4,\)"):
        aggregate("median", [v, torch.zeros(4)], [1, 1])
    with pytest.raises(ValueError, match=r"vectors\[1\] holds NaN"):
        aggregate("fedavg", [v, torch.tensor([0.0, float("nan"), 0.0])], [1, 1])
    with pytest.raises(ValueError, match="2 vectors but 1 weights"):
        aggregate("fedavg", [v, v], [1])
    with pytest.raises(ValueError, match=r"weights\[0\] must be a positive integer"):
        aggregate("fedavg", [v], [0])
    with pytest.raises(ValueError, match="dtype torch.float64"):
        aggregate("fedavg", [v.double()], [1])
    with pytest.raises(ValueError, match="unknown aggregation rule 'mean'"):
        aggregate("mean", [v], [1])
    with pytest.raises(ValueError, match="trim_ratio"):
        aggregate("trimmed-mean", [v], [1], trim_ratio=0.5)
    with pytest.raises(ValueError, match="at least f \\+ 3 = 4 vectors, got 3"):
        aggregate("krum", [v, v, v], [1, 1, 1], krum_f=1)


def test_all_permutations_small_case():
    vectors, weights = inputs(n=4, seed=5, d=50)
    for rule in RULES:
        digests = {
            aggregate_digest(aggregate(rule, [vectors[i] for i in p], [weights[i] for i in p], krum_f=1))
            for p in itertools.permutations(range(4))
        }
        assert len(digests) == 1, rule
