"""The peer's round loop on the one-transaction-per-round ledger (contracts/PipelinedLedger.sol;
docs/LEDGER.md, "One transaction per round" and "Porting the peers").

Round r opens in the block where r - 1 closes, before r - 1 is final. A participant of r - 1 then
aggregates r - 1 at once (the agreement step, with the votes counted on r - 1 as its attestations;
no `attest`), trains r from its own aggregate, and commits r carrying its vote on r - 1: the
aggregate's digest and bitmap, i.e. the model its update was trained from. r - 1 finalizes as the
r commits land, while r runs, and this peer learns of it then; its outcome of r - 1 is complete
once r - 1 ended (emitted through `on_round` during round r). A peer that took no part in r - 1
(or lost its blobs) waits for r - 1 to end and trains from its finalized model instead. At the
run's last round (and when its budget is spent, and on `stop`) a participant sends a final `vote`
on the round it took part in instead of committing the next one.

Secure aggregation is not ported: a secure swarm stays on SwarmLedger (`Peer`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import trio

from node.chain.errors import LedgerError
from node.chain.pipelined import PipelinedClient
from node.chain.records import Commitment, RoundInfo, RoundState
from node.chain.votes import leading
from node.peer.cpu import PROCESS_COMPUTE
from node.peer.fetching import Prefetch, round_fetches
from node.peer.peer import Peer
from node.peer.ports import LedgerPort, Receipt
from node.peer.round_outcome import Phase, RoundOutcome, gas_used
from node.peer.vetting import Vetted
from node.peer.watch import ChainWatcher
from node.protocol import wire
from node.protocol.policy import PrivacySpend
from node.protocol.settings import PeerSettings
from node.protocol.wire import encode_bitmap
from node.rules import Verdict, base_verdict

log = logging.getLogger("swarm.peer")

NO_BASE = b"\0" * 32  # a round 1 commit's vote digest: there is no round before it


class NoBase(LedgerError):
    """Nothing to commit from: the round an update was trained from was aborted (and the open round
    with it), or it finalized another model and no holder served that one."""


@dataclass(frozen=True)
class Base:
    """The model a commit of round `round` + 1 trains from, and what that commit says of it: its
    own aggregate of `round` (`included` its bitmap: a vote, counted if this peer took part in
    `round`), or the finalized model of `round` (the digest it claims as its base, no bitmap)."""

    round: int
    vector: torch.Tensor
    digest: bytes
    included: bytes

    @property
    def claim(self) -> tuple[bytes, bytes]:
        """The (vote digest, bitmap) the commit carries."""
        return (self.digest, self.included) if self.round > 0 else (NO_BASE, b"")


class PipelinedWatcher(ChainWatcher):
    """`ChainWatcher` with the pipelined ledger's nudges: a round closes by itself in the commit
    that fills its set, or in the next round's first commit once its window passed, so `closeRound`
    is tried only past the commit window (and is refused while the round before is pending);
    `abortRound` on the voting round past its attestation window (counted from its close, which is
    the next round's opening) is the base class's."""

    async def _nudge_close(self, r: int) -> None:
        info = self.info
        if info is not None and info.round == r and self.block > info.opened_block + self.windows[0]:
            await self._try(self.ledger.close_round, r)


class PipelinedPeer(Peer):
    """A swarm participant on a PipelinedLedger (`ledger`: a `PipelinedClient` with an account);
    the rest as `Peer`'s, without secure aggregation."""

    def __init__(self, settings: PeerSettings, *, ledger: PipelinedClient, **kwargs: Any) -> None:
        # Peer's own commit and attest are never called here (`_send_commit` is overridden, and a
        # vote rides in the commit): the reads are LedgerPort's, as the client offers them.
        super().__init__(settings, ledger=cast(LedgerPort, ledger), **kwargs)
        if self.secure is not None:
            raise ValueError("secure aggregation is not ported to the pipelined ledger: deploy a SwarmLedger")
        self.pipelined = ledger
        self.watcher = PipelinedWatcher(
            self.ledger, self.chain, poll_interval=settings.poll_interval, chain_timeout=settings.chain_timeout
        )
        self._held: torch.Tensor | None = None  # the last finalized model this peer holds (`_model_digest`)
        self._held_round = -1  # its round (-1: not known, as after `start`)
        self._voting: RoundOutcome | None = None  # our outcome of the round before the open one, until it ended
        self._base: Base | None = None  # what the next commit trains from and votes
        self._outcomes: list[RoundOutcome] = []
        self._on_round: Callable[[RoundOutcome], None] | None = None
        self._stopping = False
        self._bases: dict[int, bytes] = {}  # round -> its finalized digest, for the base rule
        self._claims: dict[int, dict[tuple[str, bytes], bytes]] = {}  # round -> (peer, digest) -> its base

    def stop(self) -> None:
        """End cleanly: commit no further round; the final vote on the round this peer took part
        in, then its end (`run` returns after it)."""
        self._stopping = True

    # ---------------------------------------------------------------- rounds
    async def run(self, *, on_round: Callable[[RoundOutcome], None] | None = None) -> list[RoundOutcome]:
        """Rounds until `settings.rounds` (or `stop`): each outcome is emitted (`on_round`) once its
        round ended, which for a round this peer committed in is during the next one."""
        self._held = await self.start()
        self._outcomes, self._on_round = [], on_round
        async with trio.open_nursery() as background:
            self._background = background
            background.start_soon(self.watcher.run)
            while not self._stopping:
                current = await self.chain(self.ledger.current_round)
                if current > self.s.rounds:
                    break
                await self.play_round(current)
            # the last round this peer took part in: its final vote, then its end
            await self._final_vote()
            await self._conclude()
            self._background = None
            background.cancel_scope.cancel()
        await self._serve_on(self._outcomes[-1] if self._outcomes else None, stopped=self._stopping)
        return self._outcomes

    async def play_round(self, r: int) -> None:  # type: ignore[override]
        """Open round r: learn how r - 1 ended where this peer needs it to train (else while r runs),
        train from our aggregate of r - 1 (else r - 1's finalized model) and commit with the vote
        on r - 1, prefetching r's blobs; once r closed, aggregate it (a participant). r's outcome
        is completed when r ends (`_conclude`, during the next round)."""
        self.round = r
        if self._voting is not None and self._voting.round != r - 1:  # rounds went by (an abort's cascade)
            await self._conclude()
        out = RoundOutcome(round=r, state="open")
        with self._measured(out):
            info = await self.chain(self.ledger.round_info, r)
            out.committed = await self.chain(self._committed, r)
            is_open = info.state == RoundState.OPEN
            # No cancel scope covers this body but the round's (at its end): cancelling one would
            # cancel `_conclude` too, once it had taken r - 1's outcome (lost, never emitted).
            prefetch = Prefetch()
            async with round_fetches() as fetches:
                if is_open:
                    fetches.start_soon(self._prefetch, r, prefetch)
                if is_open and not out.committed:
                    self._base = self._own_base(r) or await self._finalized_base(r)
                    if self._base is None:
                        log.warning("round %d: following: this peer holds no model to train from", r)
                    else:
                        await self._commit(r, self._base.vector, out)
                if not out.committed:
                    await self._final_vote()  # took part in r - 1 but not in r: its vote goes alone
                    prefetch.whole.cancel()  # a follower aggregates nothing: no need of the blobs
                await self._conclude()  # r - 1's end: r closes only after it
                self._set(Phase.WAITING_CLOSE if out.committed else Phase.FOLLOWING)
                info = await self.watcher.closed(r)
                prefetch.watching.cancel()  # the fetches started run on into the agreement step
                out.state = info.state.name.lower()
                if info.state == RoundState.CLOSED and out.committed:
                    if self._held_round != r - 1:  # committed before a restart: r's base is r - 1's model
                        await self._finalized_base(r)
                    if self._held is not None:
                        await self._agree_and_aggregate(r, self._held, out)
        self._voting = out

    def _own_base(self, r: int) -> Base | None:
        """Our aggregate of r - 1, with its bitmap, if we computed one (we took part in r - 1);
        None otherwise."""
        voting, own = self._voting, self._own_aggregate
        if voting is None or voting.round != r - 1 or not voting.included or own is None or own[0] != r - 1:
            return None
        return Base(r - 1, own[2], own[1], encode_bitmap(voting.included))

    async def _finalized_base(self, r: int) -> Base | None:
        """The finalized model of r - 1 once it ended, caught up with if we do not hold it; if r - 1
        was aborted (r opened after the abort), the last finalized model. None if no holder served it."""
        if r == 1:
            self._held = self._held if self._held is not None else self.genesis_vector.clone()
            self._held_round = 0
            return Base(0, self._held, b"", b"")
        await self._conclude()
        info = await self.watcher.ended(r - 1)
        if info.state == RoundState.FINALIZED and info.finalized_digest is not None:
            if self._model_digest != info.finalized_digest or self._held is None:
                scratch = RoundOutcome(round=r - 1, state="finalized")
                self._held = await self._catch_up(r - 1, info, self._held, scratch)
            base_round, digest = r - 1, info.finalized_digest
        else:
            base_round, digest = await self.chain(self.ledger.last_finalized)
            if base_round == 0:
                self._held, self._model_digest = self.genesis_vector.clone(), None
            elif self._held is None or self._model_digest != digest:
                self._held = await self._latest_global()
                self._model_digest = digest
        if self._held is None:
            return None
        self._held_round = base_round
        return Base(base_round, self._held, digest, b"")

    # ------------------------------------------------------------ contribute
    async def _contribute(self, r: int, global_vector: torch.Tensor, out: RoundOutcome) -> PrivacySpend:
        """Train from `self._base` and commit with its vote; before sending, the votes already
        counted on r - 1 are read: a base that cannot win any more is replaced (`_checked_base`)
        and the update trained again from the new one."""
        base = self._base
        if base is None:
            raise RuntimeError(f"round {r}: no base to train from")
        spent = await self.spending.next_spend(r, int(self.train_y.shape[0]))
        data, num_samples = await self._train_update(r, base.vector, base.digest, out)
        checked = await self._checked_base(r, base)
        if checked is None:
            raise NoBase(f"round {r}: round {r - 1} was aborted, or its finalized model is not held: no commit")
        if checked is not base:
            log.info("round %d: training again from the base the chain's votes point to", r)
            self._base = base = checked
            data, num_samples = await self._train_update(r, base.vector, base.digest, out)
        await self._publish_update(r, data, num_samples, spent, out)
        return spent

    async def _checked_base(self, r: int, base: Base) -> Base | None:
        """`base`, or the one to train from instead. r - 1 finalized on another key: its finalized
        model (our aggregate lost; our commit then only names that model as its base). r - 1
        pending, and the votes counted on it lead with another (digest, bitmap): the agreement
        step runs again with those votes as focal candidates (blobs already held are not fetched
        again), once; its aggregate if it differs. None: r - 1 was aborted."""
        if base.round != r - 1 or r == 1:
            return base
        info = await self.chain(self.ledger.round_info, r - 1)
        if info.state == RoundState.ABORTED:
            return None
        if info.state == RoundState.FINALIZED:
            if info.finalized_digest == base.digest:
                return base
            log.warning("round %d: round %d finalized another aggregate than ours: training from it", r, r - 1)
            return await self._finalized_base(r)
        if not base.included or self._voting is None:
            return base
        lead = leading(await self.chain(self.ledger.attestations, r - 1))
        if lead is None or (bytes(lead.aggregate_digest), bytes(lead.included)) == base.claim:
            return base
        if self._held is None:
            return base
        missed = dict(self.withholding.missed)  # the first run's record of who served stands
        try:
            digest = await self._agree_and_aggregate(r - 1, self._held, self._voting)  # r - 1's base: still held
        finally:
            self.withholding.missed = missed
        own = self._own_aggregate
        if digest is None or own is None or digest == base.digest:
            return base
        return Base(r - 1, own[2], digest, encode_bitmap(self._voting.included))

    def _send_commit(self, r: int, digest: bytes, num_samples: int, spent: PrivacySpend) -> Receipt:
        """Round r's commit with the vote on r - 1 (`self._base`), the mechanism named in our
        first commit only (an empty one is unchanged: the contract keeps the last named)."""
        if self._base is None:
            raise RuntimeError(f"round {r}: no base to vote")
        vote_digest, included = self._base.claim
        mechanism = b"" if self.spending.commits else wire.canonical(self.s.mechanism).encode()
        return self.pipelined.commit(
            r, digest, num_samples, spent.eps_micro, mechanism, vote_digest, included, spent.record_eps_micro
        )

    # ------------------------------------------------------------ the base rule
    async def _vet(self, r: int, c: Commitment) -> Vetted:
        """Rules 1 to 3 (`Peer`'s), then the base rule (`node.rules.base_verdict`, as `swarm verify`
        applies it): a commit of round r whose vote digest (the model it claims it was trained from)
        is not r - 1's finalized digest is left out, "trained from another base", ours included (our
        aggregate of r - 1 lost). Known only once r - 1 finalized (always so once r closed); not
        applied before, by a prefetch (`_prefetch_vet`), in round 1, or in the round that opens after an abort."""
        raw, verdict = await super()._vet(r, c)
        if verdict is None and r > 1:
            verdict = await self._base_verdict(r, c)
        return raw, verdict

    async def _prefetch_vet(self, r: int, c: Commitment) -> Vetted:
        """Rules 1 to 3 only. The base rule is known once r - 1 finalized, which for the first half of
        r's commits is after they landed, and each new commit needed the round's vote digests read
        again: two reads off the event loop per commit while r is open (docs/SCALING.md). A blob
        it leaves out is fetched, and left out by the agreement step's `_vet`, which reads the
        round's vote digests once."""
        return await super()._vet(r, c)

    async def _base_verdict(self, r: int, c: Commitment) -> Verdict | None:
        base = self._bases.get(r - 1)
        if base is None:
            info = await self.chain(self.ledger.round_info, r - 1)
            if info.state != RoundState.FINALIZED or info.finalized_digest is None:
                return None
            base = self._bases[r - 1] = info.finalized_digest
            self._bases = {k: v for k, v in self._bases.items() if k >= r - 2}
        key = (c.peer, bytes(c.digest))
        claims = self._claims.get(r, {})
        if key not in claims:  # a commit newer than our last read: read the round's again
            claims = {(v.peer, v.digest): v.vote_digest for v in await self.chain(self.pipelined.voted_commits, r)}
            self._claims = {k: v for k, v in self._claims.items() if k >= r - 1} | {r: claims}
        claim = claims.get(key)
        return None if claim is None else base_verdict(r, claim, base)

    # ------------------------------------------------------------ the votes' end
    async def _final_vote(self) -> None:
        """Our vote on the round we took part in and aggregated, sent alone: this peer commits no
        next round (the run's last round, a spent budget, a commit refused, `stop`). Refused
        (logged at debug) once the round is no longer voting: finalized by others, or aborted."""
        voting, own = self._voting, self._own_aggregate
        if voting is None or not voting.included or own is None or own[0] != voting.round:
            return
        # A majority of votes finalizes the round: the participants numbered past it wait a while
        # for it to end without theirs (one transaction fewer each, and no vote racing the
        # finalizing one, to be mined after it and revert).
        participants = await self.chain(self.ledger.participants, voting.round)
        if self.address in participants and participants.index(self.address) > len(participants) // 2:
            self._set(Phase.WAITING_FINAL)
            with trio.move_on_after(self.s.fetch_timeout):
                await self.watcher.ended(voting.round)
                return
        self._set(Phase.ATTESTING, included=sum(voting.included), participants=len(voting.included))
        try:
            receipt = await self.chain(self.pipelined.vote, voting.round, own[1], encode_bitmap(voting.included))
        except LedgerError as exc:
            log.debug("round %d: final vote refused: %s", voting.round, exc)
            return
        voting.gas_used += gas_used(receipt)

    async def _conclude(self) -> None:
        """Once the round we last played ended (nudging its abort past its attestation window):
        its state, the finalized model (ours if our aggregate won, else caught up with), its
        accuracy; the outcome is emitted."""
        out = self._voting
        if out is None:
            return
        self._voting = None
        self._set(Phase.WAITING_FINAL)
        info: RoundInfo = await self.watcher.ended(out.round)
        out.state = info.state.name.lower()
        own = self._own_aggregate
        if info.state == RoundState.FINALIZED:
            if own is not None and own[0] == out.round and own[1] == info.finalized_digest:
                self._held, self._model_digest, self._held_round = own[2], own[1], out.round
                out.global_digest = own[1].hex()
                self._set(Phase.EVALUATING)
                out.accuracy, out.loss = await self._off_loop(PROCESS_COMPUTE.timed(self._evaluate), own[2])
            else:
                out.included = []  # ours lost: `_catch_up` says what won
                # the model the round was trained from, held still: the rebuild's base
                self._held = await self._catch_up(out.round, info, self._held, out)
                self._held_round = out.round
        elif self._held is None:  # aborted: the model we lack is still the latest
            self._held = await self._latest_global()
            self._held_round = -1
        self._outcomes.append(out)
        if self._on_round is not None:
            self._on_round(out)
