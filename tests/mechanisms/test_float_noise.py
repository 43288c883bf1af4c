"""Floating-point noise: the exact uniform U*, the snapping Laplace and exponential mechanism, the
snapped float64 Gaussian and the residual delta they carry into the recorded figures
(docs/MECHANISMS.md, "Floating point").

Statistical checks use fixed seeds and 5 standard errors from the closed forms (a correct
implementation fails one with probability ~6e-7): a proportion p of n has sd sqrt(p (1-p) / n);
a mean of n draws sqrt(Var / n); a sample variance sqrt((m4 - s^4) / n).
"""

import math

import mpmath
import numpy as np
import pytest
import torch

import mechanisms as M
from mechanisms import accounting as A
from mechanisms import draws as D
from mechanisms import gaussian as G
from mechanisms import snapping as S
from mechanisms.randomness import seeded_generator
from tests.mechanisms.replay import ReplayStream

Z = 5.0
D_MODEL = 42_090  # the reviewer's update size (coordinates per release)


def gen(seed=0):
    return seeded_generator(seed)


def stream(seed=0):
    return seeded_generator(seed).mechanism


def u_star(n, seed, extra_bits=42):
    s = stream(seed)
    bits = D.bits63_(torch.empty(n, dtype=torch.int64), s)
    aux = D.bits63_(torch.empty(n, dtype=torch.int64), s)
    extra = aux.bitwise_right_shift_(63 - extra_bits)
    return D.round_down_uniform_(torch.empty(n, dtype=torch.float64), bits, extra, extra_bits, s)


# ---------------------------------------------------------------------------------------------
# U*: a uniform real rounded down to a float64


def test_u_star_matches_an_independent_construction():
    """From the same 126 bits, U* = 2^(e - 54) (1 + M 2^-52), where 2^(e-1) <= h < 2^e is the
    binade of the 53-bit integer h (top 11 bits of the first draw, then 42 of the second) and M
    the first draw's low 52 bits: computed here with frexp/ldexp, bit for bit."""
    n = 1 << 16
    s = stream(1)
    bits = D.bits63_(torch.empty(n, dtype=torch.int64), s)
    aux = D.bits63_(torch.empty(n, dtype=torch.int64), s)
    h = ((bits >> 52) << 42) | (aux >> 21)
    assert int(h.min()) > 0  # no coordinate needs a second level here (probability 2^-53 each)
    _, e = torch.frexp(h.double())
    significand = 1.0 + (bits & ((1 << 52) - 1)).double() * 2.0**-52
    reference = torch.ldexp(significand, (e - 54).double())
    u = D.round_down_uniform_(torch.empty(n, dtype=torch.float64), bits.clone(), aux >> 21, 42, stream(99))
    assert torch.equal(u, reference)


def test_u_star_law_in_every_binade_including_redrawn_ones():
    """With only 11 binade bits per level (extra_bits=0), 1/2048 of the draws go one level down
    (fresh draws, R = 2^-11 R'): P[U* < 2^-j] = 2^-j for every j, across the level boundary, and
    the significand is uniform (its mean fraction 1/2, sd 1/sqrt(12 n))."""
    n = 1 << 21
    u = u_star(n, seed=2, extra_bits=0)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    for j in (1, 2, 5, 10, 11, 12, 14, 16):
        p = 2.0**-j
        count = int((u < p).sum())
        assert abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p)) + 1, j
    mantissa, _ = torch.frexp(u)  # in [1/2, 1): the significand over 2
    frac = mantissa * 2 - 1
    assert abs(float(frac.mean()) - 0.5) <= Z / math.sqrt(12 * n)


