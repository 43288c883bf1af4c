"""Reproduce the PNPM paper (seed 004, section 4) on the FULL Fashion-MNIST: non-private against
PNPM, Duchi and PM for 10 to 500 users at eps 0.5, 1 and 2, plus HM, LDP-FL's mechanism and
k-of-d sampling (PM), each with its honest whole-update eps. Writes docs/figures/pnpm_users.png,
runs/reproduce/pnpm-sweep.json (the sweep's wall time) and prints the markdown tables of
docs/RESULTS.md.

    python scripts/reproduce_pnpm.py             # the whole grid, 2 worker processes
    REPRODUCE_WORKERS=1 python scripts/reproduce_pnpm.py

The paper's setup: all 60,000 training images split IID among the users, the 10,000 test
images, the 3-conv + 2-fc CNN with 41,936 weights (pnpm-fmnist), 10 global rounds, every
user every round, weights (not updates) perturbed and averaged with plain FedAvg, learning rate
0.01 for 100 users and 0.05 for 500. The paper does not give the local epochs, batch size or
optimizer for Fashion-MNIST. Its two learning rates grow with the number of users exactly as
the local steps per round shrink (lr x local steps is the same at 100 and 500 users), so we keep
that rule, lr = LR_AT_100 x users / 100, capped at LR_CAP (above it momentum SGD on 4 local steps
per round oscillated in a pilot), with 1 local epoch, batch 32 and SGD momentum 0.9
(docs/RESULTS.md gives the pilots that chose them).
Finished runs are reused (runs/reproduce/<name>/summary.json); delete the folder to rerun.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reproduce_common import FIGURES, RUNS, command, eps_text, pct, run_all, write_sweep  # noqa: E402

USERS = (10, 70, 100, 200, 500)
EPSILONS = (0.5, 1.0, 2.0)
LR_AT_100 = 0.05  # the paper: 0.01 at 100 users, 0.05 at 500; see the module docstring
LR_CAP = 0.1
BASE = [
    "data.dataset=fashion-mnist",
    "swarm.rounds=10",  # no data.limit: all 60,000 + 10,000
    "train.epochs=1",
    "train.batch_size=32",
    "train.momentum=0.9",
    "aggregation.rule=fedavg",
    "swarm.seed=1",
    "privacy.perturb=weights",
]
LDP_FL = {"center": 0.0, "radius": 0.5}  # trained weights of this CNN lie within +-0.5
# what the paper states for Fashion-MNIST (text of sections 4.2 and 4.3): (users, mechanism, eps) -> %
PAPER = {
    (100, "none", None): 83.56,
    (100, "pnpm", 1.0): 81.20,
    (70, "none", None): 86.07,
    (70, "pnpm", 1.0): 85.92,
    (70, "duchi", 1.0): 66.98,
    (70, "pm", 1.0): 54.83,
}


def lr_for(users: int) -> float:
    return round(min(LR_CAP, LR_AT_100 * users / 100), 6)


def jobs() -> list[tuple]:
    """Runs that go the whole 10 rounds first, the ones likely to diverge early (Duchi, PM and HM
    on weights) last, so that two workers finish together."""
    full, short = [], []

    def add(into, mech: str, eps: float | None, users: int, params: dict | None = None):
        name = f"full-{mech}-n{users}" if eps is None else f"full-{mech}-eps{eps:g}-n{users}"
        overrides = BASE + [
            f"swarm.peers={users}",
            f"train.lr={lr_for(users)}",
            f"privacy.mechanism={mech}",
            f"privacy.epsilon={eps or 1.0}",
        ]
        into.append((name, overrides, 1.0, params))

    for users in USERS:
        add(full, "none", None, users)
        for eps in EPSILONS:
            add(full, "pnpm", eps, users)
        add(full, "ldp-fl", 1.0, users, {"name": "ldp-fl", "epsilon": 1.0, **LDP_FL})
        add(full, "sampled", 1.0, users, {"name": "sampled", "base": "pm", "epsilon": 1.0, "clip": True})
        for eps in EPSILONS:
            add(short, "duchi", eps, users)
            add(short, "pm", eps, users)
        add(short, "hm", 1.0, users)
    return full + short


def main() -> None:
    todo = jobs()
    fresh = not any((RUNS / name / "summary.json").exists() for name, *_ in todo)
    started = time.perf_counter()
    results = run_all(todo)
    wall = time.perf_counter() - started
    sweep = RUNS / "pnpm-sweep.json"
    if fresh:  # the sweep's own wall time is only meaningful when nothing was reused
        write_sweep(sweep, len(todo), wall)
    print(
        "| users | lr | mechanism | eps per coordinate | paper % | final acc % | best acc % | "
        "whole-update eps per peer (10 rounds) | seconds | note |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, overrides, fraction, params in sorted(todo, key=_order):
        s = results[name]["summary"]
        mech = s["mechanism"]
        eps = mech.get("epsilon")
        paper = PAPER.get((s["peers"], mech["name"], eps if mech["name"] != "none" else None))
        print(
            "| "
            + " | ".join(
                str(c)
                for c in (
                    s["peers"],
                    f"{s['lr']:g}",
                    mech["name"],
                    "-" if eps is None else f"{eps:g}",
                    "" if paper is None else f"{paper:.2f}",
                    pct(s["final_accuracy"]),
                    pct(s["best_accuracy"]),
                    eps_text(s),
                    f"{s['seconds']['total']:.0f}",
                    s.get("diverged") or "",
                )
            )
            + " |"
        )
    total = sum(results[n]["summary"]["seconds"]["total"] for n, *_ in todo)
    print(
        f"\n{len(todo)} runs, {total:.0f} s of simulated time in all; sweep wall time {wall:.0f} s"
        f"{'' if fresh else ' (some runs reused: see runs/reproduce/pnpm-sweep.json for the fresh sweep)'}"
    )
    print("\nCommand of each run:")
    for name, overrides, fraction, params in sorted(todo, key=_order):
        print(f"- {name}: `{command(overrides, fraction, params)}`")
    plot(results, todo)


def _order(job) -> tuple:
    names = ["none", "pnpm", "duchi", "pm", "hm", "ldp-fl", "sampled"]
    name = job[0]
    users = int(name.rsplit("-n", 1)[1])
    mech = next(m for m in sorted(names, key=len, reverse=True) if name.startswith(f"full-{m}-"))
    eps = name.split("-eps", 1)[1].split("-n", 1)[0] if "-eps" in name else "0"
    return users, names.index(mech), float(eps)


def plot(results, todo) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIGURES.mkdir(parents=True, exist_ok=True)
    colors = {
        "non-private": "black",
        "pnpm": "tab:red",
        "duchi": "tab:blue",
        "pm": "tab:purple",
        "hm": "tab:orange",
        "ldp-fl": "tab:green",
        "sampled": "tab:pink",
    }
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4), sharey=True)
    for ax, eps in zip(axes, EPSILONS):
        series: dict[str, list[tuple[int, float]]] = {}
        for name, *_ in todo:
            s = results[name]["summary"]
            mech = s["mechanism"]
            if mech["name"] != "none" and mech.get("epsilon") != eps:
                continue
            label = "non-private" if mech["name"] == "none" else mech["name"]
            # a diverged run is plotted at its last finished round's accuracy (None: chance, 10%)
            series.setdefault(label, []).append((s["peers"], 100 * (s["final_accuracy"] or 0.1)))
        for label in colors:
            points = sorted(series.get(label, []))
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colors[label], label=label)
        for (users, mech, e), value in PAPER.items():
            if mech == "none" or e == eps:
                ax.scatter(
                    [users],
                    [value],
                    marker="*",
                    s=110,
                    color=colors["non-private" if mech == "none" else mech],
                    edgecolors="white",
                    zorder=5,
                )
        ax.set_xscale("log")
        ax.set_xlabel("users (all take part every round)")
        ax.set_title(f"eps {eps:g} per coordinate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[0].set_ylabel("test accuracy after 10 rounds (%)")
    fig.suptitle(
        "Fashion-MNIST (60,000 images), PNPM paper setup, mechanisms on the weights; "
        "stars: the paper's numbers (same colour = same mechanism)"
    )
    fig.tight_layout()
    fig.savefig(FIGURES / "pnpm_users.png", dpi=110)


if __name__ == "__main__":
    main()
