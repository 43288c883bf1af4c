"""Shared plumbing of the reproduction scripts (scripts/reproduce_*.py): run one simulation into
runs/reproduce/<name> (reused when its summary already exists, so an interrupted sweep resumes),
run a list of them on a small process pool, and print markdown tables.

Every run is `node.runs.simulate.Simulation` (what `swarm simulate` runs) on scripts/baseline.toml
(the defaults these figures were measured with) plus its own overrides; each line of a table names
the equivalent command."""

from __future__ import annotations

import json
import os
import shlex
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "reproduce"
FIGURES = ROOT / "docs" / "figures"
BASELINE = ROOT / "scripts" / "baseline.toml"


def command(overrides: list[str], fraction: float = 1.0, mechanism_params: dict | None = None) -> str:
    """The `swarm simulate` command line that reproduces a run. Mechanism parameters the config
    cannot hold (a string such as sampled's base) are named after it: those runs come from
    `Simulation(config, mechanism_params=...)`, which this script calls."""
    parts = ["swarm", "simulate", "--config", "scripts/baseline.toml"] + [a for o in overrides for a in ("--set", o)]
    if fraction != 1.0:
        parts += ["--fraction", f"{fraction:g}"]
    text = shlex.join(parts)
    if mechanism_params:
        text += f"  [mechanism {json.dumps(mechanism_params, sort_keys=True)}]"
    return text


def run_one(job: tuple) -> dict:
    """Run (or reuse) one simulation; returns its summary plus records and wall time."""
    import torch

    from node.config import load_config
    from node.runs.simulate import Simulation

    name, overrides, fraction = job[:3]
    mechanism_params = job[3] if len(job) > 3 else None
    out = RUNS / name
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
        return {"name": name, "summary": summary, "records": records, "reused": True}
    if out.exists():  # an interrupted run: start it again
        import shutil

        shutil.rmtree(out)
    torch.set_num_threads(1)
    started = time.perf_counter()
    result = Simulation(
        load_config(BASELINE, overrides), fraction=fraction, out=out, threads=1, mechanism_params=mechanism_params
    ).run()
    wall = time.perf_counter() - started
    return {"name": name, "summary": result.summary, "records": result.records, "reused": False, "wall": wall}


def write_sweep(path: Path, runs: int, wall: float) -> None:
    """Record a sweep's wall time (only meaningful when no run was reused)."""
    record = {
        "runs": runs,
        "wall_seconds": round(wall, 1),
        "workers": int(os.environ.get("REPRODUCE_WORKERS", "2")),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    path.write_text(json.dumps(record, indent=1) + "\n")


def run_all(jobs: list[tuple], workers: int | None = None) -> dict[str, dict]:
    workers = workers or int(os.environ.get("REPRODUCE_WORKERS", "2"))
    results = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for res in pool.map(run_one, jobs):
            s = res["summary"]
            print(
                f"{res['name']}: final {s['final_accuracy']}, {s['seconds']['total']:.0f} s"
                f"{' (reused)' if res['reused'] else ''}",
                flush=True,
            )
            results[res["name"]] = res
    return results


def pct(value) -> str:
    return "diverged" if value is None else f"{100 * value:.2f}"


def eps_text(summary: dict) -> str:
    p = summary.get("privacy")
    if p is None or "eps_whole_update_max" not in p:  # no local mechanism (DP-SGD alone is reported apart)
        return "none (no local mechanism)" if p else "none (no privacy)"
    # summaries written before the record-level headline had "protects" and "delta" for the mechanism
    what = " (sign only)" if p.get("mechanism_protects", p.get("protects")) == "sign" else ""
    mechanism_delta = p.get("eps_whole_update_delta", p.get("delta"))
    delta = f", delta {mechanism_delta:.0e}" if mechanism_delta else ""
    return f"{p['eps_whole_update_max']:.4g}{delta}{what}"
