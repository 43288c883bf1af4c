"""A peer whose next commit would pass the swarm's eps cap stops contributing and says so, while
the others go on; Ctrl-C on `swarm up` stops everything and keeps every finished round verifiable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.config import load_config
from node.derive import num_params
from node.runs.local import LocalSwarm

pytestmark = pytest.mark.slow

SETS = ["swarm.peers=4", "swarm.rounds=2", "chain.min_peers=3"]


def test_peer_over_budget_stops_contributing_and_follows(tmp_path):
    d = num_params(load_config(None, SETS))
    # eps 1 per coordinate: d per round, 2d for the run; the cap allows 2.5 d
    config = load_config(None, [*SETS, f"chain.eps_cap={2.5 * d}"])
    greedy = ["privacy.epsilon=2"]  # 2d per round: its second commit would reach 4d > 2.5d
    with LocalSwarm(config, tmp_path / "run", peer_overrides={3: greedy}) as swarm:
        swarm.start()
        swarm.wait(400)
        assert [p.process.returncode for p in swarm.peers] == [0, 0, 0, 0]
        greedy_peer = swarm.peers[3]
        assert greedy_peer.address in swarm.ledger.participants(1)
        assert greedy_peer.address not in swarm.ledger.participants(2)
        assert swarm.ledger.round_info(2).state.name == "FINALIZED"  # the 3 others still make quorum
        assert swarm.ledger.eps_spent(greedy_peer.address) == 2 * d * 1_000_000
        assert all(swarm.ledger.eps_spent(p.address) == 2 * d * 1_000_000 for p in swarm.peers[:3])
        log = (greedy_peer.workdir / "peer.log").read_text()
        assert "past the swarm's cap" in log and "stops contributing" in log
        second = [m for m in greedy_peer.metrics() if m["round"] == 2][-1]
        assert not second["committed"]  # it followed the round and holds the finalized model
        assert second["global_digest"] == bytes(swarm.ledger.finalized_digest(2)).hex()
        swarm.finish(interrupted=False)


def processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(cmdline.parent.name))
        except OSError:  # the process ended while we looked
            pass
    return found


def test_ctrl_c_stops_the_swarm_and_keeps_finished_rounds(tmp_path):
    out = tmp_path / "run"
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "node.cli",
            "up",
            "--rounds",
            "6",
            "--out",
            str(out),
            "--json",
            "--set",
            "chain.min_peers=3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "peers" / "0" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert up.poll() is None, up.communicate()
        assert time.monotonic() < deadline, "no two finished rounds within 300 s"
        time.sleep(0.2)
    up.send_signal(signal.SIGINT)
    stdout, stderr = up.communicate(timeout=120)
    assert up.returncode == 130, stderr[-2000:]
    report = json.loads(stdout)
    assert report["interrupted"] is True
    finished = [r for r in report["rounds"] if r["state"] == "finalized"]
    assert len(finished) >= 2
    assert (out / "chain" / "state.json").exists() and (out / "report.md").exists()
    assert processes_mentioning(str(out)) == []  # no peer process survives its swarm
    check = subprocess.run(
        [sys.executable, "-m", "node.cli", "verify", "--run", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    verified = [r for r in json.loads(check.stdout)["rounds"] if r["state"] == "finalized"]
    assert len(verified) >= len(finished) and all(r["aggregate_ok"] for r in verified)
