"""`swarm dashboard --run DIR`: the live page of `swarm up --dashboard` / `swarm node --dashboard`,
served from a finished run folder or a `swarm node` workdir, until Ctrl-C (or SIGTERM: exit 0);
and what those two commands share: the `--dashboard` options and page (`add_options`, `start`,
`finish`: served until the command exits, or with --linger until Ctrl-C) and the log of the
ledger's events they keep in the folder with or without a page (`log_events`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from node.cli import common

if TYPE_CHECKING:
    from node.config import Config
    from node.dashboard.chainlog import ChainEventLog
    from node.dashboard.server import Dashboard


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard",
        help="serve the live page of a run folder or a swarm node workdir on 127.0.0.1",
        description="Serve the page `--dashboard` shows (rounds, peers, curves, eps, gas, the ledger's events) "
        "for a finished `swarm up` run folder or a `swarm node` workdir, on 127.0.0.1, until Ctrl-C. "
        "Nothing talks to the chain: the folder's files are the record.",
    )
    p.add_argument("--run", type=Path, required=True, metavar="DIR", help="a `swarm up` run folder or a node workdir")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    common.add_verbose(p)
    p.set_defaults(func=handle)


def add_options(p: argparse.ArgumentParser) -> None:
    """`--dashboard` and `--dashboard-port`, for `swarm up` and `swarm node`."""
    p.add_argument(
        "--dashboard",
        action="store_true",
        help="serve a live page (rounds, peers, curves, eps, gas, chain events) on 127.0.0.1; its URL is printed",
    )
    p.add_argument(
        "--dashboard-port", type=int, default=0, metavar="PORT", help="port of the page (default: any free port)"
    )
    p.add_argument(
        "--linger",
        action="store_true",
        help="with --dashboard: keep serving the page after the run has ended, until Ctrl-C "
        "(without it the page is served until the command exits)",
    )


def check_options(args: argparse.Namespace) -> None:
    """The page's options, before anything heavy loads."""
    from node.cli import CLIError

    if not 0 <= args.dashboard_port <= 65535:
        raise CLIError(f"--dashboard-port must be in 0..65535, got {args.dashboard_port}")
    if args.linger and not args.dashboard:
        raise CLIError("--linger keeps the page of --dashboard: give both")


def _serve(folder: Path, port: int, *, live: bool) -> Dashboard:
    from node.cli import CLIError
    from node.dashboard.server import Dashboard

    if not 0 <= port <= 65535:
        raise CLIError(f"port must be in 0..65535, got {port}")
    try:
        return Dashboard(folder, port=port, live=live).start()
    except OSError as exc:
        raise CLIError(f"cannot serve the dashboard on 127.0.0.1:{port}: {exc.strerror or exc}") from None


def run_folder(args: argparse.Namespace, config: Config) -> Path:
    """The folder `swarm up` will write (the page needs it before the run makes it): --out, or
    the same default node.runs.local.run_up picks."""
    from node.runs.local import default_out_dir

    if args.out is not None:
        return Path(args.out)
    return Path(config.output.dir) / default_out_dir().name if config.output.dir else default_out_dir()


def start(args: argparse.Namespace, folder: Path) -> Dashboard | None:
    """With --dashboard: serve `folder`'s page live and print its URL to stderr (stdout may be
    --json). None without --dashboard. The chain's events on the page come from `log_events`."""
    if not getattr(args, "dashboard", False):
        return None
    dashboard = _serve(folder, args.dashboard_port, live=True)
    print(f"dashboard: {dashboard.url}", file=sys.stderr, flush=True)
    return dashboard


def finish(served: Dashboard | None, args: argparse.Namespace) -> None:
    """The run has ended: the page says so and gets the folder's last state; with --linger it is
    served on until Ctrl-C (or SIGTERM), then stopped."""
    if served is None:
        return
    served.run_ended()
    if args.linger:
        print(f"dashboard: the run has ended; still serving {served.url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        _wait_for_ctrl_c()
        print("dashboard: stopped", file=sys.stderr, flush=True)
    served.stop()


def _wait_for_ctrl_c() -> None:
    """Sleep until Ctrl-C or SIGTERM."""
    import signal
    import time

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # `kill` stops it as cleanly as Ctrl-C
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return


def log_events(args: argparse.Namespace, folder: Path, source: Callable[[], tuple[str, str] | None]) -> ChainEventLog:
    """Keep the ledger's events in `folder`/chain-events.jsonl (started; `stop()` reads once more
    and ends it), whether or not a page is served, so `swarm dashboard --run` shows them later.
    `source` gives (rpc_url, ledger) once known. Read every second for a live page, else every
    few seconds: one eth_blockNumber (and eth_getLogs when blocks came) per read."""
    from node.dashboard.chainlog import POLL_SECONDS, QUIET_POLL_SECONDS, ChainEventLog

    events = ChainEventLog(
        folder, source, poll=POLL_SECONDS if getattr(args, "dashboard", False) else QUIET_POLL_SECONDS
    )
    events.start()
    return events


def handle(args: argparse.Namespace) -> int:
    from node.cli import CLIError

    folder: Path = args.run
    if not folder.is_dir():
        raise CLIError(f"--run {folder} is not a folder")
    if not any((folder / name).exists() for name in ("run.json", "peers", "status.json", "metrics.jsonl")):
        raise CLIError(f"--run {folder} is neither a run folder (run.json, peers/) nor a swarm node workdir")
    dashboard = _serve(folder, args.port, live=False)
    print(f"dashboard: {dashboard.url} (Ctrl-C to stop)", flush=True)
    try:
        _wait_for_ctrl_c()
        print("swarm dashboard: stopped", file=sys.stderr, flush=True)
        return 0
    finally:
        dashboard.stop()
