"""Benchmark how fast `swarm` answers; writes section "cli" of docs/BENCHMARKS.md.

Each command runs as a fresh process (`python -m node.cli ...`, as the console script does) `--reps`
times; the table gives the median wall time and its ratio to a baseline measured in the same run:
`python -c pass`, a bare interpreter start. `import torch` is timed beside it for scale: the CLI
checks its arguments and config before it loads torch, web3 or libp2p, so a bad one is answered in
a small multiple of the baseline (target: every row but `import torch` within 1.5 s).

Usage: python scripts/bench_cli.py [--reps 5] [--no-write]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdoc import machine_line, table, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SWARM = [sys.executable, "-m", "node.cli"]


def closed_port_url() -> str:
    """An http URL on a loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def cases() -> list[tuple[str, list[str]]]:
    url = closed_port_url()
    return [
        ("`python -c pass` (baseline)", [sys.executable, "-c", "pass"]),
        ("`python -c 'import torch'` (for scale)", [sys.executable, "-c", "import torch"]),
        ("`swarm --help`", [*SWARM, "--help"]),
        ("`swarm up --peers 0`", [*SWARM, "up", "--peers", "0"]),
        ("`swarm up --set data.dataset=svhn`", [*SWARM, "up", "--set", "data.dataset=svhn"]),
        ("`swarm ledger --rpc-url <closed port>`", [*SWARM, "ledger", "--rpc-url", url, "--ledger", "0x" + "1" * 40]),
    ]


def time_command(command: list[str], reps: int) -> tuple[float, int]:
    """Median wall seconds of `reps` runs, and the exit status (the same every run)."""
    seconds, statuses = [], set()
    for _ in range(reps):
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True)
        seconds.append(time.perf_counter() - start)
        statuses.add(done.returncode)
    if len(statuses) != 1:
        raise SystemExit(f"{command} exited with {sorted(statuses)} across runs")
    return statistics.median(seconds), statuses.pop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args()
    measured = [(label, *time_command(command, args.reps)) for label, command in cases()]
    baseline = measured[0][1]
    rows = [[label, f"{t:.2f}", f"{t / baseline:.1f}x", status] for label, t, status in measured]
    markdown = "\n".join(
        [
            "## CLI answers (`scripts/bench_cli.py`)",
            "",
            f"{machine_line()}; median of {args.reps} fresh processes each. The arguments and the config are "
            "checked before torch, web3 or libp2p load, so `--help` and a bad argument, config or `--rpc-url` "
            "cost a small multiple of a bare interpreter start, not the seconds of `import torch`.",
            "",
            table(["command", "seconds", "x baseline", "exit status"], rows),
        ]
    )
    print(markdown)
    if not args.no_write:
        print(f"wrote {write_section('cli', markdown)}")


if __name__ == "__main__":
    main()
