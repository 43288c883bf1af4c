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

from mechanisms.record_level import record_level_spend
from node.config import load_config
from node.derive import dp_policy, eps_step_micro
from node.protocol.wire import eps_to_micro
from node.runs.local import LocalSwarm

pytestmark = pytest.mark.slow

BASELINE = Path(__file__).resolve().parents[2] / "scripts" / "baseline.toml"  # digits: 337 records a peer
SETS = ["swarm.peers=4", "swarm.rounds=2", "chain.min_peers=3", "chain.commit_window=240", "train.dp_sgd=true"]
CAP = 12.0  # record-level: above what a 337-record peer spends in 2 rounds (7.9), below a 100-record peer's (16.8)


def test_peer_over_its_record_level_budget_stops_contributing_and_follows(tmp_path):
    """Every peer runs the swarm's policy (DP-SGD under PNPM). Peer 3 holds fewer records (its
    data is its own business), so its record-level eps grows faster and its second commit would
    pass the record-level cap: it stops contributing and follows. The three others finalize both
    rounds, and every figure on chain is exactly what the policy spends."""
    config = load_config(BASELINE, [*SETS, f"chain.record_eps_cap={CAP}"])
    policy = dp_policy(config)
    small = ["data.limit=400"]  # 100 records instead of 337
    with LocalSwarm(config, tmp_path / "run", peer_overrides={3: small}) as swarm:
        swarm.start()
        swarm.wait(500)
        assert [p.process.returncode for p in swarm.peers] == [0, 0, 0, 0]
        small_peer = swarm.peers[3]
        assert small_peer.address in swarm.ledger.participants(1)
        assert small_peer.address not in swarm.ledger.participants(2)
        assert swarm.ledger.round_info(2).state.name == "FINALIZED"  # the 3 others still make quorum
        log = (small_peer.workdir / "peer.log").read_text()
        assert "record-level eps" in log and "past the swarm's cap" in log and "stops contributing" in log
        second = [m for m in small_peer.metrics() if m["round"] == 2][-1]
        assert not second["committed"]  # it followed the round and holds the finalized model
        assert second["global_digest"] == bytes(swarm.ledger.finalized_digest(2)).hex()
        # on chain: exactly the policy's figures, both of them
        step = eps_step_micro(config)
        for p in swarm.peers[:3]:
            history = swarm.ledger.commit_history(p.address)
            counts = [h.num_samples for h in history]
            assert len(counts) == 2 and counts[0] == counts[1] > 300
            assert swarm.ledger.eps_spent(p.address) == 2 * step
            record = swarm.ledger.record_eps_spent(p.address)
            assert record == eps_to_micro(record_level_spend(policy, counts).epsilon)
            # the peer keeps its accountant in its workdir: the same composition, continued over rounds
            last = [m for m in p.metrics() if m["round"] == 2][-1]  # metrics.jsonl: each eps with scope and delta
            assert last["record_eps_cumulative"] == pytest.approx(record / 1e6, abs=1e-6)
            assert last["record_delta"] == 1e-5 and last["record_protects"] == "each training record (DP-SGD)"
            assert "sign only" in last["eps_protects"] and last["delta_cumulative"] == 0.0
            saved = json.loads((p.workdir / "privacy-accountant.json").read_text())
            assert len(saved["history"]) == 2 and saved["epsilon"] == pytest.approx(record / 1e6, abs=1e-6)
        assert swarm.ledger.record_eps_spent(small_peer.address) == eps_to_micro(
            record_level_spend(policy, [100]).epsilon
        )
        swarm.finish(interrupted=False)
        report = (swarm.out / "report.md").read_text()
        assert "each training record (DP-SGD)" in report


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
            "--set",
            "chain.block_time=1",  # rounds of a few seconds: the Ctrl-C lands mid-run, not after the end
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    # Any peer's metrics: under load one peer may start late and write its lines only while it
    # catches up at the very end of the run (then the Ctrl-C would land after the swarm's end).
    def most_rounds() -> int:
        files = (out / "peers").glob("*/metrics.jsonl")
        return max((len(f.read_text().splitlines()) for f in files), default=0)

    deadline = time.monotonic() + 300
    while most_rounds() < 2:
        assert up.poll() is None, up.communicate()
        assert time.monotonic() < deadline, "no two finished rounds within 300 s"
        time.sleep(0.2)
    assert up.poll() is None, "the swarm ended before the Ctrl-C"
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
    # every check holds, and verify says what report.md says: the run stopped early (exit status 3)
    assert check.returncode == 3, check.stdout + check.stderr
    checked = json.loads(check.stdout)
    verified = [r for r in checked["rounds"] if r["state"] == "finalized"]
    assert len(verified) >= len(finished) and all(r["aggregate_ok"] for r in verified)
    assert checked["ok"] and checked["stopped"] == report["stopped"] and report["stopped"].endswith(" of 6 rounds")
    assert f"**{report['stopped'].capitalize()} (interrupted).**" in (out / "report.md").read_text()
