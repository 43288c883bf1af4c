"""scripts/bench_dpsgd.py: with tiny sizes, every variant trains, its ratio to plain SGD is a
positive finite number and the section renders (no timing is asserted: the figures are the
benchmark's, written to docs/BENCHMARKS.md, never a test's pass/fail)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from node.cli.bench import SUITES

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("bench_dpsgd", ROOT / "scripts" / "bench_dpsgd.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_dpsgd"] = module
    spec.loader.exec_module(module)
    return module


bd = _load()


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", ["scatter-linear", "pnpm-fmnist"])
def test_every_variant_runs_and_gives_a_positive_finite_ratio(name: str) -> None:
    result = bd.measure(name, batch=4, steps=2, repeat=1, data="random")
    assert list(result["rows"]) == bd.variants_for(name)
    assert ("k2" in result["rows"]) == (name == "pnpm-fmnist")  # augmentations only on pixels
    assert ("ghost" in result["rows"]) == (name == "scatter-linear")  # ghost clipping only without convolutions
    assert result["rows"]["sgd"]["ratio"] == 1.0
    for row in result["rows"].values():
        for key in ("s_per_record", "ms_per_step", "ratio", "cpu_ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, (name, key, row)


def test_per_sample_modes_take_the_accountants_steps() -> None:
    x, y = bd.load_inputs("pnpm-fmnist", 12, "random")
    dp = bd.DPSGDPolicy(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=4, epochs=1)
    for mode in bd.PER_SAMPLE_MODES:
        model = bd.init_model("pnpm-fmnist", input_shape=bd.IMAGE_SHAPE, num_classes=10, seed=0)
        before = [p.detach().clone() for p in model.parameters()]
        assert bd.train_per_sample(model, x, y, dp, torch.Generator().manual_seed(0), mode) == 3
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), mode
        assert not any(hasattr(p, "grad_sample") and p.grad_sample is not None for p in model.parameters())


def test_the_section_renders_and_is_written_between_its_markers(tmp_path: Path) -> None:
    row = {"s_per_record": 1e-4, "ms_per_step": 25.0, "ratio": 1.0, "cpu_ratio": 1.0}
    result = {
        "model": "pnpm-fmnist",
        "parameters": 42_090,
        "batch": 256,
        "records": 1024,
        "rows": {
            "sgd": row,
            "trained": {**row, "ratio": 2.5},
            "hooks": {**row, "ratio": 3.5},
            "ew": {**row, "ratio": 2.0},
            "functorch": {**row, "ratio": 4.0},
            "k2": {**row, "ratio": 7.0},
        },
    }
    md = bd.render([result], steps=4, repeat=5, threads=1, data="random", load=(1.0, 2.0))
    assert md.startswith("## DP-SGD cost per sample")
    lines = md.splitlines()
    assert sum(line.startswith("| pnpm-fmnist |") for line in lines) == 6
    assert "| **2.50** | 1.00 | <= 3 | yes |" in md and "| 7.00 | 1.00 | <= 3 | **no** |" in md
    assert "met for pnpm-fmnist" in md and "expanded weights" in md
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\n<!-- bench:other -->\nkept\n<!-- /bench:other -->\n")
    bd.benchdoc.write_section("dpsgd", md, doc)
    bd.benchdoc.write_section("dpsgd", md, doc)  # replaced, not appended twice
    text = doc.read_text()
    assert text.count("<!-- bench:dpsgd -->") == 1 and "kept" in text


def test_swarm_bench_knows_the_suite() -> None:
    assert "dpsgd" in SUITES
    assert (ROOT / "scripts" / "bench_dpsgd.py").is_file()