def test_u_star_reaches_below_the_53_bit_grid():
    """A draw whose binade bits are all 0 goes down a level: U* < 2^-53, so -ln U* > 36.7 and
    a Gaussian radius > 8.57 sigma, neither reachable from torch's uniforms (2^-24 grid in
    float32: 5.77 sigma; 2^-53 in float64: 8.57 sigma)."""
    n = 4096
    zeros = torch.zeros(n, dtype=torch.int64)
    u = D.round_down_uniform_(torch.empty(n, dtype=torch.float64), zeros.clone(), zeros.clone(), 42, stream(3))
    assert float(u.max()) < 2.0**-53 and float(u.min()) > 0.0
    radius = torch.sqrt(-2.0 * torch.log(u))
    assert float(radius.min()) > math.sqrt(-2.0 * math.log(2.0**-53)) > 8.57
    # the grid limits of torch's samplers, analytically
    assert math.sqrt(-2.0 * math.log(2.0**-24)) == pytest.approx(5.768, abs=1e-3)
    assert G.TAIL_RADIUS > 37.6


def _worst_ulps(fn, reference, values: list[float]) -> float:
    got = fn(torch.tensor(values, dtype=torch.float64)).tolist()
    mpmath.mp.dps = 40
    worst = 0.0
    for v, y in zip(values, got, strict=True):
        exact = reference(mpmath.mpf(v))
        if exact != 0:
            worst = max(worst, float(abs(mpmath.mpf(y) - exact)) / math.ulp(float(exact)))
    return worst


def test_torch_libm_is_within_the_assumed_ulps():
    """The snapping bounds assume torch's float64 log, log1p, exp, cos and sin (and numpy's log1p) within LOG_ULPS
    ulps (Sleef u10 and glibc document 1 ulp). Measured against mpmath at 40 digits: log on U*
    values from every binade down to 2^-1022 and next to 1, log1p on -Y for Y in (0, 1/2) of
    every binade, exp on the exponential mechanism's arguments, cos and sin on angles of the
    2^-53 grid: at most 1 ulp (seen: 0.50 to 0.51, vector and scalar paths)."""
    values = [float(v) for v in u_star(2000, seed=4)]
    values += [math.ldexp(1.0 + k / 7.0, -j) for j in range(1, 1023, 3) for k in range(7)]
    values += [1.0 - k * 2.0**-53 for k in range(1, 200)]
    assert _worst_ulps(torch.log, mpmath.log, values) <= 1.0 <= S.LOG_ULPS
    halves = [-float(v) / 2 for v in u_star(2000, seed=5)] + [-math.ldexp(1.0, -j) for j in range(2, 1000, 7)]
    assert _worst_ulps(torch.log1p, mpmath.log1p, halves) <= 1.0
    # the Gaussian sampler calls numpy's log1p (faster than torch's): the same bound
    assert _worst_ulps(lambda x: torch.from_numpy(np.log1p(x.numpy())), mpmath.log1p, halves) <= 1.0
    arguments = [-k / 997.0 * 40.0 for k in range(998)]
    assert _worst_ulps(torch.exp, mpmath.exp, arguments) <= 1.0
    angles = [2.0 * math.pi * float(v) for v in u_star(3000, seed=6)] + [2.0 * math.pi * k / 1024 for k in range(1024)]
    assert _worst_ulps(torch.cos, mpmath.cos, angles) <= 1.0 and _worst_ulps(torch.sin, mpmath.sin, angles) <= 1.0


# ---------------------------------------------------------------------------------------------
# Laplace: the snapping mechanism


@pytest.mark.parametrize("eps", [0.3, 0.9, 1.0, 3.0, 40.0])
def test_snapping_outputs_lie_on_the_dithered_grid_within_the_bound(eps):
    """Every output is (k + phi) L with |k| <= steps and phi = (j + 1/2)/2048 - 1/2: y 4096 / L is an
    odd integer (exact: L is a power of 2) and |y| <= (steps + 1/2) L. The float noise's own low
    bits (Mironov's attack) never reach the output."""
    mech = M.get("laplace", epsilon=eps)
    t = torch.linspace(-1, 1, 50_001)
    y = mech.perturb(t, generator=gen(5)).double()
    grid = y * 4096.0 / mech.snap
    assert torch.equal(grid, grid.round()) and bool((grid.round().remainder(2) == 1).all())
    assert float(y.abs().max()) <= mech.bound == (mech.steps + 0.5) * mech.snap


