"""scripts/cpu_by_task.py: CPU is counted to the task and the worker job that spent it, a process
started with the counting writes its totals, and the summary takes each peer's steady window."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import trio
import trio.to_thread

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("cpu_by_task", ROOT / "scripts" / "cpu_by_task.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cbt = _load()
BURN_S = 0.03


def _burn(seconds: float) -> None:
    """Spend `seconds` of this thread's CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def burner() -> None:
    _burn(BURN_S)


async def napper() -> None:
    await trio.lowlevel.checkpoint()


def test_a_task_steps_cpu_is_counted_to_that_task():
    counts = cbt.Counts()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(burner)
            nursery.start_soon(napper)

    trio.run(main, instruments=[cbt.instrument(counts)])
    burned = counts.seconds[f"task:{__name__}.burner"]
    assert burned >= BURN_S  # the whole burn was in one step of that task
    assert counts.seconds[f"task:{__name__}.napper"] < BURN_S / 3
    assert counts.steps[f"task:{__name__}.napper"] >= 2  # before and after its sleep


def test_a_worker_job_is_named_by_the_function_a_lambda_calls():
    def commitments(r: int) -> int:
        return r

    assert cbt.job_name(lambda: commitments(3)).endswith("commitments")
    assert cbt.job_name(commitments).endswith("commitments")
    assert cbt.job_name(print) == "print"


def test_an_installed_process_writes_its_task_and_job_cpu(tmp_path):
    """`install` in a process of its own (it replaces trio.run and trio.to_thread.run_sync there)."""
    program = f"""
import sys, time
sys.path.insert(0, {str(ROOT / "scripts")!r})
import cpu_by_task
cpu_by_task.install({str(tmp_path)!r})
import trio, trio.to_thread

def spend():
    end = time.thread_time() + {BURN_S}
    while time.thread_time() < end:
        pass

async def main():
    await trio.to_thread.run_sync(spend)

trio.run(main)
"""
    subprocess.run([sys.executable, "-c", program, "node"], check=True, timeout=120)
    (written,) = tmp_path.glob("*.jsonl")
    last = json.loads(written.read_text().splitlines()[-1])  # the one written at exit
    assert last["argv"][1:] == ["node"]
    assert last["seconds"]["thread:spend"] >= BURN_S and last["steps"]["thread:spend"] == 1
    assert last["steps"]["task:__main__.main"] >= 2
    assert last["process_cpu"] >= BURN_S


def _line(wall: float, process_cpu: float, task: float, steps: int, argv: list[str]) -> dict:
    return {
        "wall": wall,
        "process_cpu": process_cpu,
        "argv": argv,
        "seconds": {"task:a": task},
        "steps": {"task:a": steps},
    }


def test_the_summary_takes_each_peers_second_half_and_leaves_other_processes_out(tmp_path):
    peer = [_line(t, 10.0 * t, 4.0 * t, 100 * t, ["x/node/cli/__main__.py", "node"]) for t in range(6)]
    bench = [_line(t, t, t, t, ["scripts/bench_round.py", "--peers"]) for t in range(6)]
    short = peer[:3]  # a peer that wrote too little to have a window
    for name, lines in (("1", peer), ("2", peer), ("3", bench), ("4", short)):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    peers = cbt.read_folder(tmp_path)
    assert len(peers) == 2
    # snapshots 3 (half of 6) to 4 (the last but one): 10 CPU-s, 4 of them in task a's 100 steps
    assert peers[0]["process_cpu"] == 10.0 and peers[0]["seconds"] == {"task:a": 4.0}
    summary = cbt.summarise(peers)
    assert summary["peers"] == 2 and summary["process_cpu_s_per_peer"] == 10.0
    (row,) = summary["rows"]
    assert row["name"] == "task:a" and row["share"] == 0.4 and row["steps_per_peer"] == 100
    assert abs(summary["outside_share"] - 0.6) < 1e-12
    assert "| task:a | 40.0% | 4.000 | 100 |" in cbt.table(summary)
