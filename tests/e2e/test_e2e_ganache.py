"""The across-hosts workflow on Ganache, the pinned npm one (a cancun build once died there at
the first call with "invalid opcode"): `swarm deploy`, three `swarm node` processes, `swarm verify`.
Ganache is started plainly, as a newcomer would (`npx ganache`): it mines only on transactions.
The same flow on Anvil is tests/e2e/test_e2e_cli_nodes.py, whose settings and helpers this reuses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from node.chain.anvil import free_port
from node.chain.client import LedgerClient, connect
from node.chain.evm import UnsupportedEVM, check_evm_target
from node.cli import main
from tests.e2e.chainkit import find_ganache, start_ganache
from tests.e2e.test_e2e_cli_nodes import SETS, _wait_for_file

pytestmark = pytest.mark.slow

GANACHE = find_ganache()
ROUNDS = 2


@pytest.mark.skipif(GANACHE is None, reason="ganache is not installed: ./run bootstrap installs the pinned one")
def test_deploy_nodes_and_verify_on_ganache(tmp_path, monkeypatch, capsys):
    assert GANACHE is not None
    config_file = tmp_path / "swarm.toml"
    settings = [s for s in SETS if not s.startswith("swarm.rounds=")] + [f"swarm.rounds={ROUNDS}"]
    from node.config import load_config

    config_file.write_text(load_config(None, settings).to_toml())
    with start_ganache(GANACHE, accounts=4, log_path=tmp_path / "ganache.log") as chain:
        w3 = connect(chain.url)  # the artifact's EVM (shanghai) runs here: no error
        with pytest.raises(UnsupportedEVM, match="no MCOPY opcode"):
            check_evm_target(w3, chain.url, "cancun")  # that cancun build would be refused up front
        # deploy and verify run in this process (the same CLI code, two interpreter starts saved)
        monkeypatch.setenv("SWARM_PRIVATE_KEY", chain.private_keys[0])
        assert main(["deploy", "--rpc-url", chain.url, "--config", str(config_file), "--json"]) == 0
        deployed = json.loads(capsys.readouterr().out)
        assert deployed["chain_id"] == 1337

        ports = [free_port() for _ in range(3)]
        nodes = []
        for i in range(3):
            env = dict(os.environ, SWARM_PRIVATE_KEY=chain.private_keys[i + 1], SWARM_P2P_PASSWORD=f"pw{i}")
            cmd = [sys.executable, "-m", "node.cli", "node", "--rpc-url", chain.url, "--ledger", deployed["address"]]
            cmd += ["--config", str(config_file), "--workdir", str(tmp_path / f"node{i}"), "--partition", f"{i}/3"]
            cmd += ["--listen", f"/ip4/127.0.0.1/tcp/{ports[i]}"]
            if i > 0:  # every node dials node 0, once it listens (a failed first dial is not retried)
                peer0 = json.loads((tmp_path / "node0" / "peer.json").read_text())["peer_id"]
                cmd += ["--bootstrap", f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/{peer0}"]
            log = open(tmp_path / f"node{i}.log", "wb")
            nodes.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            if i == 0:
                _wait_for_file(tmp_path / "node0" / "peer.json", nodes[0])
        try:
            codes = [n.wait(timeout=300) for n in nodes]
        finally:
            for n in nodes:
                n.kill()
        logs = "\n".join((tmp_path / f"node{i}.log").read_text()[-2000:] for i in range(3))
        assert codes == [0, 0, 0], logs
        assert "invalid opcode" not in logs
        ledger = LedgerClient(w3, deployed["address"])
        assert [ledger.round_info(r).state.name for r in range(1, ROUNDS + 1)] == ["FINALIZED"] * ROUNDS

        archive = tmp_path / "archive"
        for i in range(3):
            shutil.copytree(tmp_path / f"node{i}" / "blobs", archive, dirs_exist_ok=True)
        verify = [
            "verify",
            "--rpc-url",
            chain.url,
            "--ledger",
            deployed["address"],
            "--archive",
            str(archive),
            "--json",
        ]
        status = main(verify)
        out = capsys.readouterr()
        assert status == 0, out.out + out.err
        assert json.loads(out.out)["ok"]
