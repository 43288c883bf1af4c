"""`Mechanism.release_violation`: genuine outputs are never flagged, forgeries of the output's shape are.

A false alarm would fail an honest peer's round in `swarm verify`, so the first tests draw many
genuine outputs (random parameters, inputs at and inside the domain edges, clipping, float32 and
float64, up to 10^6 coordinates) and require None for every one of them. The tolerance is
`RELEASE_ULPS` machine epsilons of the release dtype times the output set's magnitude; the
forgeries below move values by far more (1e-4 relative, ~800 float32 epsilons).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import mechanisms as M
from mechanisms.local import CELLS, duchi_exact_bound, hybrid_pm_probability
from mechanisms.randomness import seeded_generator
from mechanisms.sampled import sample_count

CHECKABLE = ("duchi", "pm", "hm", "ldp-fl", "exponential", "sampled", "rr", "laplace", "gaussian")
UNCHECKABLE = ("pnpm",)
EPSILONS = st.one_of(
    st.floats(1e-4, 700.0),
    st.sampled_from([1e-6, 0.01, 0.5, 0.61, 0.6100001, 1.0, 2.5, 10.0, 36.9, 60.0, 699.0, 700.0]),
)
DTYPES = st.sampled_from([torch.float32, torch.float64])


def _inputs(d: int, kind: str, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Inputs in [-1, 1] (or beyond, for the clipping mechanisms) that stress the thresholds."""
    if kind == "uniform":
        return (torch.rand(d, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    if kind == "edges":
        return torch.tensor([-1.0, 1.0, 0.0, -0.0, 1e-30, -1e-30], dtype=dtype).repeat(d // 6 + 1)[:d]
    if kind == "update":  # a model update: small values
        return (torch.randn(d, generator=g, dtype=torch.float64) * 0.01).to(dtype)
    if kind == "spike":  # one coordinate carries the whole norm: a clipped Gaussian input lands on S
        x = torch.randn(d, generator=g, dtype=torch.float64) * 1e-4
        x[d // 2] = -1e3 if d % 2 else 1e3
        return x.to(dtype)
    return (torch.randn(d, generator=g, dtype=torch.float64) * 3).to(dtype)  # "wide": needs clip


def _build(name: str, epsilon: float, data: st.DataObject) -> M.Mechanism:
    if name == "ldp-fl":
        center = data.draw(st.sampled_from([0.0, 0.3, -2.0, 1e3, 1e-7]), label="center")
        radius = data.draw(st.sampled_from([1.0, 0.01, 1e-5, 50.0]), label="radius")
        return M.get(name, epsilon=epsilon, center=center, radius=radius)
    if name == "sampled":
        base = data.draw(st.sampled_from(["duchi", "pm", "hm"]), label="base")
        return M.get(name, base=base, epsilon=epsilon, clip=True)
    if name == "rr":
        return M.get(name, epsilon=epsilon, k=data.draw(st.sampled_from([2, 3, 7, 100]), label="k"))
    if name == "gaussian":  # sigma from z (a small z makes the clipped value dominate the bound)
        clip_norm = data.draw(st.sampled_from([1e-3, 0.05, 1.0, 50.0]), label="clip_norm")
        z = data.draw(st.sampled_from([0.054, 0.06, 0.5, 1.0, 30.0]), label="z")
        return M.get(name, clip_norm=clip_norm, noise_multiplier=z)
    if name in ("laplace", "exponential"):  # the float64 snapping refuses eps past its range
        try:
            return M.get(name, epsilon=epsilon, clip=True)
        except ValueError:
            assume(False)
    return M.get(name, epsilon=epsilon, clip=True)


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(CHECKABLE),
    epsilon=EPSILONS,
    dtype=DTYPES,
    d=st.integers(1, 3000),
    kind=st.sampled_from(["uniform", "edges", "update", "wide", "spike"]),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_genuine_outputs_are_never_flagged(name, epsilon, dtype, d, kind, seed, data):
    mech = _build(name, epsilon, data)
    g = torch.Generator().manual_seed(seed)
    if name == "rr":
        x = torch.randint(0, mech.k, (d,), generator=g).to(dtype)
    else:
        x = _inputs(d, kind, dtype, g)
    y = mech.perturb(x, generator=seeded_generator(seed))
    assert mech.release_violation(y) is None, (mech, kind)
    # what the node publishes: the float32 cast of the output (a float64 output rounded once)
    assert mech.release_violation(y.to(torch.float32)) is None, (mech, kind)
    assert mech.release_violation(y.view(-1, 1) if d else y) is None  # any shape


@pytest.mark.parametrize(
    "name, params",
    [
        ("duchi", {"epsilon": 1.0}),
        ("duchi", {"epsilon": 0.05}),
        ("pm", {"epsilon": 0.3}),
        ("pm", {"epsilon": 8.0}),
        ("hm", {"epsilon": 0.5}),
        ("hm", {"epsilon": 3.0}),
        ("ldp-fl", {"epsilon": 2.0, "center": -0.4, "radius": 0.05}),
        ("exponential", {"epsilon": 30.0}),
        ("sampled", {"base": "pm", "epsilon": 600.0}),
        ("sampled", {"base": "hm", "epsilon": 600.0}),
        ("sampled", {"base": "duchi", "epsilon": 600.0}),
        ("laplace", {"epsilon": 1.0}),
        ("laplace", {"epsilon": 0.05}),
        ("gaussian", {"clip_norm": 1.0, "noise_multiplier": 1.0}),
        ("gaussian", {"clip_norm": 1.0, "noise_multiplier": 0.054}),
    ],
)
def test_a_million_genuine_coordinates_pass(name, params):
    mech = M.get(name, **params)
    x = torch.rand(1_000_000, generator=torch.Generator().manual_seed(7)) * 2 - 1
    g = seeded_generator(7)
    for _ in range(2):
        assert mech.release_violation(mech.perturb(x, generator=g)) is None


def _genuine(mech: M.Mechanism, d: int = 2000, seed: int = 3) -> torch.Tensor:
    x = torch.rand(d, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return mech.perturb(x, generator=seeded_generator(seed))


def _update(d: int = 2000) -> torch.Tensor:
    """A raw, unperturbed model update."""
    return torch.randn(d, generator=torch.Generator().manual_seed(11)) * 0.01


@pytest.mark.parametrize(
    "mech",
    [
        M.get("duchi", epsilon=1.0, clip=True),
        M.get("duchi", epsilon=700.0),
        M.get("hm", epsilon=0.5, clip=True),
        M.get("pm", epsilon=1.0),
        M.get("hm", epsilon=2.0),
        M.get("exponential", epsilon=1.0),
        M.get("laplace", epsilon=1.0),
        M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0),
        M.get("ldp-fl", epsilon=1.0, center=0.0, radius=0.02),
        M.get("sampled", base="duchi", epsilon=1.0, clip=True),
        M.get("sampled", base="pm", epsilon=10.0, clip=True),
        M.get("sampled", base="hm", epsilon=10.0, clip=True),
    ],
    ids=repr,
)
def test_raw_update_is_flagged(mech):
    """A raw update is not on the output set (two points, a grid) of these mechanisms."""
    violation = mech.release_violation(_update())
    assert violation is not None and ("not in" in violation or "non-zero" in violation or "not on" in violation), (
        violation
    )


@pytest.mark.parametrize(
    "mech",
    [
        M.get("duchi", epsilon=1.0),
        M.get("duchi", epsilon=60.0),
        M.get("hm", epsilon=0.2),
        M.get("ldp-fl", epsilon=1.0, center=0.5, radius=0.1),
        M.get("sampled", base="duchi", epsilon=20.0),
    ],
    ids=repr,
)
def test_two_point_forgeries_are_flagged(mech):
    y = _genuine(mech)
    assert mech.release_violation(y) is None
    assert mech.release_violation(y * 1.01) is not None
    nz = int(torch.nonzero(y)[0, 0])
    for moved_to in (y[nz] * (1 + 1e-4), y[nz] * (1 - 1e-4), 0.5 * y[nz], -0.1):
        forged = y.clone()
        forged[nz] = moved_to
        violation = mech.release_violation(forged)
        assert violation is not None and f"index {nz} " in violation, (moved_to, violation)
        assert violation.startswith("1 of 2000 coordinates"), violation


def _top(mech: M.Mechanism) -> float:
    """The largest value of a grid mechanism's output set."""
    return float(mech.output_set().magnitude)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "mech",
    [
        M.get("pm", epsilon=1.0),
        M.get("hm", epsilon=2.0),
        M.get("exponential", epsilon=1.0),
        M.get("laplace", epsilon=1.0),
        M.get("laplace", epsilon=0.01),
    ],
    ids=repr,
)
def test_grid_forgeries_are_flagged(mech):
    """Values off the grid or past its ends are refused; the grid's end itself passes."""
    y = _genuine(mech)
    assert mech.release_violation(y) is None
    bound = _top(mech)
    first, step, _ = mech.output_set().grid
    for outside in (bound * (1 + 1e-4), -bound * (1 + 1e-4), 1e6, float("nan"), float("inf"), first + step / 2):
        forged = y.clone()
        forged[7] = outside
        violation = mech.release_violation(forged)
        assert violation is not None and "index 7 " in violation, (outside, violation)
    at_edge = y.clone()
    at_edge[7] = bound  # the end of the grid is a possible output
    assert mech.release_violation(at_edge) is None


def test_a_raw_update_snapped_to_the_grid_passes():
    """The documented limit: every grid value is a possible output of every input, so a raw
    update rounded to the grid cannot be told from a release."""
    for mech in (
        M.get("pm", epsilon=1.0),
        M.get("exponential", epsilon=1.0),
        M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0),
    ):
        first, step, _ = mech.output_set().grid
        snapped = first + torch.round((_update().double() - first) / step) * step
        assert mech.release_violation(snapped.float()) is None


def test_sampled_counts_non_zeros_and_checks_their_values():
    mech = M.get("sampled", base="duchi", epsilon=10.0)  # k = 4 of d = 2000, base at eps 2.5
    y = _genuine(mech)
    k, d = sample_count(10.0, 2000), 2000
    assert int(torch.count_nonzero(y)) == k and mech.release_violation(y) is None
    value = duchi_exact_bound(10.0 / k) * d / k
    assert float(y.abs().max()) == pytest.approx(value, rel=1e-6)
    extra = y.clone()
    extra[torch.nonzero(y == 0)[0, 0]] = value  # a valid value, one coordinate too many
    assert "5 of 2000 coordinates are non-zero" in mech.release_violation(extra)
    unscaled = y / (d / k)  # the base outputs without the d/k scaling
    assert mech.release_violation(unscaled) is not None
    assert mech.release_violation(torch.zeros(d)) is None  # all zeros: a PM base could round to 0
    assert mech.release_violation(torch.zeros(0)) is None


def test_randomized_response_checks_categories():
    mech = M.get("rr", epsilon=1.0, k=3)
    y = mech.perturb(torch.tensor([0.0, 1.0, 2.0] * 100), generator=seeded_generator(0))
    assert mech.release_violation(y) is None
    for bad in (3.0, -1.0, 0.5, float("nan")):
        forged = y.clone()
        forged[5] = bad
        assert "index 5 " in mech.release_violation(forged), bad


def test_non_float_releases_are_flagged():
    mech = M.get("duchi", epsilon=1.0)
    y = _genuine(mech)
    assert "float16" in mech.release_violation(y.to(torch.float16))
    assert "not a tensor" in mech.release_violation(y.tolist())  # type: ignore[arg-type]


def test_hybrid_switches_from_two_points_to_the_grid_at_its_threshold():
    assert hybrid_pm_probability(0.61) == 0.0 < hybrid_pm_probability(0.62)
    two_points, mixed = M.get("hm", epsilon=0.61), M.get("hm", epsilon=0.62)
    first, step, count = mixed.output_set().grid
    assert count == CELLS
    on_grid = torch.tensor([first + 700 * step], dtype=torch.float64)
    assert two_points.release_violation(on_grid) is not None
    assert mixed.release_violation(on_grid) is None
    assert mixed.release_violation(torch.tensor([mixed.bound, -mixed.bound], dtype=torch.float64)) is None


@pytest.mark.parametrize("name", UNCHECKABLE)
def test_unchecked_mechanisms_say_so_and_accept_anything(name):
    mech = M.get(name, epsilon=1.0)
    assert mech.release_check.startswith("nothing")
    assert mech.release_violation(_update()) is None
    assert mech.release_violation(torch.tensor([1e30, -5.0, 0.0])) is None


def test_every_mechanism_states_what_it_checks():
    for name, cls in M.MECHANISMS.items():
        assert isinstance(cls.release_check, str) and cls.release_check, name
        checks = not cls.release_check.startswith("nothing")
        assert checks == (name in CHECKABLE), name
    assert math.isclose(M.base.release_tolerance(torch.float32, 2.0), 8 * 2.0**-23 * 2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_clipped_gaussian_coordinate_at_the_clip_norm_passes(dtype):
    """The clip-dominated corner of the Gaussian: one coordinate carries the whole norm of a
    million (the float32 norm's rounding is largest there) and the noise is the smallest the
    snapped Gaussian takes, so the release's largest value sits near clip_norm itself."""
    mech = M.get("gaussian", clip_norm=1.0, noise_multiplier=0.054)
    g = torch.Generator().manual_seed(5)
    for sign in (1.0, -1.0):
        x = (torch.randn(1_000_000, generator=g, dtype=torch.float64) * 1e-4).to(dtype)
        x[123] = sign * 1e3
        y = mech.perturb(x, generator=seeded_generator(5))
        assert abs(float(y[123])) > 0.7  # the clipped coordinate, close to S (noise sd 0.054)
        assert mech.release_violation(y) is None
        assert mech.release_violation(y.to(torch.float32)) is None
