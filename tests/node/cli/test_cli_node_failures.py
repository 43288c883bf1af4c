"""`swarm node`'s expected failures end in one line on stderr and exit status 2 (the trace only with
-v), against a real Anvil and real processes: no SWARM_P2P_PASSWORD and no terminal, an unreachable
--rpc-url, a --ledger that is no ledger, and bootstrap peers nobody can reach (the node gives up
after --bootstrap-timeout instead of waiting for ever). The last also shows what -q silences and
that a node keeps the ledger's events in its workdir without --dashboard."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys

import pytest
from web3 import Web3

from node.chain.anvil import free_port, start_anvil
from node.chain.client import connect
from node.cli import main
from node.config import load_config
from node.dashboard.snapshot import EVENTS_FILE, snapshot

PEER_ID = "12D3KooWGgpcVCY9V3D5pJn4ifJLtEysQUZAaqxHGFWA97gZJJDw"  # valid, and nobody's
SETS = ["swarm.peers=2", "swarm.rounds=1", "chain.min_peers=2", "data.limit=200", "data.test_limit=100"]


def _env(**extra: str) -> dict[str, str]:
    drop = ("SWARM_PRIVATE_KEY", "SWARM_KEYSTORE_PASSWORD", "SWARM_P2P_PASSWORD")
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


def _node(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", "node", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,  # no terminal: nothing may prompt
    )


def _closed_port() -> int:
    """A loopback port that was free a moment ago and has no listener now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def chain():
    """Anvil mining like `swarm chain` (a block a second and one per transaction): a node waiting
    on it neither mines nor warns about a stalled chain."""
    with start_anvil(accounts=4, block_time=1, mixed_mining=True) as anvil:
        yield anvil


@pytest.fixture
def deployed(chain, tmp_path_factory):
    """A ledger of its own for each test, deployed for SETS through `swarm deploy` (in this process):
    (config file, address). A ledger another node committed to would make this one fetch that blob."""
    config_file = tmp_path_factory.mktemp("swarm") / "swarm.toml"
    config_file.write_text(load_config(None, SETS).to_toml())
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("SWARM_PRIVATE_KEY", chain.private_keys[0])
        assert main(["deploy", "--rpc-url", chain.url, "--config", str(config_file), "--json"]) == 0
    return config_file, json.loads(printed.getvalue())["address"]


def test_no_p2p_password_without_a_terminal_is_one_line(chain, tmp_path):
    proc = _node(
        "--rpc-url",
        chain.url,  # answers (checked first, at once); the password is asked for before the ledger is read
        "--ledger",
        "0x" + "11" * 20,
        "--workdir",
        str(tmp_path / "node"),
        env=_env(SWARM_PRIVATE_KEY="0x" + "11" * 32),
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "swarm node: error: set SWARM_P2P_PASSWORD to the password of this peer's libp2p key file "
        "(created on first use; see swarm node --help)"
    ), proc.stderr
    assert proc.stdout == "" and not (tmp_path / "node" / "p2p.key").exists()


