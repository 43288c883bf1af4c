"""Empirical audit: a statistical LOWER bound on a mechanism's eps, from outside.

Run the mechanism `trials` times on each of two neighbouring inputs x0 and x1, histogram the
outputs (each distinct value is an event when there are few; else equal-width bins), and for every
event E and direction bound
    eps >= ln( P_lo[M(x0) in E] / P_hi[M(x1) in E] )
with exact Clopper-Pearson bounds (bisection on the regularized incomplete beta, math only).
All 2 * (#events) pairs of bounds hold together with the stated confidence (Bonferroni), so the
reported maximum is a lower bound on the true eps at that confidence. A lower bound above the
claimed eps is a bug, or, for PNPM's value privacy, the documented limit: with an event that
only one input can produce the bound grows without limit as trials grow (`disjoint_support`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from .base import Mechanism, check_epsilon
from .gaussian import Gaussian
from .local import LDPFL
from .randomness import seeded_generator

_DISCRETE_LIMIT = 64


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (Lentz's method, Numerical Recipes 6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def _solve_increasing(f: Callable[[float], float], target: float) -> tuple[float, float]:
    """The final bracket [lo, hi] of a bisection on [0, 1] for f(p) = target, f increasing."""
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return lo, hi


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """One-sided exact bounds: P[p >= lower] >= 1 - alpha and P[p <= upper] >= 1 - alpha."""
    k, n = successes, trials
    lower = 0.0 if k == 0 else _solve_increasing(lambda p: betainc(k, n - k + 1, p), alpha)[0]
    upper = 1.0 if k == n else _solve_increasing(lambda p: betainc(k + 1, n - k, p), 1.0 - alpha)[1]
    return lower, upper


@dataclass(frozen=True)
class AuditResult:
    mechanism: str
    claimed_epsilon: float
    protects: str
    x0: float
    x1: float
    trials: int
    confidence: float
    epsilon_lower_bound: float
    event: str
    disjoint_support: bool
    method: str = "Clopper-Pearson, Bonferroni over all events"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _event_counts(a: torch.Tensor, b: torch.Tensor, bins: int) -> list[tuple[str, int, int]]:
    """(label, count in a, count in b) of every event the audit tests."""
    both = torch.cat([a, b])
    values = torch.unique(both)
    if values.numel() <= _DISCRETE_LIMIT:
        return [(f"output == {float(v):.6g}", int((a == v).sum()), int((b == v).sum())) for v in values]
    lo, hi = float(both.min()), float(both.max())
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64)
    ca = torch.histc(a.to(torch.float64), bins=bins, min=lo, max=hi)
    cb = torch.histc(b.to(torch.float64), bins=bins, min=lo, max=hi)
    events = [
        (f"output in [{float(edges[i]):.4g}, {float(edges[i + 1]):.4g}]", int(ca[i]), int(cb[i])) for i in range(bins)
    ]
    # Tail events catch mechanisms whose ratio peaks in the tails (Laplace, Gaussian).
    lower_a, lower_b = torch.cumsum(ca, 0), torch.cumsum(cb, 0)
    events += [(f"output <= {float(edges[i + 1]):.4g}", int(lower_a[i]), int(lower_b[i])) for i in range(bins - 1)]
    events += [
        (f"output > {float(edges[i + 1]):.4g}", a.numel() - int(lower_a[i]), b.numel() - int(lower_b[i]))
        for i in range(bins - 1)
    ]
    return events


def audit_pair(
    mechanism: Mechanism,
    x0: float,
    x1: float,
    *,
    trials: int = 200_000,
    seed: int = 0,
    bins: int = 40,
    confidence: float = 0.95,
) -> AuditResult:
    """Lower-bound eps from `trials` releases on each of the inputs x0 and x1."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 100:
        raise ValueError(f"trials must be an integer >= 100, got {trials!r}")
    if not (0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    gen = seeded_generator(seed)  # an audit is reproducible: public noise
    out0 = mechanism.perturb_independent(torch.full((trials,), x0, dtype=torch.float64), generator=gen)
    out1 = mechanism.perturb_independent(torch.full((trials,), x1, dtype=torch.float64), generator=gen)
    events = _event_counts(out0, out1, bins)
    alpha = (1.0 - confidence) / (2 * 2 * len(events))  # two bounds per test, two directions per event
    # Exact bounds only for the few most promising tests: the union bound already covers all.
    candidates: list[tuple[float, str, int, int, str]] = []
    for label, c0, c1 in events:
        for num, den, direction in ((c0, c1, "x0/x1"), (c1, c0, "x1/x0")):
            if num > 0:
                # rank by a rough lower bound (counts moved 3 sd against the claim)
                rough = max(num - 3.0 * math.sqrt(num), 1e-9) / (den + 3.0 * math.sqrt(den) + 1.0)
                candidates.append((rough, label, num, den, direction))
    candidates.sort(reverse=True)
    best, best_event = 0.0, "none"
    for _, label, num, den, direction in candidates[:10]:
        p_lo = clopper_pearson(num, trials, alpha)[0]
        p_hi = clopper_pearson(den, trials, alpha)[1]
        bound = math.log(p_lo / p_hi) if p_lo > 0 else 0.0
        if bound > best:
            best, best_event = bound, f"{label} ({direction}: {num} vs {den} of {trials})"
    disjoint = any((c0 == 0) != (c1 == 0) and max(c0, c1) >= 30 for _, c0, c1 in events)
    g = mechanism.guarantee
    return AuditResult(
        mechanism.name, g.epsilon, g.protects, float(x0), float(x1), trials, confidence, best, best_event, disjoint
    )


def neighbouring_inputs(mechanism: Mechanism) -> list[tuple[str, float, float]]:
    """The pairs the audit runs: the extremes of the domain; for PNPM the sign pair and a value pair."""
    name = mechanism.name
    if name == "pnpm":
        return [("sign (+w vs -w)", 0.5, -0.5), ("value (w vs 2w)", 0.25, 0.5)]
    if name == "rr":
        return [("category 0 vs 1", 0.0, 1.0)]
    if isinstance(mechanism, LDPFL):
        return [("c-r vs c+r", mechanism.center - mechanism.radius, mechanism.center + mechanism.radius)]
    if isinstance(mechanism, Gaussian):
        return [("-S vs +S", -mechanism.clip_norm, mechanism.clip_norm)]
    return [("-1 vs +1", -1.0, 1.0)]


def audit_mechanism(
    mechanism: Mechanism, *, trials: int = 200_000, seed: int = 0, confidence: float = 0.95
) -> list[tuple[str, AuditResult]]:
    return [
        (label, audit_pair(mechanism, x0, x1, trials=trials, seed=seed + i, confidence=confidence))
        for i, (label, x0, x1) in enumerate(neighbouring_inputs(mechanism))
    ]


__all__ = [
    "AuditResult",
    "audit_pair",
    "audit_mechanism",
    "clopper_pearson",
    "betainc",
    "neighbouring_inputs",
    "check_epsilon",
]
