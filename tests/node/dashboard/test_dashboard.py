"""The dashboard without a browser: the snapshot read from a run folder (malformed files included;
gas and bytes per round), the HTTP routes, the event stream, the bounds on chain values, and
`swarm dashboard --run DIR` run as a command. The browser test is tests/e2e/test_e2e_dashboard.py."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from node.dashboard.chainlog import MAX_TEXT, _plain
from node.dashboard.server import Dashboard
from node.dashboard.snapshot import EVENTS_FILE, snapshot


def metric(peer: str, round_number: int, **extra: object) -> str:
    record = {"peer": peer, "round": round_number, "state": "finalized", "accuracy": 0.5 + round_number / 10}
    record.update(loss=1.0, eps_cumulative=2.0 * round_number, delta_cumulative=0.0, eps_protects="sign", gas_used=100)
    record.update(extra)
    return json.dumps(record) + "\n"


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    for i in (0, 1):
        (run / "peers" / str(i)).mkdir(parents=True)
    config = {"swarm": {"rounds": 3}, "privacy": {"mechanism": "pnpm"}, "train": {"dp_sgd": False}}
    peers = [{"index": 0, "address": "0xA"}, {"index": 1, "address": "0xB"}]
    (run / "run.json").write_text(json.dumps({"ledger": "0xL", "chain_id": 31337, "config": config, "peers": peers}))
    p0, p1 = run / "peers" / "0", run / "peers" / "1"
    (p0 / "metrics.jsonl").write_text(metric("0xA", 1) + metric("0xA", 2))
    (p0 / "status.json").write_text(json.dumps({"round": 3, "phase": "training", "address": "0xA"}))
    # peer 1: a bad line in the middle (read_metrics refuses the file), a status that is not an object
    (p1 / "metrics.jsonl").write_text(metric("0xB", 1) + "{not json\n" + metric("0xB", 2))
    (p1 / "status.json").write_text("[1, 2]")
    (run / EVENTS_FILE).write_text(json.dumps({"block": 1, "event": "RoundOpened", "args": {"round": 1}}) + "\n")
    return run


def test_snapshot_reads_rounds_peers_and_events_and_survives_bad_files(run_folder):
    state = snapshot(run_folder, live=True)
    assert [(r["round"], r["state"]) for r in state["rounds"]] == [(1, "finalized"), (2, "finalized"), (3, "running")]
    assert state["rounds"][1]["eps"] == {"0xA": 4.0} and state["rounds"][1]["gas"] == 100
    assert [(p["address"], p["phase"], len(p["history"])) for p in state["peers"]] == [
        ("0xA", "training", 2),
        ("0xB", "starting", 0),  # unreadable files: shown as nothing yet, never an error
    ]
    assert state["events"][0]["event"] == "RoundOpened" and state["mechanism"] == "pnpm" and not state["finished"]


def test_gas_and_bytes_fetched_per_round_are_summed_over_the_peers(tmp_path):
    """The page's gas and bytes chart: per round, the gas every peer paid and the blob bytes every
    peer fetched from others (metrics' gas_used and bytes_received), added up."""
    for i, address in enumerate(("0xA", "0xB")):
        workdir = tmp_path / "peers" / str(i)
        workdir.mkdir(parents=True)
        lines = [
            metric(address, r, gas_used=1000 * r + 10 * i, bytes_received=100_000 * r + i, bytes_sent=7) for r in (1, 2)
        ]
        (workdir / "metrics.jsonl").write_text("".join(lines))
    rounds = snapshot(tmp_path, live=False)["rounds"]
    assert [(r["round"], r["gas"], r["bytes_fetched"]) for r in rounds] == [(1, 2010, 200_001), (2, 4010, 400_001)]


def test_a_peer_past_the_last_round_adds_no_round(run_folder):
    (run_folder / "peers" / "0" / "status.json").write_text(json.dumps({"round": 4, "phase": "done"}))
    assert [r["round"] for r in snapshot(run_folder, live=False)["rounds"]] == [1, 2]


def test_a_node_workdir_is_one_peer(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(metric("0xC", 1))
    (tmp_path / "status.json").write_text(json.dumps({"round": 1, "phase": "done", "address": "0xC"}))
    state = snapshot(tmp_path, live=False)
    assert state["kind"] == "node" and [p["address"] for p in state["peers"]] == ["0xC"]
    assert state["rounds"][0]["accuracy"] == pytest.approx(0.6)


def test_routes_headers_and_the_event_stream(run_folder):
    with Dashboard(run_folder) as served:
        assert served.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(served.url, timeout=5) as page:
            assert b"/static/uplot.min.js" in page.read()
            assert "script-src 'self'" in page.headers["Content-Security-Policy"]
        with urllib.request.urlopen(served.url + "static/uplot.min.js", timeout=5) as script:
            assert b"uPlot" in script.read(300)
        for path in ("static/../run.json", "static/LICENSE-uPlot.txt", "run.json", "api/../run.json"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(served.url + path, timeout=5)
            assert refused.value.code == 404
        state = json.loads(urllib.request.urlopen(served.url + "api/state", timeout=5).read())
        assert len(state["rounds"]) == 3
        stream = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
        stream.request("GET", "/events")
        response = stream.getresponse()
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.readline() == b"event: state\n"
        first = json.loads(response.readline().removeprefix(b"data: "))
        assert first["rounds"] == state["rounds"]
    stream.close()


def test_a_rebound_host_name_and_a_flood_of_streams_are_refused(run_folder):
    """DNS rebinding: a request naming another host (a page whose name now resolves to 127.0.0.1)
    gets 421, not the run's state; event streams beyond MAX_STREAMS get 503 while the first are served."""
    from node.dashboard.server import MAX_STREAMS

    with Dashboard(run_folder) as served:
        for host in (f"evil.example:{served.port}", "127.0.0.1:1", "localhost"):
            conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
            conn.request("GET", "/api/state", headers={"Host": host})
            response = conn.getresponse()
            assert response.status == 421 and b"rounds" not in response.read(), host
            conn.close()
        conn = http.client.HTTPConnection("localhost", served.port, timeout=5)
        conn.request("GET", "/api/state")
        assert conn.getresponse().status == 200
        conn.close()
        streams = []
        for _ in range(MAX_STREAMS):
            conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
            conn.request("GET", "/events")
            response = conn.getresponse()
            assert response.status == 200 and response.readline() == b"event: state\n"
            streams.append(conn)
        extra = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
        extra.request("GET", "/events")
        assert extra.getresponse().status == 503
        extra.close()
    for conn in streams:
        conn.close()


def test_chain_values_are_bounded():
    assert _plain(b"\x01" * 500).startswith("0x0101") and len(_plain(b"\x01" * 500)) == MAX_TEXT
    assert _plain(b'{"name":"pnpm"}') == '{"name":"pnpm"}'
    assert _plain(2**64) == str(2**64) and _plain(5) == 5 and _plain(True) is True


def test_swarm_dashboard_serves_a_finished_run_until_stopped(run_folder):
    """`swarm dashboard --run DIR` as a command: it prints its URL on 127.0.0.1, serves the folder's
    state (not live: the run is over) with its chain events, and stops on SIGTERM (as on Ctrl-C)
    with exit status 0, its port closed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "dashboard", "--run", str(run_folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        found = re.fullmatch(r"dashboard: (http://127\.0\.0\.1:(\d+)/) \(Ctrl-C to stop\)\n", line)
        assert found, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        with urllib.request.urlopen(found[1] + "api/state", timeout=10) as response:
            state = json.loads(response.read())
        assert state["title"] == "run" and state["kind"] == "run" and state["live"] is False
        assert [r["round"] for r in state["rounds"]] == [1, 2, 3] and state["ledger"] == "0xL"
        assert [e["event"] for e in state["events"]] == ["RoundOpened"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and err.strip() == "swarm dashboard: stopped", err
    with pytest.raises(OSError):  # nothing listens there any more
        socket.create_connection(("127.0.0.1", int(found[2])), timeout=2).close()


def test_swarm_dashboard_refuses_what_is_no_run(tmp_path, capsys):
    from node.cli import main

    assert main(["dashboard", "--run", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == f"swarm dashboard: error: --run {tmp_path / 'nowhere'} is not a folder"
    assert main(["dashboard", "--run", str(tmp_path)]) == 2
    assert "is neither a run folder (run.json, peers/) nor a swarm node workdir" in capsys.readouterr().err
