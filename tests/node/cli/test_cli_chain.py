"""`swarm chain` as a user runs it: a real process, its JSON line read back, the chain ticking
with no transactions and mining a transaction at once, keystores that deploy and node can
unlock, and a clean stop on Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from node.chain import keys
from node.chain.anvil import dev_private_keys
from node.cli.chain import non_loopback_warning


def rpc(url: str, method: str, params: list | None = None):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())["result"]


def first_line(process: subprocess.Popen, timeout: float) -> str:
    """The process's first stdout line, or a failure with its stderr if none comes in time."""
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not found or not found[0]:
        process.kill()
        pytest.fail(f"swarm chain printed nothing in {timeout} s: {process.stderr.read()}")
    return found[0]


def test_swarm_chain_ticks_mines_transactions_and_stops_on_ctrl_c(tmp_path):
    env = dict(os.environ, SWARM_KEYSTORE_PASSWORD="dev-pw")
    env.pop("SWARM_PRIVATE_KEY", None)
    cmd = [sys.executable, "-m", "node.cli", "chain", "--port", "0", "--block-time", "1.5", "--accounts", "1"]
    cmd += ["--keystore-dir", str(tmp_path / "keys"), "--json"]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = json.loads(first_line(process, 60))
        url = info["url"]
        assert url.startswith("http://127.0.0.1:") and info["chain_id"] == 31337 and info["host"] == "127.0.0.1"
        dev = [keys.Account.from_key(k).address for k in dev_private_keys(1)]
        assert info["accounts"] == dev

        # interval mining: blocks come with no transaction at all
        start = int(rpc(url, "eth_blockNumber"), 16)
        deadline = time.monotonic() + 15
        while int(rpc(url, "eth_blockNumber"), 16) < start + 2:
            assert time.monotonic() < deadline, "the chain did not advance by 2 blocks in 15 s without transactions"
            time.sleep(0.02)
        # and mining on transactions: sent just after a tick, it is mined long before the next tick
        sent = time.monotonic()
        tx = rpc(url, "eth_sendTransaction", [{"from": dev[0], "to": dev[0], "value": "0x0"}])
        while rpc(url, "eth_getTransactionReceipt", [tx]) is None:
            assert time.monotonic() - sent < 0.8, "a transaction waited for the interval block (no mixed mining)"
            time.sleep(0.02)

        # the keystores unlock to the dev accounts, and only the owner can read them
        paths = [tmp_path / "keys" / "dev-0.json"]
        assert info["keystores"] == [str(p) for p in paths]
        assert stat.S_IMODE(paths[0].stat().st_mode) == 0o600
        os.environ.pop(keys.PRIVATE_KEY_ENV, None)
        os.environ[keys.PASSWORD_ENV] = "dev-pw"
        try:
            assert keys.load_account(paths[0]).address == dev[0]
        finally:
            del os.environ[keys.PASSWORD_ENV]

        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 0, process.stderr.read()
        with pytest.raises(OSError):
            rpc(url, "eth_blockNumber")  # the chain went with it
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_only_loopback_binds_go_unwarned():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert non_loopback_warning(host) is None
    for host in ("0.0.0.0", "192.168.1.5", "example.org"):
        warning = non_loopback_warning(host)
        assert warning is not None and host in warning and "public" in warning


def test_the_summary_says_how_to_deploy_start_nodes_and_fund_new_keys():
    from node.cli.chain import _summary

    url = "http://127.0.0.1:8545"
    text = _summary(url, 31337, 1.0, ["0x" + "aa" * 20, "0x" + "bb" * 20], [Path("k/dev-0.json"), Path("k/dev-1.json")])
    assert f"swarm deploy --rpc-url {url} --keystore k/dev-0.json" in text
    assert f"swarm node --rpc-url {url} --keystore k/dev-1.json" in text
    assert f"swarm fund --rpc-url {url} --keystore k/dev-0.json --to ADDR" in text
