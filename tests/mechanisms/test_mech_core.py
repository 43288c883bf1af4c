"""Mechanisms: reference values, unbiasedness, variance, ranges, determinism, bad inputs.

Statistical tolerances: with n i.i.d. outputs, the sample mean has standard error sqrt(Var/n)
(Var from the closed form) and the sample variance has standard error sqrt((m4 - s^4)/n) (m4 the
sample's fourth central moment); every check allows 5 standard errors (a fixed seed makes the
test deterministic; 5 sd is where a correct implementation would fail with probability ~6e-7).

Rounding tolerances are stated in units of the unit roundoff u (2^-24 in float32, 2^-53 in
float64) times the magnitude of the values involved and the number of roundings they went
through. Elementwise IEEE operations are correctly rounded on every CPU, but whether torch fuses
`a + alpha * b` into one FMA depends on the vector kernel (AVX2/AVX512 do, the plain kernel does
not), so mechanism outputs may differ in the last bit between CPUs: no check below relies on
their exact bits, only on these bounds.
"""

import math

import pytest
import torch

import mechanisms as M
from mechanisms import gaussian as G
from mechanisms.local import piecewise_variance, pnpm_t_variance
from mechanisms.randomness import seeded_generator

N = 120_000
Z = 5.0
U32 = torch.finfo(torch.float32).eps / 2  # unit roundoff: one rounding moves x by at most U32 * |x|
U64 = torch.finfo(torch.float64).eps / 2
LOCAL = [
    ("duchi", {}),
    ("pm", {}),
    ("hm", {}),
    ("ldp-fl", {"center": 0.1, "radius": 0.5}),
    ("pnpm", {}),
    ("laplace", {}),
    ("exponential", {}),
]
UNBIASED = {"duchi", "pm", "hm", "ldp-fl", "pnpm", "laplace"}


def gen(seed=0):
    """The privacy draws of a test: ChaCha20 keyed from a public seed (reproducible)."""
    return seeded_generator(seed)


def data(seed=0):
    """Test inputs: torch's generator (nothing private rests on them)."""
    return torch.Generator().manual_seed(seed)


def printed(decimals, magnitude):
    """How far a published value quoted to `decimals` decimals can be from a float64 closed form of
    that `magnitude`: half a unit of the last digit, plus 64 float64 roundings (far below it)."""
    return 0.5 * 10.0**-decimals + 64 * U64 * magnitude


@pytest.mark.parametrize(
    "eps,duchi0,duchi1,pm0,pm1,pnpm",
    [
        (0.5, 16.671, 15.671, 17.702, 21.223, 18.839),
        (1.0, 4.683, 3.683, 3.682, 5.224, 4.134),
        (2.0, 1.724, 0.724, 0.646, 1.228, 0.757),
    ],
)
def test_privacy_md_reference_variances(eps, duchi0, duchi1, pm0, pm1, pnpm):
    t = torch.tensor([0.0, 1.0], dtype=torch.float64)
    tol = printed(3, 25.0)  # the references are quoted to 3 decimals (worst seen: 4.4e-4 off)
    # Duchi's B' and PNPM's C' are the papers' constants on a 2^-24 / 2^-32 grid (relative
    # differences below 1e-6): the variances agree to the quoted digits
    assert M.get("duchi", epsilon=eps).variance(t).tolist() == pytest.approx([duchi0, duchi1], abs=tol)
    assert piecewise_variance(t, eps).tolist() == pytest.approx([pm0, pm1], abs=tol)
    assert pnpm_t_variance(eps) == pytest.approx(pnpm, abs=tol)
    assert M.get("pnpm", epsilon=eps).variance(t)[1].item() == pytest.approx(pnpm, abs=tol)
    # PM on its 1024-cell grid: its window fraction rounded to whole cells and its mixture weight
    # to the grid's probability bound cost at most 0.2% of variance against the continuous PM
    assert M.get("pm", epsilon=eps).variance(t).tolist() == pytest.approx([pm0, pm1], rel=2e-3)


def _check_moments(mech, value, dtype, seed=0):
    x = torch.full((N,), value, dtype=dtype)
    y = mech.perturb(x, generator=gen(seed)).to(torch.float64)
    var = float(mech.variance(x)[0])
    mean, s2 = float(y.mean()), float(y.var())
    m4 = float(((y - mean) ** 4).mean())
    return x, y, var, mean, s2, m4


