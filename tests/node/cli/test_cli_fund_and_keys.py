"""`swarm fund` against a real Anvil, the newcomer's path for keys (a new default keystore, funded,
then used), and -v on `swarm deploy` and `swarm up`: the full trace of an expected failure, which
stays one line without it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from eth_account import Account

from node.chain.anvil import free_port
from node.chain.client import connect
from node.cli import main
from node.cli.chain import write_dev_keystores


def test_fund_sends_eth_to_an_address(automine_chain, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", automine_chain.private_keys[7])
    newcomer = Account.create().address
    argv = ["fund", "--rpc-url", automine_chain.url, "--to", newcomer.lower(), "--eth", "1.5"]
    assert main([*argv, "--json"]) == 0
    sent = json.loads(capsys.readouterr().out)
    w3 = connect(automine_chain.url)
    assert w3.eth.get_balance(newcomer) == 15 * 10**17 and sent["balance_eth"] == 1.5
    assert sent["to"] == newcomer and sent["from"] == Account.from_key(automine_chain.private_keys[7]).address
    assert w3.eth.get_transaction_receipt(sent["tx"])["status"] == 1
    assert main([*argv[:-2], "--eth", "0.5"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{newcomer} now holds 2 ETH")


def test_fund_failures_are_one_line(automine_chain, monkeypatch, capsys):
    poor = Account.create()
    monkeypatch.setenv("SWARM_PRIVATE_KEY", poor.key.hex())
    to = Account.create().address
    url = automine_chain.url
    assert main(["fund", "--rpc-url", url, "--to", to]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"swarm fund: error: insufficient funds: account {poor.address} holds 0 ETH, sending 1 ETH ")
    assert re.search(r"needs up to 1\.\d+ ETH with the gas", err) and len(err.splitlines()) == 1, err
    assert main(["fund", "--rpc-url", url, "--to", "0x1234"]) == 2
    assert (
        capsys.readouterr().err.strip() == "swarm fund: error: --to '0x1234' is not an address (0x and 40 hex digits)"
    )
    assert main(["fund", "--rpc-url", url, "--to", to, "--eth", "0"]) == 2
    assert capsys.readouterr().err.strip() == "swarm fund: error: --eth must be a positive amount, got 0"
    assert connect(url).eth.get_transaction_count(poor.address) == 0


def test_a_newcomer_deploys_with_the_default_keystore_once_funded(automine_chain, tmp_path):
    """`swarm deploy` without --keystore creates ~/.swarm/keystore.json (HOME is tmp_path here) and
    names its address; `swarm fund` from a dev keystore of `swarm chain` funds it; the same
    command then deploys from it."""
    env = {k: v for k, v in os.environ.items() if k != "SWARM_PRIVATE_KEY"}
    env |= {"HOME": str(tmp_path), "SWARM_KEYSTORE_PASSWORD": "pw"}
    [dev] = write_dev_keystores(tmp_path / "keys", automine_chain.private_keys[6:7], "pw")

    def swarm(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "node.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )

    deploy = ["deploy", "--rpc-url", automine_chain.url, "--genesis-digest", "11" * 32, "--min-peers", "1", "--json"]
    first = swarm(*deploy)
    default = tmp_path / ".swarm" / "keystore.json"
    created = re.search(rf"created keystore {re.escape(str(default))} for address (0x[0-9a-fA-F]{{40}})", first.stderr)
    assert first.returncode == 2 and created and default.exists(), first.stderr
    assert f"insufficient funds: account {created[1]} holds 0 ETH" in first.stderr.splitlines()[-1]
    funded = swarm("fund", "--rpc-url", automine_chain.url, "--keystore", str(dev), "--to", created[1], "--eth", "2")
    assert funded.returncode == 0 and funded.stdout.strip().endswith(f"{created[1]} now holds 2 ETH"), funded.stderr
    second = swarm(*deploy)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["deployer"] == created[1] and "created keystore" not in second.stderr


def test_deploy_v_prints_the_trace_of_an_expected_failure(automine_chain, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", Account.create().key.hex())  # no funds
    argv = ["deploy", "--rpc-url", automine_chain.url, "--genesis-digest", "11" * 32]
    assert main(argv) == 2
    line = capsys.readouterr().err
    assert len(line.strip().splitlines()) == 1 and line.startswith("swarm deploy: error: insufficient funds: "), line
    assert main([*argv, "-v"]) == 2
    verbose = capsys.readouterr().err
    assert "Traceback (most recent call last)" in verbose and "InsufficientFunds" in verbose, verbose
    assert verbose.strip().splitlines()[-1] == line.strip()


def test_deploy_v_to_an_unreachable_chain(monkeypatch, capsys):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", "0x" + "11" * 32)
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["deploy", "--rpc-url", url, "-v"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ConnectionRefusedError" in err, err
    assert err.strip().splitlines()[-1] == (
        f"swarm deploy: error: cannot reach the chain at {url} (Connection refused): start it or fix --rpc-url"
    )


def test_up_v_prints_the_trace_of_an_expected_failure(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")  # an earlier run's folder: never overwritten
    assert main(["up", "--out", str(out)]) == 2
    line = capsys.readouterr().err
    assert line.strip() == f"swarm up: error: --out {out} exists and is not empty: choose a new folder", line
    assert main(["up", "--out", str(out), "-v"]) == 2
    verbose = capsys.readouterr().err
    assert "Traceback (most recent call last)" in verbose and "_checked_config" in verbose, verbose  # where
    assert verbose.strip().splitlines()[-1] == line.strip()
    assert [p.name for p in out.iterdir()] == ["run.json"]  # nothing written into it, no events file
