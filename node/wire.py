"""What peers put on the wire and on chain, defined once so that peers and `swarm verify`
agree byte for byte: the genesis, update and model blobs, the eps fixed point and the
gossip topic. (The inclusion bitmap is the contract's layout: node.ledger.encode_bitmap.)"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from node import blob

VECTOR = "vector"  # the one tensor every blob holds: the flat float32 parameter vector
EPS_SCALE = 1_000_000  # the ledger stores eps in micro-epsilon


def canonical(obj) -> str:
    """Canonical JSON text (mechanisms.canonical_json): what every peer hashes the same way."""
    from mechanisms import canonical_json

    return canonical_json(obj).decode("utf-8")


def eps_to_micro(epsilon: float) -> int:
    """Round up, so the recorded spend is never below the true bound."""
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    return math.ceil(epsilon * EPS_SCALE - 1e-9)


def topic_for(chain_id: int, ledger_address: str) -> str:
    return f"swarm-ledger/{chain_id}/{ledger_address.lower()}"


def genesis_blob(vector: torch.Tensor, swarm: dict) -> bytes:
    """The genesis model with the swarm's shared settings (model, data, aggregation) in its
    metadata: the ledger stores its digest, so those settings are anchored on chain."""
    return blob.encode_blob({VECTOR: vector}, {"kind": "genesis", "swarm": canonical(swarm)})


def update_blob(vector: torch.Tensor, round_number: int, mechanism_json: str) -> bytes:
    return blob.encode_blob(
        {VECTOR: vector}, {"kind": "update", "round": str(round_number), "mechanism": mechanism_json}
    )


def model_blob(vector: torch.Tensor, round_number: int) -> bytes:
    """The global model after a round; its sha256 is what participants attest."""
    return blob.encode_blob({VECTOR: vector}, {"kind": "model", "round": str(round_number)})


def read_vector(data: bytes, num_params: int, *, kind: str | None = None) -> tuple[torch.Tensor, dict]:
    """Decode and validate a blob holding exactly one float32 vector of `num_params`."""
    tensors, meta = blob.decode_blob(
        data, max_size=max_blob_size(num_params), expected={VECTOR: ((num_params,), torch.float32)}
    )
    if kind is not None and meta.get("kind") != kind:
        raise blob.BlobError(f"expected a {kind!r} blob, got kind {meta.get('kind')!r}")
    return tensors[VECTOR], meta


def max_blob_size(num_params: int) -> int:
    return 4 * num_params + 64 * 1024  # the vector plus generous room for header and metadata


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

    def to_dict(self) -> dict:
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
    def from_dict(cls, d: dict) -> "SharedSettings":
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


def next_global(shared: SharedSettings, previous: torch.Tensor, vectors: list[torch.Tensor], weights: list[int]) -> torch.Tensor:
    """The global model after a round, from the included blobs in ledger order. The single
    place this is computed: the peer and `swarm verify` both call it."""
    from node.aggregate import aggregate

    agg = aggregate(shared.aggregation, vectors, weights, trim_ratio=shared.trim_ratio, krum_f=shared.krum_f)
    if shared.share == "update":
        return (previous + agg).to(torch.float32)
    return agg.to(torch.float32)
