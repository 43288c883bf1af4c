"""Start a local Anvil chain as a child process (for `swarm up`, tests and benchmarks).

    with start_anvil() as anvil:          # automine: one block per transaction
        w3 = node.chain.client.connect(anvil.url)
        ...

Anvil listens on 127.0.0.1 unless `host` says otherwise (`swarm chain --host`). Its dev accounts
come from Anvil's public test mnemonic: their keys are known to everyone and are meant for local
chains only.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from eth_account import Account

ANVIL_ENV = "SWARM_ANVIL"  # path of an anvil binary, first choice when set
# Anvil's default mnemonic (public, as in Hardhat and Foundry): dev keys for local chains only.
ANVIL_MNEMONIC = "test test test test test test test test test test test junk"
START_TIMEOUT_S = 20.0


class AnvilError(RuntimeError):
    """Anvil could not be found, started, or answered badly."""


def _checkouts() -> list[Path]:
    """Folders that may hold a project checkout's node_modules: the current directory and its
    parents, then the folder above this package (an editable install lives in the checkout)."""
    here = Path.cwd().resolve()
    package_root = Path(__file__).resolve().parents[2]
    found = [here, *here.parents]
    return found + ([package_root] if package_root not in found else [])


def find_anvil() -> str:
    """The anvil binary: $SWARM_ANVIL, else `anvil` on PATH, else a checkout's node_modules/.bin/anvil."""
    chosen = os.environ.get(ANVIL_ENV)
    if chosen:
        if not (Path(chosen).is_file() and os.access(chosen, os.X_OK)):
            raise AnvilError(f"{ANVIL_ENV}={chosen} is not an executable file")
        return chosen
    found = shutil.which("anvil")
    if found:
        return found
    for folder in _checkouts():
        local = folder / "node_modules" / ".bin" / "anvil"
        if local.exists():
            return str(local)
    raise AnvilError(
        "anvil (Foundry's local chain) not found. Install it with `npm install @foundry-rs/anvil` (then run from "
        f"that folder, or set {ANVIL_ENV}=/path/to/node_modules/.bin/anvil), or Foundry's `foundryup`, which puts "
        "anvil on PATH; in a source checkout `./run bootstrap` installs the pinned one"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def dev_private_keys(n: int) -> list[str]:
    """The first n private keys of Anvil's dev mnemonic (m/44'/60'/0'/0/i)."""

    Account.enable_unaudited_hdwallet_features()
    return [Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}").key.hex() for i in range(n)]


class Anvil:
    """A running Anvil child process. Use as a context manager or call `stop()`."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        chain_id: int,
        accounts: int,
        log_path: Path,
        host: str = "127.0.0.1",
    ) -> None:
        self.process = process
        self.port = port
        self.chain_id = chain_id
        # a wildcard bind is reached through loopback from this machine
        reach = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        self.url = f"http://{f'[{reach}]' if ':' in reach else reach}:{port}"
        self._accounts = accounts
        self._log_path = log_path
        self._keys: list[str] | None = None

    @property
    def private_keys(self) -> list[str]:
        """The dev accounts' keys (public knowledge: tests and `swarm up` only)."""
        if self._keys is None:
            self._keys = dev_private_keys(self._accounts)
        return self._keys

    def rpc(self, method: str, params: list[Any] | None = None, timeout: float = 10.0) -> Any:
        """One JSON-RPC call; raises AnvilError on an error answer."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
        if "error" in answer:
            raise AnvilError(f"{method}: {answer['error']}")
        return answer["result"]

    def mine(self, n: int = 1) -> None:
        """Mine n empty blocks at once (anvil_mine)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n:
            self.rpc("anvil_mine", [hex(n)])

    def block_number(self) -> int:
        return int(self.rpc("eth_blockNumber"), 16)

    def dump_state(self, path: str | os.PathLike[str]) -> Path:
        """Write the chain state (anvil_dumpState) as JSON that `start_anvil(load_state=path)` reloads."""
        raw = bytes.fromhex(self.rpc("anvil_dumpState", timeout=60.0)[2:])
        state = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(state)
        return path

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._log_path.unlink(missing_ok=True)

    def __enter__(self) -> Anvil:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_anvil(
    *,
    port: int | None = None,
    chain_id: int = 31337,
    block_time: float | None = None,
    load_state: str | os.PathLike[str] | None = None,
    accounts: int = 10,
    timeout: float = START_TIMEOUT_S,
    mixed_mining: bool = False,
    host: str = "127.0.0.1",
    hardfork: str | None = None,
) -> Anvil:
    """Start Anvil on 127.0.0.1 and wait until its RPC answers.

    block_time None means automine (a block per transaction); a number mines every block_time
    seconds, like a testnet, so receipts have to be awaited. mixed_mining (with block_time) does
    both: every transaction is mined at once and blocks also tick every block_time, so round
    windows (blocks and seconds, read from new blocks) pass even when nobody sends a transaction. load_state reloads a
    `dump_state` file. host is the address to bind (loopback unless told: the dev keys are
    public, so anyone who reaches the port can spend them); hardfork pins the EVM version
    (Anvil's default: its latest).
    """
    if mixed_mining and block_time is None:
        raise ValueError("mixed_mining needs a block_time")
    if accounts < 1:
        raise ValueError(f"accounts must be >= 1, got {accounts}")
    if block_time is not None and block_time <= 0:
        raise ValueError(f"block_time must be > 0 seconds, got {block_time}")
    binary = find_anvil()
    chosen = port or free_port()
    cmd = [binary, "--host", host, "--port", str(chosen), "--chain-id", str(chain_id)]
    cmd += ["--accounts", str(accounts), "--mnemonic", ANVIL_MNEMONIC]
    cmd += _mining_and_state_flags(block_time, mixed_mining, hardfork, load_state)
    log = Path(tempfile.mkstemp(prefix="anvil-", suffix=".log")[1])
    with open(log, "wb") as sink:
        # its own session: a terminal's Ctrl-C reaches only the owner, which stops the chain last
        process = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    anvil = Anvil(process, chosen, chain_id, accounts, log, host)
    try:
        _wait_until_answering(anvil, timeout)
    except BaseException:  # an interrupt while it starts stops it too: nobody else holds it yet
        anvil.stop()
        raise
    return anvil


def _mining_and_state_flags(
    block_time: float | None,
    mixed_mining: bool,
    hardfork: str | None,
    load_state: str | os.PathLike[str] | None,
) -> list[str]:
    flags: list[str] = []
    if block_time is not None:
        flags += ["--block-time", str(block_time)]
    if mixed_mining:
        flags += ["--mixed-mining"]
    if hardfork is not None:
        flags += ["--hardfork", hardfork]
    if load_state is not None:
        if not Path(load_state).is_file():
            raise ValueError(f"load_state: no such file {load_state}")
        flags += ["--load-state", str(load_state)]
    return flags


def _wait_until_answering(anvil: Anvil, timeout: float) -> None:
    """Poll until `anvil` answers with its chain id; AnvilError, the process stopped, when it exits
    first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        if anvil.process.poll() is not None:
            tail = anvil.log_tail()
            anvil.stop()
            raise AnvilError(f"anvil exited with status {anvil.process.returncode} before answering:\n{tail}")
        try:
            if int(anvil.rpc("eth_chainId", timeout=1.0), 16) == anvil.chain_id:
                return
        except (OSError, urllib.error.URLError, ValueError, AnvilError):
            pass
        if time.monotonic() > deadline:
            anvil.stop()
            raise AnvilError(f"anvil did not answer on {anvil.url} within {timeout:.0f} s")
        time.sleep(0.05)
