"""The README's across-hosts block, run as written on one machine: `swarm chain` writing dev
keystores, `swarm deploy --config --keystore`, two `swarm node` processes started from the CLI
alone (keystores and SWARM_P2P_PASSWORD from the environment, bootstrap multiaddrs; the first with
--dashboard), a newcomer whose own new keystore `swarm fund` funds before its node joins as the
third, `swarm ledger`, `swarm verify --archive` over the nodes' workdirs, then `swarm dashboard
--run` serving the first node's workdir after the run, chain events included.

The same swarm run also checks what `swarm node` prints (its addresses, one line per round, a
summary) and its expected failures, each one line on stderr with exit status 2 and no traceback:
the newcomer's first start with its new, unfunded keystore (insufficient funds, naming the
address), and after the run a late joiner and a peer whose settings do not match the ledger's
genesis."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from node.chain.anvil import free_port
from node.chain.client import LedgerClient, connect
from node.config import load_config
from node.derive import genesis
from node.protocol.blob import sha256

pytestmark = pytest.mark.slow

SETS = [
    "swarm.rounds=2",
    "swarm.peers=3",
    "chain.min_peers=3",
    "chain.commit_window=400",
    "chain.attest_window=400",
    "data.limit=600",
]


README = Path(__file__).resolve().parents[2] / "README.md"
CONFIG = Path("examples/swarm.toml")  # what the README's block passes as --config, from the checkout
README_URL = "http://127.0.0.1:8545"
README_LEDGER = "0xLEDGER"
README_BOOTSTRAP = "/ip4/HOST/tcp/4001/p2p/ID"
README_LISTEN = "/ip4/0.0.0.0/tcp/4001"
README_NEWCOMER = "0xNEWCOMER"


def cli(*args, env=None, timeout=120, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def readme_steps() -> list[list[str]]:
    """The commands of the README's across-hosts block, in order: `export NAME=VALUE` and `swarm ...`
    lines (comments dropped, backslash continuations joined), each split like a shell would."""
    block = README.read_text().split("<!-- multihost:begin -->")[1].split("<!-- multihost:end -->")[0]
    steps, pending = [], ""
    for raw in block.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith(("#", "```"))):
            continue
        pending += line.removesuffix("\\").strip() + " "
        if not line.endswith("\\"):
            steps.append(shlex.split(pending))
            pending = ""
    return steps


def test_readme_block_is_what_this_test_runs():
    """The parser sees every command of the block: a chain, a deploy, two nodes, a newcomer funded
    then started, ledger, verify, dashboard."""
    kinds = [s[1] if s[0] == "swarm" else s[0] for s in readme_steps()]
    assert kinds == [
        "export",
        "chain",
        "deploy",
        "export",
        "node",
        "node",
        "fund",
        "node",
        "ledger",
        "verify",
        "dashboard",
    ], kinds


def test_deploy_from_config_then_nodes_from_the_cli(tmp_path):
    """The README's block, run as written from tmp_path with five substitutions: the chain on a free
    port (and --json to read its URL), the deployed address for 0xLEDGER, a free loopback port for
    each node's 0.0.0.0:4001, node 0's address for the bootstrap placeholder, and the address the
    newcomer's first start printed for 0xNEWCOMER."""
    (tmp_path / "examples").mkdir()  # the README's --config examples/swarm.toml, cut down by SETS
    (tmp_path / CONFIG).write_text(load_config(README.parent / CONFIG, SETS).to_toml())
    config = load_config(tmp_path / CONFIG)
    env = {k: v for k, v in os.environ.items() if k not in ("SWARM_PRIVATE_KEY", "SWARM_KEYSTORE_PASSWORD")}
    chain = None
    url = ledger_address = ""
    ports: list[int] = []
    nodes: list[subprocess.Popen] = []
    unfunded = None
    newcomer = ""
    finished = False  # the nodes' run checked
    ran: list[str] = []

    def substitute(argv: list[str]) -> list[str]:
        out = []
        for arg in argv[1:]:
            arg = arg.replace(README_URL, url).replace(README_LEDGER, ledger_address).replace(README_NEWCOMER, newcomer)
            if arg == README_LISTEN:
                ports.append(free_port())
                arg = f"/ip4/127.0.0.1/tcp/{ports[-1]}"
            if arg == README_BOOTSTRAP:
                arg = _bootstrap_of(tmp_path / "node0")
            out.append(arg)
        return [sys.executable, "-m", "node.cli", *out]

    try:
        for step in readme_steps():
            if step[0] == "export":
                name, _, value = step[1].partition("=")
                env[name] = value
                continue
            command = step[1]
            ran.append(command)
            if command not in ("node", "fund") and nodes and not finished:
                _check_node_dashboard(tmp_path / "node0.log", nodes[0])
                codes = [n.wait(timeout=400) for n in nodes]
                logs = [(tmp_path / f"node{i}.log").read_text() for i in range(len(nodes))]
                assert codes == [0] * 3, "\n".join(log[-2000:] for log in logs)
                _check_node_output(tmp_path, logs, ports)
                finished = True
            if command == "chain":
                chain = subprocess.Popen(
                    [*substitute(step), "--port", str(free_port()), "--json"],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
                started = json.loads(chain.stdout.readline() or "{}")
                assert "url" in started, chain.stderr.read() if chain.poll() is not None else "no line"
                url = started["url"]
                assert started["keystores"] == [f"keys/dev-{i}.json" for i in range(4)], started
            elif command == "deploy":
                proc = subprocess.run(
                    [*substitute(step), "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
                )
                assert proc.returncode == 0, proc.stderr
                deployed = json.loads(proc.stdout)
                ledger_address = deployed["address"]
                ledger = LedgerClient(connect(url), ledger_address)
                params = ledger.params()
                assert params.genesis_digest == sha256(genesis(config)) and params.min_peers == 3
                assert deployed["eps_cap"] > 0  # 0 in the config = what 2 rounds of PNPM spend, honestly
            elif command == "node":
                i = len(nodes)
                log = open(tmp_path / f"node{i}.log", "wb")
                nodes.append(
                    subprocess.Popen(
                        substitute(step),
                        cwd=tmp_path,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )
                if i == 0:  # the others bootstrap to it: its address exists once it listens
                    _wait_for_file(tmp_path / "node0" / "peer.json", nodes[0])
                    unfunded = _start_unfunded(url, ledger_address, tmp_path, env)
            elif command == "fund":
                assert unfunded is not None
                newcomer = _check_unfunded(tmp_path, unfunded)  # its first start: created, then refused
                proc = subprocess.run(
                    substitute(step), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
                )
                assert proc.returncode == 0, proc.stderr
                assert proc.stdout.strip().endswith(f"{newcomer} now holds 1 ETH"), proc.stdout
            elif command == "ledger":
                proc = subprocess.run(
                    substitute(step), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
                )
                assert proc.returncode == 0, proc.stderr
                # the round the ledger opened after the last one shows as not started
                assert "round 3: not started" in proc.stdout and "round 3: OPEN" not in proc.stdout, proc.stdout
                assert [ledger.round_info(r).state.name for r in (1, 2)] == ["FINALIZED", "FINALIZED"]
            elif command == "verify":
                # verify reads the peers' workdirs as they are (their blobs/ folders), several at once;
                # peers serve genesis too: the verifier gets it from any of them
                proc = subprocess.run(
                    [*substitute(step), "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
                )
                assert proc.returncode == 0, proc.stdout + proc.stderr
                report = json.loads(proc.stdout)
                assert report["ok"] and [r["round"] for r in report["rounds"]] == [1, 2] and report["not_started"] == 3
            elif command == "dashboard":
                _check_dashboard_command(substitute(step), tmp_path, env)
        assert ran == ["chain", "deploy", "node", "node", "fund", "node", "ledger", "verify", "dashboard"], ran

        # after the run: a late joiner and a node with other settings are refused at once, in one line
        late = _run_node(url, ledger_address, tmp_path, "late", env)
        other = _run_node(url, ledger_address, tmp_path, "other", env, "--set", "swarm.seed=999")
        assert late.returncode == 2 and "has finished" in late.stderr and "Traceback" not in late.stderr, late.stderr
        assert other.returncode == 2 and "genesis digest" in other.stderr, other.stderr
        assert "Traceback" not in other.stderr and len(other.stderr.strip().splitlines()) == 1, other.stderr
    finally:
        for n in [*nodes, *([unfunded] if unfunded else [])]:
            n.kill()
        if chain is not None:
            chain.send_signal(signal.SIGINT)  # swarm chain stops its Anvil on Ctrl-C
            try:
                chain.wait(timeout=30)
            except subprocess.TimeoutExpired:
                chain.kill()


def _check_node_dashboard(log: Path, node: subprocess.Popen) -> None:
    """`swarm node --dashboard` prints its URL and serves its workdir's state while it runs: the
    page's JSON shows this node and, before it exits, a finalized round."""
    deadline = time.monotonic() + 300
    state: dict = {}
    while time.monotonic() < deadline and node.poll() is None:
        found = re.search(r"dashboard: (http://127\.0\.0\.1:\d+/)", log.read_text())
        if found:
            try:
                with urllib.request.urlopen(found[1] + "api/state", timeout=5) as response:
                    state = json.loads(response.read())
            except OSError:
                pass
            if any(r.get("state") == "finalized" for r in state.get("rounds", [])):
                break
        time.sleep(0.5)
    assert state.get("kind") == "node" and len(state.get("peers", [])) == 1, state
    assert any(r.get("state") == "finalized" for r in state["rounds"]), state.get("rounds")


def _bootstrap_of(workdir: Path) -> str:
    info = json.loads((workdir / "peer.json").read_text())
    return next(a for a in info["addrs"] if a.startswith("/ip4/127.0.0.1/")) + f"/p2p/{info['peer_id']}"


def _start_unfunded(url: str, ledger: str, tmp_path: Path, env: dict) -> subprocess.Popen:
    """The newcomer's first start, in the README's node2 workdir with the README's passwords and no
    --keystore: it creates node2/eth-keystore.json, has no ETH and no --partition, and fails at
    registration."""
    return subprocess.Popen(
        [*_node_cmd(url, ledger, CONFIG, Path("node2")), "--bootstrap", _bootstrap_of(tmp_path / "node0")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def _check_node_output(tmp_path: Path, logs: list[str], ports: list[int]) -> None:
    """swarm node talks: its addresses, one line per round, a summary."""
    for i, log in enumerate(logs):
        info = json.loads((tmp_path / f"node{i}" / "peer.json").read_text())
        assert f"listening on /ip4/127.0.0.1/tcp/{ports[i]}/p2p/{info['peer_id']}" in log, log[-2000:]
        assert f"eth address {info['address']}" in log
        for r in (1, 2):
            line = next(x for x in log.splitlines() if x.startswith(f"round {r}/2: "))
            assert "finalized" in line and "3 peers included" in line and "accuracy 0." in line, line
            assert "eps " in line and "delta" in line and "whole shared update" in line, line
        assert "finished: 2 of 2 rounds played here (2 finalized, 0 aborted)" in log, log[-2000:]
        assert "warning: no --partition" not in log


def _check_unfunded(tmp_path: Path, unfunded: subprocess.Popen) -> str:
    """The newcomer's first start: the address of its new keystore (in its workdir, by default)
    printed at creation, then one line naming it, what it holds and what registering needs. Returns
    the address."""
    _, err = unfunded.communicate(timeout=180)
    assert unfunded.returncode == 2, err
    created = re.search(r"created keystore node2/eth-keystore.json for address (0x[0-9a-fA-F]{40})", err)
    assert created, err
    assert (tmp_path / "node2" / "eth-keystore.json").exists()
    assert f"insufficient funds: account {created[1]} holds 0 ETH, register needs up to " in err, err
    assert "warning: no --partition" in err and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("swarm node: error: "), err
    return created[1]


def _check_dashboard_command(argv: list[str], tmp_path: Path, env: dict) -> None:
    """`swarm dashboard --run node0` after the run: node 0's rounds and the ledger's events it kept
    (the last round finalized included), until Ctrl-C ends it with exit status 0."""
    page = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        line = page.stdout.readline() if page.stdout else ""
        found = re.fullmatch(r"dashboard: (http://127\.0\.0\.1:\d+/) \(Ctrl-C to stop\)\n", line)
        assert found, line
        with urllib.request.urlopen(found[1] + "api/state", timeout=10) as response:
            state = json.loads(response.read())
        assert state["kind"] == "node" and state["live"] is False, state
        assert [(r["round"], r["state"]) for r in state["rounds"]] == [(1, "finalized"), (2, "finalized")]
        names = [e["event"] for e in state["events"]]
        assert {"Registered", "Committed", "RoundClosed", "Attested", "RoundFinalized"} <= set(names), names
        assert any(e["event"] == "RoundFinalized" and e["args"]["round"] == 2 for e in state["events"])
        page.send_signal(signal.SIGINT)
        _, err = page.communicate(timeout=30)
        assert page.returncode == 0 and err.strip() == "swarm dashboard: stopped", err
    finally:
        if page.poll() is None:
            page.kill()
            page.wait()


def _node_cmd(rpc_url: str, ledger: str, config_file: Path, workdir: Path) -> list[str]:
    return [sys.executable, "-m", "node.cli", "node", "--rpc-url", rpc_url, "--ledger", ledger] + [
        "--config",
        str(config_file),
        "--workdir",
        str(workdir),
        "--listen",
        f"/ip4/127.0.0.1/tcp/{free_port()}",
    ]


def _run_node(url: str, ledger: str, tmp_path: Path, name: str, env: dict, *extra: str) -> subprocess.CompletedProcess:
    """A node with the deployer's dev keystore (refused before any transaction)."""
    return subprocess.run(
        [*_node_cmd(url, ledger, tmp_path / CONFIG, tmp_path / name), "--partition", "0/3"]
        + ["--keystore", str(tmp_path / "keys" / "dev-0.json"), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _wait_for_file(path: Path, process, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, "node 0 exited before it started listening"
        assert time.monotonic() < end, f"{path} did not appear"
        time.sleep(0.2)
