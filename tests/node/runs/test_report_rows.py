"""report.json's per-round rows (node/runs/report.py): what each peer's metrics add up to."""

from __future__ import annotations

from dataclasses import dataclass, field

from node.runs.report import round_rows


@dataclass
class Peer:
    address: str
    records: list[dict] = field(default_factory=list)
    returncode: int | None = 0

    def metrics(self) -> list[dict]:
        return self.records


def record(peer: str, r: int, protocol_cpu_s: float | None) -> dict:
    m = {"peer": peer, "round": r, "state": "finalized", "gas_used": 1000, "committed": True}
    if protocol_cpu_s is not None:
        m["protocol_cpu_s"] = protocol_cpu_s
    return m


def test_each_round_reports_every_peers_protocol_cpu():
    peers = [
        Peer("0xa", [record("0xa", 1, 2.5), record("0xa", 2, 0.4)]),
        Peer("0xb", [record("0xb", 1, 2.1), record("0xb", 2, None)]),  # a peer from before the measure
    ]
    rows = round_rows(peers)
    assert [r["protocol_cpu_s"] for r in rows] == [{"0xa": 2.5, "0xb": 2.1}, {"0xa": 0.4}]
    assert [r["gas"] for r in rows] == [2000, 2000]
