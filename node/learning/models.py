"""The models peers train: the PNPM paper's CNNs, the CNN of seed 002, a small CNN for
scikit-learn's 8x8 digits, and logistic regression for tabular data.

PNPM paper (seed 004, section 4) gives only layer counts and the number of weights: MNIST
2 conv + 2 fc with 21,750 weights, Fashion-MNIST and CIFAR-10 3 conv + 2 fc with 41,936 and
56,560. The architectures below reproduce those three numbers EXACTLY when "weights" means
the conv kernels and fc matrices without biases (`count_weights`); with biases the totals are
21,840 / 42,090 / 56,714 (`count_parameters`):
- pnpm-mnist is PyTorch's classic MNIST example net: conv 1->10 5x5, pool, conv 10->20 5x5, pool,
  fc 320->50, fc 50->10: 250 + 5,000 + 16,000 + 500 = 21,750.
- pnpm-fmnist / pnpm-cifar10: conv 3x3 (padding 1) 16, 32, 64 channels, each followed by 2x2
  max-pool and ReLU, fc -> 32, fc 32 -> 10. Fashion-MNIST (1x28x28 -> 64x3x3):
  144 + 4,608 + 18,432 + 18,432 + 320 = 41,936; CIFAR-10 (3x32x32 -> 64x4x4):
  432 + 4,608 + 18,432 + 32,768 + 320 = 56,560.
No dropout and no batch norm: both would make the shared state depend on more than the weights
(batch-norm statistics) or make training depend on more random draws, and opacus rejects batch norm.

Initialization draws from a `torch.Generator` seeded by the caller (PyTorch's default bounds:
U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases), never from the global RNG:
`init_model` builds on the meta device and fills every parameter from its own generator.
"""

from __future__ import annotations

import math

import torch
from torch import nn

MODELS = ("pnpm-mnist", "pnpm-fmnist", "pnpm-cifar10", "seed002-cnn", "digits-cnn", "logreg")
DEFAULT_MODELS = {
    "mnist": "pnpm-mnist",
    "fashion-mnist": "pnpm-fmnist",
    "cifar10": "pnpm-cifar10",
    "digits": "digits-cnn",
    "breast-cancer": "logreg",
}


def _conv_out(size: int, kernel: int, padding: int, pool: bool) -> int:
    size = size + 2 * padding - kernel + 1
    return size // 2 if pool else size


class ConvNet(nn.Module):
    """conv -> 2x2 max-pool -> ReLU blocks, then fc -> ReLU -> fc.

    Pooling before the ReLU computes exactly the same function and gradients as the usual
    ReLU-then-pool (max commutes with a monotone map) on a quarter of the values; together with
    channels-last training (node.learning.train) it doubles training throughput on CPU (docs/SIMULATE.md).
    The parameter names are those of ReLU-then-pool (the ReLU and pool hold none)."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        channels: tuple[int, ...],
        kernel: int,
        padding: int,
        hidden: int,
    ) -> None:
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"a CNN needs input_shape (C, H, W), got {tuple(input_shape)}")
        in_channels, height, width = input_shape
        layers: list[nn.Module] = []
        for out_channels in channels:
            layers += [nn.Conv2d(in_channels, out_channels, kernel, padding=padding), nn.MaxPool2d(2), nn.ReLU()]
            in_channels = out_channels
            height, width = _conv_out(height, kernel, padding, True), _conv_out(width, kernel, padding, True)
            if height < 1 or width < 1:
                raise ValueError(
                    f"input_shape {tuple(input_shape)} is too small for {len(channels)} "
                    f"conv({kernel}x{kernel}) + pool blocks"
                )
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(in_channels * height * width, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class LogisticRegression(nn.Module):
    """Multinomial logistic regression (softmax of one linear layer) on flattened inputs."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def build_model(name: str, *, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The architecture `name` for inputs of `input_shape` (without batch) and `num_classes`.
    Its parameters come from PyTorch's global RNG: use `init_model` for seeded weights."""
    input_shape = tuple(int(d) for d in input_shape)
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if name == "pnpm-mnist":
        return ConvNet(input_shape, num_classes, (10, 20), kernel=5, padding=0, hidden=50)
    if name in ("pnpm-fmnist", "pnpm-cifar10"):
        return ConvNet(input_shape, num_classes, (16, 32, 64), kernel=3, padding=1, hidden=32)
    if name == "seed002-cnn":  # seed 002, section 4.2 (its printed MNIST model)
        return ConvNet(input_shape, num_classes, (32, 64), kernel=3, padding=1, hidden=128)
    if name == "digits-cnn":  # 8x8 digits: learns to ~95% in a few seconds on one core
        return ConvNet(input_shape, num_classes, (16,), kernel=3, padding=1, hidden=32)
    if name == "logreg":
        return LogisticRegression(input_shape, num_classes)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def init_model(name: str, *, input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    """`build_model` with every parameter drawn from a generator seeded with `seed`."""
    # Built on the meta device (no storage, no draws from the global RNG), then given memory.
    with torch.device("meta"):
        model = build_model(name, input_shape=input_shape, num_classes=num_classes)
    model = model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():  # registration order: fixed by the architecture
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                bound = 1.0 / math.sqrt(module.weight[0].numel())  # fan_in
                module.weight.uniform_(-bound, bound, generator=generator)
                if module.bias is not None:  # every layer of `build_model` has one
                    module.bias.uniform_(-bound, bound, generator=generator)
    return model


def default_model_for(dataset_name: str) -> str:
    try:
        return DEFAULT_MODELS[dataset_name]
    except KeyError:
        raise ValueError(f"no default model for dataset {dataset_name!r}; known: {', '.join(DEFAULT_MODELS)}") from None


def count_weights(model: nn.Module) -> int:
    """Conv kernels and fc matrices, biases excluded: the PNPM paper's "number of weights"."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.endswith("bias"))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
