"""scripts/bench_secagg.py at tiny sizes: its round unmasks to the plain sum (the script checks it
and raises otherwise), its frame sizes are the protocol's, and the section renders. No timing is
asserted: the figures are the benchmark's, written to docs/BENCHMARKS.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from mechanisms.secagg import messages as m
from node.cli.bench import SUITES

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("bench_secagg", ROOT / "scripts" / "bench_secagg.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_secagg"] = module
    spec.loader.exec_module(module)
    return module


def test_the_bench_round_runs_and_its_section_renders():
    bench = _load()
    sizes, cpu = {}, {}
    for n in (4, 6, 8):
        clock = bench.StepClock()
        sizes[n] = bench.play(n, 300, {n - 1}, clock)
        cpu[n] = clock.spent
        assert sizes[n]["MASKED"] == m.masked_frame_size(32, 300)
        assert sizes[n]["DEALING"] - sizes[4]["DEALING"] == (n - 4) * 66  # 66 bytes per holder
        assert sizes[n]["KEYS"] == m.keys_frame_size(n)  # a pair key per member
        assert all(seconds >= 0 for seconds in clock.spent.values())
    text = bench.render(300, sizes, cpu)
    assert "| 8 |" in text and "ratio" in text
    assert "secagg" in SUITES