@pytest.mark.parametrize("name,extra", LOCAL)
@pytest.mark.parametrize("value", [-1.0, 0.3, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_variance_matches_closed_form_and_unbiased(name, extra, value, dtype):
    mech = M.get(name, epsilon=1.0, **extra)
    if name == "ldp-fl":
        value = 0.1 + 0.5 * value
    x, y, var, mean, s2, m4 = _check_moments(mech, value, dtype)
    assert y.dtype == torch.float64 and mech.perturb(x, generator=gen()).dtype == dtype
    # Besides sampling, the closed form and the outputs are computed in `dtype` (a few roundings
    # each): 8 ulps of var cover that bias, 10^4 times below the statistical term.
    assert abs(s2 - var) <= Z * math.sqrt(max(m4 - s2 * s2, 0.0) / N) + 8 * torch.finfo(dtype).eps * var
    if name in UNBIASED:
        assert abs(mean - value) <= Z * math.sqrt(var / N)


@pytest.mark.parametrize("eps", [0.3, 0.61, 0.8, 4.0])
def test_hybrid_branches(eps):
    mech = M.get("hm", epsilon=eps)
    x, y, var, mean, s2, m4 = _check_moments(mech, 0.5, torch.float32)
    assert abs(mean - 0.5) <= Z * math.sqrt(var / N)
    assert abs(s2 - var) <= Z * math.sqrt((m4 - s2 * s2) / N)
    if eps <= 0.61:  # pure Duchi: two output values only
        assert torch.unique(y).numel() == 2


def test_output_ranges():
    t = torch.linspace(-1, 1, 100_001)
    for eps in (0.5, 1.0, 3.0):
        b = (math.exp(eps) + 1) / math.expm1(eps)
        z = math.exp(eps / 2)
        c = (z + 1) / (z - 1)
        # Duchi: +-B' (copysign of B' rounded once to float32), within 2^-23/k of the paper's B
        duchi = M.get("duchi", epsilon=eps)
        y = duchi.perturb(t, generator=gen())
        assert float((y.abs().double() - duchi.bound).abs().max()) <= U32 * duchi.bound
        k = (math.exp(eps) - 1) / (2 * (math.exp(eps) + 1))
        assert 0 <= duchi.bound - b <= b * 2.0**-23 / k
        for name in ("pm", "hm"):  # PM's grid ends at c (N - 1)/2, within 0.2% of the paper's C
            mech = M.get(name, epsilon=eps)
            y = mech.perturb(t, generator=gen())
            if mech.law is None:  # HM at eps <= 0.61: Duchi alone
                assert float(y.abs().max()) <= mech.bound * (1 + U32)
                continue
            top = mech.law.scale * (M.local.CELLS - 1) / 2
            assert float(y.abs().max()) <= top * (1 + U32) and abs(top - c) <= 2e-3 * c
        y = M.get("exponential", epsilon=eps).perturb(t, generator=gen())
        assert float(y.abs().max()) <= 1.0  # clamped to exactly +-1
        # LDP-FL: c +- r B' (float32 copysign of rB', then + c: 2 roundings of values of size <= |c| + rB');
        # y - 0.5 is exact in float64
        ldp = M.get("ldp-fl", epsilon=eps, center=0.5, radius=0.25)
        y = ldp.perturb(t * 3, generator=gen())
        scale = 0.5 + ldp.bound
        assert float(((y.double() - 0.5).abs() - ldp.bound).abs().max()) <= 4 * U32 * scale
        # PNPM: |w| <= |out| <= C|w|; w = 0 released as 0
        w = torch.randn(100_000, generator=data(1))
        w[:10] = 0.0
        pnpm = M.get("pnpm", epsilon=eps)
        cp = pnpm.bound  # the paper's C for the grid's flip probability: within 1e-6 of it
        assert cp == pytest.approx((math.exp(eps) + 3) / math.expm1(eps), rel=1e-6)
        y = pnpm.perturb(w, generator=gen())
        # |t*| = mid + slope F32(J) in float32 (two roundings at magnitude <= C), y = w t* once more
        rel = U32 * (2 * cp + 1)
        ratio = y[10:].double().abs() / w[10:].double().abs()
        assert float(ratio.min()) >= 1 - rel and float(ratio.max()) <= cp * (1 + rel)
        assert torch.all(y[:10] == 0)  # exact: 0 times a finite number is 0 in IEEE arithmetic
        flipped = float((torch.sign(y[10:]) != torch.sign(w[10:])).double().mean())
        q = 1 / (math.exp(eps) + 1)
        assert abs(flipped - q) <= Z * math.sqrt(q * (1 - q) / 99_990)


def test_pnpm_is_exactly_the_paper_law():
    """Given t = 1: t* uniform on [1, C] w.p. e/(e+1), uniform on [-C, -1] otherwise."""
    eps = 1.0
    mech = M.get("pnpm", epsilon=eps)
    c = mech.bound
    y = mech.perturb(torch.ones(N), generator=gen(3)).double()
    pos = y[y > 0]
    p = math.e / (math.e + 1)
    assert abs(pos.numel() / N - p) <= Z * math.sqrt(p * (1 - p) / N)
    # uniform on [1, C]: each of 10 equal bins holds 1/10 (binomial sd per bin)
    for part, lo in ((pos, 1.0), (-y[y < 0], 1.0)):
        counts = torch.histc(part, bins=10, min=lo, max=c)
        expected = part.numel() / 10
        assert torch.all((counts - expected).abs() <= Z * math.sqrt(expected))


def test_rr_binary_and_kary():
    for k in (2, 5):
        mech = M.get("rr", epsilon=1.0, k=k)
        x = torch.full((N,), 1.0)
        y = mech.perturb(x, generator=gen())
        keep = math.e / (math.e + k - 1)
        assert abs(float((y == 1).double().mean()) - keep) <= Z * math.sqrt(keep * (1 - keep) / N)
        assert set(torch.unique(y).tolist()) == set(float(i) for i in range(k))
        var = float(mech.variance(x)[0])
        s2 = float(y.double().var())
        m4 = float(((y.double() - y.double().mean()) ** 4).mean())
        assert abs(s2 - var) <= Z * math.sqrt((m4 - s2 * s2) / N)


def test_gaussian_clips_whole_vector_and_adds_sigma():
    mech = M.get("gaussian", clip_norm=2.0, noise_multiplier=1.5)
    assert mech.sigma == 3.0  # exact: 1.5 * 2.0, a product of floats that is itself a float
    x = torch.full((N,), 1.0)  # norm sqrt(N) >> 2: scaled to norm 2
    y = mech.perturb(x, generator=gen()).double()
    clipped = 2.0 / math.sqrt(N)
    assert abs(float(y.mean()) - clipped) <= Z * 3.0 / math.sqrt(N)
    s2 = float(y.var())
    assert abs(s2 - 9.0) <= Z * math.sqrt(2 * 81.0 / N)  # Var of s^2 for a normal: 2 sigma^4 / n
    assert mech.grid == 0.5  # the largest power of 2 <= sigma / 4
    assert float(mech.variance(x)[0]) == pytest.approx(9.0 + 0.25 / 12, rel=U32)  # sigma^2 + L^2/12, in float32
    g = mech.guarantee
    assert (g.scope, g.protects, g.delta) == ("vector", "value", 1e-5)
    # exact: the same pure-Python calibration on the same float arguments (sigma 3, sensitivity 2S = 4)
    assert g.epsilon == M.analytic_gaussian_epsilon(3.0, 1e-5, 4.0)


def _epsilon_resolution(sigma, delta, sensitivity, eps):
    """How precisely float64 pins down the eps at which the analytic Gaussian's delta is `delta`.

    delta(eps) = Phi(x1) - e^eps Phi(x2) with |x1|, |x2| <= x = eps s + 1/(2s) (s = sigma/sensitivity),
    and d delta/d eps = -e^eps Phi(x2) (Balle & Wang 2018), estimated here by a central difference.
    Rounding the arguments moves log Phi by about x per unit of argument error (3 roundings of
    size x each), exp(eps + log Phi(x2)) adds |log| roundings and erfc a few: relative error
    (3 x^2 + |log slope| + 8) u per term, on terms of size delta + slope; an error eta in delta
    moves eps by eta / slope. Round trip below: error 7.3e-15 measured, bound 4.1e-14.
    """
    s = sigma / sensitivity
    x = eps * s + 1 / (2 * s)
    h = 1e-6 * eps
    slope = (
        G.analytic_gaussian_delta(sigma, eps - h, sensitivity) - G.analytic_gaussian_delta(sigma, eps + h, sensitivity)
    ) / (2 * h)
    eta = (3 * x * x + abs(math.log(slope)) + 8) * U64 * (delta + 2 * slope)
    return eta / slope


def test_analytic_and_classic_gaussian_reference_values():
    assert M.analytic_gaussian_sigma(1.0, 1e-5) == pytest.approx(3.731, abs=printed(3, 8.0))
    assert M.analytic_gaussian_sigma(0.5, 1e-5) == pytest.approx(7.032, abs=printed(3, 8.0))
    assert M.classic_gaussian_sigma(1.0 - 1e-12, 1e-5) == pytest.approx(4.845, abs=printed(3, 8.0))
    with pytest.raises(ValueError, match="epsilon must be < 1"):
        M.classic_gaussian_sigma(1.0, 1e-5)
    for eps in (0.1, 0.5, 0.9):  # analytic never needs more noise than the classic bound
        assert M.analytic_gaussian_sigma(eps, 1e-5) < M.classic_gaussian_sigma(eps, 1e-5)
    s = M.analytic_gaussian_sigma(2.0, 1e-6, 3.0)
    # two solves (sigma from eps, then eps back), each bisected down to adjacent floats
    tol = 2 * _epsilon_resolution(s, 1e-6, 3.0, 2.0) + 2 * math.ulp(2.0)
    assert abs(M.analytic_gaussian_epsilon(s, 1e-6, 3.0) - 2.0) <= tol


def test_sampled_wrapper_k_of_d_zero_elsewhere_unbiased():
    d, eps = 10, 5.0  # k = 2
    mech = M.get("sampled", base="pm", epsilon=eps)
    x = torch.linspace(-0.9, 0.9, d, dtype=torch.float64)
    g = gen()
    trials = 4000
    total = torch.zeros(d, dtype=torch.float64)
    for _ in range(trials):
        y = mech.perturb(x, generator=g)
        assert int((y != 0).sum()) == 2  # unsampled coordinates are 0, never their value
        total += y
    var = mech.variance(x)
    assert torch.all((total / trials - x).abs() <= Z * torch.sqrt(var / trials))
    assert mech.guarantee.scope == "vector" and mech.guarantee.epsilon == eps
    assert M.sampled.sample_count(100.0, 10_000) == 40 and M.sampled.sample_count(1.0, 5) == 1
    big = M.get("sampled", base="hm", epsilon=20.0).perturb(torch.zeros(1000) + 0.5, generator=g)
    assert int((big != 0).sum()) == 8


@pytest.mark.parametrize(
    "name,extra", LOCAL + [("rr", {}), ("gaussian", {"clip_norm": 1.0}), ("sampled", {"base": "hm"})]
)
def test_determinism_and_shape(name, extra):
    kwargs = dict(extra, epsilon=2.0) if name != "gaussian" else dict(extra, epsilon=2.0, delta=1e-5)
    mech = M.get(name, **kwargs)
    x = torch.rand(3, 50, generator=data(9)) if name == "rr" else torch.rand(3, 50, generator=data(9)) * 2 - 1
    if name == "rr":
        x = x.round()
    a = mech.perturb(x, generator=gen(42))
    b = mech.perturb(x, generator=gen(42))
    c = mech.perturb(x, generator=gen(43))
    assert a.shape == x.shape and a.dtype == x.dtype
    # bit-identical by design: the same seed drives the same kernels in one process
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert M.from_params(mech.params()) == mech
    assert M.canonical_json(mech.params()) == M.canonical_json(M.from_params(mech.params()).params())


def test_registry_and_canonical_json():
    assert set(M.MECHANISMS) == {
        "duchi",
        "pm",
        "hm",
        "ldp-fl",
        "pnpm",
        "laplace",
        "gaussian",
        "rr",
        "exponential",
        "sampled",
    }
    assert M.canonical_json({"name": "pnpm", "epsilon": 1.0}) == b'{"epsilon":1.0,"name":"pnpm"}'
    assert M.canonical_json({"b": 0.1, "a": [1, 2]}) == b'{"a":[1,2],"b":0.1}'
    with pytest.raises(ValueError):
        M.canonical_json({"epsilon": float("nan")})
    with pytest.raises(ValueError):
        M.canonical_json({"x": object()})
    g = M.get("pnpm", epsilon=1.0).guarantee
    assert g.protects == "sign" and g.scope == "coordinate"
    assert "sign" in g.statement.lower() and "no finite eps" in g.statement


BAD_EPS = [0, -1.0, float("nan"), float("inf"), "x", None]


@pytest.mark.parametrize("name,extra", LOCAL + [("rr", {}), ("sampled", {"base": "pm"})])
@pytest.mark.parametrize("eps", BAD_EPS)
def test_bad_epsilon(name, extra, eps):
    with pytest.raises(ValueError, match="epsilon"):
        M.get(name, epsilon=eps, **extra)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"clip_norm": 1.0, "epsilon": 1.0, "delta": 0.0}, "delta"),
        ({"clip_norm": 1.0, "epsilon": 1.0, "delta": 1.0}, "delta"),
        ({"clip_norm": 1.0, "epsilon": 1.0, "delta": float("nan")}, "delta"),
        ({"clip_norm": 1.0, "epsilon": 1.0}, "delta"),
        ({"clip_norm": 1.0, "epsilon": 0.0, "delta": 1e-5}, "epsilon"),
        ({"clip_norm": 0.0, "noise_multiplier": 1.0}, "clip_norm"),
        ({"clip_norm": 1.0, "noise_multiplier": -1.0}, "noise_multiplier"),
        ({"clip_norm": 1.0}, "noise_multiplier"),
        ({"clip_norm": 1.0, "noise_multiplier": 1.0, "epsilon": 1.0, "delta": 1e-5}, "exactly one"),
    ],
)
def test_bad_gaussian_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        M.get("gaussian", **kwargs)


