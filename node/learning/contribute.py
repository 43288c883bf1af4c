"""A peer's contribution to one round: train locally, take what is shared (weights or update),
perturb it. The peer process and `swarm simulate` both call this, so a simulated round is the
real round minus the network.

Two kinds of randomness, never mixed: `seed` (public, from the swarm seed) orders plain SGD's
batches; `noise` draws everything a privacy guarantee rests on (the mechanism's noise and
sampling, DP-SGD's noise, Poisson batches and augmentation), one ChaCha20 stream per purpose. A
peer passes `secret_generator()`; only a simulation may pass `seeded_generator(...)`, and then
says its noise is reproducible."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mechanisms.base import Mechanism
from mechanisms.randomness import PrivacyGenerator
from node.learning.train import round_lr, train_local
from node.protocol.blob import TensorSpec, flatten, sha256, unflatten
from node.protocol.settings import PeerSettings


@dataclass
class Contribution:
    vector: torch.Tensor  # the perturbed float32 vector that goes into the blob
    num_samples: int
    mean_loss: float


def round_seed(seed: int, peer: str, round_number: int) -> int:
    """The public per-peer, per-round seed (from the swarm seed, the peer's identity and the round)
    for what may be reproducible: plain SGD's batch order, and a simulation's noise. Never the
    noise of a real peer: anyone can compute this."""
    digest = sha256(f"{seed}:{peer.lower()}:{round_number}".encode())
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def contribute(
    model: nn.Module,
    spec: tuple[TensorSpec, ...],
    global_vector: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    settings: PeerSettings,
    mechanism: Mechanism | None,
    round_number: int,
    seed: int,
    noise: PrivacyGenerator,
    fault: str | None = None,
) -> Contribution:
    """Train `model` (reused as scratch space) from `global_vector` on (x, y) and return the
    perturbed shared vector. `mechanism` None is a non-private baseline."""

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
        privacy_generator=noise,
        device=settings.device,  # the model comes back on the CPU: the blob is encoded from CPU tensors
        augmentations=settings.augmentations,
    )
    local, _ = flatten(model)
    shared = local - global_vector if settings.shared.share == "update" else local
    if fault and fault.startswith("scale:"):
        shared = shared * float(fault.split(":", 1)[1])  # testing: a byzantine peer (node/peer/faults.py)
    shared = shared.to(torch.float32)
    if mechanism is not None:
        shared = mechanism.perturb(shared, generator=noise).to(torch.float32)
    return Contribution(shared.contiguous(), int(result.num_samples), float(result.mean_loss))
