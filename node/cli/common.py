"""Options shared by several subcommands: config file, --set overrides, --json."""

from __future__ import annotations

import argparse
import json
import sys
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


def emit_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
