"""The sum over a member's records of each record's loss gradient clipped to l2 norm `clip`: what a
secure-aggregation member contributes to a full-batch DP-GD step (mechanisms.secagg.policy).

opacus' ghost clipping computes it without materialising per-record gradients (as DP-SGD does in
node.learning.train): a backward pass for the per-record norms, then a second one of the loss
weighted by each record's clipping factor, min(1, c / (||g|| + 1e-6)). It clips to
c = clip (1 - 2^-20): the margin keeps each clipped gradient's norm below `clip` whatever the
float32 rounding (relative error ~1e-7 per coordinate). Records go through in chunks; the chunk
sums are accumulated in float64.

ScatterNet + linear (group norm, then one linear layer) has its per-record gradients in closed
form, and they are computed directly (`scatter_linear_sum`), six times faster than the hooks: with
e = softmax - onehot, z the group norm's output and x^ its normalised input, the linear layer's
gradient is e z^T (bias e), the group norm's gamma_c and beta_c get the sums over channel c of
(W^T e) x^ and of W^T e. The same clipping factor, the same sum (a test holds the two paths equal).
"""

from __future__ import annotations

import warnings

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
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip!r}")
    if set(model.state_dict()) != {name for name, _ in model.named_parameters()}:
        raise ValueError("a secure-aggregation model's state must hold parameters only (no buffers)")
    if isinstance(model, ScatterLinear):
        return scatter_linear_sum(model, x, y, clip * CLIP_MARGIN, chunk)
    return ghost_clipped_sum(model, x, y, clip * CLIP_MARGIN, chunk)


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


@torch.no_grad()
def scatter_linear_sum(
    model: ScatterLinear, x: torch.Tensor, y: torch.Tensor, clip: float, chunk: int = CHUNK
) -> tuple[torch.Tensor, float]:
    """`clipped_gradient_sum` of ScatterNet + linear in closed form (clip used as is)."""
    norm, linear = model.norm, model.linear
    sums = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in model.named_parameters()}
    loss_sum = 0.0
    for lo in range(0, len(y), chunk):
        xb, yb = x[lo : lo + chunk], y[lo : lo + chunk]
        b, channels = xb.shape[0], xb.shape[1]
        grouped = xb.reshape(b, norm.num_groups, -1)
        mean = grouped.mean(dim=2, keepdim=True)
        var = grouped.var(dim=2, unbiased=False, keepdim=True)
        normalised = ((grouped - mean) / torch.sqrt(var + norm.eps)).reshape(b, channels, -1)
        z = (normalised * norm.weight[None, :, None] + norm.bias[None, :, None]).reshape(b, -1)
        logits = z @ linear.weight.T + linear.bias
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        e = torch.softmax(logits, dim=1)
        e[torch.arange(b), yb] -= 1.0
        upstream = (e @ linear.weight).reshape(b, channels, -1)
        gamma = (upstream * normalised).sum(dim=2)
        beta = upstream.sum(dim=2)
        squared = (e * e).sum(1) * ((z * z).sum(1) + 1.0) + (gamma * gamma).sum(1) + (beta * beta).sum(1)
        factor = torch.clamp(clip / (squared.sqrt() + 1e-6), max=1.0)  # opacus' clipping factor
        # the sums over records in float64: one record's share of a float32 sum of 4,096 could move
        # it past the clip by the sum's rounding, which the sensitivity does not charge
        f64 = factor.double()[:, None]
        scaled = e.double() * f64
        sums["linear.weight"] += scaled.T @ z.double()
        sums["linear.bias"] += scaled.sum(0)
        sums["norm.weight"] += (gamma.double() * f64).sum(0)
        sums["norm.bias"] += (beta.double() * f64).sum(0)
    total = torch.cat([sums[name].reshape(-1) for name in sorted(sums)])
    return total, loss_sum / max(1, len(y))
