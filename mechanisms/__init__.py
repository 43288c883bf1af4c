"""Local and central DP mechanisms on tensors, their guarantees, accountants and audits.
Imports torch, numpy, math and opacus only: no I/O, no network, no chain.

    mech = mechanisms.get("pnpm", epsilon=1.0)
    noisy = mech.perturb(weights, generator=secret_generator())   # mechanisms.randomness: ChaCha20
    mech.guarantee            # Guarantee(epsilon, delta, protects, scope, statement)
    mechanisms.canonical_json(mech.params())   # what goes on chain
    mechanisms.accounting.cumulative_spend(mech.params(), num_coordinates=d, rounds=T)
"""

from __future__ import annotations

import json
import math

from .base import Guarantee, Mechanism
from .gaussian import Gaussian, analytic_gaussian_epsilon, analytic_gaussian_sigma, classic_gaussian_sigma
from .local import LDPFL, PNPM, Duchi, Hybrid, Piecewise, RandomizedResponse
from .sampled import Sampled
from .snapping import Exponential, Laplace

MECHANISMS: dict[str, type[Mechanism]] = {
    "duchi": Duchi,
    "pm": Piecewise,
    "hm": Hybrid,
    "ldp-fl": LDPFL,
    "pnpm": PNPM,
    "laplace": Laplace,
    "gaussian": Gaussian,
    "rr": RandomizedResponse,
    "exponential": Exponential,
    "sampled": Sampled,
}


def get(name: str, **params: object) -> Mechanism:
    """Build the mechanism registered as `name` (lower-case) with its parameters."""
    try:
        cls = MECHANISMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(MECHANISMS)}") from None
    try:
        return cls(**params)
    except TypeError as exc:  # unknown or missing keyword
        raise ValueError(f"bad parameters for {name}: {exc}") from None


def from_params(params: dict[str, object]) -> Mechanism:
    """Inverse of `Mechanism.params()`."""
    if not isinstance(params, dict) or "name" not in params:
        raise ValueError("params must be a dict with a 'name' key")
    rest = {k: v for k, v in params.items() if k != "name"}
    return get(params["name"], **rest)  # type: ignore[arg-type]  # get() refuses a non-str name


def _check_json_value(value: object, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"params{path} is not finite: {value!r}")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"params{path} has a non-string key {k!r}")
            _check_json_value(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json_value(v, f"{path}[{i}]")
    elif not isinstance(value, (str, int, float, bool, type(None))):
        raise ValueError(f"params{path} is not JSON-able: {type(value).__name__}")


def canonical_json(params: object) -> bytes:
    """Canonical bytes of a parameter dict (or any JSON value): sorted keys, no spaces, UTF-8, floats
    in Python's shortest round-trip repr (the same on every platform); NaN/inf, non-string keys and
    non-JSON values refused with ValueError."""
    _check_json_value(params, "")
    return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


__all__ = [
    "MECHANISMS",
    "Guarantee",
    "Mechanism",
    "get",
    "from_params",
    "canonical_json",
    "Duchi",
    "Piecewise",
    "Hybrid",
    "LDPFL",
    "PNPM",
    "Laplace",
    "Gaussian",
    "RandomizedResponse",
    "Exponential",
    "Sampled",
    "analytic_gaussian_sigma",
    "analytic_gaussian_epsilon",
    "classic_gaussian_sigma",
]
