"""Likelihood ratios, accounting and the audit.

Histogram test: for neighbouring inputs x0, x1 and every bin with counts c0, c1 (n draws each),
ln(c0/c1) estimates ln(P0/P1) with standard error about sqrt(1/c0 + 1/c1) (delta method); we
require ln(c0/c1) <= eps + 5 * that error, on bins holding at least 200 draws.
"""

import json
import math
import subprocess
import sys

import pytest
import torch

import mechanisms as M
from mechanisms import accounting as A
from mechanisms.audit import audit_pair, clopper_pearson
from mechanisms.randomness import seeded_generator

N = 120_000
U64 = 2.0**-53  # float64 unit roundoff

# The accountants and Clopper-Pearson bounds are pure-Python float64 scalar math (libm calls, no
# vector kernels): tolerances below are the float64 resolution of each computation, from the
# size of the quantities it rounds, plus the digits a quoted reference value carries.


def _max_log_ratio_excess(mech, x0, x1, eps, bins=30):
    g = seeded_generator(7)
    a = mech.perturb_independent(torch.full((N,), x0, dtype=torch.float64), generator=g)
    b = mech.perturb_independent(torch.full((N,), x1, dtype=torch.float64), generator=g)
    lo, hi = float(torch.minimum(a.min(), b.min())), float(torch.maximum(a.max(), b.max()))
    ca = torch.histc(a, bins=bins, min=lo, max=hi)
    cb = torch.histc(b, bins=bins, min=lo, max=hi)
    worst, top = -math.inf, 0.0
    for c0, c1 in zip(ca.tolist(), cb.tolist()):
        if min(c0, c1) < 200:
            continue
        r = abs(math.log(c0 / c1))
        worst = max(worst, r - eps - 5 * math.sqrt(1 / c0 + 1 / c1))
        top = max(top, r)
    return worst, top


@pytest.mark.parametrize(
    "name,extra,x0,x1",
    [
        ("duchi", {}, -1.0, 1.0),
        ("pm", {}, -1.0, 1.0),
        ("hm", {}, -1.0, 1.0),
        ("hm", {}, -1.0, 0.2),
        ("laplace", {}, -1.0, 1.0),
        ("exponential", {}, -1.0, 1.0),
        ("ldp-fl", {"radius": 0.5}, -3.0, 3.0),
        ("rr", {"k": 3}, 0.0, 2.0),
        ("pnpm", {}, 0.7, -0.7),
        ("sampled", {"base": "pm"}, -1.0, 1.0),
    ],
)
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_likelihood_ratio_within_e_eps(name, extra, x0, x1, eps):
    worst, top = _max_log_ratio_excess(M.get(name, epsilon=eps, **extra), x0, x1, eps)
    assert worst <= 0.0
    assert top > 0.3 * eps  # the test has power: the inputs are distinguishable at all


def test_pnpm_value_is_not_protected():
    mech = M.get("pnpm", epsilon=1.0)
    r = audit_pair(mech, 0.25, 0.5, trials=20_000, seed=1)
    assert r.disjoint_support and r.epsilon_lower_bound > 5.0
    s = audit_pair(mech, 0.5, -0.5, trials=100_000, seed=2)
    # a statistical lower bound (measured 0.968): 0.8 only asks that it finds most of eps = 1
    assert not s.disjoint_support and 0.8 < s.epsilon_lower_bound <= 1.0


def test_audit_bounds_stay_below_claims():
    for name, kw in [
        ("duchi", {"epsilon": 1.0}),
        ("laplace", {"epsilon": 1.0}),
        ("gaussian", {"clip_norm": 1.0, "epsilon": 1.0, "delta": 1e-5}),
    ]:
        r = audit_pair(M.get(name, **kw), -1.0, 1.0, trials=50_000, seed=3)
        assert 0.0 < r.epsilon_lower_bound <= 1.0 and r.confidence == 0.95


def _bound_resolution(a, b, p, level):
    """How precisely float64 solves I_p(a, b) = level for p.

    betainc is exp(log_front) times a continued fraction: log_front sums lgamma(a + b), lgamma(a),
    lgamma(b), a log p and b log(1 - p), so rounding it costs (their total magnitude + 16) u
    relative, and the fraction stops at 1e-15 relative. An error in I moves p by that error over
    the density d I/d p = p^(a-1) (1-p)^(b-1) / B(a, b); the bisection ends on adjacent floats.
    """
    logs = [math.lgamma(a + b), math.lgamma(a), math.lgamma(b), a * math.log(p), b * math.log1p(-p)]
    relative = (sum(abs(v) for v in logs) + 16) * U64 + 1e-15
    density = math.exp(logs[0] - logs[1] - logs[2] + (a - 1) * math.log(p) + (b - 1) * math.log1p(-p))
    return relative * max(level, 1 - level) / density + 2 * math.ulp(p)


