"""The DP-SGD model options: tanh and group-norm CNN variants, ScatterNet features with
a linear or small-CNN head, and ghost clipping, checked against what each must compute."""

from __future__ import annotations

import math
import os
import time

import pytest
import torch
import torch.nn.functional as F
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.optimizers import DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from torch import nn

from mechanisms.randomness import seeded_generator
from mechanisms.record_level import DPSGDPolicy, calibrate_noise, record_level_spend
from node.config import load_config
from node.derive import genesis
from node.learning import features
from node.learning.features import SCATTER_CHANNELS, scatter_features, scatter_shape
from node.learning.models import MODELS, count_parameters, init_model, input_features, model_inputs
from node.learning.train import channels_last, train_local

FMNIST = (1, 28, 28)


def per_sample_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each row's own cross-entropy gradient, by torch.func (independent of opacus)."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_of(p, xi, yi):
        return F.cross_entropy(torch.func.functional_call(model, p, (xi[None],)), yi[None])

    return torch.func.vmap(torch.func.grad(loss_of), in_dims=(None, 0, 0))(params, x, y)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", [m for m in MODELS if m != "logreg" and not m.startswith("digits")])
def test_every_image_model_builds_seeded_and_classifies(name):
    a = init_model(name, input_shape=FMNIST, num_classes=10, seed=5)
    b = init_model(name, input_shape=FMNIST, num_classes=10, seed=5)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    x = torch.rand(3, *FMNIST)
    assert a(model_inputs(name, x)).shape == (3, 10)
    for module in a.modules():
        if isinstance(module, nn.GroupNorm):  # the identity map at genesis, as PyTorch initializes it
            assert torch.equal(module.weight, torch.ones_like(module.weight))
            assert torch.equal(module.bias, torch.zeros_like(module.bias))


def test_variants_change_only_what_their_name_says():
    plain = init_model("pnpm-fmnist", input_shape=FMNIST, num_classes=10, seed=0)
    tanh = init_model("pnpm-fmnist-tanh", input_shape=FMNIST, num_classes=10, seed=0)
    gn = init_model("pnpm-fmnist-gn", input_shape=FMNIST, num_classes=10, seed=0)
    assert count_parameters(plain) == count_parameters(tanh) == 42_090
    assert sum(isinstance(m, nn.Tanh) for m in tanh.modules()) == 4
    assert not any(isinstance(m, nn.ReLU) for m in tanh.modules())
    # a group norm of (weight, bias) after each of the three convolutions
    assert count_parameters(gn) == 42_090 + 2 * (16 + 32 + 64)
    assert [m.num_groups for m in gn.modules() if isinstance(m, nn.GroupNorm)] == [4, 8, 16]


def test_the_model_choice_is_in_the_genesis():
    linear = load_config(overrides=["data.dataset=fashion-mnist", "model.name=scatter-linear"])
    cnn = load_config(overrides=["data.dataset=fashion-mnist", "model.name=pnpm-fmnist-tanh"])
    assert genesis(linear) != genesis(cnn)
    assert b"scatter-linear" in genesis(linear)


def test_scatter_shape_and_bad_inputs():
    assert SCATTER_CHANNELS == 81  # 1 + J*L + L^2 * J(J-1)/2 for J=2, L=8
    assert scatter_shape((1, 28, 28)) == (81, 7, 7)
    assert scatter_shape((3, 32, 32)) == (243, 8, 8)
    with pytest.raises(ValueError, match="images"):
        scatter_shape((30,))
    with pytest.raises(ValueError, match="divisible by 4"):
        scatter_shape((1, 30, 30))
    with pytest.raises(ValueError, match="images"):
        init_model("scatter-linear", input_shape=(30,), num_classes=2, seed=0)


def test_scattering_of_a_constant_image_is_its_mean_and_nothing_else():
    """Order 0 is a Gaussian low-pass (a constant stays the constant); every wavelet has zero mean,
    so orders 1 and 2 of a constant are 0. Tolerances: the sampled, periodised Gaussian sums to 1
    only up to its truncated tails (3e-5 of the value here), the wavelets' zero mean up to float32
    FFT rounding (~1e-7)."""
    x = torch.full((2, 1, 28, 28), 0.7)
    out = scatter_features(x, cache=False)
    assert out.shape == (2, 81, 7, 7) and out.dtype == torch.float32
    assert torch.allclose(out[:, 0], torch.full_like(out[:, 0], 0.7), rtol=1e-4, atol=0)
    assert out[:, 1:].abs().max() < 1e-6


