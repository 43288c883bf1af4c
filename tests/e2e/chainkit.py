"""Local chains other than Anvil for the end-to-end tests: Ganache from the pinned npm package
(package.json; `./run bootstrap` installs it into node_modules/.bin)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from node.chain.anvil import ANVIL_MNEMONIC, dev_private_keys, free_port

ROOT = Path(__file__).resolve().parents[2]
GANACHE_CHAIN_ID = 1337  # Ganache's default: a local dev chain for `swarm deploy`


def find_ganache() -> str | None:
    """node_modules/.bin/ganache of this checkout, else `ganache` on PATH, else None."""
    local = ROOT / "node_modules" / ".bin" / "ganache"
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("ganache")


@dataclass
class LocalChain:
    url: str
    chain_id: int
    private_keys: list[str]  # public dev keys (Anvil's test mnemonic): tests only


def _rpc(url: str, method: str) -> object:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": []}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=2) as response:
        return json.loads(response.read())["result"]


@contextmanager
def start_ganache(binary: str, *, accounts: int = 4, log_path: Path, timeout: float = 300.0) -> Iterator[LocalChain]:
    """Ganache on 127.0.0.1 started plainly (it mines a block per transaction and none otherwise),
    funded from Anvil's mnemonic so the dev keys are the ones the Anvil tests use. It is waited for
    until it answers, for up to `timeout` (generous: node.js starts slowly on a loaded machine)."""
    port = free_port()
    cmd = [binary, "--server.host", "127.0.0.1", "--server.port", str(port)]
    cmd += ["--wallet.mnemonic", ANVIL_MNEMONIC, "--wallet.totalAccounts", str(accounts)]
    cmd += ["--chain.chainId", str(GANACHE_CHAIN_ID), "--logging.quiet"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert process.poll() is None, f"ganache exited: {log_path.read_text(errors='replace')[-2000:]}"
            try:
                if int(str(_rpc(url, "eth_chainId")), 16) == GANACHE_CHAIN_ID:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"ganache did not answer on {url} within {timeout:.0f} s"
            time.sleep(0.2)
        yield LocalChain(url, GANACHE_CHAIN_ID, dev_private_keys(accounts))
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
