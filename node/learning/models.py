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

from node.learning.features import scatter_features, scatter_shape

# (channels, kernel, padding, hidden) of each CNN: pnpm-* from the PNPM paper (module docstring),
# seed002-cnn from seed 002 section 4.2 (its printed MNIST model), digits-cnn for 8x8 digits
# (learns to ~95% in a few seconds on one core).
_CONV_ARCHITECTURES: dict[str, tuple[tuple[int, ...], int, int, int]] = {
    "pnpm-mnist": ((10, 20), 5, 0, 50),
    "pnpm-fmnist": ((16, 32, 64), 3, 1, 32),
    "pnpm-cifar10": ((16, 32, 64), 3, 1, 32),
    "seed002-cnn": ((32, 64), 3, 1, 128),
    "digits-cnn": ((16,), 3, 1, 32),
}


_CONV_BASES = tuple(_CONV_ARCHITECTURES)
# Variants of every CNN for DP-SGD (docs/RESULTS.md, ablations): "-tanh" swaps ReLU for tanh
# (tempered sigmoids: Papernot, Thakurta, Song, Chien, Erlingsson, AAAI 2021), "-gn" adds a group
# normalization after each convolution (per-sample, so DP-SGD's per-sample gradients stay valid,
# unlike batch norm).
_CONV_VARIANTS = ("", "-tanh", "-gn", "-gn-tanh")
# Linear and small-CNN heads on ScatterNet features (node.learning.features; Tramer & Boneh 2021).
SCATTER_MODELS = ("scatter-linear", "scatter-cnn")
MODELS = (*(base + v for base in _CONV_BASES for v in _CONV_VARIANTS), *SCATTER_MODELS, "logreg")
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
        activation: str = "relu",
        group_norm: bool = False,
    ) -> None:
        super().__init__()
        act: type[nn.Module] = {"relu": nn.ReLU, "tanh": nn.Tanh}[activation]
        if len(input_shape) != 3:
            raise ValueError(f"a CNN needs input_shape (C, H, W), got {tuple(input_shape)}")
        in_channels, height, width = input_shape
        layers: list[nn.Module] = []
        for out_channels in channels:
            layers.append(nn.Conv2d(in_channels, out_channels, kernel, padding=padding))
            if group_norm:
                layers.append(nn.GroupNorm(_groups(out_channels), out_channels))
            layers += [nn.MaxPool2d(2), act()]
            in_channels = out_channels
            height, width = _conv_out(height, kernel, padding, True), _conv_out(width, kernel, padding, True)
            if height < 1 or width < 1:
                raise ValueError(
                    f"input_shape {tuple(input_shape)} is too small for {len(channels)} "
                    f"conv({kernel}x{kernel}) + pool blocks"
                )
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(in_channels * height * width, hidden), act(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _groups(channels: int) -> int:
    """Group count of a group norm: groups of 4 channels (at most 32 groups), as in the DP-SGD
    literature's CNNs (De et al. 2022 use 16 groups on wider layers)."""
    return max(1, min(32, channels // 4))


class ScatterLinear(nn.Module):
    """Group norm over ScatterNet features, then one linear layer (Tramer & Boneh 2021's
    "ScatterNet + linear"; 27 groups of 3 channels for a grey image, as in their code). Its input
    is the features of `node.learning.features.scatter_features`, never pixels."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = scatter_shape(input_shape)
        self.norm = nn.GroupNorm(channels // 3, channels)
        self.linear = nn.Linear(channels * height * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x).flatten(1))


class ScatterCNN(nn.Module):
    """Group norm over ScatterNet features, then a small tanh CNN (Tramer & Boneh 2021's
    "ScatterNet + CNN" for MNIST-like data: conv 3x3 to 16 and 32 channels with a 2x2 pool,
    a group norm after each conv, a fully connected layer to 32 and the classifier)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        channels, height, width = scatter_shape(input_shape)
        self.norm = nn.GroupNorm(channels // 3, channels)
        self.body = ConvNet(
            (channels, height, width),
            num_classes,
            (16, 32),
            kernel=3,
            padding=1,
            hidden=32,
            activation="tanh",
            group_norm=True,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.norm(x))


def input_features(name: str) -> str | None:
    """What model `name` reads: None for the data set's own inputs, "scatter" for ScatterNet
    features (computed once per data set by node.learning.features.scatter_features)."""
    return "scatter" if name in SCATTER_MODELS else None


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
    if name == "scatter-linear":
        return ScatterLinear(input_shape, num_classes)
    if name == "scatter-cnn":
        return ScatterCNN(input_shape, num_classes)
    base, variant = _split_variant(name)
    if base in _CONV_ARCHITECTURES:
        channels, kernel, padding, hidden = _CONV_ARCHITECTURES[base]
        activation = "tanh" if "tanh" in variant else "relu"
        return ConvNet(input_shape, num_classes, channels, kernel, padding, hidden, activation, "gn" in variant)
    if name == "logreg":
        return LogisticRegression(input_shape, num_classes)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def _split_variant(name: str) -> tuple[str, str]:
    """("pnpm-fmnist", "-gn-tanh") from "pnpm-fmnist-gn-tanh"; the variant is "" for a base name."""
    for base in _CONV_BASES:
        if name.startswith(base) and name[len(base) :] in _CONV_VARIANTS:
            return base, name[len(base) :]
    return name, ""


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
            elif isinstance(module, nn.GroupNorm):  # PyTorch's init: the identity map
                module.weight.fill_(1.0)
                module.bias.zero_()
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


def model_inputs(name: str, x: torch.Tensor) -> torch.Tensor:
    """What model `name` is fed for the data set inputs `x`: `x` itself, or its ScatterNet features
    (computed once, cached on disk: node.learning.features)."""
    if input_features(name) == "scatter":
        return scatter_features(x)
    return x
