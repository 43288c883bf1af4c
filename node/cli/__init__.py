"""The `swarm` console script: one command, one module per subcommand.

Each module in `COMMANDS` exposes `register(subparsers)` which adds its parser and sets
`func` to a handler `handler(args) -> int`. Modules import their heavy dependencies (torch,
web3, libp2p) inside the handler, after the arguments and the config are checked, so `swarm
--help` and a bad argument are answered at once.

Every failure is one line on stderr, `swarm COMMAND: error: ...`: an expected one (`CLIError`,
exit status 2) says what to do; anything else (exit status 1) says so and that `-v` shows the trace.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

# Order is the order shown in `swarm --help`.
COMMANDS = ("up", "chain", "deploy", "fund", "node", "verify", "simulate", "ledger", "dashboard", "audit", "bench")
DISTRIBUTION = "swarm-ledger"


class CLIError(Exception):
    """A user-facing error: one line, exit status 2. With -v, the traceback of the error it was
    raised from (its cause or context), or else its own, is printed first."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm",
        description="Serverless swarm learning with local differential privacy, "
        "libp2p exchange and an on-chain round ledger.",
        epilog="`swarm COMMAND --help` describes each command; -v on any command shows the trace of a failure.",
    )
    parser.add_argument("--version", action="version", version=f"swarm {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"node.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    verbose = bool(getattr(args, "verbose", False))
    try:
        return int(args.func(args) or 0)
    except CLIError as exc:
        if verbose:  # the full trace of the error it explains (kept by `raise ... from None`), else its own
            traceback.print_exception(exc.__cause__ or exc.__context__ or exc)
        print(f"swarm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"swarm {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # not foreseen: still one line, the trace with -v
        if verbose:
            traceback.print_exception(exc)
        text = " ".join(str(exc).split()) or "no message"
        hint = "" if verbose else "; -v shows the trace"
        print(f"swarm {args.command}: unexpected error: {type(exc).__name__}: {text}{hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
