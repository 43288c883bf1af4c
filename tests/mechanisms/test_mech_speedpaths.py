"""The fast perturb paths take their decisions from the same uniform a plain reference would.

Each fast path draws `uniform_(low, high)` (the affine map folded into the draw) where a reference
draws `uniform_()` and subtracts: both consume one generator word per element, so with the same
seed the i-th decision must agree. PNPM's threshold sits between grid points and its shifted draw
is exact, so it must agree everywhere. Elsewhere the fast path rounds the threshold or the draw
(and whether torch fuses `a + alpha * b` into one FMA depends on the CPU's vector kernel), so a
decision may differ only where u lies within that rounding of the threshold: each test derives
this band and requires every disagreement to lie inside it (it holds no draw at all for these
seeds; ~0.01 expected in 200k).

u below is the unit roundoff (2^-24 in float32, 2^-53 in float64): one rounding of x moves it by
at most u |x|.
"""

import math

import torch

import mechanisms as M
from mechanisms.base import half_grid_threshold

N = 200_000
U32 = torch.finfo(torch.float32).eps / 2
U64 = torch.finfo(torch.float64).eps / 2


def disagree_only_within(fast, reference, u, threshold, band):
    """Every element where the decisions differ has |u - threshold| <= band (all float64)."""
    differ = fast != reference
    assert bool(((u - threshold).abs()[differ] <= band[differ]).all()), int(differ.sum())


def _uniforms(seed, dtype=torch.float32):
    return torch.empty(N, dtype=dtype).uniform_(generator=torch.Generator().manual_seed(seed))


def test_pnpm_flip_is_exactly_u_below_q():
    e = math.e
    q = half_grid_threshold(1 / (e + 1), torch.float32)
    u = _uniforms(5)
    w = torch.randn(N, generator=torch.Generator().manual_seed(6))
    y = M.get("pnpm", epsilon=1.0).perturb(w, generator=torch.Generator().manual_seed(5))
    flipped = torch.sign(y) != torch.sign(w)
    assert torch.equal(flipped, u < q)
    # position inside the interval: |t*| = 1 + (C - 1) (q - u)/q when flipped, else 1 + (C - 1)(u - q)/(1 - q)
    c = M.local.pnpm_bound(1.0)
    u64 = u.double()
    expected = torch.where(u64 < q, 1 + (c - 1) * (q - u64) / q, 1 + (c - 1) * (u64 - q) / (1 - q))
    # float32 t* = k_keep L + sign(s): s, the slope, k_keep and their product round once each at
    # magnitude <= C - 1, the sum once at |t*| >= 1, y = w t* once: relative error
    # <= (4 (C - 1) + 2) u32 (11 u32 here; seen: 2.8 u32), plus the float64 reference's few u64
    assert torch.allclose((y.double() / w.double()).abs(), expected, rtol=(4 * (c - 1) + 2) * U32 + 8 * U64, atol=0)


def test_duchi_and_ldp_fl_decisions_match_reference():
    t = torch.rand(N, generator=torch.Generator().manual_seed(8)) * 2 - 1
    u = _uniforms(9).double()
    e = math.exp(0.7)
    k = (e - 1) / (2 * (e + 1))
    threshold = 0.5 + k * t.double()
    y = M.get("duchi", epsilon=0.7).perturb(t, generator=torch.Generator().manual_seed(9))
    # fast: sign(u - 1/2 - k t) with u - 1/2 exact, k rounded to float32 and k t rounded (unless
    # fused): 2 u32 |k t| (3 covers the second-order terms); the final subtraction keeps its
    # sign. Reference: a few u64.
    band = 3 * U32 * (k * t.double()).abs() + 4 * U64
    disagree_only_within(y > 0, u < threshold, u, threshold, band)
    # LDP-FL with a centre far from 0: the threshold is computed on w - c, so precision holds
    # (a float64 input draws float64 uniforms)
    w = 1000.0 + 0.01 * t.double()
    u = _uniforms(9, torch.float64)
    z = M.get("ldp-fl", epsilon=0.7, center=1000.0, radius=0.01).perturb(w, generator=torch.Generator().manual_seed(9))
    slope = (w - 1000.0) / 0.01  # w - 1000 is exact (Sterbenz)
    threshold = 0.5 + k * slope
    # k / r and its product with w - c round once each (2 u64 |k s|), the reference a few u64 more,
    # and the clamp to [c - r, c + r] moves w - c by at most an ulp of 1000 where |w - c| ~ r
    band = 4 * U64 * (0.5 + (k * slope).abs()) + k * math.ulp(1000.0) / 0.01
    disagree_only_within(z > 1000.0, u < threshold, u, threshold, band)


