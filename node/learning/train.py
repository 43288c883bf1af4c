"""Local training: plain mini-batch SGD for E epochs, or DP-SGD.

Nothing draws from torch's global RNG, so many simulated peers can train in one process. Plain
SGD shuffles with a generator seeded by the caller (reproducible on one machine; no guarantee
rests on the batch order). DP-SGD's noise, Poisson batches and augmentation, which its guarantee
rests on, draw from the `privacy_generator` the caller passes, one ChaCha20 stream each
(`mechanisms.randomness`: `secret_generator()` in a real peer, never something derived from a
public seed), never from torch's MT19937. No DataLoader (and no worker processes): the data are
tensors in memory and batches are index slices. `torch.set_num_threads` is the caller's business.

DP-SGD (Abadi et al., CCS 2016): per Poisson batch, the sum of the records' loss gradients each
clipped to l2 norm `max_grad_norm` (factor min(1, C / (||g|| + 1e-6)), opacus'), plus Gaussian noise
of std `noise_multiplier * max_grad_norm` (`stream_noised`: the float64 Box-Muller sampler of
`mechanisms.gaussian`, on the `dpsgd_noise` stream, in place of opacus' torch-generator noise),
divided by the expected batch size, then an SGD step (lr, momentum); Poisson batches of rate
batch_size / N (`poisson_batches`: each record in with probability floor(q 2^32)/2^32 <= q, from the
`poisson` stream). An empty Poisson batch is a noisy step too: its clipped sum is 0, its noise is
added and the step taken, exactly as the accountant counts it. The clipped sum comes from one of
three places (`_private_steps`):
- ScatterNet + linear: in closed form (`ScatterLinearStep`, `node.learning.clipped_sum`), from the
  batch's normalised features with two batched matmuls and no backward pass: about as fast as
  plain SGD;
- other models without convolutions: opacus' ghost clipping (`GradSampleModuleFastGradientClipping`,
  Li, Tramer, Liang, Hashimoto, ICLR 2022; Bu et al. 2023 for the mixed form) for the per-sample
  norms and `DPOptimizerFastGradientClipping` for the sum, a second backward pass of the loss
  weighted by each sample's clipping factor;
- models with convolutions, and augmentation multiplicity: opacus' hooks (`GradSampleModule`,
  `DPOptimizer`), materialized per-sample gradients: conv layers have no norm sampler, and ghost
  clipping's second backward pass then costs more than it saves.
DP-SGD takes the channels-last layout like plain SGD (opacus' conv grad sampler works on it). The
rate and the number of steps come from `mechanisms.record_level.round_steps`, the function the
record-level accountant uses, so what is trained and what is accounted cannot differ. Accounting is
not done here: a round's privacy loss counts once it is released, from the sample count committed
on chain (`record_level_spend`).

Augmentation multiplicity (De, Berrada, Hayes, Smith, Balle, "Unlocking high-accuracy
differentially private image classification through scale", 2022): with `augmentations` K > 1,
each record of a DP-SGD batch is seen as K random crops (reflect-padded by 2 pixels) and
horizontal flips, and its gradient is the mean over the K copies BEFORE clipping, so one record
still moves the sum by at most the clip norm and the accountant is unchanged; the averaged
gradient is less noisy, which is what pays. It needs materialized per-sample gradients (opacus'
hooks, `GradSampleModule`), since the mean comes before the clip. The crops and flips draw from the
privacy generator's `augment` stream: nothing secret rests on them, but nothing public needs them.

`device` (node.learning.device) is where the model and the batches live while training or
evaluating; the model is always given back on the CPU, so what is flattened into a blob never
leaves the CPU path. Every draw is made on the CPU (the keystreams are OpenSSL's) and moved:
batch orders, Poisson masks, crops, and DP-SGD's noise, so a CUDA peer's noise is exactly as secret.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from opacus.validators import ModuleValidator
from torch import nn

from mechanisms.draws import WORD
from mechanisms.gaussian import add_gaussian_noise
from mechanisms.randomness import PrivacyGenerator, RandomStream
from mechanisms.record_level import DPSGDPolicy, round_steps
from node.learning.clipped_sum import normalised_features, scatter_linear_clipped_sums
from node.learning.models import ScatterLinear

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
    privacy_generator: PrivacyGenerator | None = None,
    device: torch.device | str = "cpu",
    augmentations: int = 1,
) -> TrainResult:
    """Train `model` in place on (x, y) and report what the round needs.

    With `dp`, the policy's batch size and epochs are used (they must equal `batch_size` and
    `epochs`), and `privacy_generator` is required: the noise, the Poisson batches and the
    augmentation draw from it.
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
    generator: PrivacyGenerator,
    dp: DPSGDPolicy,
    augmentations: int = 1,
) -> TrainResult:
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ValueError(f"model is not DP-SGD compatible: {errors[0]}")
    n = int(y.shape[0])
    sample_rate, total_steps = round_steps(dp.batch_size, dp.epochs, n)
    expected_batch = max(1, round(sample_rate * n))
    losses: list[float] = []
    steps = 0
    with _private_steps(model, dp, lr, momentum, expected_batch, augmentations, generator) as step:
        for _ in range(dp.epochs):
            losses = []
            for batch in poisson_batches(n, sample_rate, total_steps // dp.epochs, generator.poisson):
                steps += 1
                index = batch.to(x.device)
                loss = step(x[index], y[index])
                if loss is not None:
                    losses.append(loss)
    mean_loss = sum(losses) / len(losses) if losses else float("nan")
    if steps != total_steps:
        raise RuntimeError(f"DP-SGD took {steps} steps where the accountant counts {total_steps}")
    return TrainResult(n, mean_loss, steps)


PrivateStep = Callable[[torch.Tensor, torch.Tensor], float | None]


@contextmanager
def _private_steps(
    model: nn.Module,
    dp: DPSGDPolicy,
    lr: float,
    momentum: float,
    expected_batch: int,
    augmentations: int,
    generator: PrivacyGenerator,
) -> Iterator[PrivateStep]:
    """A function taking one DP-SGD step on a Poisson batch (x, y), possibly empty, and returning
    its mean loss (None when empty): in closed form for ScatterNet + linear, else through opacus."""
    if isinstance(model, ScatterLinear) and augmentations == 1:
        yield ScatterLinearStep(
            model, dp.max_grad_norm, dp.noise_multiplier, lr, momentum, expected_batch, generator.dpsgd_noise
        )
        return
    with opacus_steps(model, dp, lr, momentum, expected_batch, augmentations, generator) as step:
        yield step


@contextmanager
def opacus_steps(
    model: nn.Module,
    dp: DPSGDPolicy,
    lr: float,
    momentum: float,
    expected_batch: int,
    augmentations: int,
    generator: PrivacyGenerator,
) -> Iterator[PrivateStep]:
    """`_private_steps` through opacus, for any model: ghost clipping without convolutions,
    per-sample hooks with them or with augmentation; opacus' hooks are removed on exit."""
    # Ghost clipping pays where opacus has a norm sampler (linear layers); a convolution still
    # needs its per-sample gradients, and ghost clipping's second backward pass then costs more
    # than it saves (pnpm-fmnist: 3.4x plain SGD against 2.7x with the hooks; docs/BENCHMARKS.md).
    ghost = augmentations == 1 and not any(isinstance(m, nn.Conv2d) for m in model.modules())
    grad_module, optimizer = _private_optimizer(model, dp, lr, momentum, expected_batch, ghost)
    optimizer.noise_stream = generator.dpsgd_noise

    def step(x: torch.Tensor, y: torch.Tensor) -> float | None:
        optimizer.zero_grad(set_to_none=True)
        if y.numel() == 0:  # the clipped sum is 0; its noise is not, and the step counts
            optimizer.noise_only_step()
            return None
        loss = _clipped_backward(grad_module, optimizer, x, y, ghost, augmentations, generator)
        optimizer.step()
        return loss

    try:
        yield step
    finally:
        grad_module._close()  # removes opacus' hooks and per-sample buffers: `model` is plain again


class ScatterLinearStep:
    """DP-SGD steps of ScatterNet + linear with each batch's clipped sum in closed form
    (`scatter_linear_clipped_sums`: no backward pass, no hooks), then what opacus' DPOptimizer
    does: the stream's noise of std noise_multiplier x clip added to each parameter's sum
    (`stream_noised`, parameter by parameter in the model's order, so the same draws), the sum
    divided by the expected batch size, and an SGD step with the given lr and momentum. An empty
    batch's sum is 0; its noise is added and the step taken."""

    def __init__(
        self,
        model: ScatterLinear,
        clip: float,
        noise_multiplier: float,
        lr: float,
        momentum: float,
        expected_batch: int,
        noise_stream: RandomStream,
    ) -> None:
        self.model = model
        self.parameters = dict(model.named_parameters())
        self.optimizer = torch.optim.SGD(self.parameters.values(), lr=lr, momentum=momentum)
        self.clip, self.std = clip, noise_multiplier * clip
        self.expected_batch = expected_batch
        self.noise_stream = noise_stream

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> float | None:
        count = int(y.numel())
        if count:
            normalised = normalised_features(self.model.norm, x)
            sums, loss_sum = scatter_linear_clipped_sums(self.model, normalised, y, self.clip)
        else:
            sums, loss_sum = {name: torch.zeros_like(p) for name, p in self.parameters.items()}, 0.0
        for name, p in self.parameters.items():
            p.grad = stream_noised(sums[name], self.std, self.noise_stream).view_as(p)
            p.grad /= self.expected_batch  # opacus' scale_grad for the "mean" loss reduction
        self.optimizer.step()
        return loss_sum / count if count else None


def _private_optimizer(
    model: nn.Module, dp: DPSGDPolicy, lr: float, momentum: float, expected_batch: int, ghost: bool
) -> tuple[
    GradSampleModule | GradSampleModuleFastGradientClipping, _StreamNoiseGhostOptimizer | _StreamNoiseDPOptimizer
]:
    """opacus' per-sample machinery around `model`, and its DP optimizer with the stream noise."""
    grad_module: GradSampleModule | GradSampleModuleFastGradientClipping
    optimizer_class: type[_StreamNoiseGhostOptimizer] | type[_StreamNoiseDPOptimizer]
    if ghost:
        grad_module = GradSampleModuleFastGradientClipping(
            model, max_grad_norm=dp.max_grad_norm, use_ghost_clipping=True
        )
        optimizer_class = _StreamNoiseGhostOptimizer
    else:  # per-sample gradients: convolutions, and augmentation (the mean over copies comes before the clip)
        grad_module = GradSampleModule(model)
        optimizer_class = _StreamNoiseDPOptimizer
    optimizer = optimizer_class(
        torch.optim.SGD(grad_module.parameters(), lr=lr, momentum=momentum),
        noise_multiplier=dp.noise_multiplier,
        max_grad_norm=dp.max_grad_norm,
        expected_batch_size=expected_batch,
    )
    return grad_module, optimizer


def _clipped_backward(
    grad_module: GradSampleModule | GradSampleModuleFastGradientClipping,
    optimizer: DPOptimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    ghost: bool,
    augmentations: int,
    generator: PrivacyGenerator,
) -> float:
    """The backward pass(es) of one non-empty batch, leaving opacus what it clips and sums; the
    batch's mean loss."""
    if ghost:
        per_sample = F.cross_entropy(grad_module(x), y, reduction="none")
        loss = DPTensorFastGradientClipping(grad_module, optimizer, per_sample, "mean")
        loss.backward()  # two passes: per-sample norms, then the clipped sum
        return float(loss.item())
    if augmentations > 1:
        copies = augment(x, augmentations, generator.augment)
        plain_loss = F.cross_entropy(grad_module(copies), y.repeat_interleave(augmentations))
        plain_loss.backward()
        _average_copies(grad_module, len(y), augmentations)
        return float(plain_loss.item())
    plain_loss = F.cross_entropy(grad_module(x), y)
    plain_loss.backward()
    return float(plain_loss.item())


def poisson_batches(num_samples: int, sample_rate: float, steps: int, stream: RandomStream) -> Iterator[torch.Tensor]:
    """`steps` Poisson batches of range(num_samples) (CPU index tensors, possibly empty): each
    record in each batch independently with probability K/2^32, K = floor(sample_rate 2^32), an
    exact comparison of a 32-bit word (so never above the rate the accountant counts)."""
    threshold = math.floor(Fraction(sample_rate) * WORD)
    words = torch.empty(num_samples, dtype=torch.int32)
    for _ in range(steps):
        unsigned = stream.fill_(words).to(torch.int64).bitwise_and_(WORD - 1)
        yield torch.nonzero(unsigned < threshold).view(-1)


AUGMENT_PAD = 2  # pixels of reflect padding a random crop may shift by (De et al. use 4 on 32x32)


def augment(x: torch.Tensor, copies: int, stream: RandomStream) -> torch.Tensor:
    """`copies` random crops (of the image reflect-padded by AUGMENT_PAD) and horizontal flips of
    each image of `x` (N, C, H, W): rows i*copies ... i*copies + copies - 1 are copies of image i.
    The offsets (a word modulo 5: within 2^-29 of uniform) and flips (a bit) draw from `stream` on
    the CPU and are moved to x's device."""
    n, c, h, w = x.shape
    rows = n * copies
    repeated = x.repeat_interleave(copies, dim=0)
    padded = F.pad(repeated, (AUGMENT_PAD,) * 4, mode="reflect")
    words = stream.fill_(torch.empty(rows, 3, dtype=torch.int32)).to(torch.int64).bitwise_and_(WORD - 1)
    offsets = torch.remainder(words[:, :2], 2 * AUGMENT_PAD + 1).to(x.device)
    flips = words[:, 2].bitwise_and(1).bool().to(x.device)
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


def stream_noised(summed: torch.Tensor, std: float, stream: RandomStream) -> torch.Tensor:
    """`summed` + N(0, std^2) per coordinate, flat, on summed's device: the noise drawn on the CPU
    from `stream` by `mechanisms.gaussian.add_gaussian_noise` (so a CUDA peer's noise is the same
    bits), added in summed's dtype."""
    flat = summed.detach().to("cpu").reshape(-1).contiguous()
    return add_gaussian_noise(flat, 1.0, std, torch.empty_like(flat), stream).to(summed.device)


class _StreamNoise:
    """opacus' optimizers with the noise drawn from a ChaCha20 stream (`noise_stream`, set after
    construction) by `mechanisms.gaussian.add_gaussian_noise` on the CPU, then moved to the
    gradients' device, instead of opacus' noise from a torch generator (an MT19937)."""

    params: list[Any]  # parameters carrying opacus' summed_grad
    noise_multiplier: float
    max_grad_norm: float
    noise_stream: RandomStream
    original_optimizer: torch.optim.Optimizer
    loss_reduction: str
    expected_batch_size: int

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            p.grad = stream_noised(p.summed_grad, std, self.noise_stream).view_as(p)
            _mark_as_processed(p.summed_grad)

    def noise_only_step(self) -> None:
        """The step of an empty Poisson batch: its clipped sum is 0, the noise is added to it and
        the optimizer steps, as for any other batch (the accountant counts every step)."""
        for p in self.params:
            p.summed_grad = torch.zeros_like(p)
        self.add_noise()
        if self.loss_reduction == "mean":  # opacus' scale_grad, for the one (empty) batch of this step
            for p in self.params:
                p.grad /= self.expected_batch_size
        self.original_optimizer.step()


class _StreamNoiseGhostOptimizer(_StreamNoise, DPOptimizerFastGradientClipping):
    """Ghost clipping with stream noise."""


class _StreamNoiseDPOptimizer(_StreamNoise, DPOptimizer):
    """Materialized per-sample gradients (convolutions, augmentation multiplicity) with stream noise."""


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
