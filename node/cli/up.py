"""`swarm up`: a local swarm (Anvil + ledger + N peer processes) with live progress."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli import common, dashboard

if TYPE_CHECKING:
    from node.dashboard.chainlog import ChainEventLog

SHORTCUTS = {
    "peers": "swarm.peers",
    "rounds": "swarm.rounds",
    "dataset": "data.dataset",
    "mechanism": "privacy.mechanism",
    "epsilon": "privacy.epsilon",
    "seed": "swarm.seed",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="run a local swarm: Anvil, the ledger and N peers, with a verifiable run folder")
    p.add_argument("--peers", type=int, help="number of peer processes (default 4)")
    p.add_argument("--rounds", type=int, help="rounds to run (default 5)")
    p.add_argument("--dataset", help="digits, breast-cancer, fashion-mnist, mnist, cifar10 (default digits)")
    p.add_argument("--mechanism", help="pnpm (default), duchi, pm, hm, ldp-fl, laplace, gaussian, sampled, none")
    p.add_argument("--epsilon", type=float, help="the mechanism's epsilon (per coordinate for local mechanisms)")
    p.add_argument("--seed", type=int, help="the one seed of the run")
    p.add_argument(
        "--out", type=Path, help="run folder (default runs/<timestamp>; the ledger's events go to chain-events.jsonl)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log more, full tracebacks on errors")
    dashboard.add_options(p)
    common.add_config_options(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from node.chain.anvil import AnvilError
    from node.cli import CLIError
    from node.dashboard.snapshot import chain_source
    from node.runs.local import run_up

    common.setup_logging(args.verbose)
    config = common.load(args, SHORTCUTS)
    out = args.out = dashboard.run_folder(args, config)  # the page needs it before the run makes it
    served = dashboard.start(args, out)
    events: list[ChainEventLog] = []

    def log_events() -> None:  # once the folder is checked and run.json names the chain and ledger
        events.append(dashboard.log_events(args, out, lambda: chain_source(out)))

    def stop_events() -> None:  # a last read while the chain still runs: the last round's events are kept
        for log in events:
            log.stop()

    try:
        report = run_up(config, out=out, json_output=args.json, on_started=log_events, on_finished=stop_events)
    except (FileExistsError, ValueError, AnvilError) as exc:
        raise CLIError(str(exc)) from exc
    finally:
        stop_events()
        if served:
            served.stop()
    if args.json:
        common.emit_json(report)
    else:
        print((Path(report["run"]) / "report.md").read_text())
        print(f"run folder: {report['run']}\nverify it:  {report['verify_command']}")
    return exit_status(report)


def exit_status(report: dict) -> int:
    """130 after Ctrl-C (the shell's convention); 1 if the run failed (report["failure"]: no round
    finalized, most rounds aborted, rounds missing) or a peer exited non-zero; else 0."""
    if report["interrupted"]:
        return 130
    if report.get("failure"):
        print(f"swarm up: FAILED: {report['failure']}", file=sys.stderr)
        return 1
    return 0 if all(rc == 0 for rc in report["peer_exit_codes"]) else 1
