"""`swarm simulate`: hundreds of peers in one process, sharing the node's round code.

Each round, a seeded sample of the peers (a fraction of them) contributes through
`node.learning.contribute.contribute` (train from the global model, take weights or update, perturb), exactly
as a peer process does, and the global model comes from `node.protocol.wire.next_global` (the same
aggregation `swarm verify` recomputes). What is left out is the network: no libp2p, and the
ledger only when asked for (`ledger=True`: a real Anvil, one account per simulated peer, the same
blobs and transactions as `swarm up`, so `swarm verify --run DIR` checks a simulated run).

Randomness: the one seed of the config drives everything: the genesis model and the partition
(as for real peers), the peers sampled each round (`sample_peers`), and each peer's training and
perturbation (`node.learning.contribute.round_seed(seed, peer, round)`). The same seed, thread count and machine
give bit-identical metrics (the model digest of every round is in them).

Privacy: every round, each participant's cumulative eps for its whole shared vector comes from
`mechanisms.accounting.cumulative_spend(params, d, k)` (k = rounds it has contributed in), never
the per-coordinate figure; `protects` says what it covers ("sign" for PNPM).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from node.protocol import wire
from node.protocol.blob import sha256
from node.protocol.wire import encode_bitmap
from node.derive import peer_settings
import math
from opacus.accountants import RDPAccountant
import mechanisms
from node.protocol.blob import flatten
from node.learning.data import load_dataset
from node.learning.models import init_model
from node.learning.partition import partition
from mechanisms.accounting import cumulative_spend
from node.protocol.blob import unflatten
from node.learning.contribute import contribute, round_seed
from node.learning.train import evaluate
from node.runfiles import MetricsWriter
from node.runfiles import write_json_atomic
from eth_account import Account
from node.chain.anvil import start_anvil
from node.chain.client import LedgerClient, connect
from p2p.store import DiskBlobStore
from node.chain.client import LedgerClient

NO_MECHANISM = "none"  # the non-private baseline: simulate only, never on a ledger
DIVERGENCE_BOUND = 1e6  # a global model with a weight beyond this has exploded (the PNPM paper's "gradient explosion")


class SimulationError(ValueError):
    """A simulation parameter is out of range."""


def peer_name(index: int) -> str:
    """The identity a simulated peer's seeds derive from; the same with or without a ledger, so
    recording a run on chain does not change it."""
    return f"sim-peer-{index}"


def sample_peers(seed: int, round_number: int, num_peers: int, fraction: float) -> list[int]:
    """The peers of round `round_number`: max(1, round(fraction * n)) of them, drawn without
    replacement from a generator seeded by (seed, round) alone, returned sorted (the order in which
    they commit, hence the ledger order of the aggregation)."""
    if not 0 < fraction <= 1:
        raise SimulationError(f"fraction must be in (0, 1], got {fraction!r}")
    count = sample_size(num_peers, fraction)
    if count == num_peers:
        return list(range(num_peers))
    digest = hashlib.sha256(f"sample:{seed}:{round_number}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "big"))
    return sorted(int(i) for i in rng.choice(num_peers, size=count, replace=False))


@dataclass
class SimulationResult:
    records: list[dict]  # one per round: what metrics.jsonl holds (deterministic)
    summary: dict  # settings, final figures, timings
    out: Path | None = None


@dataclass
class _Peer:
    name: str
    x: torch.Tensor
    y: torch.Tensor
    commits: int = 0
    eps: float | None = None


@dataclass
class _Timing:
    train: float = 0.0  # inside node.learning.contribute.contribute: local training + perturbation
    aggregate: float = 0.0
    evaluate: float = 0.0
    ledger: float = 0.0
    rounds: list[float] = field(default_factory=list)  # wall time of each round, evaluation included
    evaluations: list[float] = field(default_factory=list)  # the test evaluation's share of each round


def simulation_settings(config, mechanism_params: dict | None = None):
    """The PeerSettings every simulated peer runs with (node.derive.peer_settings). The baseline
    "none" gets parameters {"name": "none"} (no mechanism); `mechanism_params`, when given,
    replaces the config's mechanism (for parameters the config's float-only table cannot hold)."""

    if mechanism_params is None and config.privacy.mechanism != NO_MECHANISM:
        return peer_settings(config)
    # Every field but the mechanism is the configuration's; pnpm only fills the slot.
    stand_in = copy.deepcopy(config)
    stand_in.privacy.mechanism = "pnpm"
    stand_in.privacy.params = {}
    return dataclasses.replace(peer_settings(stand_in), mechanism=dict(mechanism_params or {"name": NO_MECHANISM}))


class Simulation:
    """A whole swarm in one process. `run()` returns the per-round records and a summary and,
    with `out`, writes metrics.jsonl, summary.json, config.toml (and with `ledger` a folder that
    `swarm verify --run` checks)."""

    def __init__(self, config, *, fraction: float = 1.0, out: Path | None = None, ledger: bool = False,
                 threads: int | None = 1, on_progress: Callable[[dict], None] | None = None,
                 mechanism_params: dict | None = None):
        if not 0 < fraction <= 1:
            raise SimulationError(f"fraction must be in (0, 1], got {fraction!r}")
        if threads is not None and threads < 1:
            raise SimulationError(f"threads must be >= 1, got {threads!r}")
        if ledger and config.privacy.mechanism == NO_MECHANISM:
            raise SimulationError("mechanism none (the non-private baseline) cannot be recorded on a ledger: the "
                                  "ledger records every contribution's eps; choose a mechanism or drop --ledger")
        self.config = config
        self.fraction = float(fraction)
        self.out = Path(out) if out is not None else None
        if self.out is not None and self.out.exists() and any(self.out.iterdir()):
            raise FileExistsError(f"--out {self.out} exists and is not empty: choose a new folder")
        self.use_ledger = ledger
        self.threads = threads
        self.on_progress = on_progress or (lambda event: None)
        # Parameters the config's float-only [privacy.params] cannot express (e.g. sampled's base).
        self.mechanism_override = dict(mechanism_params) if mechanism_params else None
        self._prepared = False

    # ------------------------------------------------------------------ setup
    def prepare(self) -> None:
        """Load the data, cut the shards, build the genesis model and the mechanism (run() does
        it when not done yet; benchmarks call it first to time training on the same shards)."""
        if self._prepared:
            return
        self._prepare()
        self._prepared = True

    def _prepare(self):
        c = self.config
        self.settings = simulation_settings(c, self.mechanism_override)
        self.mechanism_params = dict(self.settings.mechanism)
        self.mechanism = (None if self.mechanism_params.get("name") == NO_MECHANISM
                          else mechanisms.from_params(self.mechanism_params))
        sh = self.settings.shared
        self.model = init_model(sh.model, input_shape=sh.input_shape, num_classes=sh.num_classes, seed=sh.seed)
        self.genesis_vector, self.spec = flatten(self.model)
        self.num_params = self.genesis_vector.numel()
        d = c.data
        train = load_dataset(d.dataset, data_dir=d.data_dir or None, split="train", limit=d.limit or None)
        test = load_dataset(d.dataset, data_dir=d.data_dir or None, split="test", limit=d.test_limit or None)
        # The same call node.derive.load_shard makes: peer i here holds what `--partition i/N` would give.
        shards = partition(train.y.numpy(), c.swarm.peers, scheme=d.partition, alpha=d.alpha,
                           shards_per_peer=d.shards_per_peer, seed=c.swarm.seed)
        self.peers = []
        for i, idx in enumerate(shards):
            index = torch.as_tensor(idx, dtype=torch.long)
            self.peers.append(_Peer(peer_name(i), train.x[index].contiguous(), train.y[index].contiguous()))
        self.test_x, self.test_y = test.x, test.y
        self._spend_cache: dict[int, object] = {}

    def _spend(self, commits: int):
        """Cumulative spend after `commits` contributions: depends on k only, so computed once per k."""
        if self.mechanism is None:
            return None
        if commits not in self._spend_cache:
            self._spend_cache[commits] = cumulative_spend(self.mechanism_params, self.num_params, commits)
        return self._spend_cache[commits]

    # -------------------------------------------------------------------- run
    def run(self) -> SimulationResult:
        previous_threads = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            self.prepare()
            c = self.config
            seed = c.swarm.seed
            timing = _Timing()
            records: list[dict] = []
            recorder = self._recorder()
            metrics = None
            if self.out is not None:
                self.out.mkdir(parents=True, exist_ok=True)
                (self.out / "config.toml").write_text(c.to_toml())
                metrics = MetricsWriter(self.out / "metrics.jsonl")
            started = time.perf_counter()
            try:
                t0 = time.perf_counter()
                recorder.start(self)
                timing.ledger += time.perf_counter() - t0
                global_vector = self.genesis_vector.clone()
                stop_reason = None
                for r in range(1, c.swarm.rounds + 1):
                    round_start = time.perf_counter()
                    chosen = sample_peers(seed, r, len(self.peers), self.fraction)
                    vectors, weights, losses = [], [], []
                    diverged = None
                    for done, i in enumerate(chosen, start=1):
                        peer = self.peers[i]
                        t0 = time.perf_counter()
                        try:
                            contribution = contribute(self.model, self.spec, global_vector, peer.x, peer.y,
                                                      settings=self.settings, mechanism=self.mechanism,
                                                      round_number=r, seed=round_seed(seed, peer.name, r))
                        except ValueError as exc:
                            if "nan" not in str(exc).lower() and "inf" not in str(exc).lower():
                                raise
                            contribution, diverged = None, f"peer {i}: {exc}"
                        timing.train += time.perf_counter() - t0
                        if contribution is not None and not bool(torch.isfinite(contribution.vector).all()):
                            diverged = f"peer {i}: non-finite contribution"
                        if diverged:
                            break
                        vectors.append(contribution.vector)
                        weights.append(contribution.num_samples)
                        losses.append(contribution.mean_loss)
                        peer.commits += 1
                        spend = self._spend(peer.commits)
                        peer.eps = None if spend is None else float(spend.epsilon)
                        self.on_progress({"round": r, "done": done, "of": len(chosen)})
                    if diverged:
                        stop_reason = f"diverged in round {r} ({diverged})"
                        records.append(self._record(r, chosen, None, None, losses, None, diverged=True))
                        if metrics:
                            metrics.write(records[-1])
                        break
                    t0 = time.perf_counter()
                    global_vector = wire.next_global(self.settings.shared, global_vector, vectors, weights)
                    timing.aggregate += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    model_digest = recorder.round(self, r, chosen, vectors, weights, global_vector)
                    timing.ledger += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    self.model.load_state_dict(unflatten(global_vector, self.spec))
                    accuracy, loss = evaluate(self.model, self.test_x, self.test_y)
                    timing.evaluations.append(time.perf_counter() - t0)
                    timing.evaluate += timing.evaluations[-1]
                    exploded = (not np.isfinite(loss)) or float(global_vector.abs().max()) > DIVERGENCE_BOUND
                    records.append(self._record(r, chosen, accuracy, loss, losses, model_digest, diverged=exploded))
                    if metrics:
                        metrics.write(records[-1])
                    timing.rounds.append(time.perf_counter() - round_start)
                    self.on_progress({"round": r, "accuracy": accuracy, "finished": True})
                    if exploded:
                        stop_reason = f"diverged in round {r} (global model exploded)"
                        break
                t0 = time.perf_counter()
                recorder.finish(self)
                timing.ledger += time.perf_counter() - t0
            finally:
                recorder.close()
                if metrics:
                    metrics.close()
            summary = self._summary(records, timing, time.perf_counter() - started, stop_reason, recorder)
            if self.out is not None:
                write_json_atomic(self.out / "summary.json", summary)
            return SimulationResult(records, summary, self.out)
        finally:
            torch.set_num_threads(previous_threads)

    def _recorder(self):
        if self.use_ledger:
            if self.out is None:
                raise SimulationError("a simulation with the ledger needs an output folder (--out)")
            return ChainRecorder(self.out)
        return _DigestOnly()

    # ------------------------------------------------------------- reporting
    def _record(self, r, chosen, accuracy, loss, train_losses, model_digest, *, diverged: bool) -> dict:
        """One metrics line: only deterministic values (timings go to summary.json)."""
        eps = [p.eps for p in self.peers if p.eps is not None]
        spend = self._spend(1)
        finite = [v for v in train_losses if np.isfinite(v)]
        return {
            "round": r,
            "participants": len(chosen),
            "participants_digest": hashlib.sha256(",".join(map(str, chosen)).encode()).hexdigest()[:16],
            "accuracy": None if accuracy is None else float(accuracy),
            "loss": None if loss is None or not np.isfinite(loss) else float(loss),
            "train_loss": float(np.mean(finite)) if finite else None,
            "model_digest": model_digest,
            "diverged": bool(diverged),
            "eps_max": max(eps) if eps else None,  # largest cumulative whole-update eps of any peer so far
            "eps_per_contribution": None if spend is None else float(spend.epsilon),
            "protects": "nothing (non-private baseline)" if spend is None else spend.protects,
        }

    def _summary(self, records, timing: _Timing, seconds: float, stop_reason, recorder) -> dict:
        c = self.config
        done = [r for r in records if r["accuracy"] is not None]
        peer_rounds = sum(r["participants"] for r in records)
        spend = self._spend(1)
        max_commits = max((p.commits for p in self.peers), default=0)
        final_spend = self._spend(max_commits) if max_commits else None
        return {
            "dataset": c.data.dataset,
            "model": self.settings.shared.model,
            "num_params": self.num_params,
            "peers": c.swarm.peers,
            "fraction": self.fraction,
            "rounds": c.swarm.rounds,
            "rounds_done": len(done),
            "seed": c.swarm.seed,
            "share": self.settings.shared.share,
            "aggregation": self.settings.shared.aggregation,
            "mechanism": self.mechanism_params,
            "epochs": self.settings.epochs,
            "batch_size": self.settings.batch_size,
            "lr": self.settings.lr,
            "partition": c.data.partition,
            "final_accuracy": done[-1]["accuracy"] if done else None,
            "best_accuracy": max(r["accuracy"] for r in done) if done else None,
            "diverged": stop_reason,
            "privacy": None if spend is None else {
                "per_contribution_eps": float(spend.epsilon),
                "max_contributions": max_commits,
                "eps_whole_update_max": float(final_spend.epsilon) if final_spend else None,
                "delta": float(getattr(final_spend or spend, "delta", 0.0) or 0.0),
                "protects": spend.protects,
                "per_coordinate_eps": self.mechanism_params.get("epsilon"),
            },
            "dp_sgd": self._dp_sgd_summary(),
            "peer_rounds": peer_rounds,
            "threads": self.threads,
            "seconds": {"total": seconds, "train": timing.train, "aggregate": timing.aggregate,
                        "evaluate": timing.evaluate, "ledger": timing.ledger, "rounds": timing.rounds,
                        "evaluations": timing.evaluations},
            "ledger": recorder.info(),
        }


    def _dp_sgd_summary(self) -> dict | None:
        """With DP-SGD in local training: each peer's cumulative record-level eps over every step
        of every round it took part in (RDP), the largest over peers. node.learning.train accounts one
        call at a time; the steps of all rounds compose, which is what this adds up."""
        dp = self.settings.dp
        if dp is None:
            return None
        worst = 0.0
        for peer in self.peers:
            if peer.commits:
                worst = max(worst, dp_sgd_epsilon(dp, len(peer.y), self.settings.batch_size, self.settings.epochs,
                                                  peer.commits))
        return {"epsilon": worst, "delta": dp.delta, "protects": "each training record (DP-SGD, RDP accountant)",
                "noise_multiplier": dp.noise_multiplier, "max_grad_norm": dp.max_grad_norm}


def dp_sgd_epsilon(dp, num_samples: int, batch_size: int, epochs: int, rounds: int) -> float:
    """Record-level eps of a peer after `rounds` rounds of DP-SGD as node.learning.train runs it: Poisson
    sampling at rate q = batch/N, ceil(1/q) steps per epoch, every step accounted."""

    rate = min(1.0, batch_size / num_samples)
    accountant = RDPAccountant()
    accountant.history = [(dp.noise_multiplier, rate, max(1, math.ceil(1 / rate)) * epochs * rounds)]
    return float(accountant.get_epsilon(dp.delta))


class _DigestOnly:
    """Without a ledger: nothing to record but the model digest each round (the sha256 of the
    model blob, what participants would attest), which makes reproducibility checkable."""

    def start(self, sim) -> None:
        pass

    def round(self, sim, r, chosen, vectors, weights, global_vector) -> str:
        return sha256(wire.model_blob(global_vector, r)).hex()

    def finish(self, sim) -> None:
        pass

    def close(self) -> None:
        pass

    def info(self):
        return None


class ChainRecorder:
    """Records a simulated run on a real Anvil exactly as `swarm up` would: one funded account
    per simulated peer (registered when first sampled), per round each participant's update blob
    committed from its own account (digest, samples, cumulative eps, mechanism JSON), the round
    closed, and every participant attesting the aggregate's digest with the all-included bitmap.
    Leaves run.json, chain/state.json and archive/ so that `swarm verify --run OUT` re-checks it.

    The contract counts windows in blocks and Anvil mines one block per transaction: the commit
    window is sized so that every participant of a round fits in it, and the recorder mines empty
    blocks up to the window's end before closing."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self._anvil = None
        self.gas: dict[str, int] = {}

    def start(self, sim) -> None:
        c = sim.config
        n = len(sim.peers)
        self.window = 2 * sample_size(n, sim.fraction) + 3  # registrations + commits of a round, one block each
        (self.out / "chain").mkdir(parents=True, exist_ok=True)
        self.archive = DiskBlobStore(self.out / "archive")
        genesis = wire.genesis_blob(sim.genesis_vector, sim.settings.shared.to_dict())
        self.archive.put(genesis)
        self._anvil = start_anvil(accounts=n + 1)
        self.w3 = connect(self._anvil.url)
        keys = self._anvil.private_keys
        # The cap is exactly what `rounds` contributions spend: no simulated peer can reach past it.
        cap = wire.eps_to_micro(cumulative_spend(sim.mechanism_params, sim.num_params, c.swarm.rounds).epsilon)
        self.ledger = LedgerClient.deploy(self.w3, Account.from_key(keys[0]), min_peers=1, commit_window=self.window,
                                          attest_window=self.window, eps_cap_micro=cap, delta=c.privacy.delta,
                                          genesis_digest=sha256(genesis))
        self.accounts = [Account.from_key(k) for k in keys[1:n + 1]]
        self.clients: dict[int, object] = {}
        self.mechanism_json = wire.canonical(sim.mechanism_params)
        self.run_info = {"ledger": self.ledger.address, "chain_id": self.w3.eth.chain_id, "rpc_url": self._anvil.url,
                         "simulated": True,
                         "peers": [{"index": i, "address": a.address, "peer_id": _sim_peer_id(i).hex()}
                                   for i, a in enumerate(self.accounts)],
                         "started": time.time(), "config": c.to_dict(), "fraction": sim.fraction}
        write_json_atomic(self.out / "run.json", self.run_info)

    def _client(self, i: int):
        if i not in self.clients:
            client = LedgerClient(self.w3, self.ledger.address, self.accounts[i])
            self._add_gas("register", client.register(_sim_peer_id(i)))
            self.clients[i] = client
        return self.clients[i]

    def _add_gas(self, what: str, receipt) -> None:
        self.gas[what] = self.gas.get(what, 0) + int(receipt["gasUsed"])

    def round(self, sim, r, chosen, vectors, weights, global_vector) -> str:
        if self.ledger.current_round() != r:
            raise RuntimeError(f"ledger is in round {self.ledger.current_round()}, the simulation in round {r}")
        for i, vector, samples in zip(chosen, vectors, weights):
            blob = wire.update_blob(vector, r, self.mechanism_json)
            digest = self.archive.put(blob)
            eps_micro = wire.eps_to_micro(sim.peers[i].eps)
            self._add_gas("commit", self._client(i).commit(r, bytes.fromhex(digest), samples, eps_micro,
                                                           self.mechanism_json.encode()))
        last_block = self.ledger.round_info(r).opened_block + self.window
        # One past the window's last block: the close must already hold when it is estimated.
        self._anvil.mine(max(0, last_block + 1 - self.ledger.block_number()))
        self._add_gas("close", self.ledger.close_round(r))
        model = wire.model_blob(global_vector, r)
        digest = self.archive.put(model)
        included = encode_bitmap([True] * len(chosen))
        for i in chosen:
            if self.ledger.round_info(r).state.name == "FINALIZED":
                break  # a strict majority already attested: the rest would be refused
            self._add_gas("attest", self._client(i).attest(r, bytes.fromhex(digest), included))
        if self.ledger.finalized_digest(r) != bytes.fromhex(digest):
            raise RuntimeError(f"round {r} did not finalize with the simulated aggregate {digest[:16]}...")
        self._anvil.dump_state(self.out / "chain" / "state.json")
        return digest

    def finish(self, sim) -> None:
        self._anvil.dump_state(self.out / "chain" / "state.json")

    def close(self) -> None:
        if self._anvil is not None:
            self._anvil.stop()
            self._anvil = None

    def info(self) -> dict:
        return {"ledger": self.run_info["ledger"], "chain_id": self.run_info["chain_id"], "gas": dict(self.gas),
                "verify_command": f"swarm verify --run {self.out}"}


