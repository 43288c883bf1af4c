"""The peer's round state machine (DESIGN.md, "A round, step by step").

One trio event loop per peer. The libp2p host serves blobs from the loop while training and
every synchronous web3 call run in worker threads (`trio.to_thread.run_sync`). Every wait on
the chain or the network has a deadline; the chain decides who is in a round, and every
participant aggregates the on-chain set in ledger order, so all honest peers attest the same
bits.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import trio
from libp2p.crypto.keys import PrivateKey

import mechanisms
from mechanisms.accounting import Spend, cumulative_spend
from mechanisms.randomness import secret_generator
from mechanisms.record_level import RecordAccountant, record_level_spend
from node.chain.errors import LedgerError, LedgerUnavailable, RoundNotClosed
from node.chain.records import PROTECTS_WORDS, Commitment, RoundInfo
from node.learning.contribute import contribute, round_seed
from node.learning.models import init_model
from node.learning.train import evaluate
from node.peer.agree import Agreement, NothingToAggregate, obtain
from node.peer.ports import HostPort, LedgerPort, PoisonableStore, Receipt, RunSync, StorePort
from node.protocol import policy, wire
from node.protocol.blob import flatten, sha256, unflatten
from node.protocol.settings import PeerSettings
from node.protocol.wire import decode_bitmap, encode_bitmap
from node.runfiles import write_json_atomic
from p2p import peer_id_from_bytes

log = logging.getLogger("swarm.peer")

T = TypeVar("T")

RPC_RETRY_INTERVAL = 1.0  # seconds between two calls while the chain's RPC does not answer
QUICK_WAIT = 2.0  # seconds after the ledger's last event during which the chain is polled every poll_interval
IDLE_POLL = 0.5  # seconds between two polls once the ledger has been quiet that long (a waiting peer is idle)
# An RPC's logs may lag its blocks (node/chain/client.py, LOG_LAG_RETRIES): an event missed that way
# would leave a waiter waiting for the next one, and after a round's last event there is none. So a
# new block after this many seconds without an event is taken as one: the waiters re-read the ledger.
REREAD_AFTER = 5.0


class Phase(enum.StrEnum):
    STARTING = "starting"
    TRAINING = "training"
    COMMITTING = "committing"
    WAITING_CLOSE = "waiting-close"
    FETCHING = "fetching"
    AGGREGATING = "aggregating"
    ATTESTING = "attesting"
    WAITING_FINAL = "waiting-final"
    FOLLOWING = "following"  # not a participant this round: waits for the result
    EVALUATING = "evaluating"
    BUDGET_SPENT = "budget-spent"
    SERVING = "serving"  # the last round is over; still serving blobs to peers that lag behind
    DONE = "done"


@dataclass
class RoundOutcome:
    round: int
    state: str
    committed: bool = False
    included: list[bool] = field(default_factory=list)
    accuracy: float | None = None
    loss: float | None = None
    eps_cumulative: float | None = None  # the local mechanism's, whole shared update
    delta_cumulative: float | None = None  # the delta that eps_cumulative holds at
    eps_protects: str | None = None  # what eps_cumulative protects ("sign" for PNPM), from the guarantee
    record_eps_cumulative: float | None = None  # DP-SGD's, each training record (None without DP-SGD)
    record_delta: float | None = None
    record_protects: str | None = None
    train_seconds: float = 0.0
    train_started: float | None = None  # wall clock (Unix time) of this round's local training:
    train_ended: float | None = None  # a speculative training (see Speculation) starts before the round opens
    round_seconds: float = 0.0
    bytes_received: int = 0  # blob bytes this peer fetched from others during the round
    bytes_sent: int = 0  # blob bytes this peer served to others during the round
    gas_used: int = 0
    phase_seconds: dict[str, float] = field(default_factory=dict)  # wall time per Phase value
    global_digest: str | None = None  # the model this peer holds after the round


@dataclass
class Speculation:
    """The next round's training, started on this peer's own aggregate as soon as it attested,
    while the round waits for its majority. Used only if the round finalizes exactly that model
    (`base`); otherwise dropped unseen: nothing of it was released, so it spent no privacy."""

    round: int
    base: str  # digest of the aggregate it trains from
    done: trio.Event = field(default_factory=trio.Event)
    result: tuple[torch.Tensor, int] | None = None
    started: float = 0.0
    ended: float = 0.0


class Peer:
    """A swarm participant: drives rounds until `settings.rounds` is reached.

    `run_sync` runs every blocking call (ledger, training, aggregation, evaluation) off the
    event loop: worker threads in production; the unit tests run them inline under a mock clock.
    """

    def __init__(
        self,
        settings: PeerSettings,
        *,
        ledger: LedgerPort,
        host: HostPort,
        store: StorePort,
        train_xy: tuple[torch.Tensor, torch.Tensor],
        test_xy: tuple[torch.Tensor, torch.Tensor],
        on_status: Callable[[dict[str, Any]], None] | None = None,
        run_sync: RunSync = trio.to_thread.run_sync,
        accountant_path: Path | None = None,
        identity: PrivateKey | None = None,
        registration_ok: Callable[[str, bytes], bool] | None = None,
    ) -> None:
        self.s = settings
        self.ledger = ledger
        self.host = host
        self.store = store
        self._run_sync = run_sync
        self.train_x, self.train_y = train_xy
        self.test_x, self.test_y = test_xy
        self.on_status = on_status or (lambda status: None)
        sh = settings.shared
        self.model = init_model(sh.model, input_shape=sh.input_shape, num_classes=sh.num_classes, seed=sh.seed)

        self.genesis_vector, self.spec = flatten(self.model)
        self.num_params = self.genesis_vector.numel()
        if ledger.account is None:
            raise ValueError("a peer needs a ledger client with an account: it sends transactions")
        self.address: str = ledger.account.address
        self.phase = Phase.STARTING
        self._phase_since = time.monotonic()
        self._phase_seconds: dict[str, float] = {}
        self.round = 0
        self._commits = 0  # rounds this peer has committed in: the accountant's T
        self._my_counts: list[int] = []  # numSamples of each of our commits, oldest first (on chain)
        self.accountant_path = accountant_path  # where the record-level accountant is kept (DP-SGD)
        # the libp2p key of host.peer_id_bytes: it signs the registration (None: in-memory tests
        # only; the peer then registers unsigned, which real peers and `swarm verify` ignore)
        self.identity = identity
        # blocking: does (committer address, its on-chain peer id) hold the registration that owns
        # the peer id (signed by its key, the first to verify)? None: every registration counts
        # (the in-memory tests, whose fake chain has no signatures)
        self.registration_ok = registration_ok
        # evaluation has a model of its own: it runs while a speculative training uses self.model
        self.eval_model = init_model(sh.model, input_shape=sh.input_shape, num_classes=sh.num_classes, seed=sh.seed)
        self._background: trio.Nursery | None = None  # run()'s: speculative trainings outlive their round
        self._speculation: Speculation | None = None
        # self.model is the training's scratch space (opacus hooks into it): one training at a time
        self._model_in_use = trio.Lock()
        self._model_digest: str | None = None  # digest of the finalized model we hold (None: genesis)
        self._own_aggregate: tuple[int, str, torch.Tensor] | None = None  # (round, digest, vector) we attested
        self._info: RoundInfo | None = None  # the round's state as last read
        self._block = 0  # the chain's block number as last read
        self._moves = 0  # ledger events seen so far (in blocks, by the chain watcher): waiters re-read on a change
        self._last_move = 0.0  # trio time of the last one
        self._last_reread = 0.0  # trio time of the last re-read without an event (REREAD_AFTER)
        self._tick = trio.Event()  # set on every new block
        self._watching = False  # the chain watcher runs (in run())
        self._windows = (0, 0)  # (commit, attest) windows in blocks, from the ledger's params
        self._nudged_at = (0, 0)  # (round, participant count) at our last try to close a round
        self._peer_ids: dict[str, bytes] = {}  # committer address -> its registered peer id
        self._histories: dict[str, list[Commitment]] = {}  # committer address -> its commits so far
        self._vetted: dict[tuple[int, str, bytes], tuple[bytes, tuple[str, str] | None]] = {}
        # the swarm's mechanism (its policy, in the genesis): every fetched update must be one of
        # its possible outputs (wire.check_release); None for an empty policy, which checks nothing
        self.release_mechanism = wire.swarm_mechanism(sh)

    # ---------------------------------------------------------------- helpers
    async def chain(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call the (synchronous) ledger off the event loop. While the RPC endpoint does not
        answer (`LedgerUnavailable`: the client's own retries are used up), wait and call again,
        for at most `chain_timeout`: an RPC outage delays the peer, it does not end it. Nothing
        was sent when the client raises it (it comes from reads and estimates), so calling a
        transaction again is safe."""
        deadline = trio.current_time() + self.s.chain_timeout
        warned = False
        while True:
            try:
                return await self._off_loop(fn, *args, **kwargs)
            except LedgerUnavailable as exc:
                if trio.current_time() >= deadline:
                    raise
                if not warned:
                    log.warning("round %d: the chain does not answer (%s); trying again", self.round, exc)
                    warned = True
                await trio.sleep(RPC_RETRY_INTERVAL)

    async def _off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call (ledger, training, aggregation, evaluation) without blocking the loop."""
        return cast(T, await self._run_sync(lambda: fn(*args, **kwargs)))

    def _status(self, **extra: Any) -> None:
        self.on_status(
            {"round": self.round, "phase": self.phase.value, "address": self.address, "time": time.time(), **extra}
        )

    def _set(self, phase: Phase, **extra: Any) -> None:
        now = time.monotonic()
        self._phase_seconds[self.phase.value] = self._phase_seconds.get(self.phase.value, 0.0) + now - self._phase_since
        self.phase, self._phase_since = phase, now
        self._status(**extra)

    async def _wait_for(
        self,
        predicate: Callable[[], T | None],
        *,
        what: str,
        nudge: Callable[[], Awaitable[None]] | None = None,
    ) -> T:
        """Watch the chain until predicate() is truthy; `nudge` may send a transaction that moves
        the round along (close or abort), and decides itself whether the chain would take it.

        The predicate is re-read only after the ledger emitted an event (every change of its state
        does), as the chain watcher (`_watch_chain`) reports; `nudge` is offered every new block
        (its windows count blocks)."""
        with trio.move_on_after(self.s.chain_timeout):
            while True:
                moves = self._moves
                value = await self.chain(predicate)
                if value:
                    return value
                while self._moves == moves:
                    if nudge is not None:
                        await nudge()
                    await self._next_tick()
        raise TimeoutError(f"round {self.round}: no {what} on chain within {self.s.chain_timeout:.0f} s")

    async def _next_tick(self) -> None:
        """Until the chain has a new block (read by the watcher when it runs, else here)."""
        if self._watching:
            await self._tick.wait()
        else:  # play_round driven without run(): poll here, as the watcher would
            await self._poll_chain(pause=self.s.poll_interval)

    async def _watch_chain(self) -> None:
        """The peer's one poller of the chain, for its whole life: reads the cheap block number,
        and on a new block whether the ledger emitted anything in it. Waiters (`_wait_for`, the
        prefetch) read the ledger again only then, so a peer with nothing to do stays idle; after
        QUICK_WAIT of quiet it polls every IDLE_POLL only."""
        self._watching = True
        try:
            while True:  # ends when run()'s nursery is cancelled
                quiet = trio.current_time() - self._last_move
                try:
                    await self._poll_chain(pause=self.s.poll_interval if quiet < QUICK_WAIT else IDLE_POLL)
                except Exception as exc:  # an RPC that fails or lies: the waiters' own deadlines decide
                    log.warning("round %d: watching the chain failed, trying again: %s", self.round, exc)
                    await trio.sleep(RPC_RETRY_INTERVAL)
        finally:
            self._watching = False

    async def _poll_chain(self, *, pause: float) -> None:
        """One poll after `pause`: on a new block, wake the waiters, and count a move if the ledger
        emitted an event since the last block seen."""
        await trio.sleep(pause)
        block = await self.chain(self.ledger.block_number)
        if block <= self._block:
            return
        seen, self._block = self._block, block
        now = trio.current_time()
        if not seen or await self.chain(self.ledger.activity, seen + 1, block):
            self._moves += 1
            self._last_move = now
        elif now - max(self._last_move, self._last_reread) > REREAD_AFTER:
            self._moves += 1
            self._last_reread = now  # not a move: the watcher stays at its idle pace
        self._tick.set()
        self._tick = trio.Event()

    async def _nudge_close(self, r: int) -> None:
        """Close round r when the chain would take it: its commit window is over, or a commit came
        since our last try (the last registered peer's commit lets anyone close it at once)."""
        info = self._info
        if info is None or info.round != r:
            return
        window_over = self._block > info.opened_block + self._windows[0]
        if window_over or (r, info.participant_count) != self._nudged_at:
            self._nudged_at = (r, info.participant_count)
            await self._try(self.ledger.close_round, r)

    async def _nudge_abort(self, r: int) -> None:
        """Abort round r once its attestation window is over without a majority."""
        info = self._info
        if info is None or info.round != r or info.state.name != "CLOSED":
            return
        if self._block > info.closed_block + self._windows[1]:
            await self._try(self.ledger.abort_round, r)

    # ------------------------------------------------------------ bootstrap
    async def start(self) -> torch.Tensor:
        """Register if needed, check the genesis, and return the current global model."""

        params = await self.chain(self.ledger.params)
        self._windows = (params.commit_window, params.attest_window)
        genesis = wire.genesis_blob(self.genesis_vector, self.s.shared.to_dict())
        if sha256(genesis) != bytes(params.genesis_digest):
            raise RuntimeError(
                "this peer's swarm settings (model, dataset, aggregation, seed, privacy policy: mechanism and its "
                "parameters, DP-SGD noise, clip, batch size and epochs) do not match the ledger's genesis digest "
                f"{bytes(params.genesis_digest).hex()}: got {sha256(genesis).hex()}"
            )
        self.store.put(genesis)
        await self.host.announce_blob(sha256(genesis).hex())
        registered_id = await self.chain(self.ledger.peer_id_of, self.address)
        if registered_id and registered_id != self.host.peer_id_bytes:
            raise RuntimeError(
                f"{self.address} is registered with another libp2p peer id: use the key file "
                "it registered with (the workdir's p2p.key)"
            )
        if not registered_id:
            message = await self.chain(self.ledger.registration_message, self.address)
            signature = self.identity.sign(message) if self.identity is not None else b""
            try:
                await self.chain(self.ledger.register, self.host.peer_id_bytes, signature)
            except LedgerError as exc:  # raced with ourselves after a restart: fine if now registered
                if not await self.chain(lambda: len(self.ledger.peer_id_of(self.address)) > 0):
                    raise RuntimeError(f"registration failed: {exc}") from exc
        history = await self.chain(self.ledger.commit_history, self.address)
        self._my_counts = [int(c.num_samples) for c in history]
        self._commits = len(history)
        self._resume_accountant()
        return await self._latest_global()

    def _resume_accountant(self) -> None:
        """Continue the record-level accountant after a restart. The chain's commits are what was
        released, so they are the accountant's history; a saved file that says otherwise (a crash
        between a commit and the save) is reported and rewritten."""
        if self.s.dp is None or self.accountant_path is None:
            return
        from_chain = self._record_accountant()
        if self.accountant_path.exists():
            try:
                saved = RecordAccountant.from_dict(json.loads(self.accountant_path.read_text()))
            except (OSError, ValueError) as exc:
                log.warning("accountant file %s unreadable (%s): rebuilt from the chain", self.accountant_path, exc)
            else:
                if saved.history != from_chain.history:
                    log.warning(
                        "accountant file %s holds %d round(s), the chain %d: the chain's commits are what was "
                        "released, so the accountant continues from them",
                        self.accountant_path,
                        len(saved.history),
                        len(from_chain.history),
                    )
        self._save_accountant()

    def _record_accountant(self) -> RecordAccountant:
        accountant = RecordAccountant()
        if self.s.dp is not None:
            for n in self._my_counts:
                accountant.step_round(self.s.dp, n)
        return accountant

    def _save_accountant(self) -> None:
        if self.s.dp is None or self.accountant_path is None:
            return
        accountant = self._record_accountant()
        eps, delta = accountant.get_privacy_spent(self.s.dp.delta)
        state = accountant.to_dict() | {"policy": self.s.dp.to_dict(), "epsilon": eps, "delta": delta}
        write_json_atomic(self.accountant_path, state)

    async def _resync_commits(self) -> None:
        """After a commit that failed without a clear refusal (the RPC went away while it was being
        sent), take our commits from the chain again: if it landed after all, its eps is spent and
        the accountant must count it."""
        history = await self.chain(self.ledger.commit_history, self.address)
        if len(history) != self._commits:
            log.warning(
                "the chain holds %d commit(s) of ours, not %d: continuing from the chain", len(history), self._commits
            )
            self._my_counts = [int(c.num_samples) for c in history]
            self._commits = len(history)
            self._save_accountant()

    def _committed(self, r: int) -> bool:
        return self.address in self.ledger.participants(r)

    def _holds_commit(self, r: int, digest: str) -> bool:
        return any(c.peer == self.address and c.digest.hex() == digest for c in self.ledger.commitments(r))

    async def _latest_global(self) -> torch.Tensor:
        """The model of the last finalized round (genesis if none): from our store, else from
        any peer, checked against the finalized digest on chain."""
        last, _ = await self.chain(self.ledger.last_finalized)
        return await self._fetch_model(last) if last > 0 else self.genesis_vector.clone()

    async def _fetch_model(self, r: int) -> torch.Tensor:
        """The finalized model of round r, checked against its digest on chain. Its holders are
        the round's participants (each computed it) and whoever announced it since; a peer that
        just started may not have heard any announcement yet, so ask the participants first and
        keep trying other holders until the deadline."""

        digest = await self._finalized_hex(r)
        participants = await self.chain(self.ledger.participants, r)
        holders = [
            peer_id_from_bytes(await self.chain(self.ledger.peer_id_of, a)) for a in participants if a != self.address
        ]
        deadline = trio.current_time() + 3 * self.s.fetch_timeout
        while True:
            providers = holders + [p for p in self.host.providers(digest) if p not in holders]
            try:
                data = await self._obtain(digest, providers)
                break
            except Exception as exc:  # P2PError: holders busy or gone; others may answer
                if trio.current_time() > deadline:
                    raise RuntimeError(
                        f"round {r}: the finalized model {digest[:16]} could not be fetched from "
                        f"any of {len(providers)} holders: {exc}"
                    ) from exc
                await trio.sleep(0.5)
        vector, _ = wire.read_vector(data, self.num_params, kind="model")
        await self.host.announce_blob(digest, later=True)  # fetchers ask the participants first anyway
        return vector

    async def _rebuild_model(self, r: int, previous: torch.Tensor, included: list[bool]) -> None:
        """Round r finalized before this peer saw it close, so it computed no aggregate: compute
        it now from the winning set if every included blob is already here (prefetched while the
        round was open), and store it if it is the finalized model. The faster peers that hold the
        model may be gone by now (after the last round they linger only `linger` seconds); the
        blobs are not. Anything short of the exact finalized digest leaves the fetch to do it."""
        try:
            digest = await self._finalized_hex(r)
            commitments = await self.chain(self.ledger.commitments, r)
            if self.store.has(digest) or not any(included) or len(included) != len(commitments):
                return
            chosen = [c for c, inc in zip(commitments, included) if inc]
            blobs = [self.store.get(bytes(c.digest).hex()) for c in chosen]
            if any(b is None for b in blobs):
                return
            vectors = [wire.read_update(b, self.num_params, self.release_mechanism) for b in blobs if b is not None]
            weights = [int(c.num_samples) for c in chosen]
            vector = await self._off_loop(wire.next_global, self.s.shared, previous, vectors, weights)
        except Exception as exc:  # a chain read that failed, a blob we would not take: the fetch decides
            log.warning("round %d: the finalized model could not be rebuilt here: %s", r, exc)
            return
        data = wire.model_blob(vector, r)
        if sha256(data).hex() == digest:
            self.store.put(data)
        else:  # e.g. our previous model is not the round's base: fetch it instead
            log.info("round %d: a local rebuild is not the finalized model: fetching it", r)

    async def _finalized_hex(self, r: int) -> str:
        digest = await self.chain(self.ledger.finalized_digest, r)
        if digest is None:
            raise RuntimeError(f"round {r} is not finalized: it has no model digest on chain")
        return bytes(digest).hex()

    async def _obtain(self, digest_hex: str, providers: list[str]) -> bytes:
        return await obtain(
            self.store,
            self.host,
            digest_hex,
            providers,
            max_size=wire.max_blob_size(self.num_params),
            timeout=self.s.fetch_timeout,
        )

    # ---------------------------------------------------------------- rounds
    async def run(self, *, on_round: Callable[[RoundOutcome], None] | None = None) -> list[RoundOutcome]:
        global_vector = await self.start()
        outcomes: list[RoundOutcome] = []
        async with trio.open_nursery() as background:
            self._background = background
            background.start_soon(self._watch_chain)
            while True:
                current = await self.chain(self.ledger.current_round)
                if current > self.s.rounds:
                    break
                outcome, global_vector = await self.play_round(current, global_vector)
                outcomes.append(outcome)
                if on_round:
                    on_round(outcome)
            self._background = None
            background.cancel_scope.cancel()  # a speculation for a round that will not come
        # Followers of the last round fetch its model from us after it finalized: do not vanish.
        self._set(Phase.SERVING)
        await trio.sleep(self.s.linger)
        self._set(Phase.DONE)
        return outcomes

    async def play_round(self, r: int, global_vector: torch.Tensor) -> tuple[RoundOutcome, torch.Tensor]:
        self.round = r
        started = time.monotonic()
        self._phase_seconds, self._phase_since = {}, started
        sent0, received0 = self.host.bytes_served, self.host.bytes_fetched
        out = RoundOutcome(round=r, state="open")
        info = await self.chain(self.ledger.round_info, r)
        already = await self.chain(self._committed, r)
        async with trio.open_nursery() as early:
            if info.state.name == "OPEN":
                early.start_soon(self._prefetch, r)
            if info.state.name == "OPEN" and not already:
                try:
                    await self._commit_round(r, global_vector, out)
                except BudgetExhausted as exc:
                    self._set(Phase.BUDGET_SPENT, reason=str(exc))
                    log.warning("round %d: %s", r, exc)
                except LedgerError as exc:  # window closed under us, or similar: follow this round
                    log.warning("round %d: commit refused: %s", r, exc)
                    await self._resync_commits()
            out.committed = out.committed or already
            if not out.committed:
                early.cancel_scope.cancel()  # a follower aggregates nothing: no need of the blobs

            self._set(Phase.WAITING_CLOSE if out.committed else Phase.FOLLOWING)
            info = await self._wait_for(
                lambda: self._state_after(r, "OPEN"), what="close", nudge=lambda: self._nudge_close(r)
            )
            early.cancel_scope.cancel()
        if info.state.name == "CLOSED" and out.committed:
            participants = await self.chain(self.ledger.participants, r)
            if self.address in participants:
                out.included, gas = await self._aggregate_and_attest(r, global_vector)
                out.gas_used += gas
        self._set(Phase.WAITING_FINAL)
        info = await self._wait_for(
            lambda: self._state_after(r, "OPEN", "CLOSED"),
            what="finalization",
            nudge=lambda: self._nudge_abort(r),
        )
        out.state = info.state.name.lower()
        if info.state.name == "FINALIZED":
            if out.committed and not out.included:  # finalized before we saw it close: say what won
                out.included = await self._finalized_set(r, info)
                await self._rebuild_model(r, global_vector, out.included)
            global_vector = await self._fetch_model(r)
            out.global_digest = self._model_digest = await self._finalized_hex(r)
            self._set(Phase.EVALUATING)
            out.accuracy, out.loss = await self._off_loop(self._evaluate, global_vector)
        self._set(Phase.WAITING_FINAL)  # closes the last phase's timer
        out.round_seconds = time.monotonic() - started
        out.phase_seconds = {k: round(v, 4) for k, v in self._phase_seconds.items() if v > 0}
        out.bytes_sent, out.bytes_received = self.host.bytes_served - sent0, self.host.bytes_fetched - received0
        return out, global_vector

    async def _commit_round(self, r: int, global_vector: torch.Tensor, out: RoundOutcome) -> None:
        spend, record = await self._contribute(r, global_vector, out)
        out.eps_cumulative, out.delta_cumulative = spend.epsilon, spend.delta
        out.eps_protects = f"whole shared update: {PROTECTS_WORDS.get(spend.protects, spend.protects)}"
        if record is not None:
            out.record_eps_cumulative, out.record_delta = record.epsilon, record.delta
            out.record_protects = record.protects
        out.committed = True

    # ----------------------------------------------------------- overlapping
    def _speculate(self, next_round: int) -> None:
        """Start training `next_round` on the aggregate we just attested, while the majority forms
        (the round's wait, the model's evaluation and the next round's opening then overlap it)."""
        own, self._speculation = self._own_aggregate, None
        if self._background is None or own is None or own[0] != next_round - 1 or next_round > self.s.rounds:
            return
        spec = Speculation(round=next_round, base=own[1])
        self._speculation = spec
        self._background.start_soon(self._run_speculation, spec, own[2])

    async def _run_speculation(self, spec: Speculation, base: torch.Tensor) -> None:
        try:
            async with self._model_in_use:
                spec.started = time.time()
                spec.result = await self._off_loop(self._train_and_perturb, spec.round, base)
        except Exception as exc:  # the round's own training runs instead, and raises what it raises
            log.warning("round %d: speculative training failed: %s", spec.round, exc)
        finally:
            spec.ended = time.time()
            spec.done.set()

    async def _trained(self, r: int, global_vector: torch.Tensor, out: RoundOutcome) -> tuple[torch.Tensor, int]:
        """Round r's perturbed update: the speculation's if it trained from the model we hold,
        else trained now."""
        spec, self._speculation = self._speculation, None
        if spec is not None and spec.round == r and spec.base == self._model_digest:
            await spec.done.wait()
            if spec.result is not None:
                out.train_started, out.train_ended = spec.started, spec.ended
                return spec.result
        async with self._model_in_use:  # a dropped speculation may still be training: one at a time
            out.train_started = time.time()
            result = await self._off_loop(self._train_and_perturb, r, global_vector)
            out.train_ended = time.time()
        return result

    async def _prefetch(self, r: int) -> None:
        """While round r is open: vet each commitment as it lands on chain and fetch its blob,
        so that at close only the last committers' blobs are left to fetch. Best effort: any
        failure here is met again, and handled, by the agreement step."""
        started: set[bytes] = set()
        async with trio.open_nursery() as nursery:
            while True:  # until play_round cancels us at close
                moves = self._moves
                with contextlib.suppress(Exception):
                    info = await self._off_loop(self.ledger.round_info, r)
                    if info.participant_count > len(started):
                        for c in await self._off_loop(self.ledger.commitments, r):
                            if bytes(c.digest) not in started:
                                started.add(bytes(c.digest))
                                nursery.start_soon(self._prefetch_one, r, c)
                while self._moves == moves:  # a commit is a ledger event
                    await self._next_tick()

    async def _prefetch_one(self, r: int, c: Commitment) -> None:
        try:
            raw_id, refused = await self._vet(r, c)
            if refused is None and c.peer != self.address:
                await self._obtain(bytes(c.digest).hex(), [peer_id_from_bytes(raw_id)])
        except Exception as exc:
            log.debug("round %d: prefetch of %s failed: %s", r, bytes(c.digest).hex()[:12], exc)

    async def _finalized_set(self, r: int, info: RoundInfo) -> list[bool]:
        """The inclusion bitmap the majority of a finalized round attested (its finalized digest, most votes)."""
        attestations = await self.chain(self.ledger.attestations, r)
        winning = [a for a in attestations if a.aggregate_digest == info.finalized_digest]
        if not winning:
            return []
        return decode_bitmap(max(winning, key=lambda a: a.votes).included, info.participant_count)

    def _state_after(self, r: int, *states: str) -> RoundInfo | None:
        info = self._info = self.ledger.round_info(r)
        return None if info.state.name in states else info

    async def _try(self, fn: Callable[..., object], *args: Any) -> None:
        """Close or abort when the chain allows it; refusals (window still open, quorum not
        met, someone else was first) are the normal case and are ignored."""

        with contextlib.suppress(LedgerError):
            await self.chain(fn, *args)

    # ------------------------------------------------------------ contribute
    async def _contribute(self, r: int, global_vector: torch.Tensor, out: RoundOutcome) -> tuple[Spend, Spend | None]:
        """Train, perturb, commit (what the policy spends, both figures), then serve. Sets the
        training times and the commit's gas in `out`."""
        counts = [*self._my_counts, int(self.train_y.shape[0])]
        privacy = self.s.shared.privacy
        eps_micro, record_micro = await self._off_loop(policy.expected_micro, privacy, self.num_params, counts)
        spend = cumulative_spend(self.s.mechanism, self.num_params, len(counts))
        record = record_level_spend(self.s.dp, counts) if self.s.dp is not None else None
        params = await self.chain(self.ledger.params)
        for what, micro, cap in (
            (f"eps to {wire.eps_from_micro(eps_micro):.6g} ({spend.protects})", eps_micro, params.eps_cap_micro),
            (
                f"record-level eps to {wire.eps_from_micro(record_micro):.6g}",
                record_micro,
                params.record_eps_cap_micro,
            ),
        ):
            if micro > cap:
                raise BudgetExhausted(
                    f"committing round {r} would bring {what}, past the swarm's cap "
                    f"{wire.eps_from_micro(cap):.6g}: this peer stops contributing"
                )
        self._set(Phase.TRAINING)
        vector, num_samples = await self._trained(r, global_vector, out)
        out.train_seconds = (out.train_ended or 0.0) - (out.train_started or 0.0)
        mech_json = wire.canonical(self.s.mechanism)
        data = wire.update_blob(vector, r, mech_json)
        digest = sha256(data).hex()
        self._set(Phase.COMMITTING)
        receipt: Any = None
        try:
            receipt = await self.chain(
                self.ledger.commit, r, bytes.fromhex(digest), num_samples, eps_micro, mech_json.encode(), record_micro
            )
        except LedgerError:
            # A commit can be mined although its reply was lost (the resend then reads "nonce too
            # low"): if the chain holds this very digest from us, it is ours, spent and counted in
            # the round, so store, serve and attest it like any other.
            if not await self.chain(self._holds_commit, r, digest):
                raise
            log.warning("round %d: the commit's reply was lost, but the chain holds it: going on", r)
        self._commits += 1
        self._my_counts = counts
        self._save_accountant()
        # Commit first, then serve: the release is public only once its eps is on chain, and a
        # refused commit (an exception above) leaves nothing stored or announced.
        self.store.put(data)
        if self.s.fault == "wrong-bytes":
            cast(PoisonableStore, self.store).poison(digest)  # testing: commit this digest, serve other bytes
        # Batched with the round's other HAVEs: fetchers know the committer from the chain (one gossip
        # message per peer and round instead of three or four: docs/NODE.md, "Announcements").
        await self.host.announce_blob(digest, later=True)
        out.gas_used += _gas(receipt)
        return spend, record

    def _train_and_perturb(self, r: int, global_vector: torch.Tensor) -> tuple[torch.Tensor, int]:
        c = contribute(
            self.model,
            self.spec,
            global_vector,
            self.train_x,
            self.train_y,
            settings=self.s,
            mechanism=mechanisms.from_params(self.s.mechanism),
            round_number=r,
            seed=round_seed(self.s.shared.seed, self.address, r),
            noise=secret_generator(),  # fresh from the OS CSPRNG for every release, never kept
            fault=self.s.fault,
        )
        return c.vector, c.num_samples

    # -------------------------------------------------------------- aggregate
    async def _aggregate_and_attest(self, r: int, previous: torch.Tensor) -> tuple[list[bool], int]:
        """Fetch the round's blobs, agree on which go in (node/peer/agree.py), aggregate, attest.
        Returns the inclusion bitmap and the gas of the attestation."""

        self._set(Phase.FETCHING)
        agreement = await self._agreement(r)
        try:
            included = await agreement.run()
        except NothingToAggregate as exc:
            # e.g. every release of the round past the fixed-point bound: nothing to vote for; the
            # round aborts at the end of its window and the peer goes on from the last model
            log.warning("%s: no vote this round", exc)
            return [], 0
        self._set(Phase.AGGREGATING)
        digest = await self._aggregate(r, previous, agreement.commitments, agreement.blobs.vectors, included)
        if digest is None:  # aggregation failed (logged): no vote this round, the peer goes on
            return [], 0
        self._speculate(r + 1)  # train on our aggregate while the attestation is mined and the majority forms
        self._set(Phase.ATTESTING, included=sum(included), participants=len(included))
        try:
            receipt = await self.chain(self.ledger.attest, r, bytes.fromhex(digest), encode_bitmap(included))
        except RoundNotClosed:  # a majority finalized (or the round was aborted) before our vote
            return included, 0
        except LedgerError as exc:  # e.g. sent but unconfirmed while the RPC was away: the round goes on
            log.warning("round %d: attestation failed: %s", r, exc)
            return included, 0
        return included, _gas(receipt)

    async def _agreement(self, r: int) -> Agreement:
        """The agreement step of round r over its on-chain set, wired to this peer's ledger, host and store."""
        commitments = await self.chain(self.ledger.commitments, r)
        vetted = [await self._vet(r, c) for c in commitments]
        peer_ids = [peer_id_from_bytes(raw) for raw, _ in vetted]
        refused = [reason for _, reason in vetted]
        return Agreement(
            r,
            commitments,
            peer_ids,
            me=self.address,
            fetch_timeout=self.s.fetch_timeout,
            obtain=self._obtain,
            announced=self.host.providers,
            # decoded, bounded (wire.read_vector) and a possible output of the swarm's mechanism
            # (wire.check_release): the rule `swarm verify` applies, so peers and verify agree
            read_update=lambda data: wire.read_update(data, self.num_params, self.release_mechanism),
            read_attestations=lambda: self.chain(self.ledger.attestations, r),
            refused=refused,
        )

    async def _vet(self, r: int, c: Commitment) -> tuple[bytes, tuple[str, str] | None]:
        """Commitment c's peer id and why it is left out (None: it is not), read once per round:
        both rest on chain data fixed once c is on chain (registrations precede commits, the
        committer's history up to round r), so a verdict made while the round was open holds."""
        key = (r, c.peer, bytes(c.digest))
        if key not in self._vetted:
            raw = self._peer_ids.get(c.peer) or bytes(await self.chain(self.ledger.peer_id_of, c.peer))
            if raw:
                self._peer_ids[c.peer] = raw  # an account registers once: its peer id never changes
            refused = await self._registration_problem(r, c, raw) or await self._policy_violation(r, c)
            self._vetted = {k: v for k, v in self._vetted.items() if k[0] >= r - 1}  # older rounds are over
            self._vetted[key] = (raw, refused)
        return self._vetted[key]

    async def _registration_problem(self, r: int, c: Commitment, peer_id: bytes) -> tuple[str, str] | None:
        """Why commitment `c` of round r comes from an account that does not own its peer id (a
        squatter: its registration does not verify, or another registration of the peer id came
        first), or None. Registrations precede commits, so every honest peer reading the chain
        decides alike, and leaves the commit out unfetched."""
        check = self.registration_ok
        if c.peer == self.address or check is None:
            return None
        if await self.chain(check, c.peer, peer_id):
            return None
        reason = f"{c.peer} does not own peer id 0x{peer_id.hex()}: its registration does not verify"
        log.warning("round %d: leaving out %s: %s", r, c.peer, reason)
        return ("registration", reason)

    async def _policy_violation(self, r: int, c: Commitment) -> tuple[str, str] | None:
        """Why commitment `c` of round r breaks the swarm's privacy policy (its mechanism, or an
        eps record other than what its commits spend), or None. From chain data only, so every
        honest peer leaves the same commits out."""
        if c.peer == self.address:
            return None
        counts = [int(h.num_samples) for h in await self._history_through(c) if h.round <= r]
        try:
            reason = await self._off_loop(
                policy.commit_violation,
                self.s.shared.privacy,
                self.num_params,
                c.mechanism,
                int(c.eps_micro),
                int(c.record_eps_micro),
                counts,
            )
        except Exception as exc:  # a pure function of chain data: it raises alike on every peer
            reason = ("policy", f"its commit could not be checked against the policy: {type(exc).__name__}: {exc}")
        if reason:
            log.warning("round %d: leaving out %s: %s", r, c.peer, reason[1])
        return reason

    async def _history_through(self, c: Commitment) -> list[Commitment]:
        """Committer c.peer's commits up to c at least, kept between rounds: each round reads only
        the blocks since the last commit we knew of."""
        known = self._histories.get(c.peer, [])
        if not any(h.round == c.round and h.digest == c.digest for h in known):
            since = max((h.block_number for h in known), default=None)
            newer = await self.chain(self.ledger.commit_history, c.peer, None if since is None else since + 1)
            rounds = {h.round for h in known}
            known = known + [h for h in newer if h.round not in rounds]
            self._histories[c.peer] = known
        return known

    async def _aggregate(
        self,
        r: int,
        previous: torch.Tensor,
        commitments: list[Commitment],
        vectors: list[torch.Tensor | None],
        included: list[bool],
    ) -> str | None:
        """The next global model from the included blobs in ledger order, stored and announced; its
        digest. None if the aggregation raised: logged, and nothing is attested for the round."""
        used = [v for v, inc in zip(vectors, included) if inc and v is not None]
        if len(used) != sum(included):
            raise RuntimeError(f"round {r}: an included blob was not fetched")  # agree.decide_inclusion rules it out
        weights = [int(c.num_samples) for c, inc in zip(commitments, included) if inc]
        try:
            new_vector = await self._off_loop(wire.next_global, self.s.shared, previous, used, weights)
        except Exception as exc:  # defence in depth: wire.read_vector bounds the values, but never crash here
            log.error("round %d: aggregation of %d blobs failed, attesting nothing: %s", r, len(used), exc)
            return None
        data = wire.model_blob(new_vector, r)
        digest = self.store.put(data)
        await self.host.announce_blob(digest, later=True)  # its fetchers ask the participants first
        self._own_aggregate = (r, digest, new_vector)
        return digest

    def _evaluate(self, vector: torch.Tensor) -> tuple[float, float]:
        self.eval_model.load_state_dict(unflatten(vector, self.spec))
        return evaluate(self.eval_model, self.test_x, self.test_y, device=self.s.device)


class BudgetExhausted(Exception):
    """The next commit would pass the swarm's eps cap."""


def _gas(receipt: object) -> int:
    try:
        return int(cast(Receipt, receipt)["gasUsed"])
    except (TypeError, KeyError):
        return int(getattr(receipt, "gas_used", 0) or 0)
