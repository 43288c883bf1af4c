"""`swarm simulate`: hundreds of peers in one process, sharing the node's round code.

Each round, a seeded sample of the peers (a fraction of them) contributes through
`node.learning.contribute.contribute` (train from the global model, take weights or update, perturb), exactly
as a peer process does, and the global model comes from `node.protocol.aggregate.next_global` (the same
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

import contextlib
import copy
import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

import mechanisms
from mechanisms.accounting import Spend, cumulative_spend
from mechanisms.randomness import PrivacyGenerator, secret_generator, seeded_generator
from mechanisms.record_level import ACCOUNTANT as RECORD_ACCOUNTANT
from mechanisms.record_level import PROTECTS as RECORD_PROTECTS
from mechanisms.record_level import record_level_spend
from mechanisms.secagg.policy import NAME as SECAGG
from mechanisms.secagg.policy import PROTECTS as SECAGG_PROTECTS
from mechanisms.secagg.policy import SecAggPolicy
from node.chain.anvil import find_anvil
from node.config import Config
from node.derive import peer_settings
from node.learning.contribute import contribute, round_seed
from node.learning.data import load_dataset
from node.learning.models import init_model, model_inputs
from node.learning.partition import partition
from node.learning.train import evaluate
from node.protocol import aggregate
from node.protocol.blob import flatten, unflatten
from node.protocol.settings import PeerSettings, PrivacyPolicy
from node.runfiles import MetricsWriter, write_json_atomic
from node.runs.recorder import ChainRecorder, DigestOnly
from node.runs.secure_round import SecureRounds

SEEDED_NOISE = "noise reproducible from the seed: a simulation, not a private run"
SECRET_NOISE = "noise from the OS CSPRNG (as a real peer draws it): not reproducible"
NO_MECHANISM = "none"  # the non-private baseline: simulate only, never on a ledger
PRIVACY_FIGURES = (  # what progress.png plots of each round's record besides the accuracy
    ("eps_max", "eps per peer, whole update (max)"),
    ("record_eps_max", "record-level eps per peer, DP-SGD (max)"),
)
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
    eps: float | None = None  # cumulative whole-update eps of the local mechanism
    record_eps: float | None = None  # cumulative record-level eps (DP-SGD)


@dataclass
class _Timing:
    train: float = 0.0  # inside node.learning.contribute.contribute: local training + perturbation
    aggregate: float = 0.0
    evaluate: float = 0.0
    ledger: float = 0.0
    rounds: list[float] = field(default_factory=list)  # wall time of each round, evaluation included
    evaluations: list[float] = field(default_factory=list)  # the test evaluation's share of each round

    @contextlib.contextmanager
    def spent(self, part: str) -> Iterator[None]:
        """Adds the block's wall time to `part` (train, aggregate, evaluate or ledger)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, part, getattr(self, part) + time.perf_counter() - t0)


def simulation_settings(config: Config, mechanism_params: dict | None = None) -> PeerSettings:
    """The PeerSettings every simulated peer runs with (node.derive.peer_settings). The baseline
    "none" gets parameters {"name": "none"} (no mechanism); `mechanism_params`, when given,
    replaces the config's mechanism (for parameters the config's float-only table cannot hold)."""

    if mechanism_params is None and config.privacy.mechanism != NO_MECHANISM:
        return peer_settings(config)
    # Every field but the mechanism is the configuration's; pnpm only fills the slot.
    stand_in = copy.deepcopy(config)
    stand_in.privacy.mechanism = "pnpm"
    stand_in.privacy.params = {}
    base = peer_settings(stand_in)
    privacy = PrivacyPolicy(dict(mechanism_params or {"name": NO_MECHANISM}), base.dp)
    return dataclasses.replace(base, shared=dataclasses.replace(base.shared, privacy=privacy))


