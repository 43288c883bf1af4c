"""`swarm verify`: re-check every round of a swarm, trusting no peer.

Its exit status means what `swarm up`'s does: 0 for a run that did every round it asked for and
holds, non-zero otherwise: 1 when a check fails, 3 when every check holds but the run stopped
after N of M rounds (report.md says the same words, `node.runs.report.stopped_after`)."""

from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli import common

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from web3 import Web3

    from node.chain.client import LedgerClient
    from node.chain.pipelined import PipelinedClient
    from node.verify import VerifyReport

CHECK_FAILED, STOPPED = 1, 3  # exit statuses besides 0 (all holds) and 2 (a bad argument: main)
DESCRIPTION = """\
Re-check every round of a swarm from the ledger and the blobs alone, trusting no peer: each blob
against its commitment, each aggregate recomputed bit for bit, each peer's eps recomputed from the
committed mechanism parameters, each registration against its peer id; under secure aggregation,
each round's sum from its archived frames (naming every member whose frame or share does not fit)
and the model stepped from it against the finalized one. A PipelinedLedger (one transaction per
round) is told by its code and checked the same way from its events, its finalizing votes and aborts
too. Give a `swarm up` run
folder (--run: its saved chain is restarted on a local Anvil), or a chain, a ledger and the peers'
folders (--rpc-url, --ledger, --archive)."""
EXIT_STATUS = """\
exit status: 0 every check holds and the run did all its rounds; 1 a check fails; 2 a bad
argument, or the chain or the folders cannot be read; 3 every check holds but the run stopped
after N of M rounds (as report.md says)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="re-check every round: blobs vs commitments, aggregates, eps per peer",
        description=DESCRIPTION,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rpc-url", help="the chain's JSON-RPC URL")
    p.add_argument("--ledger", help="the ledger contract's address (a SwarmLedger or a PipelinedLedger)")
    p.add_argument(
        "--archive",
        type=Path,
        action="append",
        metavar="DIR",
        help="a folder of the run's blobs (content-addressed), or a `swarm node` workdir (its blobs/ is read); "
        "repeatable: every peer's folder together holds the run",
    )
    p.add_argument("--run", type=Path, help="a `swarm up` run folder: restarts a local chain from its saved state")
    p.add_argument(
        "--rounds",
        type=int,
        metavar="M",
        help="the rounds the swarm was to run (its swarm.rounds), to say whether it stopped early; "
        "with --run it is read from run.json",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document for scripts")
    common.add_verbose(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from node.cli import CLIError

    if args.rounds is not None and args.rounds < 1:
        raise CLIError(f"--rounds must be >= 1, got {args.rounds}")
    if args.run:
        if args.rpc_url or args.ledger:
            raise CLIError("--run restarts the run's own chain: do not combine it with --rpc-url/--ledger")
        return _verify_run(args.run, args.archive, args.json, args.rounds)
    if not (args.rpc_url and args.ledger and args.archive):
        raise CLIError("give --rpc-url, --ledger and --archive, or --run DIR for a local run")
    folders = blob_folders(args.archive)
    common.probe_chain(args.rpc_url)  # a wrong URL is one line at once, before web3 loads
    ledger = open_verified_ledger(common.connect_chain(args.rpc_url, check_evm=False), args.ledger)
    return _verify(ledger, folders, args.json, args.rounds)


def open_verified_ledger(w3: Web3, address: str) -> LedgerClient | PipelinedClient:
    """A read-only client of the ledger at `address`: a `PipelinedClient` where the deployed code is
    the PipelinedLedger artifact's, else `common.open_ledger`'s (a SwarmLedger, or code that is
    neither, whose differences verify names: check "code")."""
    from node.chain.errors import LedgerError
    from node.chain.kind import ledger_kind
    from node.chain.pipelined import PipelinedClient

    try:
        if ledger_kind(w3, address) == "pipelined":
            return PipelinedClient(w3, address)
    except (ValueError, LedgerError):
        pass  # no code, other code or no answer: open_ledger says which
    return common.open_ledger(w3, address)


def read_run_info(run: Path) -> dict:
    """run.json of a `swarm up` (or `swarm simulate --ledger`) folder whose chain was saved."""
    from node.cli import CLIError

    try:
        info = json.loads((run / "run.json").read_text())
    except (OSError, ValueError) as exc:
        raise CLIError(f"{run} is not a swarm run folder (run.json unreadable: {exc})") from exc
    if not (isinstance(info, dict) and isinstance(info.get("ledger"), str) and isinstance(info.get("chain_id"), int)):
        raise CLIError(f"{run}/run.json names no ledger and chain id: not a swarm run folder")
    if not (run / "chain" / "state.json").exists():
        raise CLIError(f"{run / 'chain' / 'state.json'} is missing: the run's chain state was not saved")
    return info


def rounds_wanted(info: dict) -> int | None:
    """swarm.rounds of a run.json, None when it does not say."""
    rounds = ((info.get("config") or {}).get("swarm") or {}).get("rounds")
    return rounds if isinstance(rounds, int) else None


def _verify_run(run: Path, archive: list[Path] | None, as_json: bool, rounds: int | None) -> int:
    from node.chain.anvil import AnvilError, start_anvil
    from node.cli import CLIError

    info = read_run_info(run)
    folders = blob_folders(archive or [run / "archive"])
    # `kill` (SIGTERM) stops it as Ctrl-C does, so the chain it started is stopped too, not left
    # running. Until the chain is started and held, the signal waits: raised inside Popen, after
    # the fork, it would leave a chain nobody holds.
    term = _DeferredTerm()
    previous = signal.signal(signal.SIGTERM, term.handle)
    try:
        try:
            anvil = start_anvil(load_state=run / "chain" / "state.json", chain_id=info["chain_id"])
        except AnvilError as exc:
            raise CLIError(str(exc)) from exc
        with anvil:
            term.arm()
            ledger = open_verified_ledger(common.connect_chain(anvil.url, check_evm=False), info["ledger"])
            return _verify(ledger, folders, as_json, rounds or rounds_wanted(info))
    finally:
        signal.signal(signal.SIGTERM, previous)


class _DeferredTerm:
    """SIGTERM as KeyboardInterrupt, held back until `arm()`: a signal before it is raised there."""

    def __init__(self) -> None:
        self.armed = False
        self.pending = False

    def handle(self, signum: int, frame: object) -> None:
        if not self.armed:
            self.pending = True
            return
        raise KeyboardInterrupt

    def arm(self) -> None:
        self.armed = True
        if self.pending:
            raise KeyboardInterrupt


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


def _verify(ledger: LedgerClient | PipelinedClient, folders: list[Path], as_json: bool, rounds: int | None) -> int:
    from node.chain.pipelined import PipelinedClient
    from node.runs.report import ENDED_STATES, stopped_after
    from node.verify import ArchiveStores, verify
    from node.verify_pipelined import verify_pipelined
    from p2p.store import DiskBlobStore

    archive = ArchiveStores([DiskBlobStore(folder) for folder in folders])
    report = verify_pipelined(ledger, archive) if isinstance(ledger, PipelinedClient) else verify(ledger, archive)
    ended = sum(r.state in ENDED_STATES for r in report.rounds)
    stopped = stopped_after(ended, rounds) if rounds else None
    if as_json:
        common.emit_json(report.to_dict() | {"rounds_wanted": rounds, "stopped": stopped})
    else:
        _print(report, stopped)
    if not report.ok:
        return CHECK_FAILED
    return STOPPED if stopped else 0


def _print(report: VerifyReport, stopped: str | None) -> None:
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
        console.print(
            f"[green]every check holds[/green] for the rounds that ended, but the run [bold]{stopped}[/bold]: "
            "the others never ran"
            if stopped
            else "[green]every check holds[/green]"
        )
    elif stopped:
        console.print(f"the run [bold]{stopped}[/bold]")
    for f in report.failures:
        console.print(f"[red]FAIL[/red] round {f.round}, peer {f.peer}, check {f.check}: {f.detail}")
