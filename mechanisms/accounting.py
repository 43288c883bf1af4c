"""Privacy accountants: what is a peer's cumulative (eps, delta) for its WHOLE shared update?

One small class per accountant behind one abstract interface (opacus style, `IAccountant`):
`step(releases)` records releases, `get_privacy_spent(delta)` answers (eps, delta).
`cumulative_spend` is the pure function the node and `swarm verify` use to recompute a peer's
spend from the parameters it committed; it runs on these accountants.

A coordinate-scope mechanism applied to d coordinates is d releases per round: a peer's spend is
never the per-coordinate eps.
"""

from __future__ import annotations

import abc
import math
from dataclasses import asdict, dataclass
from typing import ClassVar

from .base import Guarantee, check_delta, check_epsilon
from .gaussian import Gaussian


def basic_composition(epsilon: float, releases: int, delta: float = 0.0) -> tuple[float, float]:
    """k (eps, delta) releases are (k eps, k delta)-DP (Dwork & Roth 2014, Thm 3.16)."""
    return releases * epsilon, releases * delta


def advanced_composition(epsilon: float, releases: int, delta_slack: float, delta: float = 0.0) -> tuple[float, float]:
    """k (eps, delta) releases are (sqrt(2k ln(1/d')) eps + k eps (e^eps - 1), k delta + d')-DP
    (Dwork, Rothblum, Vadhan 2010; Dwork & Roth 2014, Thm 3.20)."""
    eps = math.sqrt(2.0 * releases * math.log(1.0 / delta_slack)) * epsilon + releases * epsilon * math.expm1(epsilon)
    return eps, releases * delta + delta_slack


class IAccountant(abc.ABC):
    """An accountant (opacus style): it is told what was released and answers the cumulative
    (eps, delta) at a given delta."""

    name: ClassVar[str]

    @abc.abstractmethod
    def get_privacy_spent(self, delta: float | None = None) -> tuple[float, float]:
        """(eps, delta) of everything released so far."""


class ReleaseAccountant(IAccountant):
    """Counts releases of one mechanism (`step`); subclasses compose them."""

    def __init__(self) -> None:
        self.releases = 0

    def step(self, releases: int = 1) -> None:
        if isinstance(releases, bool) or not isinstance(releases, int) or releases < 0:
            raise ValueError(f"releases must be an integer >= 0, got {releases!r}")
        self.releases += releases


class BasicCompositionAccountant(ReleaseAccountant):
    """Sequential composition of pure (or approximate) releases."""

    name = "basic"

    def __init__(self, epsilon: float, delta: float = 0.0) -> None:
        super().__init__()
        self.epsilon = check_epsilon(epsilon)
        self.delta = 0.0 if delta == 0 else check_delta(delta)

    def get_privacy_spent(self, delta: float | None = None) -> tuple[float, float]:
        return basic_composition(self.epsilon, self.releases, self.delta)


class AdvancedCompositionAccountant(ReleaseAccountant):
    """Advanced composition; `get_privacy_spent(delta)` spends `delta` minus the releases' own."""

    name = "advanced"

    def __init__(self, epsilon: float, delta: float = 0.0) -> None:
        super().__init__()
        self.epsilon = check_epsilon(epsilon)
        self.delta = 0.0 if delta == 0 else check_delta(delta)

    def get_privacy_spent(self, delta: float | None = None) -> tuple[float, float]:
        if delta is None:
            raise ValueError("delta is required for advanced composition")
        delta = check_delta(delta)
        slack = delta - self.releases * self.delta
        if slack <= 0:
            raise ValueError(f"delta {delta} is smaller than the releases' own delta")
        if self.releases == 0:
            return 0.0, 0.0
        return advanced_composition(self.epsilon, self.releases, slack, self.delta)


class RDPGaussianAccountant(ReleaseAccountant):
    """Renyi DP of the (subsampled) Gaussian via opacus' RDPAccountant (Mironov 2017; Mironov,
    Talwar, Zhang 2019); conversion to (eps, delta) as opacus does it."""

    name = "rdp"

    def __init__(self, noise_multiplier: float, sample_rate: float = 1.0) -> None:
        super().__init__()
        if not (
            isinstance(noise_multiplier, (int, float)) and math.isfinite(noise_multiplier) and noise_multiplier > 0
        ):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
        if not (isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1):
            raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
        self.noise_multiplier = float(noise_multiplier)
        self.sample_rate = float(sample_rate)

    def get_privacy_spent(self, delta: float | None = None) -> tuple[float, float]:
        from opacus.accountants import RDPAccountant

        if delta is None:
            raise ValueError("delta is required for the RDP accountant")
        delta = check_delta(delta)
        if self.releases == 0:
            return 0.0, 0.0
        acc = RDPAccountant()
        acc.history = [(self.noise_multiplier, self.sample_rate, self.releases)]
        return float(acc.get_epsilon(delta)), delta


