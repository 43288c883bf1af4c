"""What a new user looks for: `swarm --version`, a description for every command, `swarm ledger
--run DIR` for a finished run whose chain is gone, and the README's across-hosts config file."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from node.cli import COMMANDS, build_parser, main
from node.config import load_config

ROOT = Path(__file__).resolve().parents[3]


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"swarm {version('swarm-ledger')}"


def test_every_command_has_a_description_and_v():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in COMMANDS:
        parser = sub.choices[name]
        assert parser.description and len(parser.description) > 40, name
        assert "--verbose" in parser.format_help(), name


def test_ledger_of_a_finished_run_from_its_saved_chain(recorded_run, capsys):
    assert main(["ledger", "--run", str(recorded_run)]) == 0
    text = capsys.readouterr().out
    info = json.loads((recorded_run / "run.json").read_text())
    assert text.startswith(f"SwarmLedger {info['ledger']} on chain {info['chain_id']}"), text[:200]
    assert "round 1: FINALIZED" in text and "round 2: FINALIZED" in text and "round 3: not started" in text
    assert main(["ledger", "--run", str(recorded_run), "--rpc-url", "http://127.0.0.1:8545"]) == 2
    assert "do not combine" in capsys.readouterr().err


def test_the_readme_block_uses_the_example_config_as_written():
    block = (ROOT / "README.md").read_text().split("<!-- multihost:begin -->")[1].split("<!-- multihost:end -->")[0]
    configs = re.findall(r"--config (\S+)", block)
    assert configs and set(configs) == {"examples/swarm.toml"}, configs
    config = load_config(ROOT / "examples" / "swarm.toml")
    assert config.swarm.peers == 3 and config.chain.block_time == 1.0  # the block's 3 nodes, `swarm chain`'s blocks
