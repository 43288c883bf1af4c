"""Local training: plain mini-batch SGD for E epochs, or DP-SGD through opacus.

Nothing draws from torch's global RNG, so many simulated peers can train in one process. Plain
SGD shuffles with a generator seeded by the caller (reproducible on one machine; no guarantee
rests on the batch order). DP-SGD's noise and Poisson batches, which its guarantee rests on, draw
from the `privacy_generator` the caller passes: `mechanisms.randomness.secret_generator()` in a
real peer, never something derived from a public seed. No DataLoader (and no worker processes): the
data are tensors in memory and batches are index slices. `torch.set_num_threads` is the
caller's business.

DP-SGD (Abadi et al., CCS 2016) uses opacus' pieces directly: ghost clipping
(`GradSampleModuleFastGradientClipping`, Li, Tramer, Liang, Hashimoto, "Large language models can
be strong differentially private learners", ICLR 2022; Bu et al. 2023 for the mixed form) for the
per-sample gradient norms, `DPOptimizerFastGradientClipping` for the clipped sum (a second
backward pass of the loss weighted by each sample's clipping factor) plus Gaussian noise of std
`noise_multiplier * max_grad_norm`, `UniformWithReplacementSampler` for Poisson sampling with
rate batch_size / N. The same clipped sum as materialized per-sample gradients, without them: a
linear layer's per-sample gradient norm is ||activation|| x ||output gradient||, so the
ScatterNet + linear model trains 4x faster than with opacus' hooks (docs/BENCHMARKS.md). A model with
convolutions trains with opacus' hooks (`GradSampleModule`, `DPOptimizer`) instead: conv layers have no
norm sampler, and ghost clipping's second backward pass then costs more than it saves. DP-SGD takes the
channels-last layout like plain SGD (opacus' conv grad sampler works on it). The rate and the
number of steps come from `mechanisms.record_level.round_steps`, the function the record-level
accountant uses, so what is trained and what is accounted cannot differ. Accounting is not done
here: a round's privacy loss counts once it is released, from the sample count committed on chain
(`record_level_spend`).

Augmentation multiplicity (De, Berrada, Hayes, Smith, Balle, "Unlocking high-accuracy
differentially private image classification through scale", 2022): with `augmentations` K > 1,
each record of a DP-SGD batch is seen as K random crops (reflect-padded by 2 pixels) and
horizontal flips, and its gradient is the mean over the K copies BEFORE clipping, so one record
still moves the sum by at most the clip norm and the accountant is unchanged; the averaged
gradient is less noisy, which is what pays. It needs materialized per-sample gradients (opacus'
hooks, `GradSampleModule`), since the mean comes before the clip. The crops and flips draw from the
privacy generator: nothing secret rests on them, but nothing public needs them either.

`device` (node.learning.device) is where the model and the batches live while training or
evaluating; the model is always given back on the CPU, so what is flattened into a blob never
leaves the CPU path. The generators stay on the CPU (the secret generator is a CPU MT19937):
batch orders and Poisson samples are drawn there and moved, and DP-SGD's noise is drawn on the
CPU and moved to the device (`_CPUNoiseMixin`), so a CUDA peer's noise is exactly as secret.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.optimizers.optimizer import _check_processed_flag, _generate_noise, _mark_as_processed
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from opacus.validators import ModuleValidator
from torch import nn

from mechanisms.record_level import DPSGDPolicy, round_steps

# opacus' per-sample hooks warn on every backward pass when the inputs need no gradient (they
# never do here); the warning is about input gradients we do not use.
warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)


@dataclass(frozen=True)
class TrainResult:
    num_samples: int
    mean_loss: float  # mean training loss over the last epoch's batches
    dp_steps: int = 0  # noisy DP-SGD steps taken (empty Poisson batches included); 0 without DP


def round_lr(lr0: float, decay: float, round_number: int) -> float:
    """Learning rate of round `round_number` (0-based) under exponential decay: lr0 * decay**r."""
    if not lr0 > 0:
        raise ValueError(f"lr0 must be > 0, got {lr0!r}")
    if not 0 < decay <= 1:
        raise ValueError(f"decay must be in (0, 1], got {decay!r}")
    if round_number < 0:
        raise ValueError(f"round must be >= 0, got {round_number}")
    return lr0 * decay**round_number


def train_local(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float = 0.0,
    seed: int,
    dp: DPSGDPolicy | None = None,
    privacy_generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    augmentations: int = 1,
) -> TrainResult:
    """Train `model` in place on (x, y) and report what the round needs.

    With `dp`, the policy's batch size and epochs are used (they must equal `batch_size` and
    `epochs`), and `privacy_generator` is required: the noise and the Poisson batches draw from it.
    The model trains on `device` and is on the CPU again when this returns (also after an error)."""
    n = int(y.shape[0])
    if n < 1 or x.shape[0] != n:
        raise ValueError(f"need as many inputs as labels and at least one: x {tuple(x.shape)}, y {tuple(y.shape)}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if isinstance(augmentations, bool) or not isinstance(augmentations, int) or augmentations < 1:
        raise ValueError(f"augmentations must be an integer >= 1, got {augmentations!r}")
    if augmentations > 1 and (dp is None or x.dim() != 4):
        raise ValueError("augmentation multiplicity is a DP-SGD option for image batches (N, C, H, W)")
    if dp is not None:
        if privacy_generator is None:
            raise ValueError(
                "DP-SGD needs a privacy_generator for its noise and batches (secret_generator() in a peer)"
            )
        if (batch_size, epochs) != (dp.batch_size, dp.epochs):
            raise ValueError(
                f"DP-SGD trains with the policy's batch size {dp.batch_size} and {dp.epochs} epoch(s), "
                f"not {batch_size} and {epochs}: the accountant counts the policy's steps"
            )
    model.train()
    with on_device(model, x, y, device) as (x, y):
        if dp is None:
            return _train_sgd(model, x, y, epochs, batch_size, lr, momentum, torch.Generator().manual_seed(seed))
        assert privacy_generator is not None  # checked above
        with channels_last(model, x) as x:  # opacus' conv grad sampler takes the layout too
            return _train_dpsgd(model, x, y, lr, momentum, privacy_generator, dp, augmentations)


@contextmanager
def on_device(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device | str
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Move the model and the data to `device` for the block, and the model back to the CPU after
    it: the caller flattens the model into blobs, which are encoded from CPU tensors only."""
    target = torch.device(device)
    if target.type == "cpu":  # the usual case: no copies
        yield x, y
        return
    model.to(target)
    try:
        yield x.to(target), y.to(target)
    finally:
        model.to("cpu")