def test_rr_binary_keeps_exactly_when_u_below_keep():
    v = torch.randint(0, 2, (N,), generator=torch.Generator().manual_seed(10)).float()
    u = _uniforms(11).double()
    keep = math.e / (math.e + 1)
    y = M.get("rr", epsilon=1.0, k=2).perturb(v, generator=torch.Generator().manual_seed(11))
    assert set(torch.unique(y).tolist()) <= {0.0, 1.0}
    # fast: shift = low + (high - low) u on [1 - e, 2) in float32, "keep" iff shift < 1. Rounding
    # low (which enters twice), high, their difference, the product (~e) and the sum (~1) moves
    # shift by <= (2 |low| + high + 2 (e + 1) + 1) u32; in units of u that is divided by e + 1
    e = math.e
    band = torch.full_like(u, (2 * (e - 1) + 2 + 2 * (e + 1) + 1) * U32 / (e + 1) + 4 * U64)
    disagree_only_within(y == v, u < keep, u, torch.full_like(u, keep), band)


def test_hybrid_duchi_share_and_pm_share():
    eps = 2.0
    t = torch.full((N,), 0.3)
    y = M.get("hm", epsilon=eps).perturb(t, generator=torch.Generator().manual_seed(12))
    b = M.local.duchi_bound(eps)
    beta = M.local.hybrid_pm_probability(eps)
    k = (math.exp(eps) - 1) / (2 * (math.exp(eps) + 1))
    # The Duchi share lands on +-B up to its float32 arithmetic: PM's inverse CDF evaluated at 0 or
    # 1, shifted by B + C: ~8 roundings of values up to 2 k1 + B + 2C, where k1 = (z + 1)(C + 1)
    # (z = e^(eps/2)) is the slope of that inverse CDF, which bounds the draw's range and offset
    # (8 u32 * 29 = 1.4e-5 here; seen: 4.4e-7). PM outputs that land this close to +-B by chance
    # (density 1/k1 there: ~0.6 expected) are far inside the binomial tolerance.
    c = M.local.piecewise_bound(eps)
    k1 = (math.exp(eps / 2) + 1) * (c + 1)
    near = 8 * U32 * (2 * k1 + b + 2 * c)
    plus, minus = (y.double() - b).abs() <= near, (y.double() + b).abs() <= near
    # binomial counts: 5 standard deviations
    for observed, p in ((plus, (1 - beta) * (0.5 + k * 0.3)), (minus, (1 - beta) * (0.5 - k * 0.3))):
        assert abs(int(observed.sum()) - N * p) <= 5 * math.sqrt(N * p * (1 - p))


def test_laplace_outputs_are_bounded_symmetric_and_finite():
    """The snapping Laplace (Mironov 2012) clamps to its outer grid point: every output is finite
    and within `bound` (the outer grid point plus half a step of dither), exactly (the output
    (k + phi) L is a float32 when |k + phi| < 2^12 and L is a power of 2). Its draw
    (tests/mechanisms/test_float_noise.py) reaches every binade, so the bound, not the uniform's
    grid, is what limits the noise."""
    mech = M.get("laplace", epsilon=1.0)
    y = mech.perturb(torch.zeros(N), generator=torch.Generator().manual_seed(13)).double()
    assert bool(torch.isfinite(y).all())
    assert float(y.abs().max()) <= mech.bound
    # symmetric: P[noise > 0] = 1/2 within 5 binomial sd (an output is never exactly 0: phi != 0)
    assert abs(int((y > 0).sum()) - N / 2) <= 5 * math.sqrt(N / 4)


