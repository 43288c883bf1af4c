"""`swarm up` without --dashboard keeps the ledger's events in its run folder (chain-events.jsonl,
read once more before the chain stops), so `swarm dashboard --run DIR` shows them afterwards.
A real `swarm up` (Anvil, the ledger, two peer processes) stopped by Ctrl-C once its peers run:
the peers' registrations, sent before they start, are in the file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from node.dashboard.snapshot import EVENTS_FILE, snapshot

SETS = ["swarm.peers=2", "swarm.rounds=2", "chain.min_peers=2", "data.limit=200", "data.test_limit=100"]


def test_swarm_up_keeps_the_chain_events_without_a_dashboard(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "node.cli", "up", "--out", str(out), "--json"]
    up = subprocess.Popen(
        [*cmd, *(a for s in SETS for a in ("--set", s))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not list(out.glob("peers/*/status.json")):  # a peer process runs
            assert up.poll() is None, up.communicate()
            assert time.monotonic() < deadline, "no peer started within 300 s"
            time.sleep(0.2)
        up.send_signal(signal.SIGINT)
        stdout, stderr = up.communicate(timeout=180)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 130, stderr[-3000:]
    assert json.loads(stdout)["interrupted"] is True
    run = json.loads((out / "run.json").read_text())
    events = [json.loads(line) for line in (out / EVENTS_FILE).read_text().splitlines()]
    assert events[0]["event"] == "RoundOpened" and events[0]["args"]["round"] == 1, events[:2]
    registered = [e["args"]["peer"] for e in events if e["event"] == "Registered"]
    assert registered == [p["address"] for p in run["peers"]], events
    assert [(e["block"], e["log_index"]) for e in events] == sorted({(e["block"], e["log_index"]) for e in events})
    assert snapshot(out, live=False)["events"] == events  # what `swarm dashboard --run` shows
    assert not list(out.glob(f"peers/*/{EVENTS_FILE}"))  # kept once, by `swarm up`, not by each peer
