"""Reproduce Table 2 of the PNPM paper (seed 004): how much accuracy an attacker recovers from the
SIGNS of a trained model's weights alone, on Fashion-MNIST.

A pnpm-fmnist CNN is trained centrally (node.learning.train.train_local), then rebuilt from its signs:
(a) every weight set to +-0.5, (b) every weight given a random magnitude in (0, 1) with its sign
kept (the best of 20 draws, as the paper reports), and (c), not in the paper, every weight set to
+- the mean |w| of its tensor (an attacker who knows one typical magnitude per layer). Both variants are applied to
the conv kernels only (the paper's wording: the signs of the convolution kernels) and to every weight matrix
(conv kernels and fc matrices); biases are kept in the first variant and signed the same way in
the second. PNPM releases exactly these signs with probability e^eps / (e^eps + 1) each.

    python scripts/reproduce_signs.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TRAIN_LIMIT = None  # all 60,000 training images
TEST_LIMIT = None  # all 10,000 test images
EPOCHS = 10
DRAWS = 20
SEED = 1


def main() -> None:
    import torch

    from node.learning.data import load_dataset
    from node.learning.models import init_model
    from node.learning.train import evaluate, train_local

    torch.set_num_threads(1)
    started = time.perf_counter()
    train = load_dataset("fashion-mnist", split="train", limit=TRAIN_LIMIT)
    test = load_dataset("fashion-mnist", split="test", limit=TEST_LIMIT)
    model = init_model("pnpm-fmnist", input_shape=train.input_shape, num_classes=10, seed=SEED)
    # safetensors: never pickle; the name carries the setup so a changed setup retrains
    cache = ROOT / "runs" / "reproduce" / f"signs-model-{TRAIN_LIMIT or 'all'}-e{EPOCHS}.safetensors"
    if cache.exists():
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(cache)))
    else:
        from safetensors.torch import save_file

        train_local(model, train.x, train.y, epochs=EPOCHS, batch_size=32, lr=0.05, momentum=0.9, seed=SEED)
        cache.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(cache))
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    original = evaluate(model, test.x, test.y)[0]
    generator = torch.Generator().manual_seed(SEED)

    def rebuilt(which: str, magnitude) -> float:
        state = {}
        for name, w in trained.items():
            is_conv_kernel = name.startswith("features") and name.endswith("weight")
            if which == "conv" and not is_conv_kernel:
                state[name] = w
            else:
                state[name] = torch.sign(w) * magnitude(w)
        model.load_state_dict(state)
        return evaluate(model, test.x, test.y)[0]

    half = lambda w: torch.full_like(w, 0.5)  # noqa: E731
    layer_mean = lambda w: torch.full_like(w, float(w.abs().mean()))  # noqa: E731
    # (0, 1) open: 1 - U[0, 1) lies in (0, 1].
    uniform = lambda w: 1.0 - torch.rand(w.shape, generator=generator)  # noqa: E731
    results = {"original": original}
    for which in ("conv", "all"):
        results[f"{which}_half"] = rebuilt(which, half)
        results[f"{which}_layer_mean"] = rebuilt(which, layer_mean)
        draws = [rebuilt(which, uniform) for _ in range(DRAWS)]
        results[f"{which}_random_best"] = max(draws)
        results[f"{which}_random_mean"] = sum(draws) / len(draws)
    results["seconds"] = time.perf_counter() - started
    print(json.dumps(results, indent=2))
    print(
        "\n| weights rebuilt from signs | \\|w\\| = 0.5 | random \\|w\\| in (0,1), best of 20 (mean) | "
        "\\|w\\| = layer's mean \\|w\\| | trained model |"
    )
    print("|---|---|---|---|---|")
    print("| paper (Fashion-MNIST, Table 2) | 75.26 | 72.83 | - | 89.89 |")
    for which, label in (("conv", "ours, conv kernels only"), ("all", "ours, every weight and bias")):
        print(
            f"| {label} | {100 * results[which + '_half']:.2f} | {100 * results[which + '_random_best']:.2f} "
            f"({100 * results[which + '_random_mean']:.2f}) | {100 * results[which + '_layer_mean']:.2f} | "
            f"{100 * original:.2f} |"
        )
    plot(results)


def plot(results: dict) -> None:
    """Bars: the paper's Table 2 beside ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["|w| = 0.5", "random |w|,\nbest of 20", "|w| = tensor's\nmean |w|", "trained\nmodel"]
    series = {
        "paper, Table 2": [75.26, 72.83, None, 89.89],
        "ours, conv kernels only": [
            100 * results[k] for k in ("conv_half", "conv_random_best", "conv_layer_mean", "original")
        ],
        "ours, every weight and bias": [
            100 * results[k] for k in ("all_half", "all_random_best", "all_layer_mean", "original")
        ],
    }
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.27
    for k, (label, values) in enumerate(series.items()):
        xs = [i + (k - 1) * width for i in range(len(labels))]
        ax.bar(
            [x for x, v in zip(xs, values) if v is not None],
            [v for v in values if v is not None],
            width=width,
            label=label,
        )
    ax.axhline(10, color="gray", linestyle=":", label="chance")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Fashion-MNIST model rebuilt from the signs of its weights")
    ax.legend(fontsize=8)
    fig.tight_layout()
    figures = ROOT / "docs" / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    fig.savefig(figures / "signs.png", dpi=110)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
