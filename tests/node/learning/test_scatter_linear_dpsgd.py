"""DP-SGD of ScatterNet + linear in closed form (train.ScatterLinearStep): each step is opacus' step
on materialized per-sample gradients, the noise is the stream's with the policy's standard
deviation, and whole runs are the opacus ghost-clipping path's, draw for draw."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer

from mechanisms.gaussian import add_gaussian_noise
from mechanisms.randomness import seeded_generator
from mechanisms.record_level import DPSGDPolicy, round_steps
from node.learning.clipped_sum import normalised_features, scatter_linear_clipped_sums
from node.learning.models import init_model
from node.learning.train import ScatterLinearStep, opacus_steps, poisson_batches, train_local
from node.protocol.blob import flatten

pytestmark = pytest.mark.usefixtures("one_thread")


def scatter_linear(seed: int = 1) -> torch.nn.Module:
    return init_model("scatter-linear", input_shape=(1, 28, 28), num_classes=10, seed=seed)


def records(count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ScatterNet-shaped features (81 channels of 7 x 7) off centre and scale, and labels: public
    test data, not a privacy draw."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 81, 7, 7, generator=generator) * 3 + 1
    return x, torch.randint(0, 10, (count,), generator=generator)


def per_record_norms(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each record's loss-gradient norm from opacus' materialized per-sample gradients."""
    grad_module = GradSampleModule(copy.deepcopy(model))
    F.cross_entropy(grad_module(x), y).backward()
    squares = sum(p.grad_sample.flatten(1).square().sum(1) for p in grad_module.parameters())
    grad_module._close()
    return squares.sqrt() * len(y)  # opacus' "mean" reduction scaled each row by 1/len(y)


def test_a_step_without_noise_is_opacus_per_sample_step():
    """Two steps at noise multiplier 0 (momentum 0.9, an expected batch that is not the actual
    one) move the weights as opacus' GradSampleModule + DPOptimizer do, to float32 rounding, with
    records on both sides of the clip in each batch."""
    model = scatter_linear()
    x, y = records(64)
    norms = per_record_norms(model, x, y)
    clip = float(norms.median())
    batches = [torch.arange(0, 30), torch.arange(30, 64)]
    for batch in batches:
        assert bool((norms[batch] < clip).any()) and bool((norms[batch] > clip * 1.01).any())
    reference = copy.deepcopy(model)
    grad_module = GradSampleModule(reference)
    optimizer = DPOptimizer(
        torch.optim.SGD(grad_module.parameters(), lr=0.5, momentum=0.9),
        noise_multiplier=0.0,
        max_grad_norm=clip,
        expected_batch_size=40,
    )
    before = flatten(model)[0].clone()
    step = ScatterLinearStep(model, clip, 0.0, 0.5, 0.9, 40, seeded_generator(0).dpsgd_noise)
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        expected_loss = F.cross_entropy(grad_module(x[batch]), y[batch])
        expected_loss.backward()
        optimizer.step()
        loss = step(x[batch], y[batch])
        assert loss == pytest.approx(expected_loss.item(), rel=1e-5)
    grad_module._close()
    moved, expected = flatten(model)[0] - before, flatten(reference)[0] - before
    assert float(expected.abs().max()) > 1e-3  # the steps moved the weights
    assert torch.allclose(moved, expected, rtol=0, atol=2e-5 * float(expected.abs().max()))


def test_the_noise_has_the_policys_standard_deviation():
    """One step, lr 1, no momentum: the update is -(clipped sum + noise) / expected batch. The
    noise it implies has mean 0 and std noise_multiplier x clip over the 39,862 coordinates
    (within 5 standard errors); on an empty batch it is the noise stream's draws themselves."""
    multiplier, clip, expected_batch = 1.3, 0.5, 8
    std = multiplier * clip
    x, y = records(12)
    model = scatter_linear()
    before = flatten(model)[0].clone()
    sums, _ = scatter_linear_clipped_sums(model, normalised_features(model.norm, x), y, clip)
    summed = torch.cat([sums[name].reshape(-1) for name in sorted(sums)])  # flatten's order: sorted names
    ScatterLinearStep(model, clip, multiplier, 1.0, 0.0, expected_batch, seeded_generator(7).dpsgd_noise)(x, y)
    noise = ((before - flatten(model)[0]) * expected_batch - summed).double()
    d = noise.numel()
    assert float(summed.norm()) > 1.0  # a sum the noise is added to
    assert abs(float(noise.mean())) <= 5 * std / math.sqrt(d)
    assert abs(float(noise.std()) - std) <= 5 * std / math.sqrt(2 * d)

    model = scatter_linear()
    before = [p.detach().clone() for p in model.parameters()]
    empty = torch.arange(0)
    ScatterLinearStep(model, clip, multiplier, 1.0, 0.0, expected_batch, seeded_generator(8).dpsgd_noise)(
        x[empty], y[empty]
    )
    reference = seeded_generator(8).dpsgd_noise
    for p, b in zip(model.parameters(), before, strict=True):  # parameter by parameter, in the model's order
        zeros = torch.zeros(p.numel())
        draws = add_gaussian_noise(zeros, 1.0, std, torch.empty_like(zeros), reference).view_as(p)
        assert torch.equal(p.detach(), b - draws / expected_batch)


def test_training_is_the_ghost_clipping_path_draw_for_draw():
    """train_local on ScatterNet + linear and opacus' ghost clipping (the path for models without
    convolutions) fed the same seeded streams: the same Poisson batches, empty ones among them,
    the same noise on each parameter, the same steps; the weights agree to float32 rounding. The
    noise and the batches draw from the privacy generator's streams, and nothing else does."""
    n = 24
    dp = DPSGDPolicy(noise_multiplier=1.1, max_grad_norm=0.2, batch_size=2, epochs=2)
    rate, steps = round_steps(dp.batch_size, dp.epochs, n)
    batches = list(poisson_batches(n, rate, steps // 2, seeded_generator(2).poisson))
    assert any(b.numel() == 0 for b in batches) and any(b.numel() > 1 for b in batches)  # this seed's batches
    x, y = records(n, seed=3)
    model, reference = scatter_linear(), scatter_linear()
    generator = seeded_generator(2)
    result = train_local(
        model, x, y, epochs=2, batch_size=2, lr=0.5, momentum=0.9, seed=0, dp=dp, privacy_generator=generator
    )
    assert result.dp_steps == steps and math.isfinite(result.mean_loss)
    assert generator.poisson.drawn == steps * n * 4  # one 32-bit word per record per step
    assert generator.augment.drawn == 0 and generator.mechanism.drawn == 0
    noise_drawn = generator.dpsgd_noise.drawn

    generator = seeded_generator(2)
    with opacus_steps(reference, dp, 0.5, 0.9, round(rate * n), 1, generator) as step:
        for _ in range(dp.epochs):
            for batch in poisson_batches(n, rate, steps // dp.epochs, generator.poisson):
                step(x[batch], y[batch])
    assert generator.dpsgd_noise.drawn == noise_drawn
    ours, theirs = flatten(model)[0], flatten(reference)[0]
    assert not torch.equal(ours, flatten(scatter_linear())[0])
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-5 * float(theirs.abs().max()))
