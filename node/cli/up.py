"""`swarm up`: a local swarm (Anvil + ledger + N peer processes) with live progress."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli import common, dashboard

if TYPE_CHECKING:
    from node.config import Config
    from node.dashboard.chainlog import ChainEventLog
    from node.dashboard.server import Dashboard

SHORTCUTS = {
    "peers": "swarm.peers",
    "rounds": "swarm.rounds",
    "dataset": "data.dataset",
    "data_dir": "data.data_dir",
    "mechanism": "privacy.mechanism",
    "epsilon": "privacy.epsilon",
    "seed": "swarm.seed",
}
DESCRIPTION = """\
Run a whole swarm on this machine: a local Anvil chain, the ledger, N peer processes training on
their own shards, a live table of every peer's round, phase and privacy spend, then the report and
a run folder that `swarm verify --run DIR` re-checks after the chain has stopped. The defaults
(node/defaults.toml) train Fashion-MNIST from /usr/share/datasets/fashion-mnist with DP-SGD and
PNPM on each update; every setting can be changed with --config and --set."""
EXIT_STATUS = """\
exit status: 0 every round ended and the peers exited cleanly; 1 the run failed (no round
finalized, most rounds aborted, rounds missing, a peer failed); 2 a bad argument, config or
data (nothing was started); 130 interrupted (Ctrl-C: the rounds that ended verify)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="run a local swarm: Anvil, the ledger and N peers, with a verifiable run folder",
        description=DESCRIPTION,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--peers", type=int, help="number of peer processes (default 4)")
    p.add_argument("--rounds", type=int, help="rounds to run (default 5)")
    p.add_argument("--dataset", help="fashion-mnist (default), mnist, cifar10, digits, breast-cancer")
    p.add_argument(
        "--data-dir",
        help="folder holding the dataset's files (default for fashion-mnist: /usr/share/datasets/fashion-mnist)",
    )
    p.add_argument(
        "--mechanism",
        help="pnpm (default), duchi, pm, hm, ldp-fl, laplace, gaussian, sampled, secagg (secure aggregation: "
        "docs/SECAGG.md, examples/secure-demo.toml)",
    )
    p.add_argument("--epsilon", type=float, help="the mechanism's epsilon (per coordinate for local mechanisms)")
    p.add_argument("--seed", type=int, help="the one seed of the run")
    p.add_argument(
        "--out", type=Path, help="run folder (default runs/<timestamp>; the ledger's events go to chain-events.jsonl)"
    )
    common.add_verbose(p)
    dashboard.add_options(p)
    common.add_config_options(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    config = _checked_config(args)  # everything a user can get wrong, before anything is started
    out = args.out = dashboard.run_folder(args, config)  # the page needs it before the run makes it
    served = dashboard.start(args, out)
    try:
        report = _run(args, config, out, served)
    finally:
        if served:
            served.stop()  # a no-op after dashboard.finish
    return exit_status(report)


def _checked_config(args: argparse.Namespace) -> Config:
    """The config, the data, the device and the run folder checked: first what needs no heavy
    import (answered at once), then the data and the device (torch)."""
    from node.cli import CLIError

    config = common.load(args, SHORTCUTS)
    common.check_data_dir(config)
    dashboard.check_options(args)
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        raise CLIError(f"--out {args.out} exists and is not empty: choose a new folder")
    common.setup_logging(args.verbose)
    from node.derive import mechanism_params

    common.check_device(config)
    common.check_data(config)
    try:
        mechanism_params(config)  # a bad mechanism setting fails here, before anything is deployed
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    return config


def _run(args: argparse.Namespace, config: Config, out: Path, served: Dashboard | None) -> dict:
    """The swarm to its end; the report printed (stdout), the page served on as --linger says."""
    from node.chain.anvil import AnvilError
    from node.cli import CLIError
    from node.dashboard.snapshot import chain_source
    from node.runs.local import run_up

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
    if args.json:
        common.emit_json(report)
    else:
        print((Path(report["run"]) / "report.md").read_text())
        print(f"run folder: {report['run']}\nverify it:  {report['verify_command']}", flush=True)
    dashboard.finish(served, args)
    return report


def exit_status(report: dict) -> int:
    """130 after Ctrl-C (the shell's convention); 1 if the run failed (report["failure"]: no round
    finalized, most rounds aborted, rounds missing) or a peer exited non-zero; else 0."""
    if report["interrupted"]:
        return 130
    if report.get("failure"):
        print(f"swarm up: FAILED: {report['failure']}", file=sys.stderr)
        return 1
    return 0 if all(rc == 0 for rc in report["peer_exit_codes"]) else 1
