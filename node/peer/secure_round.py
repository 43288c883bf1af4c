"""A peer's round under secure aggregation (privacy.mechanism = secagg; docs/SECAGG.md, docs/NODE.md
"The secure round"): what `Peer.play_round` runs instead of train, commit, fetch, aggregate.

- While the round is open: the member's residues from its own records at the global model (the
  clipped gradient sum, stochastic rounding and its share of discrete Gaussian noise, mod 2^bits:
  `MemberRecords.clipped_sum` and `mechanisms.secagg.member.encode`, what `swarm simulate` runs,
  the draws from a fresh secret generator), computed while `SecureMember.play` runs the KEYS and
  DEALING steps (their windows need not cover the training), which then commits the MASKED
  frame's digest through `commit` below: the ordinary commit, with the spend of the policy.
- Once the REVEAL window has passed: the sum of U3 (the survivors). The next model is
  `node.protocol.secure_step.next_global` of it (the genesis' step, with momentum), over the
  survivors' committed record counts, refused when the sum is outside what honest members can
  produce (`member.within_norm_bound`); stored, announced and attested with the bitmap of U3
  over the round's participants.
- A round this member could not finish (it sat out at some step, the unmasking failed with
  `RoundFailed`) is attested by nobody here: it finalizes from the others' votes or aborts at the
  end of its window, as any round without our vote. Either way the peer follows it to its end.

The velocity is a function of every finalized round's sum, and part of the swarm's state: the
model blob a round finalizes holds the model and the velocity (`wire.model_blob`), so a member
that missed a round's sum (it sat out, followed, or restarted) takes both from the finalized blob
it fetches, checked against the digest on chain, and votes again from the next round on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import PrivateKey

from mechanisms.randomness import PrivacyGenerator, secret_generator
from mechanisms.secagg.member import Ints, encode, within_norm_bound
from mechanisms.secagg.policy import NAME as SECAGG
from mechanisms.secagg.policy import SecAggPolicy
from mechanisms.secagg.unmask import RoundResult
from node.chain.client import LedgerClient
from node.chain.errors import LedgerError, RoundNotClosed
from node.chain.records import Commitment, RoundState
from node.chain.secure_steps import round_members
from node.learning.clipped_sum import MemberRecords
from node.peer.catchup import ModelUnavailable
from node.peer.cpu import PROCESS_COMPUTE
from node.peer.faults import SECURE_FAULTS
from node.peer.ports import HostPort, StorePort
from node.peer.round_outcome import Phase, RoundOutcome, gas_used, mined_in
from node.peer.secure import Residues, SecureMember, SecureOutcome, SecureSettings
from node.peer.spending import BudgetExhausted
from node.protocol import wire
from node.protocol.blob import BlobError, sha256, unflatten
from node.protocol.secure_step import GlobalStep, next_global
from node.protocol.settings import PeerSettings
from node.protocol.wire import encode_bitmap
from p2p import peer_id_from_bytes

if TYPE_CHECKING:  # the peer drives this module (and imports it): annotations only
    from node.peer.peer import Peer

log = logging.getLogger("swarm.peer")


def secure_policy(settings: PeerSettings) -> SecAggPolicy | None:
    """The swarm's secure-aggregation policy, None when its privacy policy is another."""
    params = settings.mechanism
    return SecAggPolicy.from_dict(params) if params.get("name") == SECAGG else None


def secure_rounds(peer: Peer, membership: Membership | None) -> SecureRounds | None:
    """The peer's rounds under the swarm's secure-aggregation policy; None under another policy."""
    policy = secure_policy(peer.s)
    if policy is None:
        return None
    if membership is None:
        raise ValueError("a secure-aggregation swarm's peer needs its protocol member (secure_round.open_member)")
    return SecureRounds(peer, policy, membership)