def test_clopper_pearson_known_values():
    # k = 0: upper = 1 - alpha^(1/n) (the reference's own pow and 1 - x: 2 roundings of ~1)
    upper = clopper_pearson(0, 100, 0.05)[1]
    assert abs(upper - (1 - 0.05 ** (1 / 100))) <= _bound_resolution(1, 100, upper, 0.95) + 2 * U64
    # symmetric case around 1/2; 0.39832 is quoted to 5 decimals (measured: 1.1e-6 off, 0 asymmetry)
    lo, hi = clopper_pearson(50, 100, 0.025)
    lo_res, hi_res = _bound_resolution(50, 51, lo, 0.025), _bound_resolution(51, 50, hi, 0.975)
    assert abs(lo - (1 - hi)) <= lo_res + hi_res + U64
    assert abs(lo - 0.39832) <= 0.5e-5 + lo_res


def test_opacus_rdp_reference():
    acc = A.RDPGaussianAccountant(1.5, 0.04)
    acc.step(2250)
    # The reference is opacus' value quoted to 11 decimals (truncated: < 1e-11 off; measured 8.7e-12).
    # Its float64 error: at the optimal order alpha = 3.9, log A_alpha is a signed log-sum of at most
    # 64 series terms of size <= 1 (8 roundings each, absolute), and eps = 2250 log A / (alpha - 1) + ...
    float64_error = 2250 * 64 * 8 * U64 / (3.9 - 1)
    assert abs(acc.get_privacy_spent(1e-5)[0] - 7.32911117143) <= 1e-11 + float64_error


def test_composition_formulas():
    acc = A.BasicCompositionAccountant(0.5)
    acc.step(10)
    assert acc.get_privacy_spent() == (5.0, 0.0)  # exact: 10 * 0.5 is a float
    adv = A.AdvancedCompositionAccountant(0.01)
    adv.step(10_000)
    eps, delta = adv.get_privacy_spent(1e-5)
    # two sums of positive terms, each side <= 8 roundings (libm within an ulp): 16 u relative
    assert eps == pytest.approx(math.sqrt(2e4 * math.log(1e5)) * 0.01 + 100 * math.expm1(0.01), rel=16 * U64, abs=0)
    assert delta == 1e-5 and eps < 100.0
    with pytest.raises(ValueError, match="delta"):
        adv.get_privacy_spent(None)
    with pytest.raises(ValueError, match="releases"):
        acc.step(-1)


def test_cumulative_spend_is_whole_update():
    pnpm = {"name": "pnpm", "epsilon": 1.0}
    s = A.cumulative_spend(pnpm, 1000, 5)
    # exact here and below: integer release counts times an eps that is a small float
    assert (s.epsilon, s.delta, s.protects, s.method) == (5000.0, 0.0, "sign", "basic")
    assert "sign" in s.statement and "no finite eps" in s.statement
    adv = A.cumulative_spend({"name": "duchi", "epsilon": 0.01, "clip": False}, 1000, 10, target_delta=1e-5)
    assert adv.method == "advanced" and adv.epsilon < 100.0 and adv.delta == 1e-5
    smp = A.cumulative_spend({"name": "sampled", "base": "pm", "epsilon": 2.0, "clip": False}, 10**6, 3)
    assert smp.epsilon == 6.0  # vector scope: eps per round, independent of d
    gauss = {"name": "gaussian", "clip_norm": 1.0, "epsilon": 1.0, "delta": 1e-5}
    assert A.cumulative_spend(gauss, 10, 1).epsilon == 1.0  # one round: the calibrated eps itself
    g50 = A.cumulative_spend(gauss, 10, 50)
    assert g50.method == "rdp" and 1.0 < g50.epsilon < 50.0
    sampled_peers = A.cumulative_spend(gauss, 10, 50, sample_rate=0.1)
    assert sampled_peers.epsilon < g50.epsilon
    # deterministic: the same params give the same float (same pure-Python math in one process)
    assert A.cumulative_spend(gauss, 10, 50) == g50
    for bad in ({"num_coordinates": 0, "rounds": 1}, {"num_coordinates": 3, "rounds": -1}):
        with pytest.raises(ValueError):
            A.cumulative_spend(pnpm, **bad)
    with pytest.raises(ValueError, match="sample_rate"):
        A.cumulative_spend(pnpm, 3, 1, sample_rate=0.5)
    with pytest.raises(ValueError, match="target_delta"):
        A.cumulative_spend(pnpm, 3, 1, target_delta=2.0)


def test_swarm_audit_cli():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "node.cli",
            "audit",
            "--mechanism",
            "pnpm",
            "--epsilon",
            "1",
            "--trials",
            "20000",
            "--seed",
            "5",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["guarantee"]["protects"] == "sign"
    sign, value = report["audits"]
    assert sign["epsilon_lower_bound"] <= 1.0 and not sign["disjoint_support"]
    assert value["disjoint_support"] and value["epsilon_lower_bound"] > 5
    text = subprocess.run(
        [sys.executable, "-m", "node.cli", "audit", "--mechanism", "pnpm", "--epsilon", "1", "--trials", "5000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "DISJOINT SUPPORTS" in text.stdout and "sign of each weight only" in text.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "node.cli", "audit", "--mechanism", "pnpm", "--epsilon", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "epsilon must be finite and > 0" in bad.stderr