def test_gaussian_norm_matches_float64():
    """l2_norm sums squares in float32 over rows of _NORM_ROW values (in whatever order the CPU's
    vector kernel takes), then the row results in float64. The relative error of a float32 sum of
    n positive terms grows as sqrt(n) u32 (Higham and Mary 2019; 2 sqrt(n) u32 is ~6 standard
    deviations of that random walk, n u32 the worst case); the square root halves it and rounds
    once more; the total norm's relative error is a weighted mean of its rows'. So the tolerance
    is (sqrt(_NORM_ROW) + 1) u32 = 17 u32, whatever n (seen: <= 1.6 u32 at n = 256; a plain
    float32 norm of 10^6 values is ~200 u32 off). 257 tests one row plus a tail."""
    from mechanisms.gaussian import _NORM_ROW, l2_norm

    for n in (1, 255, 256, 257, 1_000_003):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 0.05
        exact = float(torch.linalg.vector_norm(x.double()))
        rel = (math.sqrt(_NORM_ROW) + 1) * U32 + (n / _NORM_ROW + 2) * U64
        assert abs(l2_norm(x) - exact) <= rel * exact, (n, abs(l2_norm(x) - exact) / exact / U32)


def test_blocked_exponential_matches_a_whole_tensor_reference():
    """The exponential mechanism draws and transforms block by block (cache-sized); the result
    must equal a plain float64 inverse CDF on ONE whole-tensor draw, across blocks and a short
    last block. (Laplace, which now draws twice per block, is checked against a reference of its
    own in tests/mechanisms/test_float_noise.py.)

    Both sides compute the same value in float64 by different formulas (log vs log1p, vector
    kernels whose last bit varies by CPU) and round it once to float32, so they may differ by
    their float64 disagreement plus one float32 ulp (2 u32 relative) where the two straddle a
    float32 rounding boundary. (Seen: bit-identical float32, float64 outputs 3.6e-15 apart.)"""
    n = 2 * M.local._BLOCK + 12_345
    t = torch.rand(n, generator=torch.Generator().manual_seed(14)) * 2 - 1
    t64 = t.double()

    eps, b = 1.5, 4.0 / 1.5
    u = torch.empty(n, dtype=torch.float64).uniform_(generator=torch.Generator().manual_seed(16))
    left = b * -torch.expm1(-(1 + t64) / b)
    right = b * -torch.expm1(-(1 - t64) / b)
    s = u * (left + right) - left  # signed mass from t
    reference = (t64 - b * torch.sign(s) * torch.log1p(-s.abs() / b)).clamp(-1, 1).float()
    y = M.get("exponential", epsilon=eps).perturb(t, generator=torch.Generator().manual_seed(16))
    # each side: ~8 roundings of masses of size <= 1, then log(1 - |s|) with 1 - |s| >= e^(-2/b)
    # (amplifies the absolute error by up to e^(2/b)), scaled by b
    float64_error = 16 * U64 * b * math.exp(2 / b)
    assert torch.allclose(y, reference, rtol=2 * U32, atol=float64_error)
    # at large eps the float64 masses round (1 - c h -> 1); outputs stay finite and in range
    t = torch.linspace(-1, 1, 100_001)
    for eps in (50.0, 699.0):
        y = M.get("exponential", epsilon=eps).perturb(t, generator=torch.Generator().manual_seed(17))
        assert bool(torch.isfinite(y).all()) and float(y.abs().max()) <= 1.0
