"""train.device: resolution and validation, the CPU path, the CPU-drawn DP-SGD noise (the ChaCha20
stream's Gaussian), the genesis left untouched; the CUDA path only where CUDA exists."""

import pytest
import torch
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

from mechanisms.gaussian import add_gaussian_noise
from mechanisms.randomness import seeded_generator
from mechanisms.record_level import DPSGDPolicy
from node.config import ConfigError, load_config
from node.derive import genesis, peer_settings, shared_settings
from node.learning.data import load_dataset
from node.learning.device import resolve_device
from node.learning.models import init_model
from node.learning.train import evaluate, train_local
from node.protocol.blob import encode_blob, flatten

TRAIN = load_dataset("digits", limit=200)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine (torch.cuda.is_available() is False)")


pytestmark = pytest.mark.usefixtures("one_thread")


def fresh(seed: int = 0) -> torch.nn.Module:
    return init_model("digits-cnn", input_shape=TRAIN.input_shape, num_classes=10, seed=seed)


def test_resolution_follows_the_machine():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if CUDA else "cpu")
    if CUDA:
        assert resolve_device("cuda") == torch.device("cuda")
    else:
        with pytest.raises(ValueError, match="needs CUDA.*SWARM_TORCH_INDEX"):
            resolve_device("cuda")


@pytest.mark.parametrize("bad", ["gpu", "CUDA", "cuda:0", "", "mps"])
def test_bad_values_are_refused_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"train\.device must be one of auto, cpu, cuda"):
        load_config(overrides=[f"train.device={bad}"])


def test_cuda_is_a_valid_config_value_on_any_machine():
    """Whether this machine has CUDA is checked where training starts (resolve_device above; the CLI
    before any work: tests/node/cli/test_fast_answers.py), so a config stays checkable without torch."""
    assert load_config(overrides=["train.device=cuda"]).train.device == "cuda"


def test_device_is_per_peer_not_in_the_genesis():
    auto, cpu = load_config(), load_config(overrides=["train.device=cpu"])
    assert auto.train.device == "auto"
    assert peer_settings(cpu).device == "cpu"
    assert peer_settings(auto).device == ("cuda" if CUDA else "cpu")
    assert "device" not in str(shared_settings(auto).to_dict())
    assert genesis(auto) == genesis(cpu)


def test_cpu_path_is_the_default_path_bit_for_bit():
    a, b = fresh(), fresh()
    train_local(a, TRAIN.x, TRAIN.y, epochs=1, batch_size=32, lr=0.1, seed=3)
    train_local(b, TRAIN.x, TRAIN.y, epochs=1, batch_size=32, lr=0.1, seed=3, device="cpu")
    assert torch.equal(flatten(a)[0], flatten(b)[0])
    assert evaluate(a, TRAIN.x, TRAIN.y) == evaluate(b, TRAIN.x, TRAIN.y, device="cpu")


@pytest.mark.parametrize("ghost", [True, False], ids=["ghost-clipping", "per-sample-hooks"])
def test_dp_sgd_noise_is_the_streams_gaussian(ghost):
    """The optimizers add to each parameter's clipped sum exactly sigma z, z the Gaussian
    sampler's values on the noise stream (drawn on the CPU, so a CUDA peer's noise is the same
    bits), with ghost clipping and with the per-sample hooks that convolutions and augmentation
    multiplicity use."""
    from node.learning.train import _private_optimizer

    x, y = TRAIN.x[:16], TRAIN.y[:16]
    dp = DPSGDPolicy(noise_multiplier=1.3, max_grad_norm=1.0, batch_size=16, epochs=1)
    grad_module, optimizer = _private_optimizer(fresh(), dp, 0.5, 0.0, 16, ghost)
    optimizer.noise_stream = seeded_generator(11).dpsgd_noise
    optimizer.zero_grad(set_to_none=True)
    if ghost:
        per_sample = torch.nn.functional.cross_entropy(grad_module(x), y, reduction="none")
        DPTensorFastGradientClipping(grad_module, optimizer, per_sample, "mean").backward()
        optimizer.accumulate()
    else:
        torch.nn.functional.cross_entropy(grad_module(x), y).backward()
        optimizer.clip_and_accumulate()
    summed = [p.summed_grad.clone() for p in optimizer.params]
    optimizer.add_noise()
    reference = seeded_generator(11).dpsgd_noise
    for p, s in zip(optimizer.params, summed, strict=True):
        flat = s.reshape(-1)
        expected = add_gaussian_noise(flat, 1.0, 1.3, torch.empty_like(flat), reference)
        assert torch.equal(p.grad.reshape(-1), expected)
    grad_module._close()


@needs_cuda
@pytest.mark.parametrize("dp", [None, DPSGDPolicy(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=32, epochs=1)])
def test_cuda_training_gives_back_a_cpu_model_that_encodes(dp):
    model = fresh()
    before = flatten(model)[0]
    result = train_local(
        model,
        TRAIN.x,
        TRAIN.y,
        epochs=1,
        batch_size=32,
        lr=0.1,
        seed=3,
        dp=dp,
        privacy_generator=seeded_generator(5) if dp else None,
        device="cuda",
    )
    assert all(p.device.type == "cpu" for p in model.parameters())
    vector, _ = flatten(model)
    assert vector.device.type == "cpu" and torch.isfinite(vector).all() and not torch.equal(vector, before)
    assert result.num_samples == len(TRAIN) and (dp is None or result.dp_steps > 0)
    assert encode_blob({"w": vector}, {"kind": "update"})
    accuracy, loss = evaluate(model, TRAIN.x, TRAIN.y, device="cuda")
    assert 0 <= accuracy <= 1 and loss > 0 and next(model.parameters()).device.type == "cpu"
