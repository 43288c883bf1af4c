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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import trio

import mechanisms
from mechanisms.accounting import cumulative_spend
from node.chain.errors import LedgerError, RoundNotClosed
from node.learning.contribute import contribute, round_seed
from node.learning.models import init_model
from node.learning.train import evaluate
from node.protocol import wire
from node.protocol.blob import BlobError, flatten, sha256, unflatten
from node.protocol.settings import PeerSettings
from node.protocol.wire import decode_bitmap, encode_bitmap
from p2p import peer_id_from_bytes

log = logging.getLogger("swarm.peer")


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
    eps_cumulative: float | None = None
    train_seconds: float = 0.0
    round_seconds: float = 0.0
    bytes_received: int = 0  # blob bytes this peer fetched from others during the round
    bytes_sent: int = 0  # blob bytes this peer served to others during the round
    gas_used: int = 0
    phase_seconds: dict = field(default_factory=dict)  # wall time per Phase value
    global_digest: str | None = None  # the model this peer holds after the round


class Peer:
    """A swarm participant: drives rounds until `settings.rounds` is reached."""

    def __init__(
        self,
        settings: PeerSettings,
        *,
        ledger,
        host,
        store,
        train_xy,
        test_xy,
        on_status: Callable[[dict], None] | None = None,
    ):
        self.s = settings
        self.ledger = ledger
        self.host = host
        self.store = store
        self.train_x, self.train_y = train_xy
        self.test_x, self.test_y = test_xy
        self.on_status = on_status or (lambda status: None)
        sh = settings.shared
        self.model = init_model(sh.model, input_shape=sh.input_shape, num_classes=sh.num_classes, seed=sh.seed)

        self.genesis_vector, self.spec = flatten(self.model)
        self.num_params = self.genesis_vector.numel()
        self.address = ledger.account.address
        self.phase = Phase.STARTING
        self._phase_since = time.monotonic()
        self._phase_seconds: dict[str, float] = {}
        self.round = 0
        self._commits = 0  # rounds this peer has committed in: the accountant's T

    # ---------------------------------------------------------------- helpers
    async def chain(self, fn, *args, **kwargs):
        return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    def _status(self, **extra):
        self.on_status(
            {"round": self.round, "phase": self.phase.value, "address": self.address, "time": time.time(), **extra}
        )

    def _set(self, phase: Phase, **extra):
        now = time.monotonic()
        self._phase_seconds[self.phase.value] = self._phase_seconds.get(self.phase.value, 0.0) + now - self._phase_since
        self.phase, self._phase_since = phase, now
        self._status(**extra)

    async def _wait_for(self, predicate, *, what: str, nudge=None, nudge_every: float = 1.0):
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
                "this peer's swarm settings (model, dataset, aggregation, seed) do not match the ledger's "
                f"genesis digest {bytes(params.genesis_digest).hex()}: got {sha256(genesis).hex()}"
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
            try:
                await self.chain(self.ledger.register, self.host.peer_id_bytes)
            except LedgerError as exc:  # raced with ourselves after a restart: fine if now registered
                if not await self.chain(lambda: len(self.ledger.peer_id_of(self.address)) > 0):
                    raise RuntimeError(f"registration failed: {exc}") from exc
        self._commits = await self.chain(self._count_my_commits)
        return await self._latest_global()

    def _count_my_commits(self) -> int:
        current = self.ledger.current_round()
        return sum(1 for r in range(1, current + 1) if self._committed(r))

    def _committed(self, r: int) -> bool:
        return self.address in self.ledger.participants(r)

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

        digest = bytes(await self.chain(self.ledger.finalized_digest, r)).hex()
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

    async def _obtain(self, digest_hex: str, providers) -> bytes:
        data = self.store.get(digest_hex)
        if data is not None:
            return data
        return await self.host.fetch(
            digest_hex, providers=providers, max_size=wire.max_blob_size(self.num_params), timeout=self.s.fetch_timeout
        )

    # ---------------------------------------------------------------- rounds
    async def run(self, *, on_round: Callable[[RoundOutcome], None] | None = None) -> list[RoundOutcome]:
        global_vector = await self.start()
        outcomes = []
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
                out.train_seconds, out.gas_used, out.eps_cumulative = await self._contribute(r, global_vector)
                out.committed = True
            except BudgetExhausted as exc:
                self._set(Phase.BUDGET_SPENT, reason=str(exc))
                log.warning("round %d: %s", r, exc)
            except LedgerError as exc:  # window closed under us, or similar: follow this round
                log.warning("round %d: commit refused: %s", r, exc)
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
            out.global_digest = bytes(await self.chain(self.ledger.finalized_digest, r)).hex()
            self._set(Phase.EVALUATING)
            out.accuracy, out.loss = await trio.to_thread.run_sync(self._evaluate, global_vector)
        self._set(Phase.WAITING_FINAL)  # closes the last phase's timer
        out.round_seconds = time.monotonic() - started
        out.phase_seconds = {k: round(v, 4) for k, v in self._phase_seconds.items() if v > 0}
        out.bytes_sent, out.bytes_received = self.host.bytes_served - sent0, self.host.bytes_fetched - received0
        return out, global_vector

    def _state_after(self, r: int, *states: str):
        info = self.ledger.round_info(r)
        return None if info.state.name in states else info

    async def _try(self, fn, *args):
        """Close or abort when the chain allows it; refusals (window still open, quorum not
        met, someone else was first) are the normal case and are ignored."""

        with contextlib.suppress(LedgerError):
            await self.chain(fn, *args)

    # ------------------------------------------------------------ contribute
    async def _contribute(self, r: int, global_vector: torch.Tensor) -> tuple[float, int, float]:
        spend = cumulative_spend(self.s.mechanism, self.num_params, self._commits + 1)
        cap = (await self.chain(self.ledger.params)).eps_cap_micro
        eps_micro = wire.eps_to_micro(spend.epsilon)
        if eps_micro > cap:
            raise BudgetExhausted(
                f"committing round {r} would bring eps to {spend.epsilon:.6g} ({spend.protects}), past the "
                f"swarm's cap {wire.eps_from_micro(cap):.6g}: this peer stops contributing"
            )
        self._set(Phase.TRAINING)
        t0 = time.monotonic()
        vector, num_samples = await trio.to_thread.run_sync(self._train_and_perturb, r, global_vector)
        train_seconds = time.monotonic() - t0
        mech_json = wire.canonical(self.s.mechanism)
        data = wire.update_blob(vector, r, mech_json)
        digest = self.store.put(data)
        if self.s.fault == "wrong-bytes":
            self.store.poison(digest)  # testing: commit this digest, serve other bytes
        await self.host.announce_blob(digest)
        self._set(Phase.COMMITTING)
        receipt = await self.chain(
            self.ledger.commit, r, bytes.fromhex(digest), num_samples, eps_micro, mech_json.encode()
        )
        self._commits += 1
        return train_seconds, _gas(receipt), spend.epsilon

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
            fault=self.s.fault,
        )
        return c.vector, c.num_samples

    # -------------------------------------------------------------- aggregate
    async def _aggregate_and_attest(self, r: int, previous: torch.Tensor):
        """Fetch the round's blobs, agree on which go in, aggregate, attest.

        Agreement: when peers cannot all fetch the same blobs by their deadlines, their bitmaps
        differ and no (digest, bitmap) reaches a majority. So a peer adopts as its focal set the
        bitmap of the first attestation on chain that includes its own blob (nobody can leave a
        peer out without its consent), fetches what of it is missing from the peers that attested
        it (they hold those blobs), and votes the same bitmap. Without a usable focal set it
        attests what it could fetch itself.
        """

        self._set(Phase.FETCHING)
        commitments = await self.chain(self.ledger.commitments, r)
        n = len(commitments)
        index = {c.peer: i for i, c in enumerate(commitments)}
        mine = index[self.address]
        peer_ids = [peer_id_from_bytes(await self.chain(self.ledger.peer_id_of, c.peer)) for c in commitments]
        vectors: list[torch.Tensor | None] = [None] * n
        malformed = [False] * n
        holders: list[list[str]] = [[] for _ in range(n)]  # attesters who included blob i hold it
        focal: list[bool] | None = None

        def settled(wanted: list[bool]) -> bool:
            return all(vectors[i] is not None or malformed[i] for i in range(n) if wanted[i])

        def done() -> bool:
            return settled([True] * n) or (focal is not None and settled(focal))

        async def fetch_one(i: int, scope: trio.CancelScope) -> None:
            digest_hex = bytes(commitments[i].digest).hex()
            while vectors[i] is None and not malformed[i]:  # or until cancelled
                providers = [peer_ids[i], *holders[i]]
                providers += [p for p in self.host.providers(digest_hex) if p not in providers]
                try:
                    data = await self._obtain(digest_hex, providers)
                    vectors[i], _ = wire.read_vector(data, self.num_params, kind="update")
                except BlobError as exc:  # right digest, malformed content: nobody can use it
                    log.warning("round %d: blob of %s is malformed: %s", r, commitments[i].peer, exc)
                    malformed[i] = True
                except Exception as exc:  # P2P errors: try again (other holders) until cancelled
                    log.info("round %d: fetch of %s failed: %s", r, digest_hex[:12], exc)
                    await trio.sleep(0.5)
            if done():
                scope.cancel()

        async def watch(scope: trio.CancelScope) -> None:
            nonlocal focal
            while True:  # ends by cancelling its own nursery, or with it
                for a in await self.chain(self.ledger.attestations, r):
                    bits_a = decode_bitmap(a.included, n)
                    for i in range(n):
                        if bits_a[i] and peer_ids[index[a.peer]] not in holders[i]:
                            holders[i].append(peer_ids[index[a.peer]])
                    if focal is None and bits_a[mine]:
                        focal = bits_a
                if done():
                    scope.cancel()
                    return
                await trio.sleep(0.5)

        async def fetch_until(deadline: float, wanted: list[bool]) -> None:
            with trio.move_on_at(deadline):
                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        if wanted[i] and vectors[i] is None and not malformed[i]:
                            nursery.start_soon(fetch_one, i, nursery.cancel_scope)
                    nursery.start_soon(watch, nursery.cancel_scope)

        await fetch_until(trio.current_time() + self.s.fetch_timeout, [True] * n)
        if focal is not None and not settled(focal):  # fetch the focal set's rest from its holders
            await fetch_until(trio.current_time() + self.s.fetch_timeout, focal)
        have = [v is not None for v in vectors]
        use_focal = focal is not None and all(have[i] for i in range(n) if focal[i])
        included = list(focal) if use_focal else have
        if not any(included):
            raise RuntimeError(f"round {r}: no blob could be fetched, not even our own")
        self._set(Phase.AGGREGATING)
        new_vector = await trio.to_thread.run_sync(
            lambda: wire.next_global(
                self.s.shared,
                previous,
                [v for v, inc in zip(vectors, included) if inc],
                [int(c.num_samples) for c, inc in zip(commitments, included) if inc],
            )
        )
        data = wire.model_blob(new_vector, r)
        digest = self.store.put(data)
        await self.host.announce_blob(digest)
        self._set(Phase.ATTESTING, included=sum(included), participants=n)

        try:
            receipt = await self.chain(self.ledger.attest, r, bytes.fromhex(digest), encode_bitmap(included))
        except RoundNotClosed:  # a majority finalized (or the round was aborted) before our vote
            return included, 0
        return included, _gas(receipt)

    def _evaluate(self, vector: torch.Tensor) -> tuple[float, float]:
        self.model.load_state_dict(unflatten(vector, self.spec))
        return evaluate(self.model, self.test_x, self.test_y)


class BudgetExhausted(Exception):
    """The next commit would pass the swarm's eps cap."""


def _gas(receipt) -> int:
    try:
        return int(receipt["gasUsed"])
    except (TypeError, KeyError):
        return int(getattr(receipt, "gas_used", 0) or 0)
