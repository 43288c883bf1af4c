"""The settings a round runs with, as plain frozen records: what every peer of a swarm must agree
on (anchored in the genesis blob), and what one peer runs with locally. Built from a config by
`node.derive`; used by the peer, `swarm simulate` and `swarm verify` alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mechanisms.record_level import DPSGDPolicy
from node.protocol.secure_step import GlobalStep

MAX_SAMPLES = 2**32 - 1  # what the ledger's uint32 numSamples can hold


@dataclass(frozen=True)
class PrivacyPolicy:
    """The swarm's privacy policy, part of its genesis: the local mechanism every peer applies to
    what it shares (its canonical parameters; empty = none, for `swarm simulate` baselines only)
    and the DP-SGD every peer trains with (None = plain SGD). A peer with another policy has
    another genesis digest and is refused at join; every commit spends exactly what it implies."""

    mechanism: Mapping[str, object] = field(default_factory=dict)
    dp_sgd: DPSGDPolicy | None = None

    def to_dict(self) -> dict[str, object]:
        # key order does not matter: the genesis blob holds wire.canonical(...) of this
        return {"mechanism": dict(self.mechanism), "dp_sgd": self.dp_sgd.to_dict() if self.dp_sgd else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PrivacyPolicy:
        mechanism, dp = d.get("mechanism"), d.get("dp_sgd")
        if not isinstance(mechanism, dict) or not (dp is None or isinstance(dp, dict)):
            raise ValueError(f"not a privacy policy: {dict(d)!r}")
        return cls(mechanism, DPSGDPolicy.from_dict(dp) if dp is not None else None)


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
    privacy: PrivacyPolicy
    # The most samples a commit may claim: the weight FedAvg gives its update, and the record count
    # its record-level eps is computed for. Rule 2 (node/rules.py) holds every commit to the smaller
    # of this and the ledger's maxSamples. A swarm derives it from its data (node.derive.max_samples);
    # a record built in code without one is bounded by the ledger's alone.
    max_samples: int = MAX_SAMPLES
    # Under secure aggregation, the global step every member applies to the round's sum
    # (node.protocol.secure_step); None otherwise, and then absent from the genesis.
    global_step: GlobalStep | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_samples, bool) or not isinstance(self.max_samples, int):
            raise ValueError(f"max_samples must be an integer, got {self.max_samples!r}")
        if not 1 <= self.max_samples <= MAX_SAMPLES:
            raise ValueError(f"max_samples must be in 1..2^32 - 1, got {self.max_samples}")

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
            "privacy": self.privacy.to_dict(),
            "max_samples": self.max_samples,
        } | ({"global_step": self.global_step.to_dict()} if self.global_step is not None else {})

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
            privacy=PrivacyPolicy.from_dict(d["privacy"]),
            max_samples=int(d["max_samples"]),
            global_step=GlobalStep.from_dict(d["global_step"]) if "global_step" in d else None,
        )


@dataclass(frozen=True)
class PeerSettings:
    """What one peer runs with: the swarm's shared settings (with its privacy policy) plus its
    local training and timing choices. With DP-SGD, `epochs` and `batch_size` are the policy's.
    `device` is where this peer trains ("cpu" or "cuda", resolved from train.device): hardware
    differs between peers, so it is not part of the shared settings or the genesis."""

    shared: SharedSettings
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
    linger_max: float = 60.0  # ... and on, up to this, while a participant has not announced it (node/peer/linger.py)
    device: str = "cpu"  # torch device local training runs on (node/learning/device.py)
    augmentations: int = 1  # DP-SGD augmentation multiplicity (node.learning.train); 1 = off
    fault: str | None = None  # testing only: "wrong-bytes", "withhold" or "scale:K" (node/peer/faults.py)

    @property
    def mechanism(self) -> dict[str, object]:
        """The policy's mechanism parameters, e.g. {"name": "pnpm", "epsilon": 1.0}."""
        return dict(self.shared.privacy.mechanism)

    @property
    def dp(self) -> DPSGDPolicy | None:
        return self.shared.privacy.dp_sgd