def test_unreachable_rpc_url_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", "0x" + "11" * 32)
    monkeypatch.setenv("SWARM_P2P_PASSWORD", "pw")
    url = f"http://127.0.0.1:{_closed_port()}"
    status = main(["node", "--rpc-url", url, "--ledger", "0x" + "11" * 20, "--workdir", str(tmp_path / "node")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip() == (
        f"swarm node: error: cannot reach the chain at {url} (Connection refused): start it or fix --rpc-url"
    ), err


def test_a_ledger_address_with_no_ledger_is_one_line_and_v_shows_the_trace(chain, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", chain.private_keys[3])
    monkeypatch.setenv("SWARM_P2P_PASSWORD", "pw")
    nobody = Web3.to_checksum_address("0x" + "42" * 20)  # no contract there
    argv = ["node", "--rpc-url", chain.url, "--ledger", nobody, "--workdir", str(tmp_path / "node")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("swarm node: error: ") and nobody in err
    assert err.strip().endswith("check --ledger (the address swarm deploy printed) and --rpc-url"), err
    assert main([*argv, "-v"]) == 2
    verbose = capsys.readouterr().err
    assert "Traceback (most recent call last)" in verbose and "LedgerError" in verbose, verbose
    assert verbose.strip().splitlines()[-1] == err.strip()  # the same line, last


@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "talking"])
def test_unreachable_bootstrap_peers_stop_the_node(chain, deployed, tmp_path, quiet):
    """Bootstrap peers that nobody can reach (a closed loopback port): after --bootstrap-timeout the
    node stops with one line saying what happened and what to do, exit status 2. With -q stdout
    stays empty; without it the node printed its addresses first. Without --dashboard the node
    still kept the ledger's events (a last read at exit): the file holds every log of the ledger."""
    config_file, ledger = deployed
    unreachable = f"/ip4/127.0.0.1/tcp/{_closed_port()}/p2p/{PEER_ID}"
    workdir = tmp_path / "node"
    account = 1 if quiet else 2  # a node per account: each registers its own peer id
    args = ["--rpc-url", chain.url, "--ledger", ledger, "--config", str(config_file), "--workdir", str(workdir)]
    args += ["--partition", f"{account - 1}/2", "--listen", f"/ip4/127.0.0.1/tcp/{free_port()}"]
    args += ["--bootstrap", unreachable, "--bootstrap-timeout", "3"] + (["-q"] if quiet else [])
    proc = _node(*args, env=_env(SWARM_PRIVATE_KEY=chain.private_keys[account], SWARM_P2P_PASSWORD="pw"))

    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("swarm node: error: no peer reached in 3 s: none of the --bootstrap peers answered ")
    assert f"{unreachable}: Connection refused" in lines[0], lines[0]
    assert "check that they run" in lines[0] and "--bootstrap-timeout waits longer" in lines[0], lines[0]
    info = json.loads((workdir / "peer.json").read_text())  # it did listen before giving up
    if quiet:
        assert proc.stdout == "", proc.stdout
    else:
        assert f"peer id {info['peer_id']}" in proc.stdout and "listening on /ip4/127.0.0.1/" in proc.stdout

    w3 = connect(chain.url)
    logs = w3.eth.get_logs({"address": ledger, "fromBlock": 0, "toBlock": "latest"})
    on_chain = [(int(e["blockNumber"]), int(e["logIndex"])) for e in logs]
    kept = [json.loads(line) for line in (workdir / EVENTS_FILE).read_text().splitlines()]
    assert [(e["block"], e["log_index"]) for e in kept] == on_chain
    assert kept[0]["event"] == "RoundOpened" and kept[0]["args"]["round"] == 1
    assert snapshot(workdir, live=False)["events"] == kept  # what `swarm dashboard --run` shows


def test_bootstrap_timeout_must_not_be_negative(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_P2P_PASSWORD", "pw")
    bootstrap = f"/ip4/127.0.0.1/tcp/1/p2p/{PEER_ID}"
    argv = ["node", "--rpc-url", "http://127.0.0.1:1", "--ledger", "0x" + "11" * 20, "--bootstrap", bootstrap]
    assert main([*argv, "--bootstrap-timeout", "-1", "--workdir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "swarm node: error: --bootstrap-timeout must be >= 0 seconds, got -1"


def test_help_names_each_default_keystore(capsys):
    """One story for keys: a node's own key lives in its workdir; the operator's, which deploys
    and funds, in ~/.swarm/keystore.json. Each command's help says which it takes."""
    helps = {}
    for command in ("node", "deploy", "fund"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        helps[command] = " ".join(capsys.readouterr().out.split())
    assert "--keystore" in helps["node"] and "default <workdir>/eth-keystore.json" in helps["node"]
    assert "`swarm deploy` and `swarm fund` default to ~/.swarm/keystore.json" in helps["node"], helps["node"]
    for command in ("deploy", "fund"):
        assert "--keystore" in helps[command] and "default ~/.swarm/keystore.json" in helps[command], helps[command]
