"""`swarm up`: a whole swarm on one machine. Starts Anvil on a free loopback port, deploys the
ledger, starts the peers as separate `swarm node` processes, shows live progress, and leaves a
run folder that `swarm verify --run DIR` re-checks after the chain has stopped:

    run.json          ledger address, chain id, config, peers
    config.toml       the resolved configuration every peer ran with
    archive/          every blob of the run (content-addressed)
    chain/state.json  the chain's state (Anvil dump), refreshed after every finished round
    metrics.jsonl     one line per round: accuracy, eps per peer, gas, bytes
    progress.png      accuracy and eps per round
    report.md         the final report with the ledger address and the verify command
    peers/<i>/        each peer's own log, metrics, status and blob store
"""
from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from node import wire
from node.blob import sha256
from node.runner import P2P_PASSWORD_ENV, write_json_atomic


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PeerProcess:
    index: int
    workdir: Path
    address: str
    peer_id: str
    multiaddr: str
    process: subprocess.Popen | None = None
    returncode: int | None = None
    history: list[dict] = field(default_factory=list)

    def status(self) -> dict:
        try:
            return json.loads((self.workdir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def metrics(self) -> list[dict]:
        from node.metrics import read_metrics

        path = self.workdir / "metrics.jsonl"
        return read_metrics(path) if path.exists() else []


def default_out_dir() -> Path:
    return Path("runs") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def run_up(config, *, out: Path | None, json_output: bool, config_path_note: str | None = None) -> dict:
    """Run a local swarm to the end (or Ctrl-C) and return the report as a dict."""
    from eth_account import Account

    from node.chain import start_anvil
    from node.ledger import LedgerClient, connect
    from node.setup import eps_cap_micro, genesis
    from p2p.identity import load_or_create_identity
    from p2p.store import DiskBlobStore
    from p2p import peer_id_of_key_pair

    out = Path(out or default_out_dir())
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"--out {out} exists and is not empty: choose a new folder")
    (out / "chain").mkdir(parents=True, exist_ok=True)
    archive = DiskBlobStore(out / "archive")
    n = config.swarm.peers
    (out / "config.toml").write_text(config.to_toml())
    say = (lambda *a: None) if json_output else (lambda msg: print(msg, flush=True))

    with start_anvil(block_time=config.chain.block_time, accounts=n + 1) as anvil:
        w3 = connect(anvil.url)
        deployer = Account.from_key(anvil.private_keys[0])
        genesis_blob = genesis(config)
        archive.put(genesis_blob)
        ledger = LedgerClient.deploy(
            w3, deployer, min_peers=config.chain.min_peers, commit_window=config.chain.commit_window,
            attest_window=config.chain.attest_window, eps_cap_micro=eps_cap_micro(config),
            delta=config.privacy.delta, genesis_digest=sha256(genesis_blob))
        say(f"ledger {ledger.address} on {anvil.url} (chain id {w3.eth.chain_id})")
        password = secrets.token_hex(16)
        peers: list[PeerProcess] = []
        for i in range(n):
            workdir = out / "peers" / str(i)
            workdir.mkdir(parents=True)
            key_pair = load_or_create_identity(workdir / "p2p.key", password.encode())
            port = free_port()
            peer_id = peer_id_of_key_pair(key_pair)
            peers.append(PeerProcess(i, workdir, Account.from_key(anvil.private_keys[i + 1]).address, peer_id,
                                     f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id}"))
        run_info = {"ledger": ledger.address, "chain_id": w3.eth.chain_id, "rpc_url": anvil.url,
                    "peers": [{"index": p.index, "address": p.address, "peer_id": p.peer_id} for p in peers],
                    "started": time.time(), "config": config.to_dict()}
        write_json_atomic(out / "run.json", run_info)
        for p in peers:
            env = dict(os.environ, SWARM_PRIVATE_KEY=anvil.private_keys[p.index + 1], **{P2P_PASSWORD_ENV: password})
            cmd = [sys.executable, "-m", "node.cli", "node", "--rpc-url", anvil.url, "--ledger", ledger.address,
                   "--config", str(out / "config.toml"), "--workdir", str(p.workdir),
                   "--listen", p.multiaddr.rsplit("/p2p/", 1)[0], "--partition", f"{p.index}/{n}"]
            for q in peers:
                if q is not p:
                    cmd += ["--bootstrap", q.multiaddr]
            log = open(p.workdir / "peer.log", "wb")
            p.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)  # Ctrl-C reaches us; we stop them in order
        interrupted = False
        try:
            _watch(peers, ledger, anvil, out, config, json_output)
        except KeyboardInterrupt:
            interrupted = True
            say("interrupted: stopping the peers, saving the chain and the archive")
        finally:
            _stop(peers)
            anvil.dump_state(out / "chain" / "state.json")
            _collect_archive(peers, archive)
        report = _report(out, peers, ledger, run_info, interrupted)
    return report


def _watch(peers, ledger, anvil, out: Path, config, json_output: bool) -> None:
    """Show live progress until every peer process has exited; dump the chain after every
    finished round so a hard kill of this process still leaves a verifiable folder."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    deadline = time.monotonic() + config.chain.run_timeout
    last_dumped = 0

    def table() -> Table:
        t = Table(title=f"swarm {ledger.address[:10]}…  round {ledger.current_round()} of {config.swarm.rounds}")
        for col in ("peer", "round", "phase", "accuracy", "eps (cumulative)", "state"):
            t.add_column(col)
        for p in peers:
            st, m = p.status(), p.metrics()
            last = m[-1] if m else {}
            acc = f"{last['accuracy']:.3f}" if last.get("accuracy") is not None else "-"
            eps = f"{last['eps_cumulative']:.4g}" if last.get("eps_cumulative") is not None else "-"
            state = "running" if p.process.poll() is None else f"exit {p.process.returncode}"
            t.add_row(str(p.index), str(st.get("round", "-")), st.get("phase", "starting"), acc, eps, state)
        return t

    console = Console(stderr=True, quiet=json_output)
    with Live(table(), console=console, refresh_per_second=2, transient=False) as live:
        while any(p.process.poll() is None for p in peers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the swarm did not finish within {config.chain.run_timeout} s")
            time.sleep(0.5)
            live.update(table())
            done = ledger.current_round() - 1
            if done > last_dumped:
                anvil.dump_state(out / "chain" / "state.json")
                last_dumped = done


def _stop(peers, grace: float = 10.0) -> None:
    for p in peers:
        if p.process and p.process.poll() is None:
            p.process.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace
    for p in peers:
        if p.process:
            try:
                p.process.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.process.kill()
                p.process.wait()
            p.returncode = p.process.returncode


def _collect_archive(peers, archive) -> None:
    from p2p.store import DiskBlobStore

    for p in peers:
        store = DiskBlobStore(p.workdir / "blobs")
        for digest in store.digests():
            if not archive.has(digest):
                data = store.get(digest)
                if data is not None:
                    archive.put(data)


def _report(out: Path, peers, ledger, run_info: dict, interrupted: bool) -> dict:
    from node.report import write_report

    return write_report(out, peers, ledger, run_info, interrupted)
