"""The run folder's summary: per-round metrics (JSONL), a plot, and a report that names the
ledger and the command that verifies the run. PNPM's eps is labelled sign-only everywhere."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from matplotlib.figure import Figure

from node.chain.client import LedgerClient
from node.chain.pipelined import PipelinedClient
from node.protocol.wire import eps_from_micro
from node.runfiles import MetricsWriter, write_json_atomic


class PeerRecord(Protocol):
    """What the report reads of a peer: its address, exit code and metrics."""

    address: str
    returncode: int | None

    def metrics(self) -> list[dict]: ...


def round_rows(peers: Sequence[PeerRecord]) -> list[dict]:
    """One row per round from every peer's metrics: the global model is the same on every
    peer, so accuracy is taken from any peer that evaluated it (they agree bit for bit)."""
    by_round: dict[int, dict] = {}
    for p in peers:
        for m in p.metrics():
            row = by_round.setdefault(
                m["round"],
                {
                    "round": m["round"],
                    "state": m["state"],
                    "accuracy": None,
                    "loss": None,
                    "eps": {},
                    "delta": 0.0,
                    "record_eps": {},  # DP-SGD's record-level eps per peer (empty without DP-SGD)
                    "record_delta": None,
                    "gas": 0,
                    "bytes_fetched": 0,
                    "committed": 0,
                    "train_seconds": [],
                    "round_seconds": [],
                    "protocol_cpu_s": {},  # per peer: its process's CPU less training and evaluation
                    "rpc_requests": {},  # per peer: HTTP requests to its chain endpoint over the round
                },
            )
            row["state"] = m["state"]
            if m.get("accuracy") is not None:
                row["accuracy"], row["loss"] = m["accuracy"], m["loss"]
            if m.get("eps_cumulative") is not None:
                row["eps"][m["peer"]] = m["eps_cumulative"]
                row["delta"] = max(row["delta"], float(m.get("delta_cumulative") or 0.0))
            if m.get("record_eps_cumulative") is not None:
                row["record_eps"][m["peer"]] = m["record_eps_cumulative"]
                row["record_delta"] = m.get("record_delta")
            row["gas"] += int(m.get("gas_used") or 0)
            row["bytes_fetched"] += int(m.get("bytes_received") or 0)
            row["committed"] += bool(m.get("committed"))
            row["train_seconds"].append(m.get("train_seconds") or 0.0)
            row["round_seconds"].append(m.get("round_seconds") or 0.0)
            if m.get("protocol_cpu_s") is not None:
                row["protocol_cpu_s"][m["peer"]] = m["protocol_cpu_s"]
            if m.get("rpc_requests") is not None:
                row["rpc_requests"][m["peer"]] = m["rpc_requests"]
    rows = []
    for r in sorted(by_round):
        row = by_round[r]
        row["train_seconds"] = max(row["train_seconds"])
        row["round_seconds"] = max(row["round_seconds"])
        rows.append(row)
    return rows


ENDED_STATES = ("finalized", "aborted")


def stopped_after(rounds_ended: int, rounds_wanted: int) -> str | None:
    """ "stopped after N of M rounds" when fewer rounds ended than the run asked for, else None:
    what report.md and `swarm verify` both say of a run that did not finish."""
    if rounds_ended >= rounds_wanted:
        return None
    return f"stopped after {rounds_ended} of {rounds_wanted} rounds"


def run_failure(rows: list[dict], rounds_wanted: int, interrupted: bool) -> str | None:
    """Why a finished run failed, or None: no round finalized, more than half of the rounds that
    ended were aborted, or (not interrupted) fewer rounds ended than were asked for. A run that
    learnt nothing must not look like a success."""
    ended = [r for r in rows if r["state"] in ENDED_STATES]
    finalized = sum(r["state"] == "finalized" for r in ended)
    aborted = len(ended) - finalized
    if not finalized:
        return f"no round finalized ({aborted} aborted, {len(rows) - len(ended)} never ended): the swarm learnt nothing"
    if 2 * aborted > len(ended):
        return f"{aborted} of {len(ended)} rounds were aborted (no majority agreed on an aggregate in time)"
    stopped = stopped_after(len(ended), rounds_wanted)
    if not interrupted and stopped:
        return f"{stopped}: the peers ended before the last round"
    return None


def plot(rows: list[dict], path: Path) -> None:
    # The object API, not pyplot: no global figure state and no display backend to choose.
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.subplots()
    rounds = [r["round"] for r in rows if r["accuracy"] is not None]
    ax.plot(rounds, [r["accuracy"] for r in rows if r["accuracy"] is not None], "o-", color="tab:blue")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy", color="tab:blue")
    ax.set_ylim(0, 1)
    ax2 = ax.twinx()
    eps_rounds = [r["round"] for r in rows if r["eps"]]
    ax2.plot(eps_rounds, [max(r["eps"].values()) for r in rows if r["eps"]], "s--", color="tab:red")
    ax2.set_ylabel("max eps per peer (cumulative)", color="tab:red")
    ax.set_title("accuracy and privacy spend per round")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_report(
    out: Path, peers: Sequence[PeerRecord], ledger: LedgerClient | PipelinedClient, run_info: dict, interrupted: bool
) -> dict:
    rows = round_rows(peers)
    with MetricsWriter(out / "metrics.jsonl") as metrics:
        for row in rows:
            metrics.write(row)
    if rows and run_info["config"]["output"]["plot"]:
        plot(rows, out / "progress.png")
    eps_spent: dict[str, float | None] = {}
    record_eps_spent: dict[str, float | None] = {}
    for p in peers:
        try:
            eps_spent[p.address] = eps_from_micro(ledger.eps_spent(p.address))
            record_eps_spent[p.address] = eps_from_micro(ledger.record_eps_spent(p.address))
        except Exception:  # the chain may be gone after a hard stop; metrics still hold the figures
            eps_spent[p.address] = record_eps_spent[p.address] = None
    dp_sgd = bool(run_info["config"]["train"]["dp_sgd"])
    wanted = int(run_info["config"]["swarm"]["rounds"])
    try:  # what `swarm verify` counts: the rounds the ledger ended (it opens the next one as one ends)
        ended = min(ledger.current_round() - 1, wanted)
    except Exception:  # the chain is gone after a hard stop: what the peers recorded
        ended = sum(r["state"] in ENDED_STATES for r in rows)
    report = {
        "run": str(out),
        "ledger": run_info["ledger"],
        "chain_id": run_info["chain_id"],
        "interrupted": interrupted,
        "failure": run_failure(rows, wanted, interrupted),
        "stopped": stopped_after(ended, wanted),
        "rounds_wanted": wanted,
        "rounds": rows,
        "eps_spent": eps_spent,
        "record_eps_spent": record_eps_spent if dp_sgd else None,
        "mechanism": run_info["config"]["privacy"]["mechanism"],
        "protects": run_info["protects"],  # from the mechanism's guarantee (node.runs.local)
        "peer_exit_codes": [p.returncode for p in peers],
        "verify_command": f"swarm verify --run {out}",
        "finished": time.time(),
    }
    write_json_atomic(out / "report.json", report)
    (out / "report.md").write_text("\n".join(render_markdown(out, report, run_info["config"])) + "\n")
    return report


def render_markdown(out: Path, report: dict, config: dict) -> list[str]:
    rows, failure, stopped = report["rounds"], report["failure"], report["stopped"]
    dp_sgd = report["record_eps_spent"] is not None
    if failure:
        verdict = [f"**FAILED: {failure}.** See the peers' logs: `{out}/peers/*/peer.log`.", ""]
    elif stopped:
        why = "interrupted" if report["interrupted"] else "the peers ended early"
        verdict = [f"**{stopped.capitalize()} ({why}).** The rounds that ended verify; the others never ran.", ""]
    else:
        verdict = []
    lines = [
        f"# Swarm run {out.name}",
        "",
        *verdict,
        f"- ledger: `{report['ledger']}` (chain id {report['chain_id']})",
        *_figures(report, config),
        f"- mechanism: `{report['mechanism']}`; its eps (whole shared update) protects {report['protects']}",
        f"- record-level eps: each training record (DP-SGD), replace-one neighbours, at delta "
        f"{config['train']['dp_delta']:g}, computed from each peer's declared sample count (numSamples, at most "
        f"{config['chain']['max_samples']:,}): a peer that declares more records than it holds records less than its "
        "records get"
        if dp_sgd
        else "- record-level eps: the figure above (secure aggregation records it as both of a commit's figures)"
        if report["mechanism"] == "secagg"
        else "- record-level eps: none (no DP-SGD: the training records have no guarantee of their own)",
        f"- peers: {len(report['peer_exit_codes'])}, exit codes {report['peer_exit_codes']}"
        + (" (interrupted)" if report["interrupted"] else ""),
        f"- verify: `{report['verify_command']}`",
        "",
        "| round | state | accuracy | max eps per peer (delta), whole update | max record-level eps (delta), "
        "each training record | gas | bytes fetched |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = f"{r['accuracy']:.4f}" if r["accuracy"] is not None else "-"
        eps = f"{max(r['eps'].values()):.6g} ({r['delta']:g})" if r["eps"] else "-"
        rec = f"{max(r['record_eps'].values()):.6g} ({r['record_delta']:g})" if r["record_eps"] else "-"
        lines.append(f"| {r['round']} | {r['state']} | {acc} | {eps} | {rec} | {r['gas']:,} | {r['bytes_fetched']:,} |")
    return lines


def _figures(report: dict, config: dict) -> list[str]:
    """The run's outcome in two lines: the last finalized model's accuracy, and the privacy each
    peer spent (the largest over peers) with its delta and what it protects."""
    finalized = [r for r in report["rounds"] if r["state"] == "finalized" and r["accuracy"] is not None]
    lines = [
        f"- test accuracy: {finalized[-1]['accuracy']:.4f} after round {finalized[-1]['round']}"
        if finalized
        else "- test accuracy: none (no round finalized)"
    ]
    spent = [r for r in report["rounds"] if r.get("eps")]  # cumulative: the last such round holds the totals
    last = spent[-1] if spent else {}
    if last:
        privacy = (
            f"- privacy spent (largest per peer): eps {max(last['eps'].values()):.6g} at delta {last['delta']:g} "
            f"for the whole shared update, protecting {report['protects']}"
        )
        if last.get("record_eps") and report["mechanism"] != "secagg":  # secagg: one figure, said above
            privacy += (
                f"; eps {max(last['record_eps'].values()):.4g} at delta {config['train']['dp_delta']:g} "
                "for each training record (DP-SGD)"
            )
        lines.append(privacy)
    return lines