def test_snapping_output_set_does_not_depend_on_the_input():
    """Same draws, inputs 2^-20 apart: the float Laplace (today's inverse CDF) gives different
    float32 outputs for nearly every draw (the sum's low bits carry t); snapped, an output moves
    only when t crosses a rounding boundary: probability (2^-20 / L) per coordinate."""
    mech = M.get("laplace", epsilon=1.0)
    n = 200_000
    t0 = torch.zeros(n)
    t1 = torch.full((n,), 2.0**-20)
    moved = int((mech.perturb(t0, generator=gen(6)) != mech.perturb(t1, generator=gen(6))).sum())
    p = 2.0**-20 / mech.snap
    assert moved <= n * p + Z * math.sqrt(n * p) + 1


@pytest.mark.parametrize("eps", [0.3, 0.9, 1.5, 4.0])
@pytest.mark.parametrize("value", [-1.0, 0.37, 1.0])
def test_snapping_is_unbiased_with_the_stated_variance(eps, value):
    """The dither keeps E[y] = t (to within L/4096, far inside the tolerance) and Var = 2 b^2 +
    L^2/12: eps 0.9 puts b just above 2 (L = 4: the grid adds 17% variance), 1.5 puts c = b/L at
    2/3."""
    mech = M.get("laplace", epsilon=eps)
    n = 200_000
    y = mech.perturb(torch.full((n,), value), generator=gen(7)).double()
    var = S.snapping_variance(mech.scale, mech.snap)
    assert float(mech.variance(torch.zeros(1))[0]) == pytest.approx(var, rel=1e-7)  # float32 result
    mean, s2 = float(y.mean()), float(y.var())
    m4 = float(((y - mean) ** 4).mean())
    assert abs(mean - value) <= Z * math.sqrt(var / n) + mech.snap / 4096
    assert abs(s2 - var) <= Z * math.sqrt((m4 - s2 * s2) / n)


@pytest.mark.parametrize("eps", [1e-6, 0.5, 1.0, 2.0, 3.0, 10.0, 100.0, 700.0])
def test_snapping_guarantee_includes_the_float_excess(eps):
    """eps' = (2/b)(1 + 2^-52) + 32 rho, rho = 2^-52 ((LOG_ULPS + 1)(2 steps + 3) + 1), rounded
    up: positive, and the calibration keeps it within the requested eps, which is what the
    guarantee and cumulative_spend record (d releases per round at eps each, pure)."""
    mech = M.get("laplace", epsilon=eps)
    rho = 2.0**-52 * ((S.LOG_ULPS + 1.0) * (2 * mech.steps + 3) + 1.0)
    assert S.snap_error(mech.steps) == rho
    bound = S.snap_bound(mech.scale, mech.snap, mech.steps)
    assert bound >= (2.0 / mech.scale) * (1 + 2.0**-52) + 32 * rho
    assert 0.0 < mech.float_excess == bound - 2.0 / mech.scale < 1e-10
    assert bound <= eps and 2.0 / mech.scale < eps
    # Mironov's Lambda: the smallest power of 2 >= the requested scale 2/eps
    assert mech.snap == 2.0 ** math.ceil(math.log2(2.0 / eps)) or mech.snap == 2.0 / eps
    c = mech.scale / mech.snap
    assert 0.5 < c <= 1.0 + 1e-10
    # the outer grid point: >= 1 + 32 b (or as far as exactness allows), past the inputs
    assert mech.steps * mech.snap >= min(1.0 + 32.0 * mech.scale, 1.0 + mech.snap)
    # every draw past TAIL_EXPONENT saturates: 2 steps + 1 <= c T
    assert 2 * mech.steps + 1 <= c * D.TAIL_EXPONENT
    g = mech.guarantee
    assert (g.epsilon, g.delta, g.residual_delta) == (eps, 0.0, 0.0)
    assert "snapping" in g.statement and "floating-point excess" in g.statement
    spend = A.cumulative_spend(mech.params(), D_MODEL, 3)
    assert spend.epsilon == 3 * D_MODEL * eps and spend.delta == 0.0 and spend.residual_delta == 0.0