def _sim_peer_id(index: int) -> bytes:
    """A stand-in for a libp2p peer id (simulated peers have no host): 32 bytes, unique per peer."""
    return hashlib.sha256(peer_name(index).encode()).digest()


def sample_size(num_peers: int, fraction: float) -> int:
    return max(1, min(num_peers, round(fraction * num_peers)))


def summary_line(summary: dict) -> str:
    """One human line on the privacy of a run: the honest whole-update figure and what it covers."""
    p = summary.get("privacy")
    dp = summary.get("dp_sgd")
    records = "" if not dp else (f"; DP-SGD: ({dp['epsilon']:.4g}, {dp['delta']:g})-DP for {dp['protects']}")
    if p is None:
        return ("no local DP on the shared vector" + records) if dp else "no privacy: non-private baseline"
    note = " (sign only: PNPM never randomizes |w|, so the value itself has no finite eps)" if p["protects"] == "sign" else ""
    return (f"eps per peer, whole shared vector of {summary['num_params']} coordinates, after "
            f"{p['max_contributions']} contributions: {p['eps_whole_update_max']:.6g} "
            f"(per contribution {p['per_contribution_eps']:.6g}; per coordinate {p['per_coordinate_eps']}); "
            f"protects {p['protects']}{note}{records}")


def load_summary(out: Path) -> dict:
    return json.loads((Path(out) / "summary.json").read_text())