@contextmanager
def channels_last(model: nn.Module, x: torch.Tensor) -> Iterator[torch.Tensor]:
    """Run a conv net on image batches in channels-last layout, then give the parameters back
    in the standard layout (so state dicts and blobs never see the difference).

    oneDNN's convolutions and max-pooling are vectorised over channels in this layout: with the
    pool-before-ReLU blocks of node.learning.models it trains the PNPM CNN about 2x faster on CPU
    (docs/SIMULATE.md). Values are the same up to float rounding order inside the convolutions.
    Inputs that are not image batches (N, C, H, W) pass through unchanged, and so do models with
    a group norm: torch 2.13's CPU GroupNorm backward crashes the process (SIGSEGV) on
    channels-last inputs (tests/node/learning/test_model_variants.py trains one)."""
    if x.dim() != 4 or any(isinstance(m, nn.GroupNorm) for m in model.modules()):
        yield x
        return
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs omit memory_format
    try:
        yield x.contiguous(memory_format=torch.channels_last)
    finally:
        model.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]  # as above


def _train_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    generator: torch.Generator,
) -> TrainResult:
    n = int(y.shape[0])
    losses: list[float] = []
    with channels_last(model, x) as x:
        # after the layout change: the optimizer's buffers take the parameters' layout
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        for _ in range(epochs):
            losses = []
            order = torch.randperm(n, generator=generator).to(x.device)  # drawn on the CPU generator
            for start in range(0, n, batch_size):
                batch = order[start : start + batch_size]
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x[batch]), y[batch])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    return TrainResult(n, sum(losses) / len(losses))


