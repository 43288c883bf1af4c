"""A swarm's secure-aggregation policy (part of its genesis) and what follows from it.

Every round is one full-batch DP-GD step of the union of the members' records: each member clips
each record's gradient to `clip` (l2), sums them, scales by `scale` (so that scale x clip is a power
of two), rounds (`quantize.stochastic_round`), adds its share of discrete Gaussian noise and
reduces mod 2^bits. The aggregate, lifted to [-2^(bits-1), 2^(bits-1)) and divided by scale and
the union's record count, is the noisy mean gradient.

Noise: the sum must carry N_Z-noise of standard deviation noise_multiplier x sensitivity, where
sensitivity is the replace-one l2 sensitivity of one member's rounded sum (2 scale clip plus the
rounding, `quantize.rounded_sensitivity`). Each member adds N_Z(0, sigma^2 / h), h = the members
counted on to add theirs: members - floor(dropout_fraction x members). Up to that many members may
drop or skip their noise and the guarantee still holds (`epsilon` counts h members only); when all
add theirs the sum carries members / h times the variance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mechanisms.accounting import Spend

from . import accounting
from .discrete_gaussian import DiscreteGaussian
from .quantize import check_bits, rounded_sensitivity, scale_for

NAME = "secagg"
PROTECTS = "each training record (distributed DP on the secure sum)"


@dataclass(frozen=True)
class SecAggPolicy:
    members: int  # members of every round (all of the swarm's peers)
    max_records: int  # the union's largest record count (peers x the genesis sample cap)
    dim: int  # coordinates of the shared vector (the model's parameters)
    clip: float  # l2 bound of each record's gradient
    noise_multiplier: float  # the sum's noise std over its sensitivity
    bits: int = 32
    dropout_fraction: float = 0.0  # members that may drop or skip their noise, as a fraction
    delta: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("members", "max_records", "dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        check_bits(self.bits)
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be finite and > 0, got {self.clip!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {self.noise_multiplier!r}")
        if not 0 <= self.dropout_fraction < 1:
            raise ValueError(f"dropout_fraction must lie in [0, 1), got {self.dropout_fraction!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        self.scale  # noqa: B018 (raises when the bits cannot hold the sum)

    @property
    def counted_members(self) -> int:
        """h: the members whose noise the guarantee counts on."""
        return self.members - math.floor(self.dropout_fraction * self.members)

    @property
    def scale(self) -> float:
        """Units per gradient unit: scale x clip is a power of two (`quantize.scale_for`)."""
        return scale_for(self.bits, self.max_records, self.clip, self.noise_multiplier, self.dim)

    @property
    def sensitivity(self) -> float:
        """Replace-one l2 sensitivity of a member's rounded sum, in integer units."""
        return rounded_sensitivity(2.0 * self.scale * self.clip, self.dim)

    @property
    def local_noise(self) -> DiscreteGaussian:
        """Each member's share: N_Z(0, sigma^2 / h), sigma = noise_multiplier x sensitivity, its
        variance an integer product at least that."""
        return DiscreteGaussian.covering((self.noise_multiplier * self.sensitivity) ** 2 / self.counted_members)

    def epsilon(self, rounds: int) -> float:
        """Record-level eps (at `delta`) of any member's record after `rounds` rounds."""
        return accounting.epsilon(
            self.sensitivity, self.counted_members, float(self.local_noise.variance), self.dim, rounds, self.delta
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "name": NAME,
            "members": self.members,
            "max_records": self.max_records,
            "dim": self.dim,
            "clip": float(self.clip),
            "noise_multiplier": float(self.noise_multiplier),
            "bits": self.bits,
            "dropout_fraction": float(self.dropout_fraction),
            "delta": float(self.delta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SecAggPolicy:
        if d.get("name") != NAME or set(d) != set(cls.__dataclass_fields__) | {"name"}:
            raise ValueError(f"not a secure-aggregation policy: {dict(d)!r}")
        return cls(
            members=_int(d["members"]),
            max_records=_int(d["max_records"]),
            dim=_int(d["dim"]),
            clip=_float(d["clip"]),
            noise_multiplier=_float(d["noise_multiplier"]),
            bits=_int(d["bits"]),
            dropout_fraction=_float(d["dropout_fraction"]),
            delta=_float(d["delta"]),
        )


def secagg_spend(policy: SecAggPolicy, rounds: int) -> Spend:
    """A member's record-level guarantee after `rounds` rounds, as the ledger's figures are stated."""
    eps = policy.epsilon(rounds)
    return Spend(
        epsilon=eps,
        delta=policy.delta,
        protects=PROTECTS,
        scope="record",
        statement=(
            f"each record of every member: ({eps:.4g}, {policy.delta:g})-DP over {rounds} full-batch rounds, "
            f"if at least {policy.counted_members} of {policy.members} members add their noise"
        ),
        method="distributed discrete Gaussian, RDP (Kairouz-Liu-Steinke 2021, Prop. 14), replace-one",
    )


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)
