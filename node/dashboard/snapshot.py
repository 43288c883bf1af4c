"""What the page shows, read from a folder: a `swarm up` run folder (run.json, peers/<i>/) or a
`swarm node` workdir (status.json and metrics.jsonl at its top). Nothing here talks to the chain
or the peers: the files are the record (written atomically or as fsynced JSON lines by the peers),
so a live run and a finished one are read the same way.

Every value comes from files other processes wrote (and, through them, from peers and the chain),
so reading is defensive: an unreadable or malformed file is shown as missing, never raised, and
the page renders all text with textContent (node/dashboard/static/dashboard.js)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.runfiles import read_metrics
from node.runs.report import round_rows

EVENTS_FILE = "chain-events.jsonl"  # written by node.dashboard.chainlog while a page is served live
MAX_EVENTS = 300  # the newest events the page gets; the file keeps them all

# What the page plots of each round a peer recorded.
HISTORY_KEYS = (
    "round",
    "state",
    "committed",
    "accuracy",
    "loss",
    "eps_cumulative",
    "delta_cumulative",
    "eps_protects",
    "record_eps_cumulative",
    "record_delta",
    "record_protects",
)


@dataclass
class PeerFolder:
    """One peer's files; `address` and `returncode` make it a node.runs.report.PeerRecord."""

    index: int
    workdir: Path
    address: str = ""
    returncode: int | None = None

    def status(self) -> dict[str, Any]:
        value = _read_json(self.workdir / "status.json")
        return value if isinstance(value, dict) else {}

    def metrics(self) -> list[dict]:
        path = self.workdir / "metrics.jsonl"
        try:
            records = read_metrics(path) if path.exists() else []
        except (OSError, ValueError):
            return []
        # round_rows indexes these keys: a record without them is not one of the peer's round records
        return [
            m
            for m in records
            if isinstance(m, dict) and isinstance(m.get("round"), int) and {"state", "peer"} <= m.keys()
        ]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def peer_folders(folder: Path) -> list[PeerFolder]:
    """The peers of a run folder (peers/<i>/), or the one peer of a `swarm node` workdir."""
    peers_dir = folder / "peers"
    if peers_dir.is_dir():
        found = []
        for d in peers_dir.iterdir():
            if d.is_dir() and d.name.isdigit():
                found.append(PeerFolder(int(d.name), d))
        return sorted(found, key=lambda p: p.index)
    return [PeerFolder(0, folder)]


def read_events(folder: Path, limit: int = MAX_EVENTS) -> list[dict[str, Any]]:
    path = folder / EVENTS_FILE
    if not path.exists():
        return []
    try:
        events = [e for e in read_metrics(path) if isinstance(e, dict)]
    except (OSError, ValueError):
        return []
    return events[-limit:]


def chain_source(folder: Path) -> tuple[str, str] | None:
    """(rpc_url, ledger address) from a run folder's run.json, once `swarm up` has written it."""
    run = _read_json(Path(folder) / "run.json")
    if isinstance(run, dict) and isinstance(run.get("rpc_url"), str) and isinstance(run.get("ledger"), str):
        return run["rpc_url"], run["ledger"]
    return None


def snapshot(folder: Path, *, live: bool) -> dict[str, Any]:
    """Everything the page shows, as one JSON-able dict."""
    folder = Path(folder)
    run = _read_json(folder / "run.json")
    run = run if isinstance(run, dict) else {}
    report = _read_json(folder / "report.json")
    report = report if isinstance(report, dict) else None
    config: dict[str, Any] = run["config"] if isinstance(run.get("config"), dict) else {}
    peers = peer_folders(folder)
    known = {p.get("index"): p for p in run.get("peers", []) if isinstance(p, dict)}
    peer_views = [_peer_view(p, known) for p in peers]
    try:
        rows = round_rows(peers)
    except (KeyError, TypeError, ValueError):  # a record with a malformed figure: show no rounds, not a crash
        rows = []
    ended = {r["round"] for r in rows}
    rounds_wanted = (config.get("swarm") or {}).get("rounds")
    for round_number in sorted({v["round"] for v in peer_views if isinstance(v["round"], int)} - ended):
        if isinstance(rounds_wanted, int) and round_number > rounds_wanted:
            continue  # a peer past its last round reports the next one: never shown as a round
        rows.append({"round": round_number, "state": "running"})
    return {
        "title": folder.name,
        "kind": "run" if run else "node",
        "live": live,
        "finished": report is not None,
        "failure": report.get("failure") if report else None,
        "ledger": run.get("ledger"),
        "chain_id": run.get("chain_id"),
        "rounds_wanted": rounds_wanted,
        "mechanism": (config.get("privacy") or {}).get("mechanism"),
        "protects": run.get("protects"),
        "dp_sgd": bool((config.get("train") or {}).get("dp_sgd")),
        "rounds": sorted(rows, key=lambda r: r["round"]),
        "peers": peer_views,
        "events": read_events(folder),
    }


def _peer_view(p: PeerFolder, known: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """One peer's row and history; sets `p.address` from run.json (`known`) or its status."""
    status, metrics = p.status(), p.metrics()
    p.address = str(known.get(p.index, {}).get("address") or status.get("address") or "")
    last = metrics[-1] if metrics else {}
    return {
        "index": p.index,
        "address": p.address,
        "round": status.get("round"),
        "phase": status.get("phase", "starting"),
        "updated": status.get("time"),
        "accuracy": last.get("accuracy"),
        "history": [{key: m.get(key) for key in HISTORY_KEYS} for m in metrics],
    }
