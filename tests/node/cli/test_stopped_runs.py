"""A run that stopped before its last round says so in the same words in report.md and in `swarm
verify` ("stopped after N of M rounds"), and neither exit status calls it complete: `swarm up`
exits 130 (Ctrl-C) or 1, `swarm verify` 3 when every check of the rounds that ended holds. The
interrupted `swarm up` itself is tests/e2e/test_e2e_budget_and_interrupt.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.cli import main
from node.cli.verify import STOPPED
from node.runs.report import render_markdown, stopped_after


def test_stopped_after_names_what_ended_of_what_was_asked():
    assert stopped_after(2, 5) == "stopped after 2 of 5 rounds"
    assert stopped_after(0, 1) == "stopped after 0 of 1 rounds"
    assert stopped_after(5, 5) is None and stopped_after(6, 5) is None


def test_verify_says_a_run_stopped_and_exits_3(recorded_run, capsys):
    out = recorded_run  # 2 rounds asked for, 2 ended
    assert main(["verify", "--run", str(out), "--json"]) == 0  # all of its 2 rounds: complete
    assert json.loads(capsys.readouterr().out)["stopped"] is None
    # the same ledger read as a swarm that was to run 5 rounds: the 2 that ended hold, the run stopped
    assert main(["verify", "--run", str(out), "--rounds", "5", "--json"]) == STOPPED
    checked = json.loads(capsys.readouterr().out)
    assert checked["ok"] and checked["stopped"] == "stopped after 2 of 5 rounds" and checked["rounds_wanted"] == 5
    assert main(["verify", "--run", str(out), "--rounds", "5"]) == STOPPED
    text = " ".join(capsys.readouterr().out.split())
    assert "every check holds for the rounds that ended, but the run stopped after 2 of 5 rounds" in text, text


def test_report_md_says_the_same_words():
    report = {
        "rounds": [{"round": 1, "state": "finalized", "accuracy": 0.5, "eps": {"0xA": 2.0}, "delta": 0.0}],
        "failure": None,
        "stopped": "stopped after 1 of 5 rounds",
        "interrupted": True,
        "record_eps_spent": None,
        "ledger": "0xLEDGER",
        "chain_id": 31337,
        "mechanism": "pnpm",
        "protects": "sign only",
        "peer_exit_codes": [0],
        "verify_command": "swarm verify --run runs/x",
    }
    report["rounds"][0] |= {"record_eps": {}, "record_delta": None, "gas": 1, "bytes_fetched": 2}
    config = {"train": {"dp_delta": 1e-5}}
    text = "\n".join(render_markdown(Path("runs/x"), report, config))
    assert "**Stopped after 1 of 5 rounds (interrupted).** The rounds that ended verify" in text, text
    assert "FAILED" not in text and "test accuracy: 0.5000 after round 1" in text


def _children(pid: int) -> list[int]:
    """The live child processes of `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def test_a_killed_verify_stops_the_chain_it_started(recorded_run):
    """`kill` (SIGTERM) on `swarm verify` used to end it and leave its Anvil running. The process is
    frozen (SIGSTOP) the moment its Anvil child exists, signalled, then let go: whichever step it
    was in (Anvil starting, or the checks), the chain goes with it."""
    verify = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "verify", "--run", str(recorded_run)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (children := _children(verify.pid)):
        assert verify.poll() is None and time.monotonic() < deadline, "verify never started its chain"
        time.sleep(0.01)
    os.kill(verify.pid, signal.SIGSTOP)
    (wrapper,) = children
    while not (native := _children(wrapper)):  # npm's anvil is a wrapper around the native binary
        assert time.monotonic() < deadline, "the wrapper never started anvil"
        time.sleep(0.01)
    os.kill(verify.pid, signal.SIGTERM)
    os.kill(verify.pid, signal.SIGCONT)
    assert verify.wait(120) == 130, verify.stderr.read() if verify.stderr else ""
    with pytest.raises(ProcessLookupError):  # reaped by verify, not left running
        os.kill(wrapper, 0)
    while any(Path(f"/proc/{pid}/stat").exists() for pid in native):  # the native chain exits after it
        assert time.monotonic() < deadline, f"anvil {native} left running"
        time.sleep(0.05)
