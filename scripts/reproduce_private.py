"""Private and accurate: record-level DP-SGD on the full Fashion-MNIST, from 1 to 100
peers. Prints the markdown tables of docs/RESULTS.md ("Private and accurate") and writes
docs/figures/private_frontier.png.

    python scripts/reproduce_private.py                 # the frontier (about 35 min on 2 cores)
    python scripts/reproduce_private.py recipe pnpm     # the non-private recipe, the PNPM rows
    python scripts/reproduce_private.py all             # frontier, recipe, ablations, pnpm
    REPRODUCE_WORKERS=1 python scripts/reproduce_private.py

Parts:
- frontier: peers {1 (central DP-SGD on the union: the same code with one peer), 10, 100} x
  record-level eps {1, 3, 8} at delta 1e-5 over the whole run, DP-SGD alone and with PNPM (eps 1
  per coordinate, on the update) on top, plus the non-private line of the same model.
  The model is ScatterNet + linear (Tramer & Boneh 2021); the noise multiplier of each point is
  the smallest that keeps the record-level eps (replace-one PLD, what the ledger records) within
  the target over all its rounds (`mechanisms.record_level.calibrate_noise`).
- recipe: the non-private FedAvg recipe on the PNPM paper's CNN, 10 and 100 peers, IID and
  Dirichlet(0.5), 20 rounds.
- ablations: at 10 peers and eps 3, one change at a time (batch size and steps, learning-rate
  decay, clip norm; pixels instead of ScatterNet features with ReLU, tanh, group norm and
  augmentation multiplicity, 5 rounds for the CNNs: end-to-end DP-SGD on a CNN costs ~20x the
  linear head).
- pnpm: the PNPM paper table's 70- and 100-user rows (non-private and PNPM eps 1 on the weights,
  10 rounds as in the paper) with the new local recipe, beside the old ones of
  scripts/reproduce_pnpm.py.

Finished runs are reused (runs/reproduce/<name>/summary.json); delete a folder to rerun it. Each
part's wall time is written to runs/reproduce/private-<part>.json when nothing was reused.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reproduce_common import FIGURES, RUNS, command, pct, run_all, write_sweep  # noqa: E402

DELTA = 1e-5
EPSILONS = (1.0, 3.0, 8.0)
ROUNDS = 20
# (batch size, local epochs) per swarm size; the clip norm and learning rate are Tramer & Boneh's
# for ScatterNet + linear (C 0.1, lr 4, momentum 0.9).
DP_SHAPE = {1: (4096, 1), 10: (1024, 2), 100: (300, 2)}
TRAIN_IMAGES = 60_000
DP_COMMON = [
    "data.dataset=fashion-mnist",
    "model.name=scatter-linear",
    f"swarm.rounds={ROUNDS}",
    "train.lr=4.0",
    "train.momentum=0.9",
    "train.dp_max_grad_norm=0.1",
    f"train.dp_delta={DELTA}",
    "swarm.seed=1",
]
PNPM_ON_TOP = ["privacy.mechanism=pnpm", "privacy.epsilon=1.0", "privacy.perturb=update"]
NO_MECHANISM = ["privacy.mechanism=none"]
CNN_RECIPE = [
    "data.dataset=fashion-mnist",
    "model.name=pnpm-fmnist",
    "train.epochs=2",
    "train.batch_size=32",
    "train.lr=0.05",
    "train.momentum=0.9",
    "privacy.mechanism=none",
    "swarm.seed=1",
]


def noise_for(eps: float, peers: int, batch: int, epochs: int, rounds: int = ROUNDS) -> float:
    from mechanisms.record_level import calibrate_noise

    return calibrate_noise(
        eps, batch_size=batch, epochs=epochs, num_samples=TRAIN_IMAGES // peers, rounds=rounds, delta=DELTA
    )


def dp_overrides(peers: int, eps: float, batch: int, epochs: int, rounds: int = ROUNDS) -> list[str]:
    return [
        f"swarm.peers={peers}",
        f"swarm.rounds={rounds}",
        f"train.batch_size={batch}",
        f"train.epochs={epochs}",
        "train.dp_sgd=true",
        f"train.dp_noise_multiplier={noise_for(eps, peers, batch, epochs, rounds)}",
    ]


def frontier_jobs() -> list[tuple]:
    jobs = []
    for peers in (10, 100, 1):  # the longest first, so two workers finish together
        batch, epochs = DP_SHAPE[peers]
        for eps in EPSILONS:
            base = DP_COMMON + dp_overrides(peers, eps, batch, epochs)
            jobs.append((f"private-dpsgd-n{peers}-eps{eps:g}", base + NO_MECHANISM, 1.0))
            jobs.append((f"private-dpsgd-pnpm-n{peers}-eps{eps:g}", base + PNPM_ON_TOP, 1.0))
        jobs.append(
            (
                f"private-nonprivate-n{peers}",
                DP_COMMON
                + [f"swarm.peers={peers}", f"train.batch_size={batch}", f"train.epochs={epochs}"]
                + NO_MECHANISM
                + ["train.lr=0.02"],
                1.0,
            )
        )
    return jobs


def recipe_jobs() -> list[tuple]:
    jobs = []
    for peers in (10, 100):
        for partition in ("iid", "dirichlet"):
            jobs.append(
                (
                    f"recipe-cnn-n{peers}-{partition}",
                    CNN_RECIPE
                    + [
                        f"swarm.peers={peers}",
                        f"swarm.rounds={ROUNDS}",
                        f"data.partition={partition}",
                        "data.alpha=0.5",
                    ],
                    1.0,
                )
            )
    return jobs


ABLATION_CNN_ROUNDS = 5


def ablation_jobs() -> list[tuple]:
    """One change at a time from the 10-peer eps-3 frontier point (its own row in the table)."""
    batch, epochs = DP_SHAPE[10]
    linear = DP_COMMON + NO_MECHANISM
    jobs = [
        ("ablate-small-batch", linear + dp_overrides(10, 3.0, 128, 1), 1.0),
        ("ablate-lr-decay", linear + dp_overrides(10, 3.0, batch, epochs) + ["train.lr_decay=0.9"], 1.0),
        (
            "ablate-clip-1",
            linear + dp_overrides(10, 3.0, batch, epochs) + ["train.dp_max_grad_norm=1.0", "train.lr=0.4"],
            1.0,
        ),
    ]
    cnn = [o for o in DP_COMMON if not o.startswith("model.name")] + NO_MECHANISM
    rounds = ABLATION_CNN_ROUNDS
    shape = dp_overrides(10, 3.0, 512, 1, rounds)
    for model, extra in (
        ("scatter-linear", []),
        ("pnpm-fmnist", []),
        ("pnpm-fmnist-tanh", []),
        ("pnpm-fmnist-gn-tanh", []),
        ("pnpm-fmnist-gn-tanh", ["train.dp_augmentations=2"]),
    ):
        suffix = "-aug2" if extra else ""
        jobs.append((f"ablate-r{rounds}-{model}{suffix}", cnn + shape + [f"model.name={model}"] + extra, 1.0))
    return jobs


def pnpm_jobs() -> list[tuple]:
    jobs = []
    for users in (70, 100):
        base = [o for o in CNN_RECIPE if not o.startswith("privacy.")] + [
            f"swarm.peers={users}",
            "swarm.rounds=10",
            "privacy.perturb=weights",
        ]
        jobs.append((f"pnpm-recipe-none-n{users}", base + ["privacy.mechanism=none"], 1.0))
        jobs.append((f"pnpm-recipe-pnpm-eps1-n{users}", base + ["privacy.mechanism=pnpm", "privacy.epsilon=1.0"], 1.0))
    return jobs


PARTS = {"frontier": frontier_jobs, "recipe": recipe_jobs, "ablations": ablation_jobs, "pnpm": pnpm_jobs}


def main(argv: list[str]) -> None:
    parts = list(PARTS) if argv == ["all"] else (argv or ["frontier"])
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)} or all")
    for part in parts:
        jobs = PARTS[part]()
        fresh = not any((RUNS / name / "summary.json").exists() for name, *_ in jobs)
        started = time.perf_counter()
        results = run_all(jobs)
        wall = time.perf_counter() - started
        if fresh:
            write_sweep(RUNS / f"private-{part}.json", len(jobs), wall)
        print(f"\n## {part}: {len(jobs)} runs, wall time {wall:.0f} s{'' if fresh else ' (some reused)'}\n")
        table(part, jobs, results)
        if part == "frontier":
            plot_frontier(results)


def _record_eps(s: dict) -> str:
    dp = s.get("dp_sgd")
    return "-" if not dp else f"{dp['epsilon']:.3g}"


def table(part: str, jobs: list[tuple], results: dict) -> None:
    print("| run | peers | model | noise | batch x epochs | record eps (1e-5) | PNPM on top | final % | best % | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, overrides, *_ in jobs:
        s = results[name]["summary"]
        dp = s.get("dp_sgd")
        mech = s["mechanism"].get("name", "none")
        print(
            f"| {name} | {s['peers']} | {s['model']} | {dp['noise_multiplier'] if dp else '-'} | "
            f"{s['batch_size']} x {s['epochs']} | {_record_eps(s)} | "
            f"{'eps 1/coord, signs' if mech == 'pnpm' else '-'} | {pct(s['final_accuracy'])} | "
            f"{pct(s['best_accuracy'])} | {s['seconds']['total']:.0f} |"
        )
    print("\nCommands:")
    for name, overrides, fraction, *_ in jobs:
        print(f"- {name}: `{command(overrides, fraction)}`")


def plot_frontier(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIGURES.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    colors = {1: "tab:green", 10: "tab:blue", 100: "tab:red"}
    for peers, color in colors.items():
        for pnpm, style in ((False, "-"), (True, ":")):
            points = []
            for eps in EPSILONS:
                key = f"private-dpsgd-{'pnpm-' if pnpm else ''}n{peers}-eps{eps:g}"
                s = results[key]["summary"]
                points.append((s["dp_sgd"]["epsilon"], 100 * (s["final_accuracy"] or 0.1)))
            label = f"{peers} peer{'s' if peers > 1 else ''}" + (" + PNPM" if pnpm else "")
            ax.plot(*zip(*points), style, marker="o", color=color, label=label)
        flat = 100 * (results[f"private-nonprivate-n{peers}"]["summary"]["final_accuracy"] or 0.1)
        ax.axhline(flat, color=color, alpha=0.35, linewidth=1)
    ax.set_xscale("log")
    ax.set_xticks([1, 3, 8], ["1", "3", "8"])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("record-level eps over the whole run (delta 1e-5, replace-one)")
    ax.set_ylabel(f"test accuracy after {ROUNDS} rounds (%)")
    ax.set_title("Fashion-MNIST, ScatterNet + linear, DP-SGD per peer; faint lines: non-private")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(FIGURES / "private_frontier.png", dpi=110)


if __name__ == "__main__":
    main(sys.argv[1:])
