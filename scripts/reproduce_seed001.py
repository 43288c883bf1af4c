"""Reproduce seed 001: (1) its medical case as federated logistic regression on scikit-learn's
breast-cancer set across 5 hospitals (E = 5 local epochs, learning rate 0.01 decaying 5% per
round, sample-weighted FedAvg, 40 rounds), with and without DP, plus its E = 1 contrast; (2) a
privacy-utility Pareto front over an eps grid x mechanisms on the same task, plotted against the
HONEST whole-update eps per hospital (docs/figures/pareto_breast_cancer.png).

Hospitals hold Dirichlet(1.0) label-skewed shards (seed 001: "the participants' data
distributions differ markedly"). Local mechanisms perturb the shared update w - w_global (clipped
to [-1, 1] coordinate-wise), PNPM the weights as its paper does; Gaussian clips the update to L2
norm 1 and adds noise for (eps, 1e-5) per round (RDP over the rounds).

    python scripts/reproduce_seed001.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reproduce_common import FIGURES, command, eps_text, pct, run_all  # noqa: E402

ROUNDS = 40
EPS_GRID = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
MECHANISMS = ("pnpm", "duchi", "pm", "hm", "laplace", "ldp-fl", "sampled", "gaussian")


def base(share: str) -> list[str]:
    return [
        "data.dataset=breast-cancer",
        "model.name=logreg",
        "swarm.peers=5",
        f"swarm.rounds={ROUNDS}",
        "data.partition=dirichlet",
        "data.alpha=1.0",
        "train.epochs=5",
        "train.batch_size=16",
        "train.lr=0.01",
        "train.lr_decay=0.95",
        "aggregation.rule=fedavg",
        "swarm.seed=3",
        f"privacy.perturb={share}",
        "privacy.delta=1e-5",
    ]


def mechanism_job(mech: str, eps: float, tag: str = "pareto") -> tuple:
    share = "weights" if mech == "pnpm" else "update"
    params = {
        "pnpm": {"name": "pnpm", "epsilon": eps},
        "ldp-fl": {"name": "ldp-fl", "epsilon": eps, "center": 0.0, "radius": 1.0},
        "sampled": {"name": "sampled", "base": "pm", "epsilon": eps, "clip": True},
        "gaussian": {"name": "gaussian", "clip_norm": 1.0, "epsilon": eps, "delta": 1e-5},
    }.get(mech, {"name": mech, "epsilon": eps, "clip": True})
    overrides = base(share) + [f"privacy.mechanism={mech}", f"privacy.epsilon={eps}"]
    return (f"s001-{tag}-{mech}-eps{eps:g}", overrides, 1.0, params)


def main() -> None:
    medical = [
        ("s001-medical-none-E5", base("update") + ["privacy.mechanism=none"], 1.0, None),
        ("s001-medical-none-E1", base("update") + ["privacy.mechanism=none", "train.epochs=1"], 1.0, None),
    ]
    pareto = [mechanism_job(m, e) for m in MECHANISMS for e in EPS_GRID]
    results = run_all(medical + pareto)

    print("## medical case: 5 hospitals, logistic regression, 40 rounds")
    print("| setting | final acc % | best acc % | whole-update eps per hospital | seconds | command |")
    print("|---|---|---|---|---|---|")
    for name, overrides, _, params in medical + [
        mechanism_job("gaussian", 1.0),
        mechanism_job("pnpm", 1.0),
        mechanism_job("gaussian", 4.0),
    ]:
        s = results[name]["summary"]
        print(
            f"| {name[5:]} | {pct(s['final_accuracy'])} | {pct(s['best_accuracy'])} | {eps_text(s)} | "
            f"{s['seconds']['total']:.1f} | `{command(overrides, 1.0, params)}` |"
        )

    print("\n## Pareto grid (final accuracy %; honest whole-update eps per hospital)")
    print("| mechanism | " + " | ".join(f"eps {e:g}" for e in EPS_GRID) + " |")
    print("|---|" + "---|" * len(EPS_GRID))
    points = []
    for m in MECHANISMS:
        cells = []
        for e in EPS_GRID:
            s = results[f"s001-pareto-{m}-eps{e:g}"]["summary"]
            cells.append(f"{pct(s['final_accuracy'])} ({eps_text(s)})")
            if s["final_accuracy"] is not None and s.get("privacy"):
                points.append(
                    (s["privacy"]["eps_whole_update_max"], s["final_accuracy"], m, e, s["privacy"]["protects"])
                )
        print(f"| {m} | " + " | ".join(cells) + " |")
    # PNPM's eps bounds the signs only: it is not comparable with the others' and stays off the front.
    front = pareto_front([p for p in points if p[4] != "sign"])
    print("\nPareto front of the value-protecting mechanisms (whole-update eps, accuracy, mechanism, its eps):")
    for p in front:
        print(f"  {p[0]:.4g}  {100 * p[1]:.2f}%  {p[2]} eps {p[3]:g}{' (sign only)' if p[4] == 'sign' else ''}")
    total = sum(r["summary"]["seconds"]["total"] for r in results.values())
    print(f"\ntotal simulated time {total:.0f} s")
    baseline = results["s001-medical-none-E5"]["summary"]["final_accuracy"]
    plot(points, front, baseline)


def pareto_front(points):
    """Points no other point beats on both axes (lower eps, higher accuracy)."""
    front = []
    for p in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or p[1] > front[-1][1]:
            front.append(p)
    return front


def plot(points, front, baseline) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIGURES.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m in MECHANISMS:
        mine = [p for p in points if p[2] == m]
        ax.scatter(
            [p[0] for p in mine], [100 * p[1] for p in mine], label=m + (" (sign only)" if m == "pnpm" else ""), s=22
        )
    ax.step(
        [p[0] for p in front],
        [100 * p[1] for p in front],
        where="post",
        color="black",
        lw=1,
        label="Pareto front (value-protecting)",
    )
    ax.axhline(100 * baseline, color="grey", ls="--", lw=1, label="non-private")
    ax.set_xscale("log")
    ax.set_xlabel("honest eps per hospital: whole update, all 40 rounds (log)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("breast cancer, 5 hospitals, federated logistic regression")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(FIGURES / "pareto_breast_cancer.png", dpi=110)


if __name__ == "__main__":
    main()
