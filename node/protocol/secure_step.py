"""The global model step of a secure-aggregation swarm (privacy.mechanism = secagg,
docs/SECAGG.md "A round"): from the unmasked sum of a round to the next global model, the one
function `swarm simulate`, every peer and `swarm verify` apply, so the model a round finalizes is
recomputed bit for bit from its sum.

The step's parameters are in the genesis (`SharedSettings.global_step`): every member applies the
same step, and the velocity (momentum) is a function of the public sums, so anyone holding the
sums of every finalized round holds it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from mechanisms.secagg.member import Ints, decode
from mechanisms.secagg.policy import SecAggPolicy


@dataclass(frozen=True)
class GlobalStep:
    """SGD with momentum on the noisy mean clipped gradient: lr x lr_decay^(round - 1)."""

    lr: float
    lr_decay: float
    momentum: float

    def __post_init__(self) -> None:
        if not self.lr > 0 or not 0 < self.lr_decay <= 1 or not 0 <= self.momentum < 1:
            raise ValueError(f"a global step needs lr > 0, lr_decay in (0, 1] and momentum in [0, 1): {self}")

    def to_dict(self) -> dict[str, object]:
        return {"lr": float(self.lr), "lr_decay": float(self.lr_decay), "momentum": float(self.momentum)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GlobalStep:
        if set(d) != {"lr", "lr_decay", "momentum"}:
            raise ValueError(f"not a global step: {dict(d)!r}")
        return cls(float(d["lr"]), float(d["lr_decay"]), float(d["momentum"]))


def next_global(
    step: GlobalStep,
    policy: SecAggPolicy,
    previous: torch.Tensor,
    velocity: torch.Tensor | None,
    total: Ints,
    records: int,
    round_number: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round `round_number`'s (1-based) model and velocity from the previous model, the velocity
    before it (None before the first finalized round) and the round's unmasked sum of `records`
    records. FloatingPointError if the model is not finite."""
    mean_gradient = torch.from_numpy(decode(policy, total, records))
    velocity = mean_gradient if velocity is None else step.momentum * velocity + mean_gradient
    lr = step.lr * step.lr_decay ** (round_number - 1)
    model = (previous.to(torch.float64) - lr * velocity).to(torch.float32)
    if not bool(torch.isfinite(model).all()):
        raise FloatingPointError("the global model is not finite")
    return model, velocity