def _train_dpsgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    momentum: float,
    generator: torch.Generator,
    dp: DPSGDPolicy,
    augmentations: int = 1,
) -> TrainResult:
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ValueError(f"model is not DP-SGD compatible: {errors[0]}")
    n = int(y.shape[0])
    sample_rate, total_steps = round_steps(dp.batch_size, dp.epochs, n)
    steps_per_epoch = total_steps // dp.epochs
    on_cpu = x.device.type == "cpu"  # elsewhere the noise is drawn on the CPU generator and moved
    grad_module: GradSampleModule | GradSampleModuleFastGradientClipping
    optimizer_class: type[DPOptimizer]
    # Ghost clipping pays where opacus has a norm sampler (linear layers); a convolution still
    # needs its per-sample gradients, and ghost clipping's second backward pass then costs more
    # than it saves (pnpm-fmnist: 3.4x plain SGD against 2.7x with the hooks; docs/BENCHMARKS.md).
    ghost = augmentations == 1 and not any(isinstance(m, nn.Conv2d) for m in model.modules())
    if ghost:
        grad_module = GradSampleModuleFastGradientClipping(
            model, max_grad_norm=dp.max_grad_norm, use_ghost_clipping=True
        )
        optimizer_class = DPOptimizerFastGradientClipping if on_cpu else _CPUNoiseGhostOptimizer
    else:  # per-sample gradients: convolutions, and augmentation (the mean over copies comes before the clip)
        grad_module = GradSampleModule(model)
        optimizer_class = DPOptimizer if on_cpu else _CPUNoiseDPOptimizer
    optimizer = optimizer_class(
        torch.optim.SGD(grad_module.parameters(), lr=lr, momentum=momentum),
        noise_multiplier=dp.noise_multiplier,
        max_grad_norm=dp.max_grad_norm,
        expected_batch_size=max(1, round(sample_rate * n)),
        generator=generator,
        secure_mode=True,  # noise as a sum of Gaussians: robust to floating-point attacks on the noise
    )
    sampler = UniformWithReplacementSampler(
        num_samples=n, sample_rate=sample_rate, generator=generator, steps=steps_per_epoch
    )
    losses: list[float] = []
    steps = 0
    try:
        for _ in range(dp.epochs):
            losses = []
            for batch in sampler:
                steps += 1  # an empty Poisson batch is a step too: the accountant counts it
                if len(batch) == 0:
                    continue
                index = torch.as_tensor(batch, dtype=torch.long, device=x.device)
                optimizer.zero_grad(set_to_none=True)
                if ghost:
                    per_sample = F.cross_entropy(grad_module(x[index]), y[index], reduction="none")
                    loss = DPTensorFastGradientClipping(grad_module, optimizer, per_sample, "mean")
                    loss.backward()  # two passes: per-sample norms, then the clipped sum
                    losses.append(loss.item())
                elif augmentations > 1:
                    copies = augment(x[index], augmentations, generator)
                    plain_loss = F.cross_entropy(grad_module(copies), y[index].repeat_interleave(augmentations))
                    plain_loss.backward()
                    _average_copies(grad_module, len(batch), augmentations)
                    losses.append(plain_loss.item())
                else:
                    plain_loss = F.cross_entropy(grad_module(x[index]), y[index])
                    plain_loss.backward()
                    losses.append(plain_loss.item())
                optimizer.step()
    finally:
        grad_module._close()  # removes opacus' hooks and per-sample buffers: `model` is plain again
    mean_loss = sum(losses) / len(losses) if losses else float("nan")
    if steps != total_steps:
        raise RuntimeError(f"DP-SGD took {steps} steps where the accountant counts {total_steps}")
    return TrainResult(n, mean_loss, steps)


AUGMENT_PAD = 2  # pixels of reflect padding a random crop may shift by (De et al. use 4 on 32x32)


