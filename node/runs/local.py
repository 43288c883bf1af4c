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

import copy
import datetime as dt
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from libp2p.peer.id import ID
from rich.console import Console
from rich.live import Live
from rich.table import Table

import mechanisms
from mechanisms.secagg.policy import NAME as SECAGG
from mechanisms.secagg.policy import PROTECTS as SECAGG_PROTECTS
from node.chain.anvil import find_anvil, free_port
from node.chain.kind import CONTRACT_NAMES
from node.chain.records import PROTECTS_WORDS
from node.chain.registration import sign_registration
from node.config import DEFAULT_FETCH_TIMEOUT, Config, quorum, window_seconds
from node.derive import (
    eps_cap_micro,
    eps_step_micro,
    genesis,
    max_samples,
    mechanism_params,
    record_delta,
    record_eps_cap_micro,
    secure_aggregation,
)
from node.peer.runner import P2P_PASSWORD_ENV
from node.runfiles import read_metrics
from node.runs.chainrun import LedgerTerms, RunChain
from node.runs.report import write_report
from node.runs.ticker import BlockTicker
from p2p import peer_id_to_bytes
from p2p.identity import load_or_create_identity
from p2p.store import DiskBlobStore


def _protects(config: Config) -> str:
    """What the run's eps protects, in words, from the mechanism's own guarantee ("sign" for
    PNPM, "value" for the others), never from its name."""

    params = mechanism_params(config)
    if params.get("name") == SECAGG:
        return SECAGG_PROTECTS
    kind = mechanisms.from_params(params).guarantee.protects
    return PROTECTS_WORDS.get(kind, kind)


