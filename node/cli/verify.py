"""`swarm verify`: re-check every round of a swarm, trusting no peer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli import common

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from node.chain.client import LedgerClient
    from node.verify import VerifyReport


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="re-check every round: blobs vs commitments, aggregates, eps per peer")
    p.add_argument("--rpc-url", help="the chain's JSON-RPC URL")
    p.add_argument("--ledger", help="the SwarmLedger contract address")
    p.add_argument(
        "--archive",
        type=Path,
        action="append",
        metavar="DIR",
        help="a folder of the run's blobs (content-addressed), or a `swarm node` workdir (its blobs/ is read); "
        "repeatable: every peer's folder together holds the run",
    )
    p.add_argument("--run", type=Path, help="a `swarm up` run folder: restarts a local chain from its saved state")
    p.add_argument("--json", action="store_true", help="print one JSON document for scripts")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from node.cli import CLIError

    if args.run:
        if args.rpc_url or args.ledger:
            raise CLIError("--run restarts the run's own chain: do not combine it with --rpc-url/--ledger")
        return _verify_run(args.run, args.archive, args.json)
    if not (args.rpc_url and args.ledger and args.archive):
        raise CLIError("give --rpc-url, --ledger and --archive, or --run DIR for a local run")
    from node.chain.client import LedgerClient, connect

    ledger = LedgerClient(connect(args.rpc_url), args.ledger)
    return _verify(ledger, args.archive, args.json)


def _verify_run(run: Path, archive: list[Path] | None, as_json: bool) -> int:
    from node.chain.anvil import AnvilError, start_anvil
    from node.chain.client import LedgerClient, connect
    from node.cli import CLIError

    try:
        info = json.loads((run / "run.json").read_text())
    except (OSError, ValueError) as exc:
        raise CLIError(f"{run} is not a swarm run folder (run.json unreadable: {exc})") from exc
    state = run / "chain" / "state.json"
    if not state.exists():
        raise CLIError(f"{state} is missing: the run's chain state was not saved")
    try:
        anvil = start_anvil(load_state=state, chain_id=info["chain_id"])
    except AnvilError as exc:
        raise CLIError(str(exc)) from exc
    with anvil:
        ledger = LedgerClient(connect(anvil.url), info["ledger"])
        return _verify(ledger, archive or [run / "archive"], as_json)


def blob_folders(archives: list[Path]) -> list[Path]:
    """The blob folders to read: each --archive as given, or its blobs/ when it is a `swarm node`
    workdir (a folder with a blobs/ folder inside)."""
    from node.cli import CLIError

    folders = []
    for archive in archives:
        if not archive.is_dir():
            raise CLIError(f"archive folder {archive} does not exist")
        folders.append(archive / "blobs" if (archive / "blobs").is_dir() else archive)
    return folders


def _verify(ledger: LedgerClient, archives: list[Path], as_json: bool) -> int:
    from node.verify import ArchiveStores, verify
    from p2p.store import DiskBlobStore

    stores = ArchiveStores([DiskBlobStore(folder) for folder in blob_folders(archives)])
    report = verify(ledger, stores)
    if as_json:
        common.emit_json(report.to_dict())
    else:
        _print(report)
    return 0 if report.ok else 1


def _print(report: VerifyReport) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"ledger {report.ledger}")
    for col in ("round", "state", "participants", "included", "blobs ok", "releases ok", "aggregate", "eps ok"):
        t.add_column(col)
    for r in report.rounds:
        agg = "-" if r.aggregate_ok is None else ("ok" if r.aggregate_ok else "FAIL")
        t.add_row(
            str(r.round),
            r.state,
            str(r.participants),
            str(r.included),
            str(r.blobs_ok),
            str(r.releases_ok),
            agg,
            str(r.eps_ok),
        )
    console.print(t)
    if report.not_started is not None:
        console.print(
            f"round {report.not_started}: not started (open, no commitment yet; the ledger opens the next round "
            "when one ends): not shown, nothing to check"
        )
    for peer, entry in sorted(report.peers.items()):
        record = (
            f"; record-level eps {entry['record_eps_spent']} at delta {entry.get('record_delta')}, protecting "
            f"{entry.get('record_protects')}"
            if "record_eps_spent" in entry
            else ""
        )
        console.print(
            f"  {peer}: eps spent {entry.get('eps_spent')} at delta {entry.get('delta')} over {entry.get('commits')} "
            f"commits, protecting {entry.get('protects')}{record}"
        )
    if report.ok:
        console.print("[green]every check holds[/green]")
    for f in report.failures:
        console.print(f"[red]FAIL[/red] round {f.round}, peer {f.peer}, check {f.check}: {f.detail}")
