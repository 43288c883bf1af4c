"""The README's across-hosts workflow, on one machine: `swarm deploy --config` against a chain
started like a testnet, then `swarm node` processes started from the CLI alone (keys from the
environment, bootstrap multiaddrs), then `swarm verify --rpc-url --ledger --archive`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.chain.anvil import free_port, start_anvil
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


def cli(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_deploy_from_config_then_nodes_from_the_cli(tmp_path):
    config_file = tmp_path / "swarm.toml"
    config_file.write_text(load_config(None, SETS).to_toml())
    config = load_config(config_file)
    with start_anvil(block_time=0.2, accounts=4) as anvil:
        env = dict(os.environ, SWARM_PRIVATE_KEY=anvil.private_keys[0])
        proc = cli("deploy", "--rpc-url", anvil.url, "--config", str(config_file), "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        deployed = json.loads(proc.stdout)
        ledger = LedgerClient(connect(anvil.url), deployed["address"])
        params = ledger.params()
        assert params.genesis_digest == sha256(genesis(config)) and params.min_peers == 3
        assert deployed["eps_cap"] > 0  # 0 in the config = what 2 rounds of PNPM spend, honestly

        ports = [free_port() for _ in range(3)]
        nodes = []
        for i in range(3):
            env = dict(os.environ, SWARM_PRIVATE_KEY=anvil.private_keys[i + 1], SWARM_P2P_PASSWORD=f"pw{i}")
            workdir = tmp_path / f"node{i}"
            # every node dials node 0; node 0's peer id is known once its key file exists
            cmd = [
                sys.executable,
                "-m",
                "node.cli",
                "node",
                "--rpc-url",
                anvil.url,
                "--ledger",
                deployed["address"],
                "--config",
                str(config_file),
                "--workdir",
                str(workdir),
                "--partition",
                f"{i}/3",
                "--listen",
                f"/ip4/127.0.0.1/tcp/{ports[i]}",
            ]
            if i > 0:
                peer0 = json.loads((tmp_path / "node0" / "peer.json").read_text())["peer_id"]
                cmd += ["--bootstrap", f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/{peer0}"]
            log = open(tmp_path / f"node{i}.log", "wb")
            nodes.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            if i == 0:
                _wait_for_file(tmp_path / "node0" / "peer.json", nodes[0])
        try:
            codes = [n.wait(timeout=400) for n in nodes]
        finally:
            for n in nodes:
                n.kill()
        assert codes == [0, 0, 0], "\n".join((tmp_path / f"node{i}.log").read_text()[-2000:] for i in range(3))
        assert [ledger.round_info(r).state.name for r in (1, 2)] == ["FINALIZED", "FINALIZED"]

        archive = tmp_path / "archive"
        for i in range(3):
            shutil.copytree(tmp_path / f"node{i}" / "blobs", archive, dirs_exist_ok=True)
        # peers serve genesis too; the verifier gets it from any of them
        proc = cli(
            "verify", "--rpc-url", anvil.url, "--ledger", deployed["address"], "--archive", str(archive), "--json"
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout)["ok"]


def _wait_for_file(path: Path, process, timeout: float = 120.0) -> None:
    import time

    end = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, "node 0 exited before it started listening"
        assert time.monotonic() < end, f"{path} did not appear"
        time.sleep(0.2)
