"""The sum over a member's records of each record's loss gradient clipped to l2 norm `clip`: what a
secure-aggregation member contributes to a full-batch DP-GD step (mechanisms.secagg.policy), and,
for ScatterNet + linear, what each DP-SGD step of node.learning.train adds its noise to.

opacus' ghost clipping computes it without materialising per-record gradients: a backward pass
for the per-record norms, then a second one of the loss weighted by each record's clipping
factor, min(1, c / (||g|| + 1e-6)). A member clips to c = clip (1 - 2^-20): the margin keeps each
clipped gradient's norm below `clip` whatever the float32 rounding (relative error ~1e-7 per
coordinate). Records go through in chunks; the chunk sums are accumulated in float64.

ScatterNet + linear (group norm, then one linear layer) has its per-record gradients in closed
form, and they are computed directly (`scatter_linear_clipped_sums`), with no backward pass: with
e = softmax - onehot, x^ the group norm's normalised input and z = gamma x^ + beta its output, the
linear layer's gradient is e z^T (bias e), the group norm's gamma_c and beta_c get the sums over
channel c of (W^T e) x^ and of W^T e, and ||z||^2 follows from per-channel sums of x^ and x^^2.
One batched matmul over x^ gives each channel's W_c x^_c, hence the logits and gamma's gradients;
a second, sum_r f_r e_r x^_r^T (f the clipping factor), from which the linear layer's sum follows
as gamma (that) + beta (sum_r f_r e_r). The same clipping factor, the same sum (tests hold it to
opacus'). x^ has no parameter: a member computes it once, in float64 (`ScatterLinearRecords`);
DP-SGD per Poisson batch, in the model's dtype.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from torch import nn

from node.learning.models import ScatterLinear

CLIP_MARGIN = 1.0 - 2.0**-20
CHUNK = 4096


def clipped_gradient_sum(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, chunk: int = CHUNK
) -> tuple[torch.Tensor, float]:
    """(sum of clipped per-record gradients as one float64 vector in the order of
    `node.protocol.blob.flatten`: sorted names; mean loss). Every entry of the model's state must
    be a parameter (no batch statistics: group norm is fine, batch norm is not)."""
    return MemberRecords(model, x, y).clipped_sum(model, clip, chunk)


class MemberRecords:
    """A member's records, with what every round's clipped sum needs of them computed once (for
    ScatterNet + linear: the normalised features, `ScatterLinearRecords`)."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.scatter_linear = (
            ScatterLinearRecords.prepare(model.norm, x, y) if isinstance(model, ScatterLinear) else None
        )

    def clipped_sum(self, model: nn.Module, clip: float, chunk: int = CHUNK) -> tuple[torch.Tensor, float]:
        """`clipped_gradient_sum` of these records at `model`."""
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip!r}")
        if set(model.state_dict()) != {name for name, _ in model.named_parameters()}:
            raise ValueError("a secure-aggregation model's state must hold parameters only (no buffers)")
        if isinstance(model, ScatterLinear):
            if self.scatter_linear is None:
                raise ValueError("records prepared for another model")
            return self.scatter_linear.clipped_sum(model, clip * CLIP_MARGIN, chunk)
        return ghost_clipped_sum(model, self.x, self.y, clip * CLIP_MARGIN, chunk)


def ghost_clipped_sum(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, chunk: int = CHUNK
) -> tuple[torch.Tensor, float]:
    """`clipped_gradient_sum` through opacus' ghost clipping, for any model (clip used as is)."""
    names = sorted(name for name, _ in model.named_parameters())
    parameters = dict(model.named_parameters())
    total = torch.zeros(sum(p.numel() for p in parameters.values()), dtype=torch.float64)
    loss_sum = 0.0
    model.train()
    grad_module = GradSampleModuleFastGradientClipping(
        model, max_grad_norm=clip, use_ghost_clipping=True, loss_reduction="sum"
    )
    optimizer = DPOptimizerFastGradientClipping(
        torch.optim.SGD(grad_module.parameters(), lr=1.0),
        noise_multiplier=0.0,
        max_grad_norm=clip,
        expected_batch_size=chunk,
        loss_reduction="sum",
    )
    try:
        with warnings.catch_warnings():
            # opacus warns on every backward pass that inputs need no gradient (they never do here)
            warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
            for lo in range(0, len(y), chunk):
                optimizer.zero_grad(set_to_none=True)
                per_record = F.cross_entropy(grad_module(x[lo : lo + chunk]), y[lo : lo + chunk], reduction="none")
                loss_sum += float(per_record.detach().sum())
                DPTensorFastGradientClipping(grad_module, optimizer, per_record, "sum").backward()
                total += torch.cat([_grad(parameters[name]).reshape(-1).to(torch.float64) for name in names])
    finally:
        grad_module._close()
        for p in model.parameters():
            p.grad = None
    return total, loss_sum / max(1, len(y))


def _grad(p: torch.Tensor) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def scatter_linear_sum(
    model: ScatterLinear, x: torch.Tensor, y: torch.Tensor, clip: float, chunk: int = CHUNK
) -> tuple[torch.Tensor, float]:
    """`clipped_gradient_sum` of ScatterNet + linear in closed form (clip used as is)."""
    return ScatterLinearRecords.prepare(model.norm, x, y).clipped_sum(model, clip, chunk)


