"""`swarm up --dashboard` watched in a real headless Chromium (Debian's): the page shows the second
round while the swarm still runs (server-sent events), with peers, curves and the chain's events;
a screenshot is saved into the test's folder. Then the finished folder is served again as
`swarm dashboard --run DIR` does, with the chain gone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from node.chain.anvil import free_port
from node.dashboard.server import Dashboard
from tests.e2e.cdp import Browser, chromium_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not chromium_available(),
        reason="Debian's chromium is not installed (./run bootstrap installs it: apt-get install chromium)",
    ),
]

# The cheapest swarm that has a second round: 2 peers on a slice of digits.
SETS = ["swarm.peers=2", "swarm.rounds=2", "chain.min_peers=2", "data.limit=300", "data.test_limit=100"]
ROUND_2 = "document.querySelector('#rounds tr[data-round=\"2\"]')"


def wait_for_line(path: Path, prefix: str, process: subprocess.Popen, timeout: float) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for line in path.read_text().splitlines():
            if line.startswith(prefix):
                return line
        assert process.poll() is None, f"swarm up exited early:\n{path.read_text()[-3000:]}"
        time.sleep(0.1)
    raise TimeoutError(f"no line starting {prefix!r} in {path}")


def test_live_page_in_chromium_shows_the_second_round(tmp_path):
    port, out, err = free_port(), tmp_path / "run", tmp_path / "up.err"
    sets = [a for s in SETS for a in ("--set", s)]
    cmd = [
        sys.executable,
        "-m",
        "node.cli",
        "up",
        "--out",
        str(out),
        "--json",
        "--dashboard",
        "--dashboard-port",
        str(port),
    ]
    with open(err, "w") as stderr:
        up = subprocess.Popen([*cmd, *sets], stdout=subprocess.PIPE, stderr=stderr, text=True)
    browser = None
    try:
        url = f"http://127.0.0.1:{port}/"
        assert wait_for_line(err, "dashboard: ", up, 120) == f"dashboard: {url}"  # printed at start
        browser = Browser(url, tmp_path / "chromium-profile")
        # Live: round 2 shows up while the swarm is still running, pushed to the open page.
        browser.wait_for(f"{ROUND_2} !== null", 90)  # (a DOM node does not come back by value: test it here)
        assert up.poll() is None, "round 2 appeared only after the run had ended"
        assert browser.wait_for(f"{ROUND_2}.dataset.state === 'finalized' && 'yes'", 60) == "yes"
        assert browser.evaluate("document.querySelectorAll('#peers tbody tr').length") == 2
        assert browser.evaluate("document.querySelectorAll('.charts canvas').length") == 3  # uPlot, served locally
        # The chain's events reach the page through the event log (polled once a second), which may
        # trail the peers' own files that finalized round 2 above: wait for them, then check.
        wanted = ["Registered", "Committed", "RoundClosed", "Attested", "RoundFinalized"]
        shown = "[...document.querySelectorAll('#events tbody tr td:nth-child(2)')].map(t => t.textContent)"
        has_all = f"{json.dumps(wanted)}.every(name => {shown}.includes(name)) && 'yes'"
        assert browser.wait_for(has_all, 30) == "yes", browser.evaluate(shown)
        assert "eps protects sign only" in browser.evaluate("document.getElementById('summary').textContent")
        shot = tmp_path / "dashboard.png"
        browser.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        stdout, _ = up.communicate(timeout=120)
        assert up.returncode == 0, err.read_text()[-3000:]
        assert json.loads(stdout)["rounds"][1]["state"] == "finalized"
    finally:
        if browser:
            browser.close()
        if up.poll() is None:
            up.kill()
            up.wait()

    # After the run (the chain has stopped): the folder alone serves the same page's data.
    with Dashboard(out, live=False) as served:
        state = json.loads(urllib.request.urlopen(served.url + "api/state", timeout=10).read())
    assert [r["state"] for r in state["rounds"]] == ["finalized", "finalized"] and state["finished"]
    assert any(e["event"] == "RoundFinalized" and e["args"]["round"] == 2 for e in state["events"])
