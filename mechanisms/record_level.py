"""Record-level DP of DP-SGD over a whole run: what each peer's releases reveal about any ONE of
its own training records.

The model is inter-silo record-level DP (Lowy & Razaviyayn, "Private federated learning without a
trusted server", 2023): every message a peer publishes is DP with respect to the records of its
own dataset, whoever reads it (other peers, the chain, the archive). Each round a peer runs
`epochs` passes of DP-SGD (Abadi et al., CCS 2016): Poisson batches of rate q = batch_size / n,
per-sample clipping, Gaussian noise of std `noise_multiplier` x clip. The guarantee composes over
every step of every round the peer released.

Neighbours are REPLACE-ONE (one record replaced by another): a peer's sample count n is public and
exact on chain (it weights the aggregate), so add/remove neighbours, whose counts differ, would
be told apart by the count alone. The accountant is Google's `dp_accounting` privacy-loss-
distribution accountant (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "Connect the dots", 2022)
for the Poisson-subsampled Gaussian under REPLACE_ONE, with its pessimistic (upper-bound)
discretisation. opacus' RDP and PRV accountants cover add/remove only; turning their figure into a
replace-one one by group privacy doubles eps (16.3 where the PLD gives 6.7 at noise 1, q 0.085,
60 steps, delta 1e-5).

The figure depends only on (noise multiplier, batch size, epochs, delta), which the swarm fixes in
its genesis settings, and the sample count of each round the peer committed, which is on chain:
anyone can recompute it (`record_level_spend`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution as pld

from .accounting import IAccountant, Spend
from .base import check_delta
from .gaussian import float_residual_delta
from .pld_self_compose import self_compose

# Width of the PLD's privacy-loss grid. Pessimistic rounding keeps eps an upper bound; at 1e-3 the
# bound is within 1e-5 of the 1e-4 grid's for 12 to 600 steps, and ten times cheaper (0.1 s).
VALUE_DISCRETIZATION = 1e-3
ACCOUNTANT = "pld-replace-one"
PROTECTS = "each training record (DP-SGD)"


def round_steps(batch_size: int, epochs: int, num_samples: int) -> tuple[float, int]:
    """(Poisson sample rate, number of noisy steps) of one round of DP-SGD on `num_samples` records:
    q = min(1, batch_size / n), ceil(1 / q) steps per epoch (opacus' convention)."""
    for name, value in (("batch_size", batch_size), ("epochs", epochs), ("num_samples", num_samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    rate = min(1.0, batch_size / num_samples)
    return rate, epochs * max(1, math.ceil(1 / rate))


@dataclass(frozen=True)
class DPSGDPolicy:
    """The swarm's DP-SGD settings (part of its genesis): every peer trains with these."""

    noise_multiplier: float
    max_grad_norm: float
    batch_size: int
    epochs: int
    delta: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "max_grad_norm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        round_steps(self.batch_size, self.epochs, 1)
        check_delta(self.delta)

    def to_dict(self) -> dict[str, object]:
        return {
            "noise_multiplier": float(self.noise_multiplier),
            "max_grad_norm": float(self.max_grad_norm),
            "batch_size": self.batch_size,
            "epochs": self.epochs,
            "delta": float(self.delta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> DPSGDPolicy:
        try:
            return cls(
                noise_multiplier=float(d["noise_multiplier"]),  # type: ignore[arg-type]
                max_grad_norm=float(d["max_grad_norm"]),  # type: ignore[arg-type]
                batch_size=_int(d["batch_size"]),
                epochs=_int(d["epochs"]),
                delta=float(d["delta"]),  # type: ignore[arg-type]
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a DP-SGD policy: {d!r} ({exc})") from exc


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def step_residual_delta(noise_multiplier: float) -> float:
    """What DP-SGD's float noise sampler adds to delta per step: the tail of its Box-Muller pairs
    past 37.6 sigma (`gaussian.float_residual_delta` at noise sigma = z C and sensitivity 2C, the
    clipped sum's under replace-one neighbours). About 1e-281 at z = 1.2."""
    return float_residual_delta(noise_multiplier, 2.0)


class RecordAccountant(IAccountant):
    """Composes a peer's DP-SGD rounds; `get_privacy_spent(delta)` answers its record-level
    (eps, delta): delta plus every step's `step_residual_delta`. The history is a list of (noise
    multiplier, sample rate, steps): plain numbers, so a peer can persist it and continue after a
    restart (`to_dict`, `from_dict`)."""

    name = ACCOUNTANT

    def __init__(self, history: Iterable[tuple[float, float, int]] = ()) -> None:
        self.history: list[tuple[float, float, int]] = []
        for sigma, rate, steps in history:
            self.step(sigma, rate, steps)

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        if not (isinstance(noise_multiplier, (int, float)) and 0 < noise_multiplier < math.inf):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
        if not (isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1):
            raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        self.history.append((float(noise_multiplier), float(sample_rate), steps))

    def step_round(self, policy: DPSGDPolicy, num_samples: int) -> None:
        rate, steps = round_steps(policy.batch_size, policy.epochs, num_samples)
        self.step(policy.noise_multiplier, rate, steps)

    def get_privacy_spent(self, delta: float | None = None) -> tuple[float, float]:
        if delta is None:
            raise ValueError("delta is required for the record-level accountant")
        delta = check_delta(delta)
        grouped: dict[tuple[float, float], int] = {}
        for sigma, rate, steps in self.history:
            grouped[(sigma, rate)] = grouped.get((sigma, rate), 0) + steps
        key = tuple(sorted(grouped.items()))
        if not any(s for _, s in key):
            return 0.0, 0.0
        return _pld_epsilon(key, delta), delta + self.residual_delta

    @property
    def residual_delta(self) -> float:
        """The float noise's residual delta over every step so far (a union bound)."""
        return sum(steps * step_residual_delta(sigma) for sigma, _, steps in self.history)

    def to_dict(self) -> dict[str, object]:
        return {"accountant": self.name, "history": [list(h) for h in self.history]}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> RecordAccountant:
        history = d.get("history")
        if d.get("accountant") != ACCOUNTANT or not isinstance(history, list):
            raise ValueError(f"not a {ACCOUNTANT} accountant state")
        rows = []
        for row in history:
            if not (isinstance(row, list) and len(row) == 3):
                raise ValueError(f"bad accountant history row {row!r}")
            rows.append((float(row[0]), float(row[1]), _int(row[2])))
        return cls(rows)


@functools.lru_cache(maxsize=4096)
def _pld_epsilon(groups: tuple[tuple[tuple[float, float], int], ...], delta: float) -> float:
    """eps of the composition, at `delta`; cached because every peer and `verify` ask the same
    questions (peers with equal sample counts, round after round).

    The operations of dp_accounting's `PLDAccountant` (REPLACE_ONE, `compose` of a
    `PoissonSampledDpEvent` of a `GaussianDpEvent` per group, then `get_epsilon`), in the same order
    on the same inputs, so the figure is the accountant's bit for bit
    (tests/mechanisms/test_record_level.py); only the one-step PLD of each (sigma, rate) is kept
    across calls (`_step_pld`): building it is about four fifths of a composition's CPU, and a
    peer's next round asks for the same one again with one round more; and so is the part of its
    self-composition that depends on it alone (`pld_self_compose`: half of what is left)."""
    composed = pld.identity(value_discretization_interval=VALUE_DISCRETIZATION)
    for (sigma, rate), steps in groups:
        if steps:
            composed = composed.compose(self_compose(_step_pld(sigma, rate), steps))
    return float(composed.get_epsilon_for_delta(delta))


@functools.lru_cache(maxsize=64)
def _step_pld(sigma: float, rate: float) -> pld.PrivacyLossDistribution:
    """The PLD of one Poisson-subsampled Gaussian step under replace-one neighbours, as
    `PLDAccountant` builds it; PLD objects are not changed by composing them (each composition
    returns a new one), so one can be shared."""
    return pld.from_gaussian_mechanism(
        standard_deviation=sigma,
        value_discretization_interval=VALUE_DISCRETIZATION,
        sampling_prob=rate,
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
    )


def record_level_spend(policy: DPSGDPolicy, sample_counts: Sequence[int]) -> Spend:
    """The record-level (eps, delta) of a peer that released one DP-SGD round per entry of
    `sample_counts` (its committed numSamples, in order) under `policy`. Pure: the peer, every
    other peer and `swarm verify` get the same figure from what is on chain."""
    accountant = RecordAccountant()
    for n in sample_counts:
        accountant.step_round(policy, n)
    eps, delta = accountant.get_privacy_spent(policy.delta)
    rounds, residual = len(sample_counts), accountant.residual_delta
    return Spend(
        eps,
        delta,
        PROTECTS,
        "record",
        f"DP-SGD: ({eps:.6g}, {policy.delta:g} + {residual:.3g})-DP for {PROTECTS}, replace-one neighbours, "
        f"over {rounds} round(s) (noise {policy.noise_multiplier:g}, clip {policy.max_grad_norm:g}, batch "
        f"{policy.batch_size}, {policy.epochs} epoch(s) per round; {ACCOUNTANT}; + the float noise's residual "
        "delta)",
        ACCOUNTANT,
        residual,
    )


def calibrate_noise(
    target_epsilon: float,
    *,
    batch_size: int,
    epochs: int,
    num_samples: int,
    rounds: int,
    delta: float = 1e-5,
    max_grad_norm: float = 1.0,
    relative_tolerance: float = 0.005,
) -> float:
    """The smallest noise multiplier (to within `relative_tolerance`, rounded up) for which a peer
    holding `num_samples` records that releases `rounds` rounds of DP-SGD stays within
    `target_epsilon` at `delta`, by `record_level_spend` (the figure the ledger records).

    Bisection on the noise multiplier: eps falls as the noise grows (more noise, less loss)."""
    if not (isinstance(target_epsilon, (int, float)) and 0 < target_epsilon < math.inf):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")

    def eps(sigma: float) -> float:
        policy = DPSGDPolicy(sigma, max_grad_norm, batch_size, epochs, delta)
        return record_level_spend(policy, [num_samples] * rounds).epsilon

    low, high = 0.1, 1.0
    while eps(high) > target_epsilon:
        low, high = high, high * 2
        if high > 1e4:
            raise ValueError(f"no noise multiplier up to 1e4 reaches eps {target_epsilon} in {rounds} rounds")
    if eps(low) <= target_epsilon:
        return low
    while (high - low) / high > relative_tolerance:
        middle = (low + high) / 2
        low, high = (low, middle) if eps(middle) <= target_epsilon else (middle, high)
    return float(f"{high:.4g}") if eps(float(f"{high:.4g}")) <= target_epsilon else high