def test_scattering_is_nearly_invariant_to_a_small_shift_and_not_to_a_flip():
    torch.manual_seed(0)
    x = torch.zeros(1, 1, 28, 28)
    x[0, 0, 8:20, 10:14] = 1.0  # a vertical bar
    shifted = torch.roll(x, shifts=1, dims=3)
    rotated = x.transpose(2, 3)  # the bar made horizontal
    fx, fs, fr = (scatter_features(t, cache=False) for t in (x, shifted, rotated))
    shift_change = (fx - fs).norm() / fx.norm()
    rotate_change = (fx - fr).norm() / fx.norm()
    assert shift_change < 0.5 * rotate_change  # a 1-pixel shift moves the features far less than a 90 degree turn


def test_features_are_cached_atomically_and_a_damaged_cache_is_recomputed(tmp_path):
    x = torch.rand(5, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    first = scatter_features(x)
    files = list((features.cache_dir() / "features").glob("scatter-*.safetensors"))
    assert len(files) == 1 and not list((features.cache_dir() / "features").glob(".tmp-*"))
    assert torch.equal(scatter_features(x), first)  # read back from the cache
    files[0].write_bytes(b"not a safetensors file")
    assert torch.equal(scatter_features(x), first)
    other = scatter_features(x + 0.01)  # other inputs, another key
    assert not torch.equal(other, first)
    assert len(list((features.cache_dir() / "features").glob("scatter-*.safetensors"))) == 2


def test_the_feature_cache_stays_within_its_limit_least_recently_used_first(monkeypatch):
    """Each file here is 5 x 81 x 7 x 7 float32 (~79 kB): a 0.2 MB limit holds two. The file a hit
    just read survives; the one unused longest goes; the file just written stays even at limit 0."""
    images = [torch.rand(5, 1, 28, 28, generator=torch.Generator().manual_seed(s)) for s in (1, 2, 3)]
    directory = features.cache_dir() / "features"
    monkeypatch.setenv("SWARM_CACHE_MAX_MB", "0.2")
    scatter_features(images[0])
    scatter_features(images[1])
    first, second = sorted(directory.glob("scatter-*.safetensors"), key=lambda f: f.stat().st_mtime_ns)
    now = time.time()
    os.utime(first, (now - 100, now - 100))
    os.utime(second, (now - 50, now - 50))
    scatter_features(images[0])  # a hit: `first` is now the most recently used

    scatter_features(images[2])

    left = set(directory.glob("scatter-*.safetensors"))
    assert first in left and second not in left and len(left) == 2
    assert sum(f.stat().st_size for f in left) <= features.cache_limit_bytes()

    monkeypatch.setenv("SWARM_CACHE_MAX_MB", "0")
    scatter_features(images[1])
    assert len(list(directory.glob("scatter-*.safetensors"))) == 1  # only the file just written
    stale = directory / ".tmp-killed-writer.safetensors"  # what a SIGKILL mid-write leaves
    stale.write_bytes(b"half")
    os.utime(stale, (now - 7200, now - 7200))
    fresh = directory / ".tmp-running-writer.safetensors"
    fresh.write_bytes(b"half")
    scatter_features(images[2])
    assert not stale.exists() and fresh.exists()  # another peer may be writing that one now
    for bad in ("lots", "-1", "nan", "inf"):
        monkeypatch.setenv("SWARM_CACHE_MAX_MB", bad)
        with pytest.raises(ValueError, match="SWARM_CACHE_MAX_MB"):
            features.cache_limit_bytes()
        with pytest.raises(ValueError, match="SWARM_CACHE_MAX_MB"):  # before any work, hit or miss
            scatter_features(images[0])


def test_model_inputs_follow_the_model():
    x = torch.rand(4, 1, 28, 28)
    assert input_features("scatter-linear") == "scatter" and input_features("pnpm-fmnist") is None
    assert model_inputs("pnpm-fmnist", x) is x
    assert model_inputs("scatter-cnn", x).shape == (4, 81, 7, 7)


def test_group_norm_models_train_without_the_channels_last_path():
    """torch 2.13's CPU GroupNorm backward crashes the process on channels-last inputs; models
    with a group norm train in the standard layout (this test would die with SIGSEGV otherwise)."""
    model = init_model("pnpm-fmnist-gn", input_shape=FMNIST, num_classes=10, seed=0)
    x = torch.rand(8, *FMNIST)
    with channels_last(model, x) as y:
        assert y is x
    plain = init_model("pnpm-fmnist", input_shape=FMNIST, num_classes=10, seed=0)
    with channels_last(plain, x) as y:
        assert y.is_contiguous(memory_format=torch.channels_last)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    labels = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(2))
    train_local(model, x, labels, epochs=1, batch_size=4, lr=0.1, seed=0)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.equal(before, after)