def open_member(
    ledger: LedgerClient,
    host: HostPort,
    store: StorePort,
    identity: PrivateKey,
    policy: SecAggPolicy,
    settings: PeerSettings,
) -> Membership:
    """The protocol member of a peer: its frames signed with its libp2p identity (the Ed25519 key
    its registration binds), the chain's head read at the client's confirmation depth."""

    def head() -> tuple[int, int]:
        block = ledger.w3.eth.get_block(ledger.block_number())
        return int(block["number"]), int(block["timestamp"])

    async def call(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    protocol = SecureSettings(
        bits=policy.bits,
        dim=policy.dim,
        counted_members=policy.counted_members,
        fetch_timeout=settings.fetch_timeout,
        fault=settings.fault if settings.fault in SECURE_FAULTS else None,
    )
    key = Ed25519PrivateKey.from_private_bytes(identity.to_bytes())
    member = SecureMember(ledger, host, store, key, protocol, call=call, head=head)
    return Membership(member, lambda r: round_members(ledger, r).addresses)


class RoundMember(Protocol):
    """What plays a round of the protocol: `SecureMember` (a scripted one in the unit tests)."""

    async def play(self, r: int, residues: Residues, commit: Callable[[bytes], Awaitable[None]]) -> SecureOutcome: ...


class _Residues:
    """The member's residues once its training has computed them: what `SecureMember.play`
    awaits when it masks, the KEYS and DEALING steps having run meanwhile."""

    def __init__(self) -> None:
        self._ready = trio.Event()
        self._value: Ints | None = None

    def set(self, value: Ints) -> None:
        self._value = value
        self._ready.set()

    async def wait(self) -> Ints:
        await self._ready.wait()
        return cast(Ints, self._value)  # set before the event


@dataclass(frozen=True)
class Membership:
    """A peer's protocol member and the round's members as it indexes them (their addresses)."""

    member: RoundMember
    addresses: Callable[[int], Sequence[str]]


@dataclass
class _Attested:
    """The model this peer attested for a round, and the velocity it leads to (both in its blob)."""

    round: int
    digest: bytes
    vector: torch.Tensor
    velocity: torch.Tensor


class SecureRounds:
    """One peer's secure rounds: its records (prepared once), and the velocity of the last
    finalized round it computed itself (other rounds': from their finalized blobs)."""

    def __init__(self, peer: Peer, policy: SecAggPolicy, membership: Membership) -> None:
        self.peer = peer
        self.policy = policy
        self.member = membership.member
        self.addresses = membership.addresses
        step = peer.s.shared.global_step
        if step is None:
            raise ValueError("a secure-aggregation swarm's genesis names its global step (node.derive.global_step)")
        self.step: GlobalStep = step
        self.records: MemberRecords | None = None
        self.velocity: torch.Tensor | None = None
        self.velocity_round = 0  # the finalized round `velocity` is the state of (0: the genesis, None)

    async def play(self, r: int, global_vector: torch.Tensor | None, out: RoundOutcome) -> torch.Tensor | None:
        """Round r from `global_vector` (None: the peer lacks the last finalized model and follows);
        the model held after it."""
        p = self.peer
        info = await p.chain(p.ledger.round_info, r)
        out.committed = await p.chain(p._committed, r)
        attested: _Attested | None = None
        if info.state is RoundState.OPEN and not out.committed and global_vector is not None:
            base = await p.chain(p.ledger.last_finalized)  # while r is open: the round it steps from
            result = await self._contribute(r, global_vector, out)
            if result is not None:
                attested = await self._attest(r, base, global_vector, result, out)
        else:
            p._set(Phase.FOLLOWING)
            await p.watcher.closed(r)
        p._set(Phase.WAITING_FINAL)
        info = await p.watcher.ended(r)
        out.state = info.state.name.lower()
        if info.state is RoundState.FINALIZED:
            return await self._finalized(r, info.finalized_digest, attested, out)
        return global_vector if global_vector is not None else await p._latest_global()

    async def _contribute(self, r: int, global_vector: torch.Tensor, out: RoundOutcome) -> RoundResult | None:
        """Residues, then the protocol with our commit inside it; the sum, or None (logged) when
        this member did not get one. The round's close is nudged meanwhile (the watcher closes a
        round once its window or quorum allows it)."""
        p = self.peer
        num_records = int(p.train_y.shape[0])
        try:
            spent = await p.spending.next_spend(r, num_records)
        except BudgetExhausted as exc:
            p._set(Phase.BUDGET_SPENT, reason=str(exc))
            log.warning("round %d: %s", r, exc)
            await p.watcher.closed(r)
            return None
        p._set(Phase.TRAINING)  # the protocol's keys and dealings meanwhile, then the commit of the MASKED frame
        residues = _Residues()

        async def train() -> None:
            started = trio.current_time()
            residues.set(await p._off_loop(PROCESS_COMPUTE.timed(self._residues), global_vector))
            out.train_seconds = trio.current_time() - started
            p._set(Phase.COMMITTING)

        mech_json = wire.canonical(p.s.mechanism).encode()

        async def commit(digest: bytes) -> None:
            receipt = await p.chain(
                p.ledger.commit, r, digest, num_records, spent.eps_micro, mech_json, spent.record_eps_micro
            )
            await p._read_back_commit(r, digest, mined_in(receipt))
            p.spending.committed(num_records)
            out.committed = True
            out.eps_cumulative, out.delta_cumulative = spent.mechanism.epsilon, spent.mechanism.delta
            out.eps_protects = spent.mechanism.protects
            out.record_eps_cumulative, out.record_delta = spent.mechanism.epsilon, spent.mechanism.delta
            out.record_protects = spent.mechanism.protects
            out.gas_used += gas_used(receipt)
            p._set(Phase.WAITING_CLOSE)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(p.watcher.closed, r)  # nudges closeRound when it is due
            nursery.start_soon(train)  # a failure ends the round as it did before the protocol began
            outcome = await self.member.play(r, residues.wait, commit)
            if outcome.result is None:  # said now: the round may take its whole window to close
                log.warning("round %d: no sum for this member (%s): no vote this round", r, outcome.sat_out)
        if not out.committed:
            await p.spending.resync()  # a commit whose reply was lost may have landed
        if outcome.faults:
            out.left_out = [f"member {i}: {why}" for i, why in sorted(outcome.faults.items())]
        return outcome.result

    def _residues(self, global_vector: torch.Tensor) -> Ints:
        """This member's residues at the global model (blocking), its rounding and noise drawn
        from the OS CSPRNG."""
        p = self.peer
        p.model.load_state_dict(unflatten(global_vector, p.spec))
        if self.records is None:
            self.records = MemberRecords(p.model, p.train_x, p.train_y)
        return member_residues(self.policy, self.records, p.model, secret_generator())

    async def _attest(
        self, r: int, base: tuple[int, bytes], previous: torch.Tensor, result: RoundResult, out: RoundOutcome
    ) -> _Attested | None:
        """The next model from the sum (round r steps from the finalized round and digest `base`),
        stored, announced and attested with U3's bitmap; None (logged) when this peer does not vote."""
        p = self.peer
        try:
            before = self._velocity_at(*base)
        except (BlobError, KeyError) as exc:
            log.warning("round %d: no velocity of round %d's finalized state (%s): no vote", r, base[0], exc)
            return None
        p._set(Phase.AGGREGATING)
        commitments = await p.chain(p.ledger.commitments, r)
        addresses = await p.chain(self.addresses, r)
        survivors = {addresses[i] for i in result.survivors}
        included = [c.peer in survivors for c in commitments]
        try:
            vector, velocity = await p._off_loop(self._next_model, r, previous, before, result, commitments, included)
        except (ValueError, FloatingPointError) as exc:
            log.error("round %d: no model from the sum, attesting nothing: %s", r, exc)
            return None
        data = wire.model_blob(vector, r, velocity)
        digest = sha256(data)
        p.store.put(data)
        await p.host.announce_blob(digest.hex(), later=True)
        if r >= p.s.rounds:  # the last round's participants, whom the peer serves on for (node/peer/linger.py)
            raw_ids = await p.chain(lambda: [bytes(p.ledger.peer_id_of(c.peer)) for c in commitments])
            p._participant_ids = (r, [peer_id_from_bytes(raw) for raw in raw_ids])
        out.included = included
        p._set(Phase.ATTESTING, included=sum(included), participants=len(included))
        try:
            receipt = await p.chain(p.ledger.attest, r, digest, encode_bitmap(included))
        except RoundNotClosed:  # finalized (or aborted) before our vote
            pass
        except LedgerError as exc:
            log.warning("round %d: attestation failed: %s", r, exc)
        else:
            out.gas_used += gas_used(receipt)
        return _Attested(r, digest, vector, velocity)

    def _velocity_at(self, base: int, digest: bytes) -> torch.Tensor | None:
        """The velocity of finalized round `base` (None at the genesis): ours if we computed that
        round, else from its finalized blob in our store (KeyError if absent, BlobError if it does
        not decode or is not that round's; the store holds only blobs that hash to their digest)."""
        if base == 0:
            return None
        if self.velocity_round == base:
            return self.velocity
        data = self.peer.store.get(digest.hex())
        if data is None:
            raise KeyError(f"finalized model {digest.hex()[:16]} not held")
        _, velocity, meta = wire.read_model_state(data, self.peer.num_params)
        if meta.get("round") != str(base):
            raise BlobError(f"the finalized blob names round {meta.get('round')!r}, not {base}")
        self.velocity, self.velocity_round = velocity, base
        return velocity

    def _next_model(
        self,
        r: int,
        previous: torch.Tensor,
        velocity: torch.Tensor | None,
        result: RoundResult,
        commitments: list[Commitment],
        included: list[bool],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return model_from_sum(
            self.step,
            self.policy,
            previous,
            velocity,
            result.total,
            len(result.survivors),
            commitments,
            included,
            r,
        )

    async def _finalized(
        self, r: int, digest: bytes | None, attested: _Attested | None, out: RoundOutcome
    ) -> torch.Tensor | None:
        """The model round r finalized (ours if it is what we attested, else fetched), evaluated."""
        p = self.peer
        digest = digest or await p.catchup.finalized_digest(r)
        if attested is not None and attested.digest == digest:
            vector = attested.vector
            self.velocity, self.velocity_round = attested.velocity, r
        else:  # its velocity is read from the fetched blob when the next round needs it
            try:
                vector = await p.catchup.fetch_model(r, digest)
            except ModelUnavailable as exc:
                log.error("%s: this peer follows the next round", exc)
                return None
        p._model_digest = digest
        out.global_digest = digest.hex()
        p._set(Phase.EVALUATING)
        out.accuracy, out.loss = await p._off_loop(PROCESS_COMPUTE.timed(p._evaluate), vector)
        return vector


def member_residues(
    policy: SecAggPolicy, records: MemberRecords, model: torch.nn.Module, generator: PrivacyGenerator
) -> Ints:
    """A member's residues mod 2^bits at `model` (blocking): its records' clipped gradient sum,
    rounded on the generator's `mechanism` stream, its noise share on `dpsgd_noise`: the
    arithmetic and streams of `swarm simulate` (node.runs.secure_round)."""
    gradient_sum, _ = records.clipped_sum(model, policy.clip)
    return encode(policy, gradient_sum.numpy(), generator.mechanism, generator.dpsgd_noise)


def model_from_sum(
    step: GlobalStep,
    policy: SecAggPolicy,
    previous: torch.Tensor,
    velocity: torch.Tensor | None,
    total: Ints,
    survivors: int,
    commitments: list[Commitment],
    included: list[bool],
    r: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round r's model and velocity from the sum of `survivors` members, whose commits are the
    `included` ones (their record counts are the sum's records); ValueError when the survivors are
    not all committers or the sum is outside what honest members can produce
    (`member.within_norm_bound`: what replaces a robust rule, which masked vectors cannot run)."""
    records = sum(int(c.num_samples) for c, inc in zip(commitments, included, strict=True) if inc)
    if records < 1 or sum(included) != survivors:
        raise ValueError(f"{survivors} survivors, {sum(included)} of them among the round's committers")
    if not within_norm_bound(policy, total, records, survivors):
        raise ValueError("the sum is outside what honest members can produce (member.within_norm_bound)")
    return next_global(step, policy, previous, velocity, total, records, r)
