"""Each mechanism's perturb time on 10 million float32 weights against its random-number floor:
the time to allocate (and so fault in) the float32 output and draw the random numbers the
mechanism needs from the same generator, measured in the same run. Targets: <= 2x the floor,
PNPM <= 1.5x.

Floor and mechanism are timed in alternation, `--repeat` rounds, and each keeps its fastest
round: on a machine shared with other jobs the minimum is the run least disturbed by them.

    python scripts/bench_mechanisms.py [--n 10000000] [--repeat 15] [--threads N] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchdoc  # noqa: E402

import mechanisms  # noqa: E402

CASES = [  # name, params, input kind, floor kind, target
    ("pnpm", {"epsilon": 1.0}, "weights", "uniform32", 1.5),
    ("duchi", {"epsilon": 1.0}, "unit", "uniform32", 2.0),
    ("pm", {"epsilon": 1.0}, "unit", "uniform32", 2.0),
    ("hm", {"epsilon": 1.0}, "unit", "uniform32", 2.0),
    ("ldp-fl", {"epsilon": 1.0, "radius": 0.1}, "weights", "uniform32", 2.0),
    ("laplace", {"epsilon": 1.0}, "unit", "uniform64", 2.0),
    ("exponential", {"epsilon": 1.0}, "unit", "uniform64", 2.0),
    ("rr", {"epsilon": 1.0, "k": 2}, "binary", "uniform32", 2.0),
    ("gaussian", {"clip_norm": 1.0, "noise_multiplier": 1.0}, "weights", "normal32", 2.0),
    ("sampled", {"base": "pm", "epsilon": 10.0}, "unit", "zeros32", 2.0),
]

_DRAW64 = {}


def _uniform64(n, g):
    """53-bit uniforms into a reused buffer (as the mechanisms draw them) + the float32 output
    allocated and written (each page faulted in once, as the mechanism's own output is)."""
    buf = _DRAW64.get(n)
    if buf is None:
        buf = _DRAW64[n] = torch.empty(n, dtype=torch.float64)
    buf.uniform_(generator=g)
    return torch.empty(n, dtype=torch.float32).zero_()


FLOORS = {
    # the output is the draw's own buffer: allocate n float32 and fill with one uniform each
    "uniform32": lambda n, g: torch.empty(n, dtype=torch.float32).uniform_(generator=g),
    "uniform64": _uniform64,
    "normal32": lambda n, g: torch.empty(n, dtype=torch.float32).normal_(generator=g),
    # sampled draws only 2k numbers: its floor is writing the (mostly zero) output
    "zeros32": lambda n, g: torch.zeros(n, dtype=torch.float32),
}


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: all torch threads, page faults included)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def floor_and_cost(floor_fn, mech_fn, repeat: int):
    """Fastest of `repeat` alternating rounds for each, after one warm-up of each:
    ((floor wall, floor cpu), (cost wall, cost cpu)), minima taken per column."""
    floor_fn(), mech_fn()
    floors, costs = [], []
    for _ in range(repeat):
        floors.append(_timed(floor_fn))
        costs.append(_timed(mech_fn))
    return tuple(map(min, zip(*floors))), tuple(map(min, zip(*costs)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-write", action="store_true", help="print only, do not write docs/BENCHMARKS.md")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    inputs = {
        "weights": torch.randn(args.n, generator=gen) * 0.05,
        "unit": torch.rand(args.n, generator=gen) * 2 - 1,
        "binary": torch.randint(0, 2, (args.n,), generator=gen).float(),
    }
    rows, ok = [], True
    for name, params, kind, floor_kind, target in CASES:
        mech = mechanisms.get(name, **params)
        x = inputs[kind]
        (floor, floor_cpu), (cost, cost_cpu) = floor_and_cost(
            lambda kind=floor_kind: FLOORS[kind](args.n, gen),
            lambda mech=mech, x=x: mech.perturb(x, generator=gen),
            args.repeat,
        )
        ratio, cpu_ratio = cost / floor, cost_cpu / floor_cpu
        ok &= ratio <= target
        rows.append(
            [
                name,
                floor_kind,
                f"{floor * 1e3:.1f}",
                f"{cost * 1e3:.1f}",
                f"{ratio:.2f}",
                f"{cpu_ratio:.2f}",
                f"<= {target}",
                "yes" if ratio <= target else "**no**",
            ]
        )
        print(
            f"{name:12s} floor {floor * 1e3:7.1f} ms  perturb {cost * 1e3:7.1f} ms  ratio {ratio:.2f}  "
            f"cpu ratio {cpu_ratio:.2f} (target {target})"
        )
    md = (
        f"Perturbing {args.n:,} float32 values (fastest of {args.repeat} rounds, floor and mechanism "
        f"timed in alternation in the same run): floor = allocate the float32 output and draw the "
        f"random numbers the mechanism needs from the same torch.Generator "
        f"({torch.get_num_threads()} torch threads).\n\n"
        + benchdoc.table(
            ["mechanism", "floor", "floor ms", "perturb ms", "ratio", "CPU-time ratio", "target", "met (wall ratio)"],
            rows,
        )
        + f"\n\nMachine: {benchdoc.machine_line()}; 1-minute load average at the end of the run: "
        f"{os.getloadavg()[0]:.1f} (ratios are only meaningful on an otherwise idle machine). "
        "Reproduce: `python scripts/bench_mechanisms.py`.\n"
        "Laplace and the exponential mechanism draw 53-bit (float64) uniforms on purpose (see "
        "docs/MECHANISMS.md), so their floor is that float64 draw (into a reused buffer, as they "
        "draw) plus writing the float32 output. `sampled` draws only 2k numbers; its floor is "
        "writing the zero output. torch draws uniforms and normals on one thread whatever the "
        "thread count; the perturb arithmetic uses all threads. The CPU-time ratio (process CPU "
        "time, all threads) is far less disturbed by other jobs than the wall ratio; the target is "
        "judged on wall time."
    )
    if not args.no_write:
        benchdoc.write_section("mechanisms", md)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
