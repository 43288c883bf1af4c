import pytest
import torch

from node.learning.models import MODELS, count_parameters, count_weights, default_model_for, init_model
from node.protocol.blob import flatten


@pytest.mark.parametrize(
    "name,shape,weights,total",
    [
        ("pnpm-mnist", (1, 28, 28), 21_750, 21_840),
        ("pnpm-fmnist", (1, 28, 28), 41_936, 42_090),
        ("pnpm-cifar10", (3, 32, 32), 56_560, 56_714),
    ],
)
def test_pnpm_paper_weight_counts_exact(name, shape, weights, total):
    model = init_model(name, input_shape=shape, num_classes=10, seed=0)
    assert count_weights(model) == weights and count_parameters(model) == total
    assert model(torch.zeros(2, *shape)).shape == (2, 10)


def test_seed002_cnn_matches_its_printout():
    model = init_model("seed002-cnn", input_shape=(1, 28, 28), num_classes=10, seed=0)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(3136, 128), (128, 10)]


def test_init_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, _ = flatten(init_model("digits-cnn", input_shape=(1, 8, 8), num_classes=10, seed=5))
    assert torch.equal(torch.random.get_rng_state(), before)
    b, _ = flatten(init_model("digits-cnn", input_shape=(1, 8, 8), num_classes=10, seed=5))
    c, _ = flatten(init_model("digits-cnn", input_shape=(1, 8, 8), num_classes=10, seed=6))
    assert torch.equal(a, b) and not torch.equal(a, c)  # same seed, same kernels, one process: same bits


def test_defaults_and_errors():
    assert default_model_for("digits") == "digits-cnn" and default_model_for("breast-cancer") == "logreg"
    for dataset in ("mnist", "fashion-mnist", "cifar10"):
        assert default_model_for(dataset) in MODELS
    logreg = init_model("logreg", input_shape=(30,), num_classes=2, seed=0)
    assert count_parameters(logreg) == 62
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        init_model("resnet", input_shape=(1, 8, 8), num_classes=10, seed=0)
    with pytest.raises(ValueError, match="too small"):
        init_model("pnpm-mnist", input_shape=(1, 8, 8), num_classes=10, seed=0)


def test_pool_before_relu_is_the_usual_relu_then_pool():
    """ConvNet pools before its ReLU (faster); values and gradients equal the usual order's.

    Bit-for-bit by design, on any CPU: max pooling and ReLU are exact selections (no rounding)
    and commute, so every convolution and linear layer of both models receives the same bits and
    runs the same kernel in this process; backwards, both orders route each gradient to the same
    argmax (ties among non-positive values are zeroed by the ReLU mask either way)."""
    model = init_model("pnpm-fmnist", input_shape=(1, 28, 28), num_classes=10, seed=3)
    usual = init_model("pnpm-fmnist", input_shape=(1, 28, 28), num_classes=10, seed=3)
    layers = usual.features
    for i in (1, 4, 7):
        layers[i], layers[i + 1] = layers[i + 1], layers[i]
    assert isinstance(layers[1], torch.nn.ReLU) and isinstance(model.features[1], torch.nn.MaxPool2d)
    assert list(model.state_dict()) == list(usual.state_dict())
    x = torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(4))
    target = torch.arange(16) % 10
    out, out_usual = model(x), usual(x)
    assert torch.equal(out, out_usual)
    torch.nn.functional.cross_entropy(out, target).backward()
    torch.nn.functional.cross_entropy(out_usual, target).backward()
    for p, q in zip(model.parameters(), usual.parameters()):
        assert torch.equal(p.grad, q.grad)