def test_snapping_refuses_what_it_cannot_bound():
    with pytest.raises(ValueError, match="too small"):
        M.get("laplace", epsilon=1e-13)


def test_laplace_matches_a_block_by_block_reference():
    """The blocked, in-place implementation equals the formula evaluated per block with plain
    tensor ops (U* from frexp/ldexp, no bit tricks), bit for bit, across blocks and a short last
    block, on the same keystream words."""
    n = 2 * D.BLOCK + 12_345
    t = torch.rand(n, generator=torch.Generator().manual_seed(14)) * 2 - 1
    mech = M.get("laplace", epsilon=1.0)
    y = mech.perturb(t, generator=gen(15))
    words = stream(15)
    parts = []
    c = mech.scale / mech.snap
    for lo in range(0, n, D.BLOCK):
        k = min(n, lo + D.BLOCK) - lo
        bits = words.fill_(torch.empty(k, dtype=torch.int64)) & ((1 << 63) - 1)
        aux = words.fill_(torch.empty(k, dtype=torch.int64)) & ((1 << 63) - 1)
        h = ((bits >> 52) << 42) | (aux >> 21)
        _, e = torch.frexp(h.double())
        u = torch.ldexp(1.0 + (bits & ((1 << 52) - 1)).double() * 2.0**-52, (e - 54).double())
        s = (aux & 4095).double() - 2047.5
        noise = torch.copysign(torch.log(u), s)
        phi = s.abs() / 2048.0 - 0.5
        v = (0.5 - s.abs() / 2048.0) + t[lo : lo + k].double() / mech.snap
        v = (v + c * noise).clamp(-mech.steps, mech.steps).round()
        parts.append(((v + phi) * mech.snap).float())
    assert torch.equal(y, torch.cat(parts))


# ---------------------------------------------------------------------------------------------
# The exponential mechanism, snapped


@pytest.mark.parametrize("eps", [0.1, 1.0, 10.0, 40.0])
def test_exponential_is_snapped_and_calibrated(eps):
    """Outputs on the 2^-10 grid of [-1, 1]; the mechanism runs at an eps whose float excess
    (exponential_excess, from the proven rho) brings it back to at most the stated eps."""
    mech = M.get("exponential", epsilon=eps)
    assert mech.run_epsilon < eps
    assert mech.run_epsilon + S.exponential_excess(eps, 4.0 / mech.run_epsilon) <= eps
    assert eps - mech.run_epsilon < (1e-8 if eps <= 10 else 0.2)
    y = mech.perturb(torch.linspace(-1, 1, 20_001), generator=gen(16)).double()
    index = y / S.EXPONENTIAL_GRID
    assert torch.equal(index, index.round()) and float(y.abs().max()) <= 1.0
    assert mech.guarantee.epsilon == eps and "floating-point excess inside eps" in mech.guarantee.statement


def test_exponential_refuses_what_it_cannot_bound():
    with pytest.raises(ValueError, match="too large for the float64 exponential"):
        M.get("exponential", epsilon=80.0)


# ---------------------------------------------------------------------------------------------
# Gaussian: snapped float64 Box-Muller on U*, and its residual delta


def _zero_binade_words(pairs: int, levels: int, seed: int) -> torch.Tensor:
    """Keystream words for `pairs` Box-Muller pairs whose U* binade bits are 0 on the first
    `levels` levels (the coin set: R = U*/2; the angle 0), random below."""
    real = stream(seed)
    first = (real.fill_(torch.empty(pairs, dtype=torch.int64)) & ((1 << 52) - 1)) | -(1 << 63)
    aux = torch.zeros(pairs, dtype=torch.int64)  # extra binade bits 0, angle 0
    deeper = [torch.zeros(2 * pairs, dtype=torch.int64) for _ in range(levels - 1)]
    rest = real.fill_(torch.empty(2 * pairs, dtype=torch.int64))
    return torch.cat([first, aux, *deeper, rest])


