"""End to end under secure aggregation: `swarm up --config examples/secure-demo.toml`, made smaller
(2 rounds, a smaller slice, shorter windows), on a real Anvil with real peer processes on
127.0.0.1. Every round finalizes, every peer holds the same model after each, and `swarm verify`
recomputes each round's sum from the archived frames and the model stepped from it; with a
MASKED frame of the archive altered, it fails and names the round and the frame's sender."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.secure_kit import altered_masked_copy

pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[2] / "examples" / "secure-demo.toml"
# 2 rounds of 64 s commit windows (KEYS, its acknowledgments, DEALING, its acknowledgments and the
# complaints 8 s each: the commits begin at 40 s) and 30 s attestation windows
SMALLER = [
    "swarm.rounds=2",
    "data.limit=5000",
    "data.test_limit=1000",
    "chain.commit_window=256",
    "chain.attest_window=120",
]


def swarm_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def secure_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("secure") / "run"
    sets = [a for s in SMALLER for a in ("--set", s)]
    proc = swarm_cli("up", "--config", str(DEMO), "--out", str(out), "--json", *sets)
    assert proc.returncode == 0, f"swarm up failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n" + peer_logs(out)
    return out


def peer_logs(run: Path) -> str:
    return "\n".join(
        f"--- peer {d.name}\n" + (d / "peer.log").read_text(errors="replace")[-2000:]
        for d in sorted((run / "peers").glob("*"))
        if (d / "peer.log").exists()
    )


def test_a_secure_swarm_finalizes_agrees_and_verifies(secure_run):
    report = json.loads((secure_run / "report.json").read_text())
    assert [(r["round"], r["state"]) for r in report["rounds"]] == [(1, "finalized"), (2, "finalized")], report
    assert report["failure"] is None
    per_peer = {
        d.name: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line]
        for d in sorted((secure_run / "peers").iterdir())
    }
    assert len(per_peer) == 5
    for r in (1, 2):
        held = {peer: next(m["global_digest"] for m in rounds if m["round"] == r) for peer, rounds in per_peer.items()}
        assert len(set(held.values())) == 1, (r, held)
    # the figure on chain is secure aggregation's record-level eps, the same for every peer, within the target
    spent = report["eps_spent"]
    assert len(spent) == 5 and len(set(spent.values())) == 1 and 0 < next(iter(spent.values())) <= 3.0, spent

    proc = swarm_cli("verify", "--run", str(secure_run), "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict = json.loads(proc.stdout)
    ended = [r for r in verdict["rounds"] if r["state"] != "open"]
    assert [r["round"] for r in ended] == [1, 2]
    assert all(r["aggregate_ok"] and r["included"] == 5 and r["eps_ok"] == 5 for r in ended), ended


def test_verify_names_an_altered_masked_frame(secure_run, tmp_path):
    run = tmp_path / "copy"
    sender = altered_masked_copy(secure_run, run, 2)

    proc = swarm_cli("verify", "--run", str(run), "--json")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failures = json.loads(proc.stdout)["failures"]
    assert {f["round"] for f in failures} == {2}, failures
    assert any(f["peer"] == sender.peer and f["check"] == "secure" for f in failures), failures
    assert any(f["peer"] == "-" and f["check"] in ("secure", "aggregate") for f in failures), failures
