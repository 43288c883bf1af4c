"""Where a swarm peer's protocol CPU goes, counted per trio task and per call run off the loop.

    python scripts/cpu_by_task.py [--peers 16] [--rounds 10] [--ledger-kind pipelined] [--json]

Runs one swarm of `scripts/bench_round.py` (no idle measure, docs/BENCHMARKS.md left alone) with
every `swarm node` process counting its own CPU: a trio Instrument reads the event loop thread's CPU
clock before and after each task step and adds the difference to the task's name;
`trio.to_thread.run_sync` reads the worker's CPU clock around each job, named by the function it
ran; each peer appends its totals (and its process CPU) to a file every 2 s and at exit. The second
half of each peer's run is taken (the steady rounds) and summed over the peers; the table gives each
task's share of the peers' CPU in that window and its steps or calls per peer (training and evaluation
are the jobs `thread:ComputeMeter.timed.<locals>.run`: the rest is the protocol's).

Why not py-spy: it samples the GIL holder by the wall clock, and with 16 processes on 2 cores a
thread descheduled while it holds the GIL still collects samples; cProfile charges its own overhead
to functions of many small calls (web3's formatters came out 20 times their cost). Counting CPU
clocks per step costs two clock reads a step (docs/SCALING.md, "Per task, counted").

The counting is put into the peers by a `sitecustomize` module in a temporary folder first on their
PYTHONPATH (a `sitecustomize` of your own is not imported during the run); the node has no switch
for it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FOLDER_ENV = "SWARM_CPU_BY_TASK"  # the folder peers write their totals to; set: counting is on
DUMP_EVERY_S = 2.0
SITECUSTOMIZE = f"""import os, sys
if os.environ.get({FOLDER_ENV!r}):
    sys.path.insert(0, {str(ROOT / "scripts")!r})
    import cpu_by_task
    cpu_by_task.install(os.environ[{FOLDER_ENV!r}])
"""


class Counts:
    """CPU seconds and steps (or calls) by name, from the loop's thread and the workers'."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.steps: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            self.seconds[name] += seconds
            self.steps[name] += 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"seconds": dict(self.seconds), "steps": dict(self.steps)}


def instrument(counts: Counts, on_wait: Any = None) -> Any:
    """A trio Instrument adding each task step's CPU (the loop thread's clock) to `counts` as
    "task:NAME"; `on_wait()` before each wait for I/O."""
    import trio

    class TaskSteps(trio.abc.Instrument):
        start = 0.0

        def before_task_step(self, task: Any) -> None:
            self.start = time.thread_time()

        def after_task_step(self, task: Any) -> None:
            counts.add("task:" + task.name, time.thread_time() - self.start)

        def before_io_wait(self, timeout: float) -> None:
            if on_wait is not None:
                on_wait()

    return TaskSteps()


def job_name(fn: Any) -> str:
    """A worker job's name: the function's, or for a lambda the first function it closes over."""
    name = str(getattr(fn, "__qualname__", type(fn).__name__))
    if name.endswith("<lambda>"):
        for cell in getattr(fn, "__closure__", None) or ():
            inner = cell.cell_contents
            if callable(inner) and hasattr(inner, "__qualname__"):
                return str(inner.__qualname__)
    return name


def install(folder: str) -> None:
    """Count this process's CPU by trio task and worker job; totals to FOLDER/PID.jsonl."""
    import atexit

    import trio
    import trio.to_thread

    counts, last = Counts(), [0.0]
    path = Path(folder) / f"{os.getpid()}.jsonl"

    def dump() -> None:
        line = {"wall": time.time(), "process_cpu": time.process_time(), "argv": sys.argv[:2], **counts.snapshot()}
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    def maybe_dump() -> None:
        if time.monotonic() - last[0] >= DUMP_EVERY_S:
            last[0] = time.monotonic()
            dump()

    run, run_sync = trio.run, trio.to_thread.run_sync

    def counted_run(*args: Any, **kwargs: Any) -> Any:
        kwargs["instruments"] = [*kwargs.get("instruments", ()), instrument(counts, maybe_dump)]
        return run(*args, **kwargs)

    async def counted_run_sync(fn: Any, *args: Any, **kwargs: Any) -> Any:
        def job(*job_args: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*job_args)
            finally:
                counts.add("thread:" + job_name(fn), time.thread_time() - start)

        return await run_sync(job, *args, **kwargs)

    trio.run, trio.to_thread.run_sync = counted_run, counted_run_sync
    atexit.register(dump)