class Simulation:
    """A whole swarm in one process. `run()` returns the per-round records and a summary and,
    with `out`, writes metrics.jsonl, summary.json, config.toml (and with `ledger` a folder that
    `swarm verify --run` checks)."""

    def __init__(
        self,
        config: Config,
        *,
        fraction: float = 1.0,
        out: Path | None = None,
        ledger: bool = False,
        threads: int | None = 1,
        on_progress: Callable[[dict], None] | None = None,
        mechanism_params: dict | None = None,
        secret_noise: bool = False,
    ):
        if not 0 < fraction <= 1:
            raise SimulationError(f"fraction must be in (0, 1], got {fraction!r}")
        if threads is not None and threads < 1:
            raise SimulationError(f"threads must be >= 1, got {threads!r}")
        if ledger and config.privacy.mechanism == NO_MECHANISM:
            raise SimulationError(
                "mechanism none (the non-private baseline) cannot be recorded on a ledger: the "
                "ledger records every contribution's eps; choose a mechanism or drop --ledger"
            )
        self.config = config
        self.fraction = float(fraction)
        self.out = Path(out) if out is not None else None
        if self.out is not None and self.out.exists() and any(self.out.iterdir()):
            raise FileExistsError(f"--out {self.out} exists and is not empty: choose a new folder")
        if config.privacy.mechanism == SECAGG and (ledger or fraction != 1):
            raise SimulationError("secure aggregation simulates every peer in every round, without the ledger")
        if ledger:
            find_anvil()  # fail before any work or folder when the chain binary is missing
        self.use_ledger = ledger
        # Seeded noise makes experiments reproducible, and anyone with the seed can subtract it:
        # every file the run writes says which kind it used.
        self.secret_noise = secret_noise
        self.noise_label = SECRET_NOISE if secret_noise else SEEDED_NOISE
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

    def _prepare(self) -> None:
        c = self.config
        self.settings = simulation_settings(c, self.mechanism_override)
        self.mechanism_params = dict(self.settings.mechanism)
        name = self.mechanism_params.get("name")
        self.mechanism = None if name in (NO_MECHANISM, SECAGG) else mechanisms.from_params(self.mechanism_params)
        self.secure = (
            SecureRounds(SecAggPolicy.from_dict(self.mechanism_params), self.settings) if name == SECAGG else None
        )
        sh = self.settings.shared
        self.model = init_model(sh.model, input_shape=sh.input_shape, num_classes=sh.num_classes, seed=sh.seed)
        self.genesis_vector, self.spec = flatten(self.model)
        self.num_params = self.genesis_vector.numel()
        d = c.data
        train = load_dataset(d.dataset, data_dir=d.data_dir or None, split="train", limit=d.limit or None)
        test = load_dataset(d.dataset, data_dir=d.data_dir or None, split="test", limit=d.test_limit or None)
        # The same call node.derive.load_shard makes: peer i here holds what `--partition i/N` would give.
        shards = partition(
            train.y.numpy(),
            c.swarm.peers,
            scheme=d.partition,
            alpha=d.alpha,
            shards_per_peer=d.shards_per_peer,
            seed=c.swarm.seed,
        )
        # A model may read fixed features of the inputs (ScatterNet): computed once for the whole set.
        train_x = model_inputs(sh.model, train.x)
        self.peers = []
        for i, idx in enumerate(shards):
            index = torch.as_tensor(idx, dtype=torch.long)
            self.peers.append(_Peer(peer_name(i), train_x[index].contiguous(), train.y[index].contiguous()))
        self.test_x, self.test_y = model_inputs(sh.model, test.x), test.y
        self._spend_cache: dict[int, Spend] = {}
        self._record_cache: dict[tuple[int, int], float] = {}

    def _noise(self, seed: int, peer: str, round_number: int) -> PrivacyGenerator:
        """The generator of one contribution's privacy draws: secret as in a real peer, or (the
        default, for reproducible experiments) seeded from the public round seed."""
        if self.secret_noise:
            return secret_generator()
        return seeded_generator(round_seed(seed, peer, round_number) ^ 0x5EED)

    def _spend(self, commits: int) -> Spend | None:
        """Cumulative spend after `commits` contributions: depends on k only, so computed once per k."""
        if self.mechanism is None:
            return None
        if commits not in self._spend_cache:
            self._spend_cache[commits] = cumulative_spend(self.mechanism_params, self.num_params, commits)
        return self._spend_cache[commits]

    def _record_spend(self, samples: int, commits: int) -> float | None:
        """Record-level eps of a peer with `samples` records after `commits` DP-SGD rounds (None
        without DP-SGD); computed once per (samples, commits)."""
        if self.secure is not None:
            return self.secure.policy.epsilon(commits)
        if self.settings.dp is None:
            return None
        key = (samples, commits)
        if key not in self._record_cache:
            self._record_cache[key] = record_level_spend(self.settings.dp, [samples] * commits).epsilon
        return self._record_cache[key]

    # -------------------------------------------------------------------- run
    def run(self) -> SimulationResult:
        previous_threads = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            self.prepare()
            return self._run()
        finally:
            torch.set_num_threads(previous_threads)

    def _run(self) -> SimulationResult:
        timing, records = _Timing(), []
        recorder = self._recorder()
        metrics = None
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.toml").write_text(self.config.to_toml())
            metrics = MetricsWriter(self.out / "metrics.jsonl")
        started = time.perf_counter()
        try:
            with timing.spent("ledger"):
                recorder.start(self)
            stop_reason = None
            global_vector = self.genesis_vector.clone()
            for r in range(1, self.config.swarm.rounds + 1):
                record, global_vector, stop_reason = self._round(r, global_vector, recorder, timing)
                records.append(record)
                if metrics:
                    metrics.write(record)
                if stop_reason:
                    break
            with timing.spent("ledger"):
                recorder.finish(self)
        finally:
            recorder.close()
            if metrics:
                metrics.close()
        summary = self._summary(records, timing, time.perf_counter() - started, stop_reason, recorder)
        if self.out is not None:
            write_json_atomic(self.out / "summary.json", summary)
            plot_run(records, self.out / "progress.png")
        return SimulationResult(records, summary, self.out)

    def _round(
        self, r: int, global_vector: torch.Tensor, recorder: ChainRecorder | DigestOnly, timing: _Timing
    ) -> tuple[dict, torch.Tensor, str | None]:
        """One round: the sampled peers contribute, the aggregate becomes the global model, which is
        evaluated. Returns the round's record, the next global model and why the run stops (None)."""
        round_start = time.perf_counter()
        chosen = sample_peers(self.config.swarm.seed, r, len(self.peers), self.fraction)
        if self.secure is not None:
            vectors, weights, losses, global_vector = self._secure_step(r, chosen, global_vector, timing)
        else:
            vectors, weights, losses, diverged = self._contributions(r, chosen, global_vector, timing)
            if diverged:
                record = self._record(r, chosen, None, None, losses, None, diverged=True)
                return record, global_vector, f"diverged in round {r} ({diverged})"
            with timing.spent("aggregate"):
                global_vector = aggregate.next_global(self.settings.shared, global_vector, vectors, weights)
        with timing.spent("ledger"):
            model_digest = recorder.round(self, r, chosen, vectors, weights, global_vector)
        t0 = time.perf_counter()
        self.model.load_state_dict(unflatten(global_vector, self.spec))
        accuracy, loss = evaluate(self.model, self.test_x, self.test_y, device=self.settings.device)
        timing.evaluations.append(time.perf_counter() - t0)
        timing.evaluate += timing.evaluations[-1]
        exploded = (not np.isfinite(loss)) or float(global_vector.abs().max()) > DIVERGENCE_BOUND
        record = self._record(r, chosen, accuracy, loss, losses, model_digest, diverged=exploded)
        timing.rounds.append(time.perf_counter() - round_start)
        self.on_progress({"round": r, "accuracy": accuracy, "finished": True})
        return record, global_vector, f"diverged in round {r} (global model exploded)" if exploded else None

    def _contributions(
        self, r: int, chosen: list[int], global_vector: torch.Tensor, timing: _Timing
    ) -> tuple[list[torch.Tensor], list[int], list[float], str | None]:
        """The chosen peers' contributions to round `r` in ledger order (vectors, sample counts,
        training losses), and which peer diverged (then the round stops there), else None."""
        seed = self.config.swarm.seed
        vectors: list[torch.Tensor] = []
        weights: list[int] = []
        losses: list[float] = []
        for done, i in enumerate(chosen, start=1):
            peer = self.peers[i]
            try:
                with timing.spent("train"):
                    contribution = contribute(
                        self.model,
                        self.spec,
                        global_vector,
                        peer.x,
                        peer.y,
                        settings=self.settings,
                        mechanism=self.mechanism,
                        round_number=r,
                        seed=round_seed(seed, peer.name, r),
                        noise=self._noise(seed, peer.name, r),
                    )
            except ValueError as exc:
                if "nan" not in str(exc).lower() and "inf" not in str(exc).lower():
                    raise
                return vectors, weights, losses, f"peer {i}: {exc}"
            if not bool(torch.isfinite(contribution.vector).all()):
                return vectors, weights, losses, f"peer {i}: non-finite contribution"
            vectors.append(contribution.vector)
            weights.append(contribution.num_samples)
            losses.append(contribution.mean_loss)
            peer.commits += 1
            spend = self._spend(peer.commits)
            peer.eps = None if spend is None else float(spend.epsilon)
            peer.record_eps = self._record_spend(len(peer.y), peer.commits)
            self.on_progress({"round": r, "done": done, "of": len(chosen)})
        return vectors, weights, losses, None

    def _secure_step(
        self, r: int, chosen: list[int], global_vector: torch.Tensor, timing: _Timing
    ) -> tuple[list[torch.Tensor], list[int], list[float], torch.Tensor]:
        """A secure-aggregation round (node.runs.secure_round): no individual vectors, the next
        global model straight from the aggregate."""
        assert self.secure is not None
        members = [self.peers[i] for i in chosen]
        seed = self.config.swarm.seed
        with timing.spent("train"):
            next_global, losses = self.secure.step(
                self.model, self.spec, global_vector, members, r, lambda name: self._noise(seed, name, r)
            )
        for peer in members:
            peer.commits += 1
            peer.record_eps = self._record_spend(len(peer.y), peer.commits)
        self.on_progress({"round": r, "done": len(members), "of": len(members)})
        return [], [], losses, next_global

    def _recorder(self) -> ChainRecorder | DigestOnly:
        if self.use_ledger:
            if self.out is None:
                raise SimulationError("a simulation with the ledger needs an output folder (--out)")
            # registrations and commits of one round, one block each, plus room to close
            return ChainRecorder(self.out, window=2 * sample_size(len(self.peers), self.fraction) + 3)
        return DigestOnly()

    # ------------------------------------------------------------- reporting
    def _record(
        self,
        r: int,
        chosen: list[int],
        accuracy: float | None,
        loss: float | None,
        train_losses: list[float],
        model_digest: str | None,
        *,
        diverged: bool,
    ) -> dict:
        """One metrics line: only deterministic values (timings go to summary.json)."""
        eps = [p.eps for p in self.peers if p.eps is not None]
        record = [p.record_eps for p in self.peers if p.record_eps is not None]
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
            "record_eps_max": max(record) if record else None,  # the same for the record-level eps (DP-SGD)
            "eps_per_contribution": None if spend is None else float(spend.epsilon),
            "protects": self._protects(spend),
            "noise": self.noise_label,
        }

    def _protects(self, spend: Spend | None) -> str:
        """What the shared vector's eps covers; a DP-SGD run without a local mechanism is private
        for each training record, never a "non-private baseline"."""
        if spend is not None:
            return spend.protects
        if self.secure is not None:
            return SECAGG_PROTECTS
        if self.settings.dp is not None:
            return "no local DP on the shared vector; DP-SGD protects each training record (see dp_sgd)"
        return "nothing (non-private baseline)"

    def _summary(
        self,
        records: list[dict],
        timing: _Timing,
        seconds: float,
        stop_reason: str | None,
        recorder: ChainRecorder | DigestOnly,
    ) -> dict:
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
            "privacy": self._privacy_summary(spend, final_spend, max_commits),
            "dp_sgd": self._dp_sgd_summary(),
            "peer_rounds": peer_rounds,
            "threads": self.threads,
            "noise": self.noise_label,
            "seconds": {
                "total": seconds,
                "train": timing.train,
                "aggregate": timing.aggregate,
                "evaluate": timing.evaluate,
                "ledger": timing.ledger,
                "rounds": timing.rounds,
                "evaluations": timing.evaluations,
            },
            "ledger": recorder.info(),
        }

    def _privacy_summary(self, spend: Spend | None, final_spend: Spend | None, max_commits: int) -> dict | None:
        """The run's guarantee: `epsilon` and `delta` are the headline pair, record-level when
        DP-SGD trains (what a data owner is promised about each record), else the local
        mechanism's whole-update figure; `scope` says which. The mechanism's own figures keep
        their names beside it. None for the non-private baseline."""
        dp = self._dp_sgd_summary()
        if self.secure is not None:
            policy = self.secure.policy
            return {
                "epsilon": policy.epsilon(max_commits),
                "delta": policy.delta,
                "scope": "record",
                "protects": SECAGG_PROTECTS,
                "secagg": {
                    **policy.to_dict(),
                    "scale": policy.scale,
                    "local_noise_variance": policy.local_noise.variance,
                },
            }
        if spend is None and dp is None:
            return None
        summary: dict = {}
        if spend is not None:
            whole = final_spend or spend
            summary = {
                "per_contribution_eps": float(spend.epsilon),
                "max_contributions": max_commits,
                "eps_whole_update_max": float(final_spend.epsilon) if final_spend else None,
                "eps_whole_update_delta": float(getattr(whole, "delta", 0.0) or 0.0),
                "per_coordinate_eps": self.mechanism_params.get("epsilon"),
                "mechanism_protects": spend.protects,
                "protects": spend.protects,
                "scope": "whole update",
                "epsilon": float(final_spend.epsilon) if final_spend else None,
                "delta": float(getattr(whole, "delta", 0.0) or 0.0),
            }
        if dp is not None:  # the record-level figure is the headline: it is what DP-SGD promises each record
            summary.update(epsilon=dp["epsilon"], delta=dp["delta"], scope="record", protects=dp["protects"])
        return summary

    def _dp_sgd_summary(self) -> dict | None:
        """With DP-SGD in local training: each peer's record-level eps composed over every step
        of every round it took part in (mechanisms.record_level, as a swarm peer commits it), the
        largest over peers."""
        dp = self.settings.dp
        if dp is None:
            return None
        worst = 0.0
        for peer in self.peers:
            if peer.commits:
                worst = max(worst, record_level_spend(dp, [len(peer.y)] * peer.commits).epsilon)
        return {
            "epsilon": worst,
            "delta": dp.delta,
            "protects": f"{RECORD_PROTECTS}, replace-one neighbours ({RECORD_ACCOUNTANT}), at each peer's record count",
            "noise_multiplier": dp.noise_multiplier,
            "max_grad_norm": dp.max_grad_norm,
        }


