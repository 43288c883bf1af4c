"""`swarm bench`: run the benchmark scripts, each writing its section of docs/BENCHMARKS.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
SUITES = ("mechanisms", "ledger", "p2p", "round", "simulate")


def register(sub) -> None:
    p = sub.add_parser("bench", help="run benchmarks and write docs/BENCHMARKS.md")
    p.add_argument("suites", nargs="*", metavar="SUITE", help=f"which to run: {', '.join(SUITES)} (default: all)")
    p.set_defaults(func=handle)


def handle(args) -> int:
    from node.cli import CLIError

    suites = args.suites or list(SUITES)
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise CLIError(f"unknown suite(s) {', '.join(unknown)}: choose from {', '.join(SUITES)}")
    status = 0
    for name in suites:
        script = SCRIPTS / f"bench_{name}.py"
        if not script.exists():
            raise CLIError(f"{script} is missing: run `swarm bench` from a source checkout")
        print(f"== bench {name}", flush=True)
        status |= subprocess.call([sys.executable, str(script)])
    return status