@pytest.mark.parametrize(
    "name,extra", LOCAL + [("gaussian", {"clip_norm": 1.0, "delta": 1e-5}), ("sampled", {"base": "duchi"}), ("rr", {})]
)
def test_bad_tensors(name, extra):
    mech = M.get(name, epsilon=1.0, **extra)
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="NaN or infinite"):
            mech.perturb(torch.tensor([0.0, bad]))
    with pytest.raises(ValueError, match="float32 or float64"):
        mech.perturb(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="torch.Tensor"):
        mech.perturb([0.0, 1.0])


@pytest.mark.parametrize("name", ["duchi", "pm", "hm", "laplace", "exponential", "sampled"])
def test_out_of_domain_refused_or_clipped(name):
    extra = {"base": "pm"} if name == "sampled" else {}
    x = torch.tensor([0.5, 1.5])
    with pytest.raises(ValueError, match=r"outside the domain \[-1.0, 1.0\]"):
        M.get(name, epsilon=1.0, **extra).perturb(x)
    clipped = M.get(name, epsilon=1.0, clip=True, **extra)
    # exact: after the clamp both calls evaluate the same kernels on the same bits in one process
    assert torch.equal(clipped.variance(x), clipped.variance(torch.tensor([0.5, 1.0])))
    assert clipped.perturb(x, generator=gen()).shape == x.shape
    with pytest.raises(ValueError, match="clip"):
        M.get(name, epsilon=1.0, clip="yes", **extra)


