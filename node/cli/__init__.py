"""The `swarm` console script: one command, one module per subcommand.

Each module in `COMMANDS` exposes `register(subparsers)` which adds its parser and sets
`func` to a handler `handler(args) -> int`. Modules import their heavy dependencies (torch,
web3, libp2p) inside the handler so `swarm --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

# Order is the order shown in `swarm --help`.
COMMANDS = ("up", "chain", "deploy", "fund", "node", "verify", "simulate", "ledger", "dashboard", "audit", "bench")


class CLIError(Exception):
    """A user-facing error: one line, exit status 2. With -v (commands that take it), the error it
    was raised from (its cause or context) is printed with its full traceback first."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm",
        description="Serverless swarm learning with local differential privacy, "
        "libp2p exchange and an on-chain round ledger.",
    )
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
    try:
        return int(args.func(args) or 0)
    except CLIError as exc:
        origin = exc.__cause__ or exc.__context__  # the error it explains (kept by `raise ... from None`)
        if getattr(args, "verbose", False) and origin is not None:
            traceback.print_exception(origin)  # -v: the full trace, then the one line
        print(f"swarm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"swarm {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
