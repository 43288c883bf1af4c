"""The peer's round state machine (README.md, "How a round works"; docs/NODE.md, "The peer").

One trio event loop per peer. The libp2p host serves blobs from the loop while training and
every synchronous web3 call run in worker threads (`trio.to_thread.run_sync`). Every wait on
the chain or the network has a deadline; the chain decides who is in a round, and every
participant aggregates the on-chain set in ledger order, so all honest peers attest the same
bits.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import trio
from libp2p.crypto.keys import PrivateKey

import mechanisms
from mechanisms.randomness import secret_generator
from node.chain.errors import LedgerError, LedgerUnavailable, RoundNotClosed, WrongRound
from node.chain.records import PROTECTS_WORDS, Commitment, RoundInfo, RoundState
from node.learning.contribute import contribute, round_seed
from node.learning.models import init_model
from node.learning.train import evaluate
from node.peer.agree import Agreement, NothingToAggregate, Withholding
from node.peer.catchup import CatchUp, ModelUnavailable
from node.peer.cpu import PROCESS_COMPUTE
from node.peer.endpoints import Witness
from node.peer.fetching import Prefetch, obtain, round_fetches
from node.peer.linger import serve_on
from node.peer.ports import HostPort, LedgerPort, PoisonableStore, Receipt, RunSync, StorePort
from node.peer.round_outcome import Phase, RoundOutcome, gas_used, mined_in
from node.peer.secure_round import Membership, secure_rounds
from node.peer.spending import BudgetExhausted, Spending
from node.peer.training import Training
from node.peer.vetting import Ownership, Vetted, Vetter
from node.peer.watch import RPC_RETRY_INTERVAL, ChainWatcher
from node.protocol import aggregate, release, wire
from node.protocol.blob import flatten, sha256, unflatten
from node.protocol.policy import PrivacySpend
from node.protocol.settings import PeerSettings
from node.protocol.wire import encode_bitmap
from p2p import peer_id_from_bytes

log = logging.getLogger("swarm.peer")

T = TypeVar("T")

CONFIRM_READS = 4  # reads back of a commit after its receipt (pauses doubling from CONFIRM_PAUSE: 1.4 s in all)
CONFIRM_PAUSE = 0.2
# The read-back waits at most this long for the block the ledger reads at to reach its commit's block
# (seconds; then it reads anyway): a loaded peer takes pushed heads late, and a read pinned below the
# commit's block cannot hold the commit.
CONFIRM_HEAD_WAIT = 30.0


class CommitUnconfirmed(LedgerError):
    """A commit's receipt came, but the chain holds no Committed event of it."""


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
        ownership: Ownership | None = None,
        witness: Witness | None = None,
        secure_member: Membership | None = None,
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
        self.watcher = ChainWatcher(
            ledger, self.chain, poll_interval=settings.poll_interval, chain_timeout=settings.chain_timeout
        )
        self.spending = Spending(
            settings,
            self.num_params,
            ledger=ledger,
            address=self.address,
            call=self.chain,
            accountant_path=accountant_path,
        )
        self.catchup = CatchUp(
            ledger=ledger,
            host=host,
            store=store,
            address=self.address,
            call=self.chain,
            obtain=self._obtain,
            update_reader=lambda commitments: self.vetting.update_reader(commitments),
            settings=settings,
            genesis_vector=self.genesis_vector,
        )
        self.identity = identity  # signs the registration (None: in-memory tests, registered unsigned)
        # a second RPC endpoint our commits must also be on (node/peer/endpoints.py); None: one endpoint
        self.witness = witness
        # every commitment held to the rulebook (node/rules.py) as `swarm verify` holds it; `ownership`
        # is the registry's rule 1 (None: in-memory tests, whose fake chain has no signatures)
        self.vetting = Vetter(ledger, sh, self.num_params, me=self.address, call=self.chain, ownership=ownership)
        # evaluation has a model of its own: it runs while a speculative training uses self.model
        self.eval_model = init_model(sh.model, input_shape=sh.input_shape, num_classes=sh.num_classes, seed=sh.seed)
        self._background: trio.Nursery | None = None  # run()'s: speculative trainings outlive their round
        # self.model is the training's scratch space: the room trains on it, one training at a time
        timed = PROCESS_COMPUTE.timed(lambda r, v: self._train_and_perturb(r, v))
        self.training = Training(timed, self._off_loop, last_round=settings.rounds)
        self._model_digest: bytes | None = None  # digest of the finalized model we hold (None: genesis)
        self._own_aggregate: tuple[int, bytes, torch.Tensor] | None = None  # (round, digest, vector) we attested
        self._participant_ids: tuple[int, list[str]] = (0, [])  # the last agreement's round and committers
        # every fetched update must be one of the swarm mechanism's outputs (None: nothing checked)
        self.release_mechanism = release.swarm_mechanism(sh)
        # who served its blobs to nobody lately: such a committer's blob is not waited for (agree.py)
        self.withholding = Withholding()
        self.secure = secure_rounds(self, secure_member)  # every round under a secure-aggregation policy

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

    # ------------------------------------------------------------ bootstrap
    async def start(self) -> torch.Tensor | None:
        """Register if needed, check the genesis, and return the current global model (None if
        no holder served it in time)."""

        params = await self.chain(self.ledger.params)
        self.watcher.windows = (params.commit_window, params.attest_window)
        self.watcher.aborts_unfilled = params.secure_aggregation
        genesis = wire.genesis_blob(self.genesis_vector, self.s.shared.to_dict())
        if sha256(genesis) != bytes(params.genesis_digest):
            raise RuntimeError(
                "this peer's swarm settings (model, dataset, aggregation, seed, privacy policy: mechanism and its "
                "parameters, DP-SGD noise, clip, batch size and epochs) do not match the ledger's genesis digest "
                f"{bytes(params.genesis_digest).hex()}: got {sha256(genesis).hex()}"
            )
        if params.secure_aggregation != (self.secure is not None):  # the genesis digest does not cover it
            raise RuntimeError(
                f"the ledger {'was' if params.secure_aggregation else 'was not'} deployed for secure aggregation "
                f"but the genesis' privacy policy {'is not' if self.secure is None else 'is'} secagg: deploy the "
                "swarm again with the matching setting"
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
        await self.spending.resume()
        return await self._latest_global()

    async def _latest_global(self) -> torch.Tensor | None:
        """The model of the last finalized round; None (logged) if no holder served it in time."""
        try:
            return await self.catchup.latest_global()
        except ModelUnavailable as exc:
            log.error("%s: this peer follows the next round", exc)
            return None

    def _committed(self, r: int) -> bool:
        return self.address in self.ledger.participants(r)

    def _own_commit(self, r: int, digest: bytes) -> Commitment | None:
        """Our commitment of `digest` in round r, from the chain's Committed events (blocking)."""
        return next(
            (c for c in self.ledger.commitments(r) if c.peer == self.address and bytes(c.digest) == digest), None
        )

    async def _read_back_commit(self, r: int, digest: bytes, mined_in: int | None = None) -> Commitment:
        """Our commit of `digest`, read back from the chain after its receipt, a few times (an
        endpoint's logs may lag the receipt it just gave); CommitUnconfirmed if it is not there:
        a receipt an endpoint made up must not make us serve a release the chain never recorded.
        `mined_in`: the receipt's block. The reads wait (CONFIRM_HEAD_WAIT at most) until the ledger
        reads at that block or later: reads are pinned at the last pushed head, which lags the
        receipt on a loaded peer (up to 5 of 16 peers a round refused their own mined commits so)."""
        if mined_in is not None:
            with trio.move_on_after(CONFIRM_HEAD_WAIT):
                while self.watcher.block < mined_in:
                    await self.watcher.next_tick()
        for attempt in range(CONFIRM_READS):
            if attempt:
                await trio.sleep(CONFIRM_PAUSE * 2 ** (attempt - 1))
            own = await self.chain(self._own_commit, r, digest)
            if own is not None:
                return own
        raise CommitUnconfirmed(
            f"round {r}: the endpoint's receipt says our commit of {digest.hex()[:16]} is mined, but the chain's "
            "Committed events do not hold it: nothing is stored or served"
        )

    async def _obtain(self, digest_hex: str, providers: list[str], timeout: float) -> bytes:
        # a secure swarm's model blob holds the velocity too (float64: three times the vector)
        max_size = wire.max_blob_size(self.num_params * (1 if self.s.shared.global_step is None else 3))
        return await obtain(self.store, self.host, digest_hex, providers, max_size=max_size, timeout=timeout)

    # ---------------------------------------------------------------- rounds
    async def run(self, *, on_round: Callable[[RoundOutcome], None] | None = None) -> list[RoundOutcome]:
        global_vector = await self.start()
        outcomes: list[RoundOutcome] = []
        async with trio.open_nursery() as background:
            self._background = background
            background.start_soon(self.watcher.run)
            while True:
                current = await self.chain(self.ledger.current_round)
                if current > self.s.rounds:
                    break
                try:
                    outcome, global_vector = await self.play_round(current, global_vector)
                except WrongRound as exc:  # the chain went back under us (a reorganisation): read it again
                    log.warning("round %d: %s; reading the chain's round again", current, exc)
                    await self.watcher.next_tick()
                    continue
                outcomes.append(outcome)
                if on_round:
                    on_round(outcome)
            self._background = None
            background.cancel_scope.cancel()  # a speculation for a round that will not come
        await self._serve_on(outcomes[-1] if outcomes else None)
        return outcomes

    async def _serve_on(self, last: RoundOutcome | None, *, stopped: bool = False) -> None:
        """Followers and late participants of the last round fetch its model from us after it ended:
        do not vanish (`linger.serve_on`: until its participants announced the model, within bounds).
        `stopped` (asked to stop before the swarm's last round): `linger` only, as asked."""
        self._set(Phase.SERVING)
        r, participants = self._participant_ids
        digest = last.global_digest if last is not None and last.round == r else None
        if digest is not None and self.store.has(digest):  # again, at once: one lost HAVE would keep them all
            try:
                await self.host.announce_blob(digest)
            except Exception as exc:  # a courtesy: the rounds are over, a failed publish must not fail the run
                log.info("the last model's announcement failed: %s", exc)
        me = peer_id_from_bytes(self.host.peer_id_bytes)
        cap = self.s.linger if stopped else self.s.linger_max
        await serve_on(self.host, digest, participants, me, floor=self.s.linger, cap=cap)
        self._set(Phase.DONE)

    async def play_round(self, r: int, global_vector: torch.Tensor | None) -> tuple[RoundOutcome, torch.Tensor | None]:
        """Round r from the model `global_vector`: train and commit while it is open, wait for it
        to close, aggregate and attest (a participant), wait for it to end, and catch up with its
        finalized model. Returns what happened and the model held after the round. Without a
        model (None: no holder served the last finalized one) the peer follows the round."""
        self.round = r
        out = RoundOutcome(round=r, state="open")
        with self._measured(out):
            if self.secure is not None:
                return out, await self.secure.play(r, global_vector, out)
            async with round_fetches() as fetches:  # prefetches outlive the close: see `_prefetch`
                info = await self._commit_and_wait_close(r, global_vector, out, fetches)
                if info.state == RoundState.CLOSED and out.committed and global_vector is not None:
                    await self._aggregate_and_attest(r, global_vector, out)
            self._set(Phase.WAITING_FINAL)
            info = await self.watcher.ended(r)
            out.state = info.state.name.lower()
            if info.state == RoundState.FINALIZED:
                global_vector = await self._catch_up(r, info, global_vector, out)
            elif global_vector is None:  # aborted: the model we lack is still the latest
                global_vector = await self._latest_global()
        return out, global_vector

    @contextlib.contextmanager
    def _measured(self, out: RoundOutcome) -> Iterator[None]:
        """The round's wall time, time per phase, CPU time and blob bytes moved, into `out`."""
        started = time.monotonic()
        self._phase_seconds, self._phase_since = {}, started
        sent0, received0 = self.host.bytes_served, self.host.bytes_fetched
        compute0, protocol0 = PROCESS_COMPUTE.compute_seconds(), PROCESS_COMPUTE.protocol_seconds()
        yield
        self._set(Phase.WAITING_FINAL)  # closes the last phase's timer
        out.round_seconds = time.monotonic() - started
        out.compute_cpu_s = round(PROCESS_COMPUTE.compute_seconds() - compute0, 4)
        out.protocol_cpu_s = round(PROCESS_COMPUTE.protocol_seconds() - protocol0, 4)
        out.phase_seconds = {k: round(v, 4) for k, v in self._phase_seconds.items() if v > 0}
        out.bytes_sent, out.bytes_received = self.host.bytes_served - sent0, self.host.bytes_fetched - received0

    async def _commit_and_wait_close(
        self, r: int, global_vector: torch.Tensor | None, out: RoundOutcome, fetches: trio.Nursery
    ) -> RoundInfo:
        """While round r is open: fetch the others' blobs as their commits land (in `fetches`), train
        and commit ours (unless the chain holds it already); then wait until the round is closed."""
        info = await self.chain(self.ledger.round_info, r)
        out.committed = await self.chain(self._committed, r)
        is_open = info.state == RoundState.OPEN
        prefetch = Prefetch()
        if is_open:
            fetches.start_soon(self._prefetch, r, prefetch)
        if is_open and not out.committed:
            if global_vector is None:
                log.warning("round %d: following: this peer does not hold the last finalized model", r)
            else:
                await self._commit(r, global_vector, out)
        if not out.committed:
            prefetch.whole.cancel()  # a follower aggregates nothing: no need of the blobs
        self._set(Phase.WAITING_CLOSE if out.committed else Phase.FOLLOWING)
        info = await self.watcher.closed(r)
        prefetch.watching.cancel()  # the fetches started run on into the agreement step
        return info

    async def _commit(self, r: int, global_vector: torch.Tensor, out: RoundOutcome) -> None:
        """Train and commit round r's update, and say in `out` what it spent. A peer past its
        budget, or whose commit the chain refused, follows the round instead."""
        try:
            spent = await self._contribute(r, global_vector, out)
        except BudgetExhausted as exc:
            self._set(Phase.BUDGET_SPENT, reason=str(exc))
            log.warning("round %d: %s", r, exc)
            return
        except LedgerError as exc:  # window closed under us, or similar: follow this round
            log.warning("round %d: commit refused: %s", r, exc)
            await self.spending.resync()
            return
        spend, record = spent.mechanism, spent.record
        out.eps_cumulative, out.delta_cumulative = spend.epsilon, spend.delta
        out.eps_protects = f"whole shared update: {PROTECTS_WORDS.get(spend.protects, spend.protects)}"
        if record is not None:
            out.record_eps_cumulative, out.record_delta = record.epsilon, record.delta
            out.record_protects = record.protects
        out.committed = True

    async def _catch_up(
        self, r: int, info: RoundInfo, previous: torch.Tensor | None, out: RoundOutcome
    ) -> torch.Tensor | None:
        """Round r's finalized model (rebuilt from the blobs held, else fetched), evaluated into
        `out`; None (logged) if no holder served it in time: the peer follows the next round."""
        if out.committed and not out.included:  # finalized before we saw it close: say what won
            out.included = await self.catchup.finalized_set(r, info)
            if previous is not None:
                await self.catchup.rebuild_model(r, previous, out.included)
        try:
            vector = await self.catchup.fetch_model(r, info.finalized_digest)
        except ModelUnavailable as exc:
            log.error("%s: this peer follows the next round", exc)
            return None
        self._model_digest = info.finalized_digest or await self.catchup.finalized_digest(r)
        out.global_digest = self._model_digest.hex()
        self._set(Phase.EVALUATING)
        out.accuracy, out.loss = await self._off_loop(PROCESS_COMPUTE.timed(self._evaluate), vector)
        return vector

    # ----------------------------------------------------------- overlapping
    async def _prefetch(self, r: int, prefetch: Prefetch) -> None:
        """While round r is open: vet each commitment as it lands on chain and fetch its blob, so
        that at close only the last committers' blobs are left to fetch. Best effort: any failure
        here is met again, and handled, by the agreement step. At close the caller ends the loop
        (`prefetch.watching`) but not the fetches it started: they run on into the agreement step,
        whose fetch of the same blob from the same holder joins them (`SwarmHost.fetch`), until the
        round's `round_fetches` nursery ends. The last commit closes the round, so its blob is always
        in flight then, and cancelling it cost a reset stream, a new one and a second OPEN per
        fetcher and round. A follower ends everything (`prefetch.whole`)."""
        started: set[bytes] = set()
        with prefetch.whole:
            async with trio.open_nursery() as fetches:
                with prefetch.watching:
                    while True:  # until the caller cancels us at close
                        moves = self.watcher.moves
                        with contextlib.suppress(Exception):
                            # no round_info first: commitments() reads it anyway, and a move while the
                            # round is open is almost always a new commit (a view call costs a few ms of CPU)
                            for c in await self._off_loop(self.ledger.commitments, r):
                                if bytes(c.digest) not in started:
                                    started.add(bytes(c.digest))
                                    fetches.start_soon(self._prefetch_one, r, c)
                        await self.watcher.moved_since(moves)  # a commit is a ledger event

    async def _prefetch_one(self, r: int, c: Commitment) -> None:
        try:
            raw_id, refused = await self._prefetch_vet(r, c)
            if refused is None and c.peer != self.address:
                await self._obtain(bytes(c.digest).hex(), [peer_id_from_bytes(raw_id)], self.s.fetch_timeout)
                self.withholding.served(c.peer)  # it serves again: awaited from now on
        except Exception as exc:
            log.debug("round %d: prefetch of %s failed: %s", r, bytes(c.digest).hex()[:12], exc)

    # ------------------------------------------------------------ contribute
    async def _contribute(self, r: int, global_vector: torch.Tensor, out: RoundOutcome) -> PrivacySpend:
        """Train, perturb, commit (what the policy spends, both figures), then serve; what this
        peer has spent once the commit is on chain. Sets the training times and the commit's gas
        in `out`; raises BudgetExhausted, before training, if the commit would pass a cap."""
        spent = await self.spending.next_spend(r, int(self.train_y.shape[0]))
        data, num_samples = await self._train_update(r, global_vector, self._model_digest, out)
        await self._publish_update(r, data, num_samples, spent, out)
        return spent

    async def _train_update(
        self, r: int, global_vector: torch.Tensor, base_digest: bytes | None, out: RoundOutcome
    ) -> tuple[bytes, int]:
        """Round r's update blob, trained from `global_vector` (whose digest is `base_digest`: a
        speculation from that model is taken), and the records it trained on; the times in `out`."""
        self._set(Phase.TRAINING)
        trained = await self.training.trained(r, global_vector, base_digest)
        out.train_started, out.train_ended = trained.started, trained.ended
        out.train_seconds = trained.ended - trained.started
        data = wire.update_blob(trained.vector, r, wire.canonical(self.s.mechanism), self.address)
        return data, trained.num_samples

    def _send_commit(self, r: int, digest: bytes, num_samples: int, spent: PrivacySpend) -> Receipt:
        """Round r's commit transaction (blocking); its receipt."""
        mechanism = wire.canonical(self.s.mechanism).encode()
        return self.ledger.commit(r, digest, num_samples, spent.eps_micro, mechanism, spent.record_eps_micro)

    async def _publish_update(
        self, r: int, data: bytes, num_samples: int, spent: PrivacySpend, out: RoundOutcome
    ) -> None:
        """Commit the update blob `data` (what it spends: `spent`), then store and serve it; the
        commit's gas in `out`. Raises the commit's LedgerError unless the chain holds it anyway."""
        digest = sha256(data)
        self._set(Phase.COMMITTING)
        receipt: Any = None
        own: Commitment | None = None
        # Fetchers see the commit when we do: their OPENs wait for the store instead of NOT_FOUND.
        with self.host.blob_coming(digest.hex()):
            try:
                receipt = await self.chain(self._send_commit, r, digest, num_samples, spent)
            except LedgerError:
                # A commit can be mined although its reply was lost (the resend then reads "nonce too
                # low"): if the chain holds this very digest from us, it is ours, spent and counted in
                # the round, so store, serve and attest it like any other.
                own = await self.chain(self._own_commit, r, digest)
                if own is None:
                    raise
                log.warning("round %d: the commit's reply was lost, but the chain holds it: going on", r)
            if own is None:  # a receipt is only the endpoint's word: the chain's Committed event is the commit
                own = await self._read_back_commit(r, digest, mined_in(receipt))
            if self.witness is not None:
                await self.chain(self.witness.confirm_commit, r, self.address, digest, own.block_number)
            self.spending.committed(int(self.train_y.shape[0]))
            # Commit first, then serve: the release is public only once its eps is on chain, and a
            # refused commit (an exception above) leaves nothing stored or announced.
            self.store.put(data)
            if self.s.fault in ("wrong-bytes", "withhold"):
                # testing: commit this digest, serve other bytes or nothing (node/peer/faults.py)
                cast(PoisonableStore, self.store).poison(digest.hex())
        # Batched with the round's other HAVEs: fetchers know the committer from the chain (one gossip
        # message per peer and round instead of three or four: docs/NODE.md, "Announcements").
        await self.host.announce_blob(digest.hex(), later=True)
        out.gas_used += gas_used(receipt)

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
    async def _aggregate_and_attest(self, r: int, previous: torch.Tensor, out: RoundOutcome) -> None:
        """Fetch the round's blobs, agree on which go in (node/peer/agree.py), aggregate, attest.
        Sets in `out` the inclusion bitmap, what was left out and why, and the attestation's gas."""
        digest = await self._agree_and_aggregate(r, previous, out)
        if digest is None:
            return
        included = out.included
        # train on our aggregate while the attestation is mined and the majority forms
        self.training.speculate(self._background, r + 1, self._own_aggregate)
        self._set(Phase.ATTESTING, included=sum(included), participants=len(included))
        try:
            receipt = await self.chain(self.ledger.attest, r, digest, encode_bitmap(included))
        except RoundNotClosed:  # a majority finalized (or the round was aborted) before our vote
            return
        except LedgerError as exc:  # e.g. sent but unconfirmed while the RPC was away: the round goes on
            log.warning("round %d: attestation failed: %s", r, exc)
            return
        out.gas_used += gas_used(receipt)

    async def _agree_and_aggregate(self, r: int, previous: torch.Tensor, out: RoundOutcome) -> bytes | None:
        """Fetch the round's blobs, agree on which go in (node/peer/agree.py) and aggregate them
        onto `previous`: the aggregate's digest (`self._own_aggregate` holds it), None (logged)
        when there is nothing to vote for. Sets in `out` the inclusion bitmap, and what was left
        out and why."""
        self._set(Phase.FETCHING)
        agreement = await self._agreement(r)
        try:
            included = await agreement.run()
        except NothingToAggregate as exc:
            # e.g. every release of the round past the fixed-point bound: nothing to vote for; the
            # round aborts at the end of its window and the peer goes on from the last model
            log.warning("%s: no vote this round", exc)
            return None
        finally:
            self.withholding.record(agreement)
            out.left_out = [why for why in agreement.blobs.left_out if why is not None]
        self._set(Phase.AGGREGATING)
        digest = await self._aggregate(r, previous, agreement.commitments, agreement.blobs.vectors, included)
        if digest is not None:  # else aggregation failed (logged): no vote this round, the peer goes on
            out.included = included
        return digest

    async def _agreement(self, r: int) -> Agreement:
        """The agreement step of round r over its on-chain set, wired to this peer's ledger, host and
        store; every commit and every fetched blob held to the rulebook by the vetting room."""
        commitments = await self.chain(self.ledger.commitments, r)
        self.vetting.closed_round(r, commitments)  # read after the close: the round's whole set
        vetted = [await self._vet(r, c) for c in commitments]
        peer_ids = [peer_id_from_bytes(raw) for raw, _ in vetted]
        self._participant_ids = (r, peer_ids)
        refused = [verdict for _, verdict in vetted]
        return Agreement(
            r,
            commitments,
            peer_ids,
            me=self.address,
            fetch_timeout=self.s.fetch_timeout,
            obtain=self._obtain,
            announced=self.host.providers,
            read_update=await self.vetting.update_reader(commitments),  # rules 4 to 6: decoding, binding, release
            read_attestations=lambda: self.chain(self.ledger.attestations, r),
            refused=refused,
            awaited=[self.withholding.awaited(c.peer) for c in commitments],
            ledger_news=self._ledger_news,
        )

    async def _ledger_news(self, timeout: float) -> bool | None:
        """Until the ledger emitted an event (the chain watcher's count), or `timeout` seconds:
        whether it did, where a subscription pushes its logs (None, cannot tell, while polling)."""
        moves = self.watcher.moves
        with trio.move_on_after(timeout):
            await self.watcher.moved_since(moves)
        return self.watcher.moves != moves if self.watcher.pushed else None

    async def _vet(self, r: int, c: Commitment) -> Vetted:
        """Commitment c's peer id and its verdict under rules 1 to 3 (`Vetter.vet`)."""
        return await self.vetting.vet(r, c)

    async def _prefetch_vet(self, r: int, c: Commitment) -> Vetted:
        """What a prefetch must know before it fetches c's blob: `_vet`'s verdict."""
        return await self._vet(r, c)

    async def _aggregate(
        self,
        r: int,
        previous: torch.Tensor,
        commitments: list[Commitment],
        vectors: list[torch.Tensor | None],
        included: list[bool],
    ) -> bytes | None:
        """The next global model from the included blobs in ledger order, stored and announced; its
        digest. None if the aggregation raised: logged, and nothing is attested for the round."""
        used = [v for v, inc in zip(vectors, included) if inc and v is not None]
        if len(used) != sum(included):
            raise RuntimeError(f"round {r}: an included blob was not fetched")  # agree.decide_inclusion rules it out
        weights = [int(c.num_samples) for c, inc in zip(commitments, included) if inc]
        try:
            new_vector = await self._off_loop(aggregate.next_global, self.s.shared, previous, used, weights)
        except Exception as exc:  # defence in depth: wire.read_vector bounds the values, but never crash here
            log.error("round %d: aggregation of %d blobs failed, attesting nothing: %s", r, len(used), exc)
            return None
        data = wire.model_blob(new_vector, r)
        digest = sha256(data)
        self.store.put(data)
        await self.host.announce_blob(digest.hex(), later=True)  # its fetchers ask the participants first
        self._own_aggregate = (r, digest, new_vector)
        return digest

    def _evaluate(self, vector: torch.Tensor) -> tuple[float, float]:
        self.eval_model.load_state_dict(unflatten(vector, self.spec))
        return evaluate(self.eval_model, self.test_x, self.test_y, device=self.s.device)
