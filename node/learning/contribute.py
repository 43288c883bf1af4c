"""A peer's contribution to one round, as a pure function of (global model, data, settings,
seed): train locally, take what is shared (weights or update), perturb it. The peer process
and `swarm simulate` both call this, so a simulated round is the real round minus the network."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from node.learning.train import round_lr, train_local
from node.protocol.blob import flatten, sha256, unflatten


@dataclass
class Contribution:
    vector: torch.Tensor  # the perturbed float32 vector that goes into the blob
    num_samples: int
    mean_loss: float
    dp_epsilon: float | None  # DP-SGD's own accountant, when DP-SGD is on


def round_seed(seed: int, peer: str, round_number: int) -> int:
    """Each peer's draws for a round derive from the run's one seed, its identity and the round."""
    digest = sha256(f"{seed}:{peer.lower()}:{round_number}".encode())
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def contribute(
    model,
    spec,
    global_vector: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    settings,
    mechanism,
    round_number: int,
    seed: int,
    fault: str | None = None,
) -> Contribution:
    """Train `model` (reused as scratch space) from `global_vector` on (x, y) and return the
    perturbed shared vector. `settings` is a PeerSettings; `mechanism` a built mechanism or
    None for a non-private baseline."""

    model.load_state_dict(unflatten(global_vector, spec))
    result = train_local(
        model,
        x,
        y,
        epochs=settings.epochs,
        batch_size=settings.batch_size,
        lr=round_lr(settings.lr, settings.lr_decay, round_number - 1),
        momentum=settings.momentum,
        seed=seed,
        dp=settings.dp,
    )
    local, _ = flatten(model)
    shared = local - global_vector if settings.shared.share == "update" else local
    if fault and fault.startswith("scale:"):
        shared = shared * float(fault.split(":", 1)[1])  # testing: a byzantine peer (node/faults.py)
    shared = shared.to(torch.float32)
    if mechanism is not None:
        generator = torch.Generator().manual_seed(seed ^ 0x5EED)
        shared = mechanism.perturb(shared, generator=generator).to(torch.float32)
    return Contribution(
        shared.contiguous(), int(result.num_samples), float(result.mean_loss), getattr(result, "dp_epsilon", None)
    )