@pytest.mark.parametrize("name", ["scatter-linear", "pnpm-fmnist-gn-tanh"])
def test_ghost_clipping_sums_exactly_the_clipped_per_sample_gradients(name):
    """The clipped sum opacus' ghost clipping produces is sum_i min(1, C / ||g_i||) g_i, with g_i
    each sample's own gradient (from torch.func, independently). Tolerance: float32 sums of 16
    terms of per-sample gradients (relative 1e-4 leaves room for the two passes' rounding)."""
    torch.manual_seed(0)
    model = init_model(name, input_shape=FMNIST, num_classes=10, seed=3)
    x = model_inputs(name, torch.rand(16, *FMNIST))
    y = torch.randint(0, 10, (16,))
    clip = 0.05  # small enough that every sample is clipped, large enough that some are not
    per_sample = per_sample_gradients(model, x, y)
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_sample.values()))
    factors = (clip / (norms + 1e-6)).clamp(max=1.0)
    assert (factors < 1).any()
    expected = {k: (factors.view(-1, *[1] * (g.dim() - 1)) * g).sum(0) for k, g in per_sample.items()}

    module = GradSampleModuleFastGradientClipping(model, max_grad_norm=clip, use_ghost_clipping=True)
    optimizer = DPOptimizerFastGradientClipping(
        torch.optim.SGD(module.parameters(), lr=0.1), noise_multiplier=1.0, max_grad_norm=clip, expected_batch_size=16
    )
    optimizer.zero_grad()
    losses = F.cross_entropy(module(x), y, reduction="none")
    DPTensorFastGradientClipping(module, optimizer, losses, "mean").backward()
    for key, param in model.named_parameters():
        assert torch.allclose(param.grad, expected[key], rtol=1e-4, atol=1e-7), key
    module._close()


def test_dp_sgd_on_scatternet_features_learns_a_separable_task():
    """Two classes that differ in where the ink is: DP-SGD (noise 1) on the ScatterNet features
    with a linear head separates them far above chance in one epoch."""
    g = torch.Generator().manual_seed(4)
    n = 256
    x = torch.rand(n, *FMNIST, generator=g) * 0.2
    y = torch.arange(n) % 2
    x[y == 0, :, :, :14] += 0.8
    x[y == 1, :, :, 14:] += 0.8
    model = init_model("scatter-linear", input_shape=FMNIST, num_classes=2, seed=0)
    feats = model_inputs("scatter-linear", x)
    dp = DPSGDPolicy(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=64, epochs=1)
    result = train_local(
        model,
        feats,
        y,
        epochs=1,
        batch_size=64,
        lr=1.0,
        seed=0,
        dp=dp,
        privacy_generator=seeded_generator(9),
    )
    assert result.dp_steps == 4
    with torch.no_grad():
        accuracy = (model(feats).argmax(1) == y).float().mean().item()
    assert accuracy > 0.9


@pytest.mark.parametrize("target", [1.0, 3.0, 8.0])
def test_calibrated_noise_meets_the_target_and_is_nearly_the_least(target):
    kwargs = dict(batch_size=512, epochs=1, num_samples=6000, rounds=10)
    sigma = calibrate_noise(target, **kwargs)
    spend = lambda s: record_level_spend(DPSGDPolicy(s, 1.0, 512, 1), [6000] * 10).epsilon  # noqa: E731
    assert spend(sigma) <= target
    assert spend(sigma * 0.98) > target  # within the 0.5% tolerance plus rounding to 4 digits
    assert math.isfinite(sigma) and sigma > 0