def normalised_features(norm: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """The group norm's normalised input x^ of records x (N, C, H, W), without gamma and beta, as
    (N, C, H W) in x's dtype (torch's fused group-norm kernel)."""
    return F.group_norm(x, norm.num_groups, None, None, norm.eps).flatten(2)


@torch.no_grad()
def scatter_linear_clipped_sums(
    model: ScatterLinear, normalised: torch.Tensor, y: torch.Tensor, clip: float
) -> tuple[dict[str, torch.Tensor], float]:
    """({parameter name: sum over the records of their gradients clipped to `clip`}, summed loss)
    of records with normalised features `normalised` (N, C, P) and labels `y`, computed in
    normalised's dtype and on its device. The clipping factor is opacus':
    min(1, clip / (||g|| + 1e-6))."""
    norm, linear = model.norm, model.linear
    count, channels, positions = normalised.shape
    dtype, classes = normalised.dtype, linear.out_features
    weight = linear.weight.to(dtype).view(classes, channels, positions)
    gamma, beta = norm.weight.to(dtype), norm.bias.to(dtype)
    weight_sums = weight.sum(dim=2)  # (classes, channels): z's beta part reaches the logits through these
    projected = torch.bmm(normalised.transpose(0, 1), weight.permute(1, 2, 0))  # (channels, N, classes): W_c x^_c
    logits = torch.einsum("cbk,c->bk", projected, gamma) + (beta @ weight_sums.T + linear.bias.to(dtype))
    loss_sum = float(F.cross_entropy(logits, y, reduction="sum"))
    e = torch.softmax(logits, dim=1)
    e[torch.arange(count, device=e.device), y] -= 1.0
    gamma_grad = torch.einsum("bk,cbk->bc", e, projected)
    beta_grad = e @ weight_sums
    squared_z = (  # ||z||^2 per record from per-channel sums of x^ and x^^2
        torch.linalg.vector_norm(normalised, dim=2).square() * gamma**2
        + 2.0 * normalised.sum(dim=2) * (gamma * beta)
        + positions * beta**2
    ).sum(dim=1)
    squared = (e * e).sum(1) * (squared_z + 1.0) + (gamma_grad * gamma_grad).sum(1) + (beta_grad * beta_grad).sum(1)
    factor = torch.clamp(clip / (squared.sqrt() + 1e-6), max=1.0)
    scaled = e * factor[:, None]
    e_sum = scaled.sum(0)
    outer = (scaled.T @ normalised.reshape(count, -1)).view(classes, channels, positions)  # sum of f e x^^T
    # z = gamma x^ + beta per channel, so sum f e z^T = gamma (sum f e x^^T) + beta (sum f e)
    linear_weight = outer * gamma[:, None] + e_sum[:, None, None] * beta[:, None]
    sums = {
        "linear.weight": linear_weight.view(classes, -1),
        "linear.bias": e_sum,
        "norm.weight": factor @ gamma_grad,
        "norm.bias": factor @ beta_grad,
    }
    return sums, loss_sum


@dataclass(frozen=True)
class ScatterLinearRecords:
    """A member's records prepared once for `scatter_linear_sum`: the group norm's normalisation
    has no parameter, so its output x^ is a function of the records alone, held in float64."""

    normalised: torch.Tensor  # (records, channels, positions), float64
    y: torch.Tensor
    num_groups: int
    eps: float

    @classmethod
    @torch.no_grad()
    def prepare(cls, norm: nn.GroupNorm, x: torch.Tensor, y: torch.Tensor, chunk: int = CHUNK) -> ScatterLinearRecords:
        normalised = torch.empty(x.shape[0], x.shape[1], x[0, 0].numel(), dtype=torch.float64, device=x.device)
        for lo in range(0, x.shape[0], chunk):  # in chunks: a float64 copy of all records at once is large
            normalised[lo : lo + chunk] = normalised_features(norm, x[lo : lo + chunk].to(torch.float64))
        return cls(normalised, y, norm.num_groups, norm.eps)

    def clipped_sum(self, model: ScatterLinear, clip: float, chunk: int = CHUNK) -> tuple[torch.Tensor, float]:
        """`clipped_gradient_sum` of these records at `model` (clip used as is), in chunks."""
        if (model.norm.num_groups, model.norm.eps) != (self.num_groups, self.eps):
            raise ValueError("records prepared for another group norm")
        totals: dict[str, torch.Tensor] = {}
        loss_sum = 0.0
        for lo in range(0, len(self.y), chunk):
            sums, loss = scatter_linear_clipped_sums(
                model, self.normalised[lo : lo + chunk], self.y[lo : lo + chunk], clip
            )
            loss_sum += loss
            for name, value in sums.items():
                totals[name] = totals[name] + value if name in totals else value
        total = torch.cat([totals[name].reshape(-1) for name in sorted(totals)])
        return total, loss_sum / max(1, len(self.y))