def test_other_bad_parameters():
    with pytest.raises(ValueError, match="unknown mechanism"):
        M.get("nope", epsilon=1.0)
    with pytest.raises(ValueError, match="bad parameters"):
        M.get("pnpm", epsilon=1.0, clip=True)  # PNPM takes any real weight: no clip option
    with pytest.raises(ValueError, match="name"):
        M.from_params({"epsilon": 1.0})
    with pytest.raises(ValueError, match="radius"):
        M.get("ldp-fl", epsilon=1.0, radius=0.0)
    with pytest.raises(ValueError, match="center"):
        M.get("ldp-fl", epsilon=1.0, center=float("inf"))
    with pytest.raises(ValueError, match="k must be"):
        M.get("rr", epsilon=1.0, k=1)
    with pytest.raises(ValueError, match="integer categories"):
        M.get("rr", epsilon=1.0, k=3).perturb(torch.tensor([0.5]))
    with pytest.raises(ValueError, match="outside the domain"):
        M.get("rr", epsilon=1.0, k=3).perturb(torch.tensor([3.0]))
    with pytest.raises(ValueError, match="base"):
        M.get("sampled", base="laplace", epsilon=1.0)
    with pytest.raises(ValueError, match="epsilon must be <="):
        M.get("duchi", epsilon=1000.0)