def augment(x: torch.Tensor, copies: int, generator: torch.Generator) -> torch.Tensor:
    """`copies` random crops (of the image reflect-padded by AUGMENT_PAD) and horizontal flips of
    each image of `x` (N, C, H, W): rows i*copies ... i*copies + copies - 1 are copies of image i.
    The offsets and flips draw from `generator` on the CPU and are moved to x's device."""
    n, c, h, w = x.shape
    rows = n * copies
    repeated = x.repeat_interleave(copies, dim=0)
    padded = F.pad(repeated, (AUGMENT_PAD,) * 4, mode="reflect")
    offsets = torch.randint(0, 2 * AUGMENT_PAD + 1, (rows, 2), generator=generator).to(x.device)
    flips = (torch.rand(rows, generator=generator) < 0.5).to(x.device)
    iy = offsets[:, :1] + torch.arange(h, device=x.device)  # (rows, h)
    ix = offsets[:, 1:] + torch.arange(w, device=x.device)  # (rows, w)
    ix = torch.where(flips[:, None], ix.flip(1), ix)
    r = torch.arange(rows, device=x.device)[:, None, None, None]
    ch = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[r, ch, iy[:, None, :, None], ix[:, None, None, :]]


def _average_copies(grad_module: GradSampleModule, records: int, copies: int) -> None:
    """Each record's per-sample gradient: the mean over its `copies` rows (opacus' "mean" loss
    reduction already scaled each row to its own loss's gradient)."""
    for p in grad_module.parameters():
        sample = getattr(p, "grad_sample", None)
        if sample is not None:
            p.grad_sample = sample.view(records, copies, *sample.shape[1:]).mean(dim=1)


class _CPUNoiseMixin:
    """opacus' optimizers with the noise drawn on the generator's device (the CPU) and then moved
    to the gradients' device. opacus draws on the gradients' device, which a CPU generator cannot
    do for CUDA tensors, and a CUDA generator could not be seeded from the OS CSPRNG the way
    mechanisms.randomness.secret_generator seeds the CPU one. Same draws in the same order as
    opacus' add_noise (tests/node/learning/test_device.py checks the bits on the CPU)."""

    params: list[Any]  # parameters carrying opacus' summed_grad
    generator: torch.Generator | None
    noise_multiplier: float
    max_grad_norm: float
    secure_mode: bool

    def add_noise(self) -> None:
        generator_device = self.generator.device if self.generator is not None else torch.device("cpu")
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            reference = torch.empty(p.summed_grad.shape, dtype=p.summed_grad.dtype, device=generator_device)
            noise = _generate_noise(
                std=self.noise_multiplier * self.max_grad_norm,
                reference=reference,
                generator=self.generator,
                secure_mode=self.secure_mode,
            )
            p.grad = (p.summed_grad + noise.to(p.summed_grad.device)).view_as(p)
            _mark_as_processed(p.summed_grad)


class _CPUNoiseGhostOptimizer(_CPUNoiseMixin, DPOptimizerFastGradientClipping):
    """Ghost clipping with CPU-drawn noise."""


class _CPUNoiseDPOptimizer(_CPUNoiseMixin, DPOptimizer):
    """Materialized per-sample gradients (augmentation multiplicity) with CPU-drawn noise."""


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 256, *, device: torch.device | str = "cpu"
) -> tuple[float, float]:
    """(accuracy in [0, 1], mean cross-entropy loss) of `model` on (x, y), computed on `device`
    (the model is back on the CPU afterwards).

    Batches of 256 keep the activations in cache: on the PNPM CNN they evaluate twice as fast
    as batches of 1,024 (docs/SIMULATE.md)."""
    n = int(y.shape[0])
    if n < 1:
        raise ValueError("cannot evaluate on an empty set")
    was_training = model.training
    model.eval()
    correct, total_loss = 0, 0.0
    with on_device(model, x, y, device) as (x, y), channels_last(model, x) as x:
        for start in range(0, n, batch_size):
            logits = model(x[start : start + batch_size])
            target = y[start : start + batch_size]
            total_loss += F.cross_entropy(logits, target, reduction="sum").item()
            correct += int((logits.argmax(dim=1) == target).sum())
    model.train(was_training)
    return correct / n, total_loss / n