def window(lines: list[dict[str, Any]], skip: float = 0.5) -> dict[str, Any] | None:
    """One peer's counts from the snapshot `skip` of the way through its run to its last but one
    (the last is written at exit, after the rounds); None with fewer than four snapshots."""
    if len(lines) < 4:
        return None
    first, last = lines[int(len(lines) * skip)], lines[-2]
    out: dict[str, Any] = {"process_cpu": last["process_cpu"] - first["process_cpu"], "seconds": {}, "steps": {}}
    for key in ("seconds", "steps"):
        for name, value in last[key].items():
            out[key][name] = value - first[key].get(name, 0)
    return out


def summarise(peers: list[dict[str, Any]]) -> dict[str, Any]:
    """The peers' windows summed: per name its share of their process CPU, CPU and steps per peer."""
    total = sum(p["process_cpu"] for p in peers)
    seconds: collections.Counter[str] = collections.Counter()
    steps: collections.Counter[str] = collections.Counter()
    for p in peers:
        seconds.update(p["seconds"])
        steps.update(p["steps"])
    loop = sum(v for k, v in seconds.items() if k.startswith("task:"))
    rows = [
        {
            "name": name,
            "share": cpu / total,
            "cpu_s_per_peer": cpu / len(peers),
            "steps_per_peer": steps[name] / len(peers),
        }
        for name, cpu in seconds.most_common()
    ]
    outside = total - sum(seconds.values())  # the scheduler, epoll, thread hops' delivery, other threads
    return {
        "peers": len(peers),
        "process_cpu_s_per_peer": total / len(peers),
        "loop_share": loop / total,
        "outside_share": outside / total,
        "rows": rows,
    }


def read_folder(folder: Path) -> list[dict[str, Any]]:
    """The windows of the swarm's peer processes (files of other processes are left out)."""
    peers = []
    for path in sorted(folder.glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not lines or not any("node" in str(a) for a in lines[0]["argv"][1:]):
            continue
        counted = window(lines)
        if counted is not None:
            peers.append(counted)
    return peers


def table(summary: dict[str, Any], top: int = 30) -> str:
    out = [
        f"{summary['peers']} peers, {summary['process_cpu_s_per_peer']:.2f} CPU-s a peer in the window; event loop "
        f"task steps {summary['loop_share']:.0%}, outside any step or job {summary['outside_share']:.0%}",
        "",
        "| task or job | share | CPU-s per peer | steps or calls per peer |",
        "|---|---|---|---|",
    ]
    for row in summary["rows"][:top]:
        out.append(
            f"| {row['name']} | {row['share']:.1%} | {row['cpu_s_per_peer']:.3f} | {row['steps_per_peer']:.0f} |"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--ledger-kind", choices=("swarm", "pipelined"), default="pipelined")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cpu-by-task-") as tmp:
        site, folder = Path(tmp) / "site", Path(tmp) / "counts"
        site.mkdir()
        folder.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        path = os.pathsep.join(filter(None, [str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        env = dict(os.environ, PYTHONPATH=path, **{FOLDER_ENV: str(folder)})
        bench = [sys.executable, str(ROOT / "scripts" / "bench_round.py"), "--peers", str(args.peers)]
        bench += ["--rounds", str(args.rounds), "--ledger-kind", args.ledger_kind, "--no-idle", "--no-write"]
        bench += ["--polled-peers", "--by-method-peers"]
        print("running " + " ".join(bench[1:]) + " with each peer counting its CPU ...", file=sys.stderr, flush=True)
        summary_line = ""
        with subprocess.Popen(bench, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:  # bench_round's progress, shown as it comes
                print(line, end="", file=sys.stderr, flush=True)
                if line.startswith("  round") and not summary_line:
                    summary_line = line.strip()
        peers = read_folder(folder)
    if not peers:
        print(f"no peer wrote its counts (bench_round exited {proc.returncode})", file=sys.stderr)
        return 1
    summary = summarise(peers) | {"bench": summary_line}
    print(json.dumps(summary, indent=1) if args.json else summary["bench"] + "\n\n" + table(summary))
    return 0 if proc.returncode in (0, 1) else proc.returncode  # 1: a target of bench_round's not met


if __name__ == "__main__":
    sys.exit(main())