@dataclass(frozen=True)
class Spend:
    """A peer's cumulative guarantee for its whole shared update."""

    epsilon: float
    delta: float
    protects: str
    scope: str
    statement: str
    method: str = ""
    # The part of `delta` that the floating-point sampler adds (Guarantee.residual_delta per
    # release, summed over releases: the events where a draw departs from the exact law add up).
    residual_delta: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def cumulative_spend(
    params: dict[str, object],
    num_coordinates: int,
    rounds: int,
    *,
    sample_rate: float = 1.0,
    target_delta: float | None = None,
) -> Spend:
    """The cumulative (eps, delta) of a peer that released its whole update `rounds` times with the
    mechanism `params` (as committed on chain) over `num_coordinates` shared coordinates.

    Coordinate-scope mechanisms: d * rounds pure-eps releases, basic composition, or advanced when
    `target_delta` is given and it is smaller. Vector-scope pure mechanisms: `rounds` releases,
    likewise. Gaussian: RDP (opacus) with unit noise sigma / (2 clip_norm) and `sample_rate`, or
    basic composition of the per-round (eps, delta) when that is smaller within `target_delta`
    (default: the mechanism's delta), plus the float sampler's residual delta of every round.
    sample_rate < 1 amplifies only against an observer who cannot tell whether the peer took part
    in a round; with public blobs, pass 1. Deterministic: Python floats and math only (opacus for
    RDP).
    """
    from . import from_params

    _check_spend_arguments(num_coordinates, rounds, sample_rate)
    if target_delta is not None:
        target_delta = check_delta(target_delta, "target_delta")
    mech = from_params(params)
    if isinstance(mech, Gaussian):
        return _gaussian_spend(mech, num_coordinates, rounds, sample_rate, target_delta)
    if sample_rate != 1.0:
        raise ValueError("sample_rate < 1 is accounted only for the gaussian mechanism")
    return _pure_spend(mech.name, mech.guarantee, num_coordinates, rounds, target_delta)


def _check_spend_arguments(num_coordinates: int, rounds: int, sample_rate: float) -> None:
    if isinstance(num_coordinates, bool) or not isinstance(num_coordinates, int) or num_coordinates < 1:
        raise ValueError(f"num_coordinates must be an integer >= 1, got {num_coordinates!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be an integer >= 0, got {rounds!r}")
    if not (isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1):
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")


def _protects(g: Guarantee) -> str:
    return (
        "the sign of each weight only (no finite eps for the values)" if g.protects == "sign" else "the update's values"
    )


def _gaussian_spend(
    mech: Gaussian, num_coordinates: int, rounds: int, sample_rate: float, target_delta: float | None
) -> Spend:
    """The exact Gaussian's (eps, delta) from RDP (or basic composition), plus the float64
    sampler's residual delta once per round (a union bound over the rounds' draws): its tail and
    its snapping, d times the per-coordinate residual."""
    g = mech.guarantee
    delta = mech.delta if target_delta is None else target_delta
    rdp = RDPGaussianAccountant(mech.sigma / mech.sensitivity, sample_rate)
    rdp.step(rounds)
    eps, method = rdp.get_privacy_spent(delta)[0], "rdp"
    if sample_rate == 1.0 and rounds * mech.delta <= delta:
        basic = BasicCompositionAccountant(g.epsilon, mech.delta)
        basic.step(rounds)
        if basic.get_privacy_spent()[0] < eps:
            eps, method = basic.get_privacy_spent()[0], "basic"
    residual = rounds * (g.residual_delta + num_coordinates * g.residual_delta_per_coordinate)
    return Spend(
        eps,
        delta + residual if rounds else 0.0,
        g.protects,
        "vector",
        f"{mech.name}: ({eps:.6g}, {delta:g} + {residual:.3g})-LDP for {_protects(g)} over {rounds} rounds "
        f"({method}, sample rate {sample_rate:g}; + the float64 sampler's residual delta)",
        method,
        residual,
    )


def _pure_spend(name: str, g: Guarantee, num_coordinates: int, rounds: int, target_delta: float | None) -> Spend:
    """Pure releases (the local mechanisms' floating-point excess is inside their eps: they are
    exact on their grids, Laplace and the exponential mechanism calibrated so that their proven
    snapping bound meets it); a residual delta, if any, adds up."""
    releases = rounds * (num_coordinates if g.scope == "coordinate" else 1)
    residual = releases * g.residual_delta
    basic = BasicCompositionAccountant(g.epsilon, g.delta)
    basic.step(releases)
    (eps, delta), method = basic.get_privacy_spent(), "basic"
    if target_delta is not None and releases > 0 and g.delta == 0.0:
        advanced = AdvancedCompositionAccountant(g.epsilon)
        advanced.step(releases)
        adv = advanced.get_privacy_spent(target_delta)[0]
        if adv < eps:
            eps, delta, method = adv, target_delta, "advanced"
    per = f"{num_coordinates} coordinates x {rounds} rounds" if g.scope == "coordinate" else f"{rounds} rounds"
    return Spend(
        eps,
        delta,
        g.protects,
        "vector",
        f"{name}: ({eps:.6g}, {delta:g})-LDP for {_protects(g)}, whole update, {per} at "
        f"eps {g.epsilon:g} each ({method} composition)",
        method,
        residual,
    )
