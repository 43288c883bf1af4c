"""`swarm simulate` under secure aggregation (privacy.mechanism = secagg): one full-batch DP-GD step
of the union per round, with each member's integer arithmetic as a swarm member computes it.

Each member: the clipped gradient sum of all its records at the global model
(`node.learning.clipped_sum`; what the records give every round is prepared in the member's first
round, `MemberRecords`), scaled, stochastically rounded, plus its discrete Gaussian share,
mod 2^bits (`mechanisms.secagg.member.encode`, its draws from the member's privacy generator:
rounding on the `mechanism` stream, noise on `dpsgd_noise`). The residues are summed mod 2^bits
and decoded to the noisy mean gradient; the global model takes an SGD step with momentum (the
velocity is a function of the public aggregates, so every member can hold it).

What a swarm adds and this leaves out: the masks. Pairwise masks cancel exactly in the sum mod
2^bits and self-masks are removed from it (tests/secagg/test_masks.py sums masked vectors and gets
these residues' sum bit for bit), so the aggregate here is the one a swarm would unmask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
from torch import nn

from mechanisms.randomness import PrivacyGenerator
from mechanisms.secagg.member import encode, sum_residues
from mechanisms.secagg.policy import SecAggPolicy
from node.learning.clipped_sum import MemberRecords
from node.protocol.blob import TensorSpec, unflatten
from node.protocol.secure_step import GlobalStep
from node.protocol.secure_step import next_global as global_step
from node.protocol.settings import PeerSettings


class Member(Protocol):
    name: str
    x: torch.Tensor
    y: torch.Tensor


class SecureRounds:
    """The state a secure-aggregation run carries between rounds: the momentum velocity."""

    def __init__(self, policy: SecAggPolicy, settings: PeerSettings) -> None:
        self.policy = policy
        self.settings = settings
        # the genesis' step (node.derive.global_step), the same every peer and `swarm verify` apply
        self.global_step = settings.shared.global_step or GlobalStep(settings.lr, settings.lr_decay, settings.momentum)
        self.velocity: torch.Tensor | None = None
        self.records: dict[str, MemberRecords] = {}  # each member's records, prepared in its first round

    def step(
        self,
        model: nn.Module,
        spec: tuple[TensorSpec, ...],
        global_vector: torch.Tensor,
        members: Sequence[Member],
        round_number: int,
        noise: Callable[[str], PrivacyGenerator],
    ) -> tuple[torch.Tensor, list[float]]:
        """The next global model and each member's mean training loss. `noise(name)` is the
        member's privacy generator for this round."""
        if len(members) != self.policy.members:
            raise ValueError(f"a secure round takes all {self.policy.members} members, got {len(members)}")
        model.load_state_dict(unflatten(global_vector, spec))
        residues, losses, records = [], [], 0
        for member in members:
            if member.name not in self.records:
                self.records[member.name] = MemberRecords(model, member.x, member.y)
            gradient_sum, loss = self.records[member.name].clipped_sum(model, self.policy.clip)
            generator = noise(member.name)
            residues.append(encode(self.policy, gradient_sum.numpy(), generator.mechanism, generator.dpsgd_noise))
            losses.append(loss)
            records += len(member.y)
        total = sum_residues(residues, self.policy.bits)
        next_global, self.velocity = global_step(
            self.global_step, self.policy, global_vector, self.velocity, total, records, round_number
        )
        return next_global, [float(v) for v in np.asarray(losses)]
