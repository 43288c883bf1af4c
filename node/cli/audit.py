"""`swarm audit`: an empirical lower bound on a mechanism's epsilon (mechanisms.audit)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from node.cli import common

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from mechanisms.base import Mechanism


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit",
        help="empirically lower-bound a mechanism's epsilon",
        description="Run a mechanism many times on two neighbouring inputs, histogram the outputs and "
        "report a Clopper-Pearson lower bound on epsilon. For pnpm it reports the sign bound and the "
        "value leak (inputs of different magnitude).",
    )
    p.add_argument(
        "--mechanism", required=True, help="duchi, pm, hm, ldp-fl, pnpm, laplace, gaussian, rr, exponential or sampled"
    )
    p.add_argument("--epsilon", required=True, type=float, help="the claimed epsilon per release")
    p.add_argument("--trials", type=int, default=200_000, help="releases per input (default 200000)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of the bound (default 0.95)")
    p.add_argument("--delta", type=float, default=1e-5, help="gaussian only: delta (default 1e-5)")
    p.add_argument("--base", default="pm", help="sampled only: base mechanism pm, hm or duchi (default pm)")
    p.add_argument("--json", action="store_true", help="print JSON")
    common.add_verbose(p)
    p.set_defaults(func=handler)


def _build(args: argparse.Namespace) -> Mechanism:
    import mechanisms

    params = {"epsilon": args.epsilon}
    if args.mechanism == "gaussian":
        params.update(clip_norm=1.0, delta=args.delta)
    elif args.mechanism == "sampled":
        params["base"] = args.base
    return mechanisms.get(args.mechanism, **params)


def handler(args: argparse.Namespace) -> int:
    from node.cli import CLIError

    try:
        mech = _build(args)
        from mechanisms.audit import audit_mechanism

        results = audit_mechanism(mech, trials=args.trials, seed=args.seed, confidence=args.confidence)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    g = mech.guarantee
    if args.json:
        print(
            json.dumps(
                {
                    "mechanism": mech.params(),
                    "guarantee": g.to_dict(),
                    "audits": [{"pair": label, **r.to_dict()} for label, r in results],
                },
                indent=2,
            )
        )
        return 0
    print(f"mechanism {mech.name}: {g.statement}")
    for label, r in results:
        verdict = (
            "DISJOINT SUPPORTS: no finite eps holds (bound grows with trials)"
            if r.disjoint_support
            else ("ABOVE the claim" if r.epsilon_lower_bound > r.claimed_epsilon else "consistent with the claim")
        )
        print(
            f"  {label}: inputs {r.x0:g} vs {r.x1:g}, {r.trials} trials each: eps >= "
            f"{r.epsilon_lower_bound:.4f} at {r.confidence:.0%} confidence (claimed {r.claimed_epsilon:g}) "
            f"-> {verdict}"
        )
        print(f"    strongest event: {r.event}; {r.method}")
    if mech.name == "pnpm":
        print("  pnpm protects the sign of each weight only; its eps says nothing about the weight's value.")
    return 0
