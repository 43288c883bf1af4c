"""`swarm` answers a bad argument or config before it loads torch, web3 or libp2p, and checks the
data and the device before anything is deployed, started or written. No timing here (the figures
are in docs/BENCHMARKS.md, scripts/bench_cli.py): what is checked is which modules a failing
command imported, in a fresh interpreter, and that nothing was left behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import mechanisms
from node import config as cfg
from node.chain.anvil import free_port
from node.cli import main
from node.learning import data, device, models, partition
from node.protocol import aggregate

HEAVY = ("torch", "web3", "libp2p", "trio", "opacus", "node.learning.data", "mechanisms")


def test_the_config_names_are_the_registries_names():
    """node/config.py writes out the names a config may use (torch-free); the registries that
    implement them must have exactly those."""
    assert cfg.DATASETS == data.DATASETS
    assert set(cfg.IMAGE_DATASETS) == {n for n, m in data.DATASET_META.items() if len(m.input_shape) == 3}
    assert cfg.MODELS == models.MODELS and cfg.DEFAULT_MODELS == models.DEFAULT_MODELS
    assert set(cfg.SCATTER_MODELS) == {m for m in models.MODELS if models.input_features(m) == "scatter"}
    assert cfg.PARTITIONS == partition.SCHEMES and cfg.RULES == aggregate.RULES and cfg.DEVICES == device.DEVICES
    assert tuple(sorted(mechanisms.MECHANISMS)) == cfg.MECHANISMS


def _imported_after(argvs: list[list[str]]) -> list[dict]:
    """Run node.cli.main on each argv in one fresh interpreter; for each, its exit status, stderr
    and the heavy modules loaded so far."""
    probe = f"""
import contextlib, io, json, sys
from node.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
    heavy = [m for m in {HEAVY!r} if m in sys.modules]
    results.append({{"status": status, "err": err.getvalue(), "heavy": heavy}})
print(json.dumps(results))
"""
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(argvs)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_bad_arguments_and_configs_are_answered_before_the_heavy_imports(tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"
    bad = tmp_path / "bad.toml"
    bad.write_text("[swarm]\npeers = 'many'\n")
    ledger = "0x" + "11" * 20
    argvs = [
        ["up", "--peers", "0"],
        ["up", "--set", "data.dataset=svhn"],
        ["up", "--config", str(bad)],
        ["up", "--set", "privacy.mechanism=pnmp"],
        ["up", "--set", "train.device=gpu"],
        ["up", "--dataset", "digits", "--data-dir", str(tmp_path)],
        ["up", "--data-dir", str(tmp_path / "missing")],
        ["up", "--linger"],
        ["simulate", "--fraction", "2"],
        ["node", "--partition", "3/3", "--rpc-url", closed, "--ledger", ledger],
        ["node", "--rpc-url", closed, "--ledger", ledger],
        ["deploy", "--rpc-url", closed],
        ["deploy", "--rpc-url", closed, "--genesis-digest", "abc"],
        ["fund", "--rpc-url", closed, "--to", "0x12"],
        ["fund", "--rpc-url", closed, "--to", ledger],
        ["ledger", "--rpc-url", closed, "--ledger", ledger],
        ["verify", "--rpc-url", closed, "--ledger", ledger, "--archive", str(tmp_path)],
        ["verify", "--run", str(tmp_path)],
        ["dashboard", "--run", str(tmp_path / "missing")],
        ["bench", "nothing"],
    ]
    results = _imported_after([["--help"], ["--version"], *argvs])
    assert [r["status"] for r in results[:2]] == [0, 0]
    for argv, result in zip(argvs, results[2:]):
        lines = result["err"].strip().splitlines()
        assert result["status"] == 2 and len(lines) == 1, (argv, result)
        assert lines[0].startswith(f"swarm {argv[0]}: error: "), (argv, lines)
    assert results[-1]["heavy"] == [], results[-1]["heavy"]  # after all of them: nothing heavy was needed


def test_missing_data_is_one_line_before_anything_is_started(tmp_path):
    """A data folder without the dataset's files: one line naming what is missing and what to do,
    exit status 2, and no run folder (the chain is never started)."""
    out = tmp_path / "run"
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "node.cli", "up", "--data-dir", str(empty), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "train-images-idx3-ubyte" in lines[0] and "--data-dir" in lines[0], lines
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: train.device = cuda is valid")
def test_cuda_without_cuda_is_one_line(tmp_path, capsys):
    """Whether this machine has CUDA is checked where training would start: before any work."""
    out = tmp_path / "sim"
    assert main(["simulate", "--quick", "--set", "train.device=cuda", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("swarm simulate: error: train.device needs CUDA") and "SWARM_TORCH_INDEX" in err, err
    assert not out.exists()