def test_gaussian_sampler_reaches_past_the_float32_and_float64_grids():
    """U* whose binade bits are 0 for two levels (each level down happens with probability
    2^-21, then 2^-53, per pair): U* < 2^-74, the radius exceeds 10.1 sigma, where torch's float32
    normal_ stops at 5.77 and its float64 one at 8.57; more levels go on down to TAIL_RADIUS (37.6
    sigma). The angle is 0: z = r along an axis, the sin coordinate 0."""
    m = 500
    words = ReplayStream(_zero_binade_words(m, 2, 8).view(torch.int32))
    z = G.standard_normal_pairs_(torch.empty(2 * m, dtype=torch.float64), words)  # type: ignore[arg-type]
    assert float(z[:m].min()) > math.sqrt(2 * 75 * math.log(2)) > 10.1 > 8.57
    assert float(z[m:].abs().max()) == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gaussian_noise_law(dtype):
    """N(0, sigma^2) with sigma 3 (DP-SGD's unsnapped noise, the mechanism's sampler): mean,
    variance, fourth moment (3 sigma^4, sd sqrt((105 - 9) sigma^8 / n)) and two tail proportions,
    within 5 sd, at a fixed seed; the cos and sin halves of a block are uncorrelated."""
    n, sigma = 400_000, 3.0
    z = G.add_gaussian_noise(torch.zeros(n, dtype=dtype), 1.0, sigma, torch.empty(n, dtype=dtype), stream(9)).double()
    assert abs(float(z.mean())) <= Z * sigma / math.sqrt(n)
    assert abs(float(z.var()) - sigma**2) <= Z * math.sqrt(2 * sigma**4 / n)
    assert abs(float((z**4).mean()) - 3 * sigma**4) <= Z * math.sqrt(96 * sigma**8 / n)
    for k in (1.0, 3.0):
        p = math.erfc(k / math.sqrt(2))
        count = int((z.abs() > k * sigma).sum())
        assert abs(count - n * p) <= Z * math.sqrt(n * p * (1 - p))
    half = D.BLOCK // 2
    a, b = z[:half], z[half : 2 * half]
    assert abs(float((a * b).mean())) <= Z * sigma**2 / math.sqrt(half)


def test_gaussian_perturb_is_the_snapped_clipped_update_plus_the_sampler():
    """y = clamp(round(scale x / L + sigma z / L), -K, K) L for the sampler's z on the same
    words, bit for bit; outputs are multiples of L within +-K L."""
    mech = M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0)
    x = torch.full((1000,), 0.1)  # norm sqrt(10): clipped by 1/sqrt(10)
    y = mech.perturb(x, generator=gen(10))
    z = G.standard_normal_pairs_(torch.empty(1000, dtype=torch.float64), stream(10))
    scale = 1.0 / G.l2_norm(x)
    v = torch.add(z * (mech.sigma / mech.grid), x, alpha=scale / mech.grid)
    expected = (v.round().clamp(-mech.steps, mech.steps) * mech.grid).float()
    assert torch.equal(y, expected)


def test_gaussian_output_moves_only_across_a_cell_boundary():
    """Same draws, inputs 2^-20 apart: an output moves only when the input crosses a rounding
    boundary of the grid L: probability about 2^-20 scale / L per coordinate."""
    mech = M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0)
    n = 200_000
    a = mech.perturb(torch.zeros(n), generator=gen(11))
    b = mech.perturb(torch.full((n,), 2.0**-20), generator=gen(11))  # norm 2^-20 sqrt(n) < 1: not clipped
    p = 2.0**-20 / mech.grid
    assert int((a != b).sum()) <= n * p + Z * math.sqrt(n * p) + 1


