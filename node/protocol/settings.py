"""The settings a round runs with, as plain frozen records: what every peer of a swarm must agree
on (anchored in the genesis blob), and what one peer runs with locally. Built from a config by
`node.derive`; used by the peer, `swarm simulate` and `swarm verify` alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SharedSettings:
    """What every peer of a swarm must agree on; stored in the genesis blob."""

    model: str
    dataset: str
    input_shape: tuple[int, ...]
    num_classes: int
    share: str  # "weights" (the PNPM paper) or "update" (w - w_global)
    aggregation: str
    trim_ratio: float
    krum_f: int
    seed: int

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "dataset": self.dataset,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "share": self.share,
            "aggregation": self.aggregation,
            "trim_ratio": self.trim_ratio,
            "krum_f": self.krum_f,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SharedSettings:
        return cls(
            model=d["model"],
            dataset=d["dataset"],
            input_shape=tuple(d["input_shape"]),
            num_classes=int(d["num_classes"]),
            share=d["share"],
            aggregation=d["aggregation"],
            trim_ratio=float(d["trim_ratio"]),
            krum_f=int(d["krum_f"]),
            seed=int(d["seed"]),
        )


@dataclass(frozen=True)
class DPSGDConfig:
    """DP-SGD inside local training (opacus): noise multiplier, per-sample clip norm, delta."""

    noise_multiplier: float
    max_grad_norm: float
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0, got {self.noise_multiplier!r}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")


@dataclass(frozen=True)
class PeerSettings:
    """What one peer runs with: the swarm's shared settings plus its local training, mechanism
    and timing choices."""

    shared: SharedSettings
    mechanism: dict[str, object]  # mechanism params, e.g. {"name": "pnpm", "epsilon": 1.0}
    epochs: int
    batch_size: int
    lr: float
    lr_decay: float
    momentum: float
    rounds: int  # stop once this round is finalized or aborted
    fetch_timeout: float = 30.0
    poll_interval: float = 0.1
    chain_timeout: float = 600.0  # longest wait for any one chain state change
    linger: float = 5.0  # seconds to keep serving after the last round, for peers still fetching its model
    fault: str | None = None  # testing only: "wrong-bytes" or "scale:K" (node/peer/faults.py)
    dp: DPSGDConfig | None = None  # DP-SGD inside local training
