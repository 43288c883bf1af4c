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
from node.protocol.wire import encode_bitmap
from node.runfiles import write_json_atomic
from p2p import peer_id_from_bytes

log = logging.getLogger("swarm.peer")

T = TypeVar("T")

RPC_RETRY_INTERVAL = 1.0  # seconds between two calls while the chain's RPC does not answer


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
    round_seconds: float = 0.0
    bytes_received: int = 0  # blob bytes this peer fetched from others during the round
    bytes_sent: int = 0  # blob bytes this peer served to others during the round
    gas_used: int = 0
    phase_seconds: dict[str, float] = field(default_factory=dict)  # wall time per Phase value
    global_digest: str | None = None  # the model this peer holds after the round


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
        nudge_every: float = 1.0,
    ) -> T:
        """Poll the chain until predicate() is truthy; `nudge` (at most every `nudge_every`
        seconds) may send a transaction that moves the round along (close or abort)."""
        next_nudge = trio.current_time()
        with trio.move_on_after(self.s.chain_timeout):
            while True:
                value = await self.chain(predicate)
                if value:
                    return value
                if nudge is not None and trio.current_time() >= next_nudge:
                    await nudge()
                    next_nudge = trio.current_time() + nudge_every
                await trio.sleep(self.s.poll_interval)
        raise TimeoutError(f"round {self.round}: no {what} on chain within {self.s.chain_timeout:.0f} s")

    # ------------------------------------------------------------ bootstrap
    async def start(self) -> torch.Tensor:
        """Register if needed, check the genesis, and return the current global model."""

        params = await self.chain(self.ledger.params)
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
        await self.host.announce_blob(digest)
        return vector

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
        while True:
            current = await self.chain(self.ledger.current_round)
            if current > self.s.rounds:
                break
            outcome, global_vector = await self.play_round(current, global_vector)
            outcomes.append(outcome)
            if on_round:
                on_round(outcome)
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
        if info.state.name == "OPEN" and not already:
            try:
                out.train_seconds, out.gas_used, spend, record = await self._contribute(r, global_vector)
                out.eps_cumulative, out.delta_cumulative = spend.epsilon, spend.delta
                out.eps_protects = f"whole shared update: {PROTECTS_WORDS.get(spend.protects, spend.protects)}"
                if record is not None:
                    out.record_eps_cumulative, out.record_delta = record.epsilon, record.delta
                    out.record_protects = record.protects
                out.committed = True
            except BudgetExhausted as exc:
                self._set(Phase.BUDGET_SPENT, reason=str(exc))
                log.warning("round %d: %s", r, exc)
            except LedgerError as exc:  # window closed under us, or similar: follow this round
                log.warning("round %d: commit refused: %s", r, exc)
                await self._resync_commits()
        out.committed = out.committed or already

        self._set(Phase.WAITING_CLOSE if out.committed else Phase.FOLLOWING)
        info = await self._wait_for(
            lambda: self._state_after(r, "OPEN"), what="close", nudge=lambda: self._try(self.ledger.close_round, r)
        )
        if info.state.name == "CLOSED" and out.committed:
            participants = await self.chain(self.ledger.participants, r)
            if self.address in participants:
                out.included, gas = await self._aggregate_and_attest(r, global_vector)
                out.gas_used += gas
        self._set(Phase.WAITING_FINAL)
        info = await self._wait_for(
            lambda: self._state_after(r, "OPEN", "CLOSED"),
            what="finalization",
            nudge=lambda: self._try(self.ledger.abort_round, r),
        )
        out.state = info.state.name.lower()
        if info.state.name == "FINALIZED":
            global_vector = await self._fetch_model(r)
            out.global_digest = await self._finalized_hex(r)
            self._set(Phase.EVALUATING)
            out.accuracy, out.loss = await self._off_loop(self._evaluate, global_vector)
        self._set(Phase.WAITING_FINAL)  # closes the last phase's timer
        out.round_seconds = time.monotonic() - started
        out.phase_seconds = {k: round(v, 4) for k, v in self._phase_seconds.items() if v > 0}
        out.bytes_sent, out.bytes_received = self.host.bytes_served - sent0, self.host.bytes_fetched - received0
        return out, global_vector

    def _state_after(self, r: int, *states: str) -> RoundInfo | None:
        info = self.ledger.round_info(r)
        return None if info.state.name in states else info

    async def _try(self, fn: Callable[..., object], *args: Any) -> None:
        """Close or abort when the chain allows it; refusals (window still open, quorum not
        met, someone else was first) are the normal case and are ignored."""

        with contextlib.suppress(LedgerError):
            await self.chain(fn, *args)

    # ------------------------------------------------------------ contribute
    async def _contribute(self, r: int, global_vector: torch.Tensor) -> tuple[float, int, Spend, Spend | None]:
        """Train, perturb, commit (what the policy spends, both figures), then serve."""
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
        t0 = time.monotonic()
        vector, num_samples = await self._off_loop(self._train_and_perturb, r, global_vector)
        train_seconds = time.monotonic() - t0
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
        await self.host.announce_blob(digest)
        return train_seconds, _gas(receipt), spend, record

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
        raw_ids = [await self.chain(self.ledger.peer_id_of, c.peer) for c in commitments]
        peer_ids = [peer_id_from_bytes(raw) for raw in raw_ids]
        refused = [
            await self._registration_problem(r, c, raw) or await self._policy_violation(r, c)
            for c, raw in zip(commitments, raw_ids)
        ]
        return Agreement(
            r,
            commitments,
            peer_ids,
            me=self.address,
            fetch_timeout=self.s.fetch_timeout,
            obtain=self._obtain,
            announced=self.host.providers,
            read_update=lambda data: wire.read_vector(data, self.num_params, kind="update")[0],
            read_attestations=lambda: self.chain(self.ledger.attestations, r),
            refused=refused,
        )

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
        history = await self.chain(self.ledger.commit_history, c.peer)
        counts = [int(h.num_samples) for h in history if h.round <= r]
        reason = await self._off_loop(
            policy.commit_violation,
            self.s.shared.privacy,
            self.num_params,
            c.mechanism,
            int(c.eps_micro),
            int(c.record_eps_micro),
            counts,
        )
        if reason:
            log.warning("round %d: leaving out %s: %s", r, c.peer, reason[1])
        return reason

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
        await self.host.announce_blob(digest)
        return digest

    def _evaluate(self, vector: torch.Tensor) -> tuple[float, float]:
        self.model.load_state_dict(unflatten(vector, self.spec))
        return evaluate(self.model, self.test_x, self.test_y, device=self.s.device)


class BudgetExhausted(Exception):
    """The next commit would pass the swarm's eps cap."""


def _gas(receipt: object) -> int:
    try:
        return int(cast(Receipt, receipt)["gasUsed"])
    except (TypeError, KeyError):
        return int(getattr(receipt, "gas_used", 0) or 0)