def test_calibration_refuses_nonsense():
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_noise(0.0, batch_size=64, epochs=1, num_samples=100, rounds=1)
    with pytest.raises(ValueError, match="rounds"):
        calibrate_noise(1.0, batch_size=64, epochs=1, num_samples=100, rounds=0)


def test_each_augmented_copy_is_a_crop_or_flipped_crop_of_its_own_image():
    from node.learning.train import AUGMENT_PAD, augment

    g = torch.Generator().manual_seed(6)
    x = torch.rand(3, 1, 28, 28, generator=g)
    copies = augment(x, 4, seeded_generator(7).augment)
    assert copies.shape == (12, 1, 28, 28)
    padded = F.pad(x, (AUGMENT_PAD,) * 4, mode="reflect")
    seen = set()
    for row in range(12):
        image = padded[row // 4]
        span = range(2 * AUGMENT_PAD + 1)
        crops = [(oy, ox, flip) for oy in span for ox in span for flip in (False, True)]
        matches = [
            c
            for c in crops
            if torch.equal(
                copies[row],
                image[:, c[0] : c[0] + 28, c[1] : c[1] + 28].flip(-1)
                if c[2]
                else image[:, c[0] : c[0] + 28, c[1] : c[1] + 28],
            )
        ]
        assert matches, f"copy {row} is no crop of image {row // 4}"
        seen.add(matches[0])
    assert len(seen) > 3  # the draws differ between copies


def test_augmented_dp_sgd_clips_each_records_mean_over_its_copies():
    """With K copies, the per-sample gradient opacus clips is the mean of the K copies' gradients
    (checked against torch.func on the same copies), so one record's share of the sum stays within
    the clip norm and the accountant's sensitivity is unchanged."""
    from opacus import GradSampleModule

    from node.learning.train import _average_copies, augment

    model = init_model("pnpm-fmnist-gn-tanh", input_shape=FMNIST, num_classes=10, seed=1)
    x = torch.rand(4, *FMNIST, generator=torch.Generator().manual_seed(8))
    y = torch.tensor([0, 3, 5, 9])
    copies = augment(x, 3, seeded_generator(9).augment)
    labels = y.repeat_interleave(3)
    per_copy = per_sample_gradients(model, copies, labels)
    expected = {k: g.view(4, 3, *g.shape[1:]).mean(1) for k, g in per_copy.items()}
    module = GradSampleModule(model)
    F.cross_entropy(module(copies), labels).backward()
    _average_copies(module, 4, 3)
    for key, param in model.named_parameters():
        assert param.grad_sample.shape == (4, *param.shape)
        # float32 means of 3 gradients, each a sum over a 28x28 image: relative 1e-4
        assert torch.allclose(param.grad_sample, expected[key], rtol=1e-4, atol=1e-6), key
    module._close()


def test_augmentation_multiplicity_trains_and_counts_the_policys_steps():
    model = init_model("pnpm-fmnist-tanh", input_shape=FMNIST, num_classes=10, seed=0)
    x = torch.rand(64, *FMNIST, generator=torch.Generator().manual_seed(1))
    y = torch.arange(64) % 10
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    dp = DPSGDPolicy(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=16, epochs=1)
    result = train_local(
        model,
        x,
        y,
        epochs=1,
        batch_size=16,
        lr=0.5,
        seed=0,
        dp=dp,
        privacy_generator=seeded_generator(2),
        augmentations=4,
    )
    assert result.dp_steps == 4 and math.isfinite(result.mean_loss)
    assert not torch.equal(before, torch.cat([p.detach().flatten() for p in model.parameters()]))
    with pytest.raises(ValueError, match="augmentation multiplicity"):
        train_local(model, x, y, epochs=1, batch_size=16, lr=0.5, seed=0, augmentations=2)  # not DP-SGD


def test_augmentations_need_dp_sgd_on_pixels():
    from node.config import ConfigError

    ok = ["train.dp_augmentations=4", "train.dp_sgd=true", "data.dataset=fashion-mnist"]
    assert load_config(overrides=ok).train.dp_augmentations == 4
    no_dp = ["train.dp_augmentations=4", "train.dp_sgd=false"]
    for bad in (no_dp, [*ok, "model.name=scatter-linear"], [*ok, "train.dp_augmentations=0"]):
        with pytest.raises(ConfigError, match="dp_augmentations"):
            load_config(overrides=bad)
