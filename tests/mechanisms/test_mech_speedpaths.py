"""The fast perturb paths take their decisions from the same uniform a plain reference would.

Each fast path draws `uniform_(low, high)` (the affine map folded into the draw) where a reference
draws `uniform_()` and subtracts: both consume one generator word per element, so with the same
seed the i-th decision must agree. Exact-threshold paths (PNPM, RR) must agree everywhere; paths
whose threshold depends on t (Duchi, HM) may differ only where u sits within an ulp of it, which
at 2^-24 per element is expected 0.01 times in 200k draws, so we allow at most 1.
"""

import math

import torch

import mechanisms as M
from mechanisms.base import half_grid_threshold

N = 200_000


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
    assert torch.allclose((y.double() / w.double()).abs(), expected, rtol=1e-5)


def test_duchi_and_ldp_fl_decisions_match_reference():
    t = torch.rand(N, generator=torch.Generator().manual_seed(8)) * 2 - 1
    u = _uniforms(9).double()
    e = math.exp(0.7)
    k = (e - 1) / (2 * (e + 1))
    reference = u < 0.5 + k * t.double()
    y = M.get("duchi", epsilon=0.7).perturb(t, generator=torch.Generator().manual_seed(9))
    assert int(((y > 0) != reference).sum()) <= 1
    # LDP-FL with a centre far from 0: the threshold is computed on w - c, so precision holds
    # (a float64 input draws float64 uniforms)
    w = 1000.0 + 0.01 * t.double()
    u = _uniforms(9, torch.float64)
    z = M.get("ldp-fl", epsilon=0.7, center=1000.0, radius=0.01).perturb(w, generator=torch.Generator().manual_seed(9))
    reference = u < 0.5 + k * ((w - 1000.0) / 0.01)
    assert int(((z > 1000.0) != reference).sum()) <= 1


def test_rr_binary_keeps_exactly_when_u_below_keep():
    v = torch.randint(0, 2, (N,), generator=torch.Generator().manual_seed(10)).float()
    u = _uniforms(11).double()
    keep = math.e / (math.e + 1)
    y = M.get("rr", epsilon=1.0, k=2).perturb(v, generator=torch.Generator().manual_seed(11))
    assert set(torch.unique(y).tolist()) <= {0.0, 1.0}
    assert int(((y == v) != (u < keep)).sum()) <= 1


def test_hybrid_duchi_share_and_pm_share():
    eps = 2.0
    t = torch.full((N,), 0.3)
    y = M.get("hm", epsilon=eps).perturb(t, generator=torch.Generator().manual_seed(12))
    b = M.local.duchi_bound(eps)
    beta = M.local.hybrid_pm_probability(eps)
    k = (math.exp(eps) - 1) / (2 * (math.exp(eps) + 1))
    plus, minus = (y - b).abs() < 1e-5, (y + b).abs() < 1e-5
    # binomial counts: 5 standard deviations
    for observed, p in ((plus, (1 - beta) * (0.5 + k * 0.3)), (minus, (1 - beta) * (0.5 - k * 0.3))):
        assert abs(int(observed.sum()) - N * p) <= 5 * math.sqrt(N * p * (1 - p))


def test_laplace_draw_is_symmetric_and_finite():
    """y = 2u - 1 + 2^-53 is never 0 or +-1: every output finite, |noise| <= b * 53 ln 2."""
    mech = M.get("laplace", epsilon=1.0)
    y = mech.perturb(torch.zeros(N), generator=torch.Generator().manual_seed(13)).double()
    assert bool(torch.isfinite(y).all())
    assert float(y.abs().max()) <= 2.0 * 53 * math.log(2) * (1 + 1e-6)
    # symmetric: P[noise > 0] = 1/2 within 5 binomial sd
    assert abs(int((y > 0).sum()) - N / 2) <= 5 * math.sqrt(N / 4)


def test_gaussian_norm_matches_float64():
    from mechanisms.gaussian import l2_norm

    for n in (1, 255, 256, 1_000_003):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 0.05
        exact = float(torch.linalg.vector_norm(x.double()))
        assert abs(l2_norm(x) - exact) <= 1e-7 * exact


def test_blocked_laplace_and_exponential_match_a_whole_tensor_reference():
    """Laplace and the exponential mechanism draw and transform block by block (cache-sized);
    the result must equal a plain float64 inverse CDF on ONE whole-tensor draw, across blocks
    and a short last block."""
    n = 2 * M.local._BLOCK + 12_345
    t = torch.rand(n, generator=torch.Generator().manual_seed(14)) * 2 - 1
    t64 = t.double()

    u = torch.empty(n, dtype=torch.float64).uniform_(-(1 - 2.0**-53), 1.0, generator=torch.Generator().manual_seed(15))
    reference = (t64 - 2.0 * torch.sign(u) * torch.log1p(-u.abs())).float()
    y = M.get("laplace", epsilon=1.0).perturb(t, generator=torch.Generator().manual_seed(15))
    assert torch.allclose(y, reference, rtol=0, atol=1e-6)

    eps, b = 1.5, 4.0 / 1.5
    u = torch.empty(n, dtype=torch.float64).uniform_(generator=torch.Generator().manual_seed(16))
    left = b * -torch.expm1(-(1 + t64) / b)
    right = b * -torch.expm1(-(1 - t64) / b)
    s = u * (left + right) - left  # signed mass from t
    reference = (t64 - b * torch.sign(s) * torch.log1p(-s.abs() / b)).clamp(-1, 1).float()
    y = M.get("exponential", epsilon=eps).perturb(t, generator=torch.Generator().manual_seed(16))
    assert torch.allclose(y, reference, rtol=0, atol=1e-6)
    # at large eps the float64 masses round (1 - c h -> 1); outputs stay finite and in range
    t = torch.linspace(-1, 1, 100_001)
    for eps in (50.0, 699.0):
        y = M.get("exponential", epsilon=eps).perturb(t, generator=torch.Generator().manual_seed(17))
        assert bool(torch.isfinite(y).all()) and float(y.abs().max()) <= 1.0