def sample_size(num_peers: int, fraction: float) -> int:
    return max(1, min(num_peers, round(fraction * num_peers)))


def summary_line(summary: dict) -> str:
    """One human line on the privacy of a run: the honest whole-update figure and what it covers."""
    p = summary.get("privacy")
    dp = summary.get("dp_sgd")
    records = "" if not dp else (f"; DP-SGD: ({dp['epsilon']:.4g}, {dp['delta']:g})-DP for {dp['protects']}")
    if p is not None and "secagg" in p:
        return f"record-level ({p['epsilon']:.4g}, {p['delta']:g})-DP: {p['protects']} [{summary['noise']}]"
    if p is None or "per_contribution_eps" not in p:  # no local mechanism
        return ("no local DP on the shared vector" + records) if dp else "no privacy: non-private baseline"
    note = (
        " (sign only: PNPM never randomizes |w|, so the value itself has no finite eps)"
        if p["mechanism_protects"] == "sign"
        else ""
    )
    noise = f" [{summary['noise']}]" if summary.get("noise") else ""
    return (
        f"eps per peer, whole shared vector of {summary['num_params']} coordinates, after "
        f"{p['max_contributions']} contributions: {p['eps_whole_update_max']:.6g} "
        f"(per contribution {p['per_contribution_eps']:.6g}; per coordinate {p['per_coordinate_eps']}); "
        f"protects {p['mechanism_protects']}{note}{records}{noise}"
    )


def plot_run(records: list[dict], path: Path) -> None:
    """progress.png of a simulated run: test accuracy and each privacy figure per round (the largest
    cumulative eps of any peer: whole update, and record-level with DP-SGD), each in its own panel."""
    figures = [("accuracy", "test accuracy")]
    figures += [(key, label) for key, label in PRIVACY_FIGURES if any(r.get(key) is not None for r in records)]
    fig = Figure(figsize=(4.0 * len(figures), 3.4))
    for ax, (key, label) in zip(fig.subplots(1, len(figures), squeeze=False)[0], figures):
        points = [(r["round"], r[key]) for r in records if r.get(key) is not None]
        ax.plot([x for x, _ in points], [y for _, y in points], "o-")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_title(label, fontsize=10)
        if key == "accuracy":
            ax.set_ylim(0, 1)
    fig.suptitle(f"{records[0]['noise']}" if records else "", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
