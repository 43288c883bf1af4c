"""`swarm bench`: run the benchmark scripts, each writing its section of docs/BENCHMARKS.md.

The scripts live in a source checkout (scripts/bench_*.py), not in the installed package: they are
looked for in the current directory and its parents, then in the folder above the package (an
editable install lives in the checkout). A wheel installed elsewhere has none and says so.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from node.cli import common

SUITES = ("mechanisms", "ledger", "p2p", "round", "simulate", "dpsgd", "cli", "secagg")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="run benchmarks and write docs/BENCHMARKS.md (from a source checkout)",
        description="Run the benchmark scripts of a source checkout (scripts/bench_*.py); each rewrites its own "
        "section of docs/BENCHMARKS.md with the figures it measured on this machine.",
    )
    p.add_argument("suites", nargs="*", metavar="SUITE", help=f"which to run: {', '.join(SUITES)} (default: all)")
    common.add_verbose(p)
    p.set_defaults(func=handle)


def is_checkout(folder: Path) -> bool:
    """Whether folder holds the benchmark scripts (scripts/benchdoc.py and scripts/bench_*.py)."""
    scripts = folder / "scripts"
    return (scripts / "benchdoc.py").is_file() and any(scripts.glob("bench_*.py"))


def find_checkout(start: Path | None = None) -> Path | None:
    """The source checkout holding the benchmark scripts: start (default the current directory) or
    one of its parents, else the folder above the package; None if there is none."""
    here = (start or Path.cwd()).resolve()
    package_root = Path(__file__).resolve().parents[2]
    for folder in [here, *here.parents, package_root]:
        if is_checkout(folder):
            return folder
    return None


def handle(args: argparse.Namespace) -> int:
    from node.cli import CLIError

    suites = args.suites or list(SUITES)
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise CLIError(f"unknown suite(s) {', '.join(unknown)}: choose from {', '.join(SUITES)}")
    checkout = find_checkout()
    if checkout is None:
        raise CLIError(
            "benchmarks run from a source checkout (they are not part of the installed package): "
            "`git clone` the project and run `swarm bench` inside it"
        )
    scripts = [checkout / "scripts" / f"bench_{name}.py" for name in suites]
    missing = [str(script) for script in scripts if not script.is_file()]
    if missing:
        raise CLIError(f"the checkout {checkout} lacks {', '.join(missing)}: update it (git pull)")
    status = 0
    for name, script in zip(suites, scripts):
        print(f"== bench {name}", flush=True)
        status |= subprocess.call([sys.executable, str(script)])
    return status
