"""Options shared by several subcommands (config file, --set overrides, --json) and how an expected
failure becomes one line: the known error unwrapped from trio's ExceptionGroups."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from node.config import Config


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="TOML", help="a swarm.toml; defaults come from node/defaults.toml")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set train.lr=0.05 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document for scripts")


def add_transaction_options(parser: argparse.ArgumentParser) -> None:
    """The options of a subcommand that sends one transaction and waits for its receipt."""
    parser.add_argument("--tx-timeout", type=float, default=120.0, help="seconds to wait for the receipt")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more, full tracebacks on errors")


def load(args: argparse.Namespace, shortcuts: dict[str, str]) -> Config:
    """Config file, then --set overrides, then the command's own shortcut flags
    (`shortcuts` maps an argparse dest to a config key) which win over both."""
    from node.cli import CLIError
    from node.config import ConfigError, load_config

    overrides = list(args.overrides)
    for dest, key in shortcuts.items():
        value = getattr(args, dest, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    try:
        return load_config(args.config, overrides)
    except (ConfigError, OSError) as exc:
        raise CLIError(str(exc)) from exc


def setup_logging(verbose: bool) -> None:
    """Log records to stderr in one format: warnings and errors, everything from INFO up with -v.
    `force`: opacus configures the root logger when imported (its own format, no level), which
    would make this a no-op. py-libp2p detaches its loggers when imported (no handler, no
    propagation: Python's last-resort handler printed their warnings raw); they go through ours,
    whose level (not the loggers', which py-libp2p sets to INFO here and there) keeps them quiet."""
    import logging

    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)
    for handler in logging.getLogger().handlers:
        handler.setLevel(level)
    logging.getLogger("libp2p").propagate = True


def emit_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside `exc`, ExceptionGroups flattened (trio wraps every task's error in
    one group per nursery it crosses), in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its causes and contexts, outermost first (cycles cut)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def expected_failure(exc: BaseException, expected: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first expected error inside `exc` (groups unwrapped), or None when some error inside is
    not expected (a bug: its traceback matters). An insufficient-funds error anywhere in its chain
    wins, since it says what to fund (registration failures wrap it)."""
    from node.chain.sender import InsufficientFunds

    inner = leaves(exc)
    if not inner or not all(isinstance(e, expected) for e in inner):
        return None
    for leaf in inner:
        for link in _chain(leaf):
            if isinstance(link, InsufficientFunds):
                return link
    return inner[0]


def interrupted(exc: BaseException) -> bool:
    """Whether Ctrl-C is among the errors inside `exc`."""
    return any(isinstance(e, KeyboardInterrupt) for e in leaves(exc))


def one_line(exc: BaseException, hints: Sequence[tuple[str, str]] = ()) -> str:
    """The error's message on one line, plus the first hint whose key occurs in it (what to do)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for key, hint in hints:
        if key.lower() in text.lower():
            return f"{text}: {hint}"
    return text


def short_reason(exc: BaseException) -> str:
    """A connection error's reason without the HTTP library's nesting ("Connection refused"),
    else the whole message."""
    import re

    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return found.group(1).strip() if found else " ".join(text.split())