def test_gaussian_residual_delta_formula_and_reference_figures():
    """delta_res = exp(-(R - D)^2/2) + 2^62 2^-1021 (D = sensitivity / sigma <= R / 2.62), rounded
    up; at the float32 normal_'s R = 5.77 the same formula gives the figures the reviewer found
    (one coordinate: Phi(D - R) = 8.2e-5 at z = 1; a Box-Muller pair: 8.3e-4)."""
    r = G.TAIL_RADIUS
    for z in (1.0, 0.5, 0.3):
        d = 2.0 / z
        expected = math.exp(-0.5 * (r - d) ** 2) + 2.0**62 * 2.0**-1021
        got = G.float_residual_delta(z * 1.0, 2.0)
        assert expected < got <= expected * (1 + 2.0**-39)
    assert G.float_residual_delta(1.0, 2.0) == pytest.approx(1.49e-276, rel=0.01)
    assert G.float_residual_delta(0.1, 2.0) == pytest.approx(9.2e18 * math.exp(-0.5 * (r - 20) ** 2), rel=1e-6)
    assert G.float_residual_delta(1.0, r) == 1.0
    r32 = math.sqrt(-2.0 * math.log(2.0**-24))
    assert 0.5 * math.erfc((r32 - 2.0) / math.sqrt(2)) == pytest.approx(8.2e-5, rel=0.01)
    assert math.exp(-0.5 * (r32 - 2.0) ** 2) == pytest.approx(8.3e-4, rel=0.01)


def test_gaussian_snapping_residual_per_coordinate():
    """delta_c = e^-72 + 2 rho(12) (1 + 2 f), rho(r) = 2^-53 (NOISE_ULPS s r + S/L (1 + 2^-16) + s r + 1),
    f = 1/(s sqrt(2 pi)), s = sigma/L: about 5e-13 at z = 1 (s = 4), growing with s = sigma/L
    (at most 8) and with S/L."""
    mech = M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0)
    s, w = mech.sigma / mech.grid, 1.0 / mech.grid * G.CLIP_SLACK
    rho = 2.0**-53 * (G.NOISE_ULPS * s * 12 + w + s * 12 + 1)
    expected = math.exp(-72) + 2 * rho * (1 + 2 / (s * math.sqrt(2 * math.pi)))
    assert expected < mech.residual_delta_per_coordinate <= expected * (1 + 2.0**-39)
    assert 1e-13 < mech.residual_delta_per_coordinate < 1e-12
    assert mech.guarantee.delta_for(D_MODEL) == mech.guarantee.delta + D_MODEL * mech.residual_delta_per_coordinate


@pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha")  # opacus, at z = 0.1
def test_gaussian_residual_delta_is_recorded():
    """The guarantee's delta includes the tail residual, and states the per-coordinate one;
    cumulative_spend adds both once per round (d coordinates each), in delta and in
    residual_delta, for the RDP and the basic paths."""
    for params in (
        {"name": "gaussian", "clip_norm": 1.0, "noise_multiplier": 0.1, "delta": 1e-5},
        {"name": "gaussian", "clip_norm": 1.0, "epsilon": 1.0, "delta": 1e-5},
    ):
        mech = M.from_params(params)
        res = G.float_residual_delta(mech.sigma, 2.0)
        per = mech.residual_delta_per_coordinate
        assert res > 0.0 and mech.residual_delta == res and per > 0.0
        g = mech.guarantee
        assert g.residual_delta == res and g.delta == mech.delta + res and g.residual_delta_per_coordinate == per
        assert "residual delta" in g.statement
        for rounds in (1, 50):
            spend = A.cumulative_spend(params, D_MODEL, rounds)
            assert spend.residual_delta == rounds * (res + D_MODEL * per) > 0.0
            assert spend.delta == mech.delta + spend.residual_delta
            assert "residual delta" in spend.statement
    assert A.cumulative_spend(params, D_MODEL, 0).delta == 0.0