@dataclass
class PeerProcess:
    index: int
    workdir: Path
    address: str
    peer_id: str
    multiaddr: str
    process: subprocess.Popen | None = None
    returncode: int | None = None

    def status(self) -> dict:
        try:
            return json.loads((self.workdir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def metrics(self) -> list[dict]:
        path = self.workdir / "metrics.jsonl"
        return read_metrics(path) if path.exists() else []


def default_out_dir() -> Path:
    return Path("runs") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")


# How long a local swarm's peers fetch a round's blobs, where chain.fetch_timeout is 0. Its N peers share
# this machine's cores, and each fetches and serves N - 1 blobs a round on about cores / N of a core, so
# the exchange takes time in proportion to N^2 / cores. Measured on 2 cores (docs/SCALING.md, "The ledger
# mirror" and "Kept blob streams"): 16 peers fetch within the default's 10 s; 32 do not (every round
# aborted, blobs "served by nobody within the fetch timeout") and finalize every round with 30 s. The
# default covers N^2 / cores up to LOCAL_EXCHANGE_LOAD (16 peers on 2 cores); beyond, the timeout grows in
# proportion (32 on 2: 40 s).
LOCAL_EXCHANGE_LOAD = 128


def local_fetch_timeout(peers: int, cores: int) -> float:
    """The fetch timeout for `peers` peer processes sharing `cores` cores (see LOCAL_EXCHANGE_LOAD)."""
    if peers < 1 or cores < 1:
        raise ValueError(f"need peers >= 1 and cores >= 1, got {peers} and {cores}")
    return DEFAULT_FETCH_TIMEOUT * max(1.0, peers * peers / cores / LOCAL_EXCHANGE_LOAD)


def size_exchange(config: Config, cores: int) -> bool:
    """Resolve chain.fetch_timeout = 0 for a local swarm of config.swarm.peers on `cores` cores, in place;
    where the attestation window's seconds are 0 (its blocks' time) and shorter than twice that timeout,
    set them to twice it, as `_check_fetch_fits_attestation` requires (the ledger's window ends once both
    its blocks and its seconds passed). A figure set in the config is kept. Whether it sized the timeout."""
    if config.chain.fetch_timeout:
        return False
    config.chain.fetch_timeout = local_fetch_timeout(config.swarm.peers, cores)
    needed = math.ceil(2 * config.chain.fetch_timeout)
    if not config.chain.attest_window_seconds and window_seconds(config)[1] < needed:
        config.chain.attest_window_seconds = needed
    return True


def _check_fetch_fits_attestation(config: Config) -> None:
    block_seconds = config.chain.attest_window * config.chain.block_time
    seconds = window_seconds(config)[1]
    attest_seconds = max(block_seconds, seconds)  # the window ends once its blocks and its seconds have passed
    if config.chain.fetch_timeout * 2 > attest_seconds:
        raise ValueError(
            f"chain.fetch_timeout ({config.chain.fetch_timeout} s) must be at most half the "
            f"attestation window ({config.chain.attest_window} blocks x {config.chain.block_time} s and "
            f"{seconds} s: {attest_seconds:g} s), or a round that waits for a missing blob is aborted"
        )


def _ledger_terms(config: Config) -> LedgerTerms:
    """What the run's ledger is deployed with, from the swarm's settings."""
    return LedgerTerms(
        min_peers=quorum(config),
        commit_window=config.chain.commit_window,
        attest_window=config.chain.attest_window,
        commit_window_seconds=window_seconds(config)[0],
        attest_window_seconds=window_seconds(config)[1],
        eps_cap_micro=eps_cap_micro(config),
        delta=config.privacy.delta,
        max_samples=max_samples(config),
        eps_step_micro=eps_step_micro(config),
        record_eps_cap_micro=record_eps_cap_micro(config),
        record_delta=record_delta(config),
        secure_aggregation=secure_aggregation(config),
    )


class LocalSwarm:
    """Anvil, the deployed ledger and N peer processes in one run folder. `swarm up` and the
    end-to-end tests drive swarms through this one class."""

    def __init__(
        self,
        config: Config,
        out: Path,
        *,
        faults: dict[int, str] | None = None,
        peer_overrides: dict[int, list[str]] | None = None,
        say: Callable[[str], None] | None = None,
    ):
        find_anvil()  # before any folder is made: a missing chain binary leaves nothing behind
        out = Path(out)
        if out.exists() and any(out.iterdir()):
            raise FileExistsError(f"--out {out} exists and is not empty: choose a new folder")
        # The sample cap resolved once, here, into the config.toml every peer runs with: a peer's own
        # data choices (`peer_overrides`) cannot then change the genesis it derives. So is the fetch
        # timeout, sized for the peers sharing this machine.
        config = copy.deepcopy(config)
        config.chain.max_samples = max_samples(config)
        cores = len(os.sched_getaffinity(0))
        sized = size_exchange(config, cores)  # the peers share this machine's cores
        self.config, self.out = config, out
        self.faults = faults or {}
        self.peer_overrides = peer_overrides or {}  # per-peer --set: local choices (its data)
        self.say = say or (lambda msg: None)
        if sized and config.chain.fetch_timeout > DEFAULT_FETCH_TIMEOUT:
            self.say(
                f"{config.swarm.peers} peers share {cores} cores: each waits up to {config.chain.fetch_timeout:g} s "
                f"for a round's blobs (chain.fetch_timeout), and a round's attestation window lasts at least "
                f"{window_seconds(config)[1]} s"
            )
        self.peers: list[PeerProcess] = []
        self._through: set[int] = set()  # peers seen past start-up and their first training (the ticker's)
        self._password = secrets.token_hex(16)

    def __enter__(self) -> LocalSwarm:
        config, out = self.config, self.out
        _check_fetch_fits_attestation(config)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(config.to_toml())
        # Transactions are mined at once; the empty blocks that make windows pass come from the
        # ticker, held at a slow pace while the peers start (node/runs/ticker.py: round 1's window
        # opened at deployment, and 16 peers take over a minute to import and load).
        self.chain = RunChain(
            out, genesis(config), _ledger_terms(config), peers=config.swarm.peers, ledger_kind=config.chain.ledger_kind
        )
        try:
            self.ticker = BlockTicker(self.chain.anvil.url, config.chain.block_time, self._peers_ready)
        except BaseException:
            self.chain.close()
            raise
        self.ticker.start()
        self.anvil, self.w3, self.ledger, self.archive = (
            self.chain.anvil,
            self.chain.w3,
            self.chain.ledger,
            self.chain.archive,
        )
        try:
            contract = CONTRACT_NAMES[config.chain.ledger_kind]
            self.say(f"{contract} {self.ledger.address} on {self.anvil.url} (chain id {self.chain.chain_id})")
            self._create_and_register_peers(config.swarm.peers)
            self.run_info = self.chain.write_run_info(
                peers=[{"index": p.index, "address": p.address, "peer_id": p.peer_id} for p in self.peers],
                config=config.to_dict(),
                protects=_protects(config),
            )
        except BaseException:
            self.ticker.stop()
            self.chain.close()
            raise
        return self

    def _create_and_register_peers(self, n: int) -> None:
        """Each peer's workdir, libp2p identity and address, then its registration on the ledger."""
        keys = []
        for i in range(n):
            workdir = self.out / "peers" / str(i)
            workdir.mkdir(parents=True)
            key_pair = load_or_create_identity(workdir / "p2p.key", self._password.encode())
            keys.append(key_pair.private_key)
            peer_id = ID.from_pubkey(key_pair.public_key).to_base58()
            multiaddr = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{peer_id}"
            self.peers.append(PeerProcess(i, workdir, self.chain.peer_account(i).address, peer_id, multiaddr))
        for p in self.peers:  # registered up front: a round may close as soon as all committed
            client = type(self.ledger)(self.w3, self.ledger.address, self.chain.peer_account(p.index))
            signature = sign_registration(keys[p.index], client.chain_id(), client.address, p.address)
            client.register(peer_id_to_bytes(p.peer_id), signature)

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            try:
                self.ticker.stop()
            finally:
                self.chain.close()

    def _peers_ready(self) -> bool:
        """Every started peer has been seen through start-up (imports, data) and its first training,
        or has exited: the chain's clock may then run at its pace (node/runs/ticker.py). Called
        by the ticker every tick; a peer seen through stays so (peers train again every round)."""
        started = [p for p in self.peers if p.process is not None]
        for p in started:
            if p.index in self._through:
                continue
            status = p.status()
            first_round_done = int(status.get("round", 0) or 0) > 1
            if (
                p.process is None
                or p.process.poll() is not None
                or first_round_done
                or status.get("phase", "starting") not in ("starting", "training")
            ):
                self._through.add(p.index)
        return bool(started) and all(p.index in self._through for p in started)

    def start_peer(self, i: int) -> None:
        self.ticker.peers_starting()
        p = self.peers[i]
        env = dict(os.environ, SWARM_PRIVATE_KEY=self.chain.peer_key(i), **{P2P_PASSWORD_ENV: self._password})
        cmd = [
            sys.executable,
            "-m",
            "node.cli",
            "node",
            "--rpc-url",
            self.anvil.url,
            "--ledger",
            self.ledger.address,
            "--config",
            str(self.out / "config.toml"),
            "--workdir",
            str(p.workdir),
            "--listen",
            p.multiaddr.rsplit("/p2p/", 1)[0],
            "--partition",
            f"{i}/{len(self.peers)}",
            # started together, the peers may come up minutes apart on a loaded machine: no deadline
            "--bootstrap-timeout",
            "0",
            "--no-chain-events",  # the run folder keeps the ledger's events once (`swarm up`)
        ]
        for q in self.peers:
            if q is not p:
                cmd += ["--bootstrap", q.multiaddr]
        if i in self.faults:
            cmd += ["--fault", self.faults[i]]
        for override in self.peer_overrides.get(i, []):
            cmd += ["--set", override]
        with open(p.workdir / "peer.log", "ab") as log:
            # A session of its own: Ctrl-C reaches only us, and we stop the peers in order.
            p.process = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    def start(self) -> None:
        self.say(
            f"starting {len(self.peers)} peers; until all are up and trained once, the chain mines a block "
            f"every {self.ticker.hold_pace:g} s (windows need blocks too), then every {self.ticker.block_time:g} s"
        )
        for i in range(len(self.peers)):
            self.start_peer(i)

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        process = self.peers[i].process
        if process is None:
            raise RuntimeError(f"peer {i} was never started")
        process.send_signal(sig)
        process.wait()

    def running(self) -> bool:
        return any(p.process and p.process.poll() is None for p in self.peers)

    def wait(self, timeout: float, on_tick: Callable[[], None] | None = None) -> None:
        """Until every peer process has exited; dumps the chain after every finished round so
        a hard kill of this process still leaves a verifiable folder."""
        deadline = time.monotonic() + timeout
        last_dumped = 0
        while self.running():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the swarm did not finish within {timeout:.0f} s (see {self.out}/peers/*/peer.log)")
            time.sleep(0.5)
            if on_tick:
                on_tick()
            done = self.ledger.current_round() - 1
            if done > last_dumped:
                self.save_chain()
                last_dumped = done

    def save_chain(self) -> None:
        self.chain.save_state()

    def stop(self, grace: float = 10.0) -> None:
        _stop(self.peers, grace)

    def finish(self, interrupted: bool) -> dict:
        self.stop()
        self.save_chain()
        _collect_archive(self.peers, self.archive)

        return write_report(self.out, self.peers, self.ledger, self.run_info, interrupted)


def run_up(
    config: Config,
    *,
    out: Path | None,
    json_output: bool,
    on_started: Callable[[], None] | None = None,
    on_finished: Callable[[], None] | None = None,
) -> dict:
    """Run a local swarm to the end (or Ctrl-C) and return the report as a dict. `on_started` is
    called once the ledger is deployed and run.json written, `on_finished` once the peers have
    stopped, while the chain still runs (`swarm up` keeps the ledger's events in the folder)."""
    say = (lambda *a: None) if json_output else (lambda msg: print(msg, flush=True))
    out = out or (Path(config.output.dir) / default_out_dir().name if config.output.dir else default_out_dir())
    with LocalSwarm(config, out, say=say) as swarm:
        if on_started:
            on_started()
        interrupted = False
        try:
            swarm.start()  # a Ctrl-C while the peers start stops the ones started, as later
            _watch(swarm, json_output)
        except KeyboardInterrupt:
            interrupted = True
            say("interrupted: stopping the peers, saving the chain and the archive")
        report = swarm.finish(interrupted)
        if on_finished:
            on_finished()
        return report


def live_title(ledger: str, live_round: int, rounds: int, ended: dict[int, str]) -> str:
    """The live table's title. The ledger opens round rounds + 1 when the last one ends, so the
    round shown stops at the last one ("round 5 of 5", never "round 6 of 5"); only the swarm's own
    rounds are counted."""
    mine = [state for r, state in ended.items() if r <= rounds]
    finalized = sum(state == "finalized" for state in mine)
    aborted = len(mine) - finalized
    warn = "  [bold red]most rounds aborted[/bold red]" if 2 * aborted > len(mine) > 0 else ""
    done = "  done" if len(mine) >= rounds else ""
    return (
        f"swarm {ledger[:10]}…  round {min(live_round, rounds)} of {rounds}: "
        f"{finalized} finalized, {aborted} aborted{warn}{done}"
    )


def _watch(swarm: LocalSwarm, json_output: bool) -> None:
    """Live progress: round, phase and last figures of every peer."""

    config, ledger = swarm.config, swarm.ledger

    dp_sgd = config.train.dp_sgd
    whole = f"eps (delta), whole update: {_protects(config)}"

    ended: dict[int, str] = {}  # round -> "finalized" | "aborted", read once each

    def table() -> Table:
        live_round = ledger.current_round()
        for r in range(1, live_round):
            if r not in ended:
                ended[r] = ledger.round_info(r).state.name.lower()
        t = Table(title=live_title(ledger.address, live_round, config.swarm.rounds, ended))
        columns = ["peer", "round", "phase", "accuracy", whole]
        if dp_sgd:
            columns.append("eps (delta), each training record (DP-SGD), at the declared count")
        for col in [*columns, "process"]:
            t.add_column(col)
        for p in swarm.peers:
            st, m = p.status(), p.metrics()
            last = m[-1] if m else {}
            acc = f"{last['accuracy']:.3f}" if last.get("accuracy") is not None else "-"
            eps = "-"
            if last.get("eps_cumulative") is not None:
                eps = f"{last['eps_cumulative']:.4g} (delta {last.get('delta_cumulative') or 0:g})"
            cells = [str(p.index), str(st.get("round", "-")), st.get("phase", "starting"), acc, eps]
            if dp_sgd:
                record = last.get("record_eps_cumulative")
                cells.append("-" if record is None else f"{record:.4g} (delta {last.get('record_delta') or 0:g})")
            code = p.process.poll() if p.process else None
            cells.append("running" if p.process and code is None else f"exit {code}")
            t.add_row(*cells)
        return t

    console = Console(stderr=True, quiet=json_output)
    with Live(table(), console=console, refresh_per_second=2) as live:
        swarm.wait(config.chain.run_timeout, on_tick=lambda: live.update(table()))


def _stop(peers: list[PeerProcess], grace: float = 10.0) -> None:
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


def _collect_archive(peers: list[PeerProcess], archive: DiskBlobStore) -> None:
    for p in peers:
        store = DiskBlobStore(p.workdir / "blobs")
        for digest in store.digests():
            if not archive.has(digest):
                data = store.get(digest)
                if data is not None:
                    archive.put(data)
