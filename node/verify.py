"""`swarm verify`: re-check every round of a swarm from the chain and an archive of blobs,
trusting no peer.

Every commit is held to the rulebook (node/rules.py), the rules every peer applies, so verify
reaches the verdict honest peers reach: the committer owns its peer id (check "registration"),
claims 1 to maxSamples samples ("samples"), names the swarm's privacy policy (from the genesis
blob, whose digest is on chain) and records exactly what that policy charges after the committer's
commits so far, neither less nor more ("mechanism", "eps", "record-eps"); its blob decodes
("blob"), names the round and the committer of its commit ("binding") and is a possible output of
the policy's mechanism ("release": `Mechanism.release_violation`: Duchi, LDP-FL and low-eps HM in
their two-point sets, PM, HM and the exponential mechanism within their range, Laplace and the
Gaussian within their bound, sampling with at most k non-zeros). Verify names every rule a commit
breaks; the first is the verdict. Whether the noise was really drawn (Gaussian, Laplace, PNPM
magnitudes, a value inside PM's range) cannot be checked from the release: it rests on each
peer's own software.

Beyond the rules, verify checks what the peers trust: each archived blob matches its on-chain
digest; the aggregate recomputed from the included blobs (ledger order, the finalizing bitmap)
matches the finalized digest, and so does the archived model; no finalized aggregate includes a
commit that honest peers leave out (check "aggregate", `aggregate_ok` false even when the
recomputed digest matches); each peer's eps totals equal its last commit's; the deployed code is
the artifact's (check "code"). Every exception inside a check is a named failure of its round (and
of its committer, where there is one), never the end of verification.

The ledger opens the next round as soon as one ends, so a finished swarm leaves a last round that
is open with no commitment: it is reported as `not_started`, not as a round (nothing to check).
The archive may be several folders (`ArchiveStores`): every peer's blob store, for example.

A secure-aggregation round (docs/SECAGG.md) is checked by `verify_secure_round`: its members and
each step's set from the chain, every frame from the archive against its digest, then the sum
recomputed by `unmask.verify_round`, naming every member whose frame or share does not fit. In a
secure swarm (its genesis policy is secagg) `verify` calls it for every finalized round (check
"secure"), then holds the finalizing bitmap to the survivors (U3 over the participants) and
recomputes the model from the sum (`node.protocol.secure_step.next_global`: the genesis' step,
with the velocity of the round before, recomputed from its sum or read from its finalized blob,
which holds the model and the velocity) bit for bit against the finalized digest (check
"aggregate"). Commits are held to rules 1 to 3; there is no update blob to decode.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

import torch
from eth_typing import ChecksumAddress
from web3 import Web3

from mechanisms.secagg.member import within_norm_bound
from mechanisms.secagg.policy import NAME as SECAGG
from mechanisms.secagg.policy import SecAggPolicy
from mechanisms.secagg.round import RoundFailed
from mechanisms.secagg.unmask import verify_round
from node.chain.client import LedgerClient, load_artifact
from node.chain.codec import abi_type
from node.chain.kind import masked_code_differences
from node.chain.records import Attestation, Commitment, RoundInfo, RoundState, SwarmParams
from node.chain.registration import Registration
from node.chain.secure_steps import (
    RoundMembers,
    Step,
    agreed,
    chain_complaints,
    chain_steps,
    fetch_archive,
    round_members,
    round_session,
    round_setup,
)
from node.protocol import aggregate, policy, wire
from node.protocol.blob import BlobError, decode_blob, sha256
from node.protocol.secure_step import next_global
from node.protocol.settings import SharedSettings
from node.protocol.wire import decode_bitmap, eps_from_micro
from node.rules import PeerIdOwners, Rulebook, Verdict


@dataclass
class Failure:
    round: int
    peer: str
    check: str
    detail: str


@dataclass
class RoundCheck:
    round: int
    state: str
    participants: int = 0
    included: int = 0
    blobs_ok: int = 0
    aggregate_ok: bool | None = None  # None: nothing to recompute (open or aborted round)
    eps_ok: int = 0  # commits that keep the sample-count and policy rules (the eps record exact)
    releases_ok: int = 0  # decoded blobs bound to their commit whose values the policy's mechanism could output


@dataclass
class VerifyReport:
    ledger: str
    rounds: list[RoundCheck] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    peers: dict[str, dict] = field(default_factory=dict)
    not_started: int | None = None  # the ledger's current round when open with no commitment yet

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {
            "ledger": self.ledger,
            "ok": self.ok,
            "rounds": [asdict(r) for r in self.rounds],
            "failures": [asdict(f) for f in self.failures],
            "peers": self.peers,
            "not_started": self.not_started,
        }


class VerifiedLedger(Protocol):
    """The reads `Verifier` makes of a ledger: `LedgerClient`'s (SwarmLedger) and `PipelinedClient`'s
    (node/verify_pipelined.py); a secure round's reads are SwarmLedger's alone."""

    @property
    def address(self) -> ChecksumAddress: ...
    @property
    def w3(self) -> Web3: ...

    def params(self) -> SwarmParams: ...
    def current_round(self) -> int: ...
    def round_info(self, round: int) -> RoundInfo: ...
    def commitments(self, round: int) -> list[Commitment]: ...
    def attestations(self, round: int) -> list[Attestation]: ...
    def chain_id(self) -> int: ...
    def registrations(self) -> list[Registration]: ...
    def peer_id_of(self, address: str) -> bytes: ...
    def eps_spent(self, address: str) -> int: ...
    def record_eps_spent(self, address: str) -> int: ...


class BlobSource(Protocol):
    """Where verify reads blobs: an archive folder's store, or any store with `get`."""

    def get(self, digest: str) -> bytes | None: ...


@runtime_checkable
class RangedBlobSource(BlobSource, Protocol):
    """A blob source that reads part of a blob: what a bounded read needs."""

    def read(self, digest: str, offset: int, length: int) -> bytes | None: ...


def read_within(source: BlobSource, digest: str, most: int) -> bytes | None:
    """`digest`'s blob from `source` if it has at most `most` bytes, never reading more than one
    byte past that; None if absent, bigger, or if `source` cannot read part of a blob."""
    if not isinstance(source, RangedBlobSource):
        return None
    data = source.read(digest, 0, most + 1)
    return data if data is not None and len(data) <= most else None


class ArchiveStores:
    """Several blob sources read as one: the first copy whose sha256 is the digest asked for, else
    the first copy found (so an altered blob, with no good copy anywhere, is still reported as
    altered rather than missing), else None."""

    def __init__(self, sources: list[BlobSource]) -> None:
        self.sources = sources

    def get(self, digest: str) -> bytes | None:
        first: bytes | None = None
        for source in self.sources:
            data = source.get(digest)
            if data is None:
                continue
            if sha256(data).hex() == digest.lower():
                return data
            first = data if first is None else first
        return first

    def read(self, digest: str, offset: int, length: int) -> bytes | None:
        """Part of the copy `get` would choose among those of at most `offset + length` bytes
        (each source read no further than one byte past that)."""
        first: bytes | None = None
        for source in self.sources:
            data = read_within(source, digest, offset + length)
            if data is None:
                continue
            if sha256(data).hex() == digest.lower():
                return data[offset:]
            first = data[offset:] if first is None else first
        return first


def verify(ledger: LedgerClient, archive: BlobSource) -> VerifyReport:
    """`ledger`: a read-only LedgerClient; `archive`: a blob store holding the run's blobs.
    Whatever goes wrong inside a check is a named failure of the report, never an exception."""
    return Verifier(ledger, archive).run()


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class Swarm:
    """What the genesis anchors: the shared settings, the first model and the rules."""

    shared: SharedSettings
    genesis_vector: torch.Tensor
    rules: Rulebook

    @property
    def secure(self) -> SecAggPolicy | None:
        """The secure-aggregation policy, None when the swarm's privacy policy is another."""
        params = dict(self.shared.privacy.mechanism)
        return SecAggPolicy.from_dict(params) if params.get("name") == SECAGG else None

    @property
    def num_params(self) -> int:
        return self.genesis_vector.numel()


@dataclass
class Commit:
    """One commitment as verified: its decoded update (None if unusable) and every rule it breaks,
    in the rulebook's order (the first is the verdict honest peers reach)."""

    commitment: Commitment
    vector: torch.Tensor | None = None
    broken: list[Verdict] = field(default_factory=list)


class Verifier:
    """One verification of a ledger against an archive: one method per check, the failures in
    `report`. Holds what a later round's checks need of the earlier ones: each committer's sample
    counts and last eps record, and who owns which peer id (read at the first commitment)."""

    def __init__(self, ledger: VerifiedLedger, archive: BlobSource) -> None:
        self.ledger = ledger
        self.archive = archive
        self.report = VerifyReport(ledger=ledger.address)
        self.counts: dict[str, list[int]] = {}  # committer -> numSamples of its commits so far
        self.last_eps: dict[str, tuple[int, int]] = {}  # committer -> its last commit's eps records
        self.peer_ids: dict[str, bytes] = {}  # committer -> its registered peer id
        self._owners: PeerIdOwners | None = None
        # a secure swarm's velocity after the last finalized round (None at the genesis): the one
        # recomputed from its sum, else the one in its finalized blob (`check_model_blob`)
        self.velocity: torch.Tensor | None = None

    def run(self) -> VerifyReport:
        try:
            self.check_code()
        except Exception as exc:
            self.fail(0, "-", "code", f"the deployed code could not be checked: {_why(exc)}")
        try:
            swarm = self.read_genesis()
            if swarm is not None:
                self.check_rounds(swarm)
                self.check_eps_totals(swarm)
        except Exception as exc:  # outside any one round: genesis, parameters, the final eps totals
            self.fail(0, "-", "verify", f"verification stopped: {_why(exc)}")
        return self.report

    def fail(self, r: int, peer: str, check: str, detail: str) -> None:
        self.report.failures.append(Failure(r, peer, check, detail))

    # ---------------------------------------------------------------- the genesis

    def read_genesis(self) -> Swarm | None:
        """The swarm's settings and rules from the genesis blob, whose digest is on chain; None
        (and a failure "genesis") when the archive does not hold it or it anchors nothing usable."""
        params = self.ledger.params()
        digest = bytes(params.genesis_digest)
        genesis = self.archive.get(digest.hex())
        if genesis is None or sha256(genesis) != digest:
            detail = f"genesis blob {digest.hex()} missing from the archive or not matching the ledger's digest"
            self.fail(0, "-", "genesis", detail)
            return None
        try:
            tensors, meta = decode_blob(genesis, max_size=1 << 31, expected=None)
            shared = SharedSettings.from_dict(json.loads(meta["swarm"]))
            vector = tensors[wire.VECTOR].to(torch.float32)
        except Exception as exc:
            self.fail(0, "-", "genesis", f"the genesis blob is unreadable: {_why(exc)}")
            return None
        try:
            rules = Rulebook(shared, vector.numel(), int(params.max_samples))
        except (ValueError, KeyError, TypeError) as exc:
            self.fail(0, "-", "genesis", f"the genesis privacy policy builds no mechanism: {exc}")
            return None
        return Swarm(shared, vector, rules)

    # ---------------------------------------------------------------- rounds

    def check_rounds(self, swarm: Swarm) -> None:
        """Every round in order, each from the model the previous one finalized."""
        model: torch.Tensor | None = swarm.genesis_vector
        current = self.ledger.current_round()
        for r in range(1, current + 1):
            check = RoundCheck(round=r, state="unknown")
            try:
                info = self.ledger.round_info(r)
            except Exception as exc:
                self.report.rounds.append(check)
                self.fail(r, "-", "round", f"the round could not be read: {_why(exc)}")
                model = None
                continue
            if r == current and info.state is RoundState.OPEN and info.participant_count == 0:
                self.report.not_started = r  # opened when the previous round ended; nobody committed (yet)
                continue
            self.report.rounds.append(check)
            check.state = info.state.name.lower()
            model = self.check_round(swarm, info, check, model)

    def check_round(
        self, swarm: Swarm, info: RoundInfo, check: RoundCheck, previous: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Round `info.round`'s checks: its commits always (later rounds' eps records count them),
        its aggregate when it finalized from a known model. The model the next round starts from
        (None: not known)."""
        r, finalized = info.round, info.state is RoundState.FINALIZED
        recomputed = None
        try:
            commits = self.check_commits(swarm, r, check)
            if finalized and previous is None:
                check.aggregate_ok = False
                self.fail(r, "-", "aggregate", "not recomputed: the previous finalized model is not known")
            elif finalized and previous is not None and swarm.secure is not None:
                recomputed = self.check_secure_aggregate(swarm, swarm.secure, info, check, commits, previous)
            elif finalized and previous is not None:
                recomputed = self.check_aggregate(swarm, info, check, commits, previous)
        except Exception as exc:  # whatever a hostile chain or archive makes a check raise
            check.aggregate_ok = False if finalized else check.aggregate_ok
            self.fail(r, "-", "round", f"the round could not be checked: {_why(exc)}")
        if not finalized:
            return previous
        try:
            return self.check_model_blob(swarm, r, info.finalized_digest, recomputed)
        except Exception as exc:  # the archive's own trouble reading the model: go on from ours
            self.fail(r, "-", "aggregate-blob", f"the finalized model could not be read from the archive: {_why(exc)}")
            return recomputed

    # ---------------------------------------------------------------- commits: the rulebook

    def check_commits(self, swarm: Swarm, r: int, check: RoundCheck) -> list[Commit]:
        """Every commitment of round r held to the rulebook, in ledger order."""
        commitments = self.ledger.commitments(r)
        check.participants = len(commitments)
        commits = []
        for c in commitments:
            commit = Commit(c)
            try:
                self.check_commit(swarm, r, commit, check)
            except Exception as exc:  # whatever else a hostile chain or archive makes a check raise
                self.fail(r, c.peer, "commit", f"the commit could not be checked: {_why(exc)}")
            commits.append(commit)
        return commits

    def check_commit(self, swarm: Swarm, r: int, commit: Commit, check: RoundCheck) -> None:
        """One commitment: every rule of the rulebook, each broken one a failure naming its committer."""
        c = commit.commitment
        counts = self.counts.setdefault(c.peer, [])
        counts.append(int(c.num_samples))
        self.last_eps[c.peer] = (int(c.eps_micro), int(c.record_eps_micro))
        registration = self.check_registration(c)
        ruled = swarm.rules.commit_verdict(c, counts)
        if ruled is None:
            check.eps_ok += 1
        commit.broken = [v for v in (registration, ruled) if v is not None]
        if swarm.secure is None:  # a secure round's commit is a MASKED frame: `check_secure_aggregate`
            commit.vector, blob_verdict = self.check_blob(swarm, r, c, check)
            if blob_verdict is not None:
                commit.broken.append(blob_verdict)
        for verdict in commit.broken:
            self.fail(r, c.peer, verdict.check, self._detail(r, c, verdict))
        self.note_spend(swarm, c.peer, counts, r)

    @staticmethod
    def _detail(r: int, c: Commitment, verdict: Verdict) -> str:
        if verdict.check == "blob":
            return (
                f"round {r}: blob {bytes(c.digest).hex()[:16]} of {c.peer} matches its digest but is {verdict.reason}"
            )
        return verdict.reason

    def check_registration(self, c: Commitment) -> Verdict | None:
        """Rule 1: the committer owns the peer id the ledger holds for it (the registrations are
        read once, at the first commitment). A registration that cannot be read is a verdict too."""
        try:
            if self._owners is None:
                owners = PeerIdOwners(self.ledger.chain_id(), self.ledger.address)
                owners.add(self.ledger.registrations())
                self._owners = owners
            if c.peer not in self.peer_ids:  # an account registers once: its peer id never changes
                self.peer_ids[c.peer] = bytes(self.ledger.peer_id_of(c.peer))
            return self._owners.verdict(c.peer, self.peer_ids[c.peer])
        except Exception as exc:
            return Verdict("registration", f"the registration could not be checked: {_why(exc)}")

    def check_blob(
        self, swarm: Swarm, r: int, c: Commitment, check: RoundCheck
    ) -> tuple[torch.Tensor | None, Verdict | None]:
        """The archived blob of commitment c against its digest, then rules 4 to 6: its update
        (None if missing, altered or malformed) and the blob rules' verdict."""
        digest = bytes(c.digest)
        try:
            data = self.archive.get(digest.hex())
        except Exception as exc:  # the archive's own trouble: this blob is unusable, the rest goes on
            self.fail(r, c.peer, "blob", f"the archive could not read the blob: {_why(exc)}")
            return None, None
        if data is None:
            return None, None  # missing: fails the recomputation if included
        if sha256(data) != digest:  # tampered archive: fails whatever the bitmap
            detail = f"archived blob altered: its bytes hash to {sha256(data).hex()[:16]}..., not the committed digest"
            self.fail(r, c.peer, "blob", detail)
            return None, None
        vector, verdict = swarm.rules.update_verdict(data, c)
        check.blobs_ok += vector is not None
        check.releases_ok += vector is not None and verdict is None
        return vector, verdict

    def note_spend(self, swarm: Swarm, peer: str, counts: list[int], r: int) -> None:
        """What the policy says the committer's commits so far spend, and what it protects, for the report."""
        try:
            spent = policy.privacy_spend(swarm.shared.privacy, swarm.num_params, counts)
        except Exception as exc:
            self.fail(r, peer, "eps", f"the spend could not be computed: {_why(exc)}")
            return
        entry = self.report.peers.setdefault(peer, {})
        entry.update(protects=spent.mechanism.protects, delta=spent.mechanism.delta)
        if spent.record is not None:
            entry.update(record_protects=spent.record.protects, record_delta=spent.record.delta)

    # ---------------------------------------------------------------- the aggregate

    def check_aggregate(
        self, swarm: Swarm, info: RoundInfo, check: RoundCheck, commits: list[Commit], previous: torch.Tensor
    ) -> torch.Tensor | None:
        """A finalized round: its majority's bitmap includes no commit that honest peers leave out,
        and the model recomputed from the included blobs is the finalized digest. The recomputed
        model if it is (the chain's model, honest or not), else None."""
        r, finalized = info.round, info.finalized_digest
        check.aggregate_ok = False
        if finalized is None:
            self.fail(r, "-", "aggregate", "finalized round without a finalized digest")
            return None
        bitmap = _finalizing_bitmap(self.ledger, r, finalized, len(commits))
        if bitmap is None:
            self.fail(r, "-", "attestation", "no majority attestation found for the finalized digest")
            return None
        chosen = [commit for commit, inc in zip(commits, decode_bitmap(bitmap, len(commits))) if inc]
        check.included = len(chosen)
        dishonest = [commit for commit in chosen if commit.broken and commit.vector is not None]
        for commit in dishonest:  # a malformed or missing one is named below: it cannot be recomputed
            verdict = commit.broken[0]
            detail = "the finalized aggregate includes it, but honest peers leave it out "
            detail += f"({verdict.check}: {verdict.reason})"
            self.fail(r, commit.commitment.peer, "aggregate", detail)
        unusable = [commit for commit in chosen if commit.vector is None]
        for commit in unusable:
            detail = (
                "included in the finalized aggregate but missing or invalid in the archive: "
                "the aggregate cannot be recomputed"
            )
            self.fail(r, commit.commitment.peer, "blob", detail)
        if unusable:
            return None
        recomputed = aggregate.next_global(
            swarm.shared,
            previous,
            [commit.vector for commit in chosen if commit.vector is not None],  # none missing: checked above
            [int(commit.commitment.num_samples) for commit in chosen],
        )
        digest = sha256(wire.model_blob(recomputed, r))
        if digest != finalized:
            detail = f"recomputed aggregate {digest.hex()[:16]}... differs from the finalized digest "
            detail += f"{finalized.hex()[:16]}..."
            self.fail(r, "-", "aggregate", detail)
            return None
        check.aggregate_ok = not dishonest  # the chain's model: the next round starts from it either way
        return recomputed

    def check_secure_aggregate(
        self,
        swarm: Swarm,
        secure: SecAggPolicy,
        info: RoundInfo,
        check: RoundCheck,
        commits: list[Commit],
        previous: torch.Tensor,
    ) -> torch.Tensor | None:
        """A finalized secure round: its sum recomputed from the archive's frames
        (`verify_secure_round`, every member it names a failure "secure"), the finalizing bitmap
        equal to the survivors over the participants, and the model stepped from the sum equal to
        the finalized digest. The recomputed model if it is (its velocity kept for the next
        round), else None (the next round then steps from the archived blob's model and velocity)."""
        r, finalized = info.round, info.finalized_digest
        check.aggregate_ok = False
        if finalized is None:
            self.fail(r, "-", "aggregate", "finalized round without a finalized digest")
            return None
        archive = cast(RangedBlobSource, self.archive)  # read_within reads nothing from a source without `read`
        sum_check = verify_secure_round(
            cast(LedgerClient, self.ledger),  # a secure swarm runs SwarmLedger only
            r,
            archive,
            bits=secure.bits,
            dim=secure.dim,
            counted_members=secure.counted_members,
        )
        for member, why in sum_check.faults.items():
            self.fail(r, member, "secure", why)
        if sum_check.failure is not None:
            self.fail(r, "-", "secure", f"the round's sum could not be recomputed: {sum_check.failure}")
            return None
        bitmap = _finalizing_bitmap(self.ledger, r, finalized, len(commits))
        if bitmap is None:
            self.fail(r, "-", "attestation", "no majority attestation found for the finalized digest")
            return None
        survivors = set(sum_check.survivors)
        expected = [commit.commitment.peer in survivors for commit in commits]
        chosen = decode_bitmap(bitmap, len(commits))
        check.included = sum(chosen)
        if chosen != expected or sum(expected) != len(survivors):
            self.fail(r, "-", "aggregate", f"the finalizing bitmap is not the round's survivors {sorted(survivors)}")
            return None
        records = sum(int(commit.commitment.num_samples) for commit, inc in zip(commits, chosen) if inc)
        if not within_norm_bound(secure, sum_check.total, records, len(survivors)):
            self.fail(r, "-", "aggregate", "the round's sum is outside what honest members can produce")
            return None
        if swarm.shared.global_step is None:
            self.fail(r, "-", "aggregate", "not recomputed: the genesis names no global step")
            return None
        recomputed, velocity = next_global(
            swarm.shared.global_step, secure, previous, self.velocity, sum_check.total, records, r
        )
        digest = sha256(wire.model_blob(recomputed, r, velocity))
        if digest != finalized:
            detail = f"the model stepped from the round's sum, {digest.hex()[:16]}..., differs from the finalized "
            detail += f"digest {finalized.hex()[:16]}..."
            self.fail(r, "-", "aggregate", detail)
            return None
        self.velocity = velocity
        check.aggregate_ok = not any(commit.broken for commit, inc in zip(commits, chosen) if inc)
        check.blobs_ok = check.releases_ok = len(survivors)
        return recomputed

    def check_model_blob(
        self, swarm: Swarm, r: int, finalized: bytes | None, recomputed: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The archived model of finalized round r against the finalized digest (check
        "aggregate-blob"); the model the next round starts from: the recomputed one, else the
        archived one (digest checked), else None."""
        if finalized is None:
            return recomputed
        data = self.archive.get(finalized.hex())
        if data is None:
            self.fail(r, "-", "aggregate-blob", f"finalized model {finalized.hex()} not in the archive")
            return recomputed
        if sha256(data) != finalized:
            detail = (
                f"archived model altered: its bytes hash to {sha256(data).hex()[:16]}..., "
                f"not the finalized digest {finalized.hex()[:16]}..."
            )
            self.fail(r, "-", "aggregate-blob", detail)
            return recomputed
        try:
            if swarm.secure is None:
                vector, meta = wire.read_vector(data, swarm.num_params, kind="model")
            else:  # the model and the global step's velocity: the next round steps with this velocity
                vector, velocity, meta = wire.read_model_state(data, swarm.num_params)
                if recomputed is None:
                    self.velocity = velocity
        except BlobError as exc:
            self.fail(r, "-", "aggregate-blob", f"finalized model blob unreadable: {exc}")
            return recomputed
        if meta.get("round") != str(r):
            self.fail(r, "-", "aggregate-blob", f"finalized model blob names round {meta.get('round')!r}, not {r}")
        return recomputed if recomputed is not None else vector.to(torch.float32)

    # ---------------------------------------------------------------- eps totals

    def check_eps_totals(self, swarm: Swarm) -> None:
        """Each committer's epsSpent / recordEpsSpent on chain equal its last commitment's records."""
        for peer, (eps_micro, record_micro) in self.last_eps.items():
            try:
                on_chain = int(self.ledger.eps_spent(peer))
                record_on_chain = int(self.ledger.record_eps_spent(peer))
            except Exception as exc:  # one peer's totals unreadable: named, the others are still checked
                self.fail(0, peer, "eps", f"the eps totals could not be read: {_why(exc)}")
                continue
            entry = self.report.peers.setdefault(peer, {})
            entry.update(eps_spent=eps_from_micro(on_chain), commits=len(self.counts[peer]))
            if swarm.shared.privacy.dp_sgd is not None:
                entry.update(record_eps_spent=eps_from_micro(record_on_chain))
            if (on_chain, record_on_chain) != (eps_micro, record_micro):
                detail = (
                    f"epsSpent {on_chain} / recordEpsSpent {record_on_chain} differ from the last commitment "
                    f"{eps_micro} / {record_micro}"
                )
                self.fail(0, peer, "eps", detail)

    # ---------------------------------------------------------------- the deployed code

    def check_code(self) -> None:
        """The runtime code at the ledger address is the artifact's deployedBytecode, up to the
        immutables (masked out at the artifact's `immutableReferences`); each immutable holds one
        value across its uses, the value `params()` reports; and the deployment transaction (at
        params' deploy block, from its deployer) ran the artifact's creation code with constructor
        arguments that are those values. A chain or state file whose code (or an immutable) was
        patched fails with check "code"."""
        for detail in code_problems(self.ledger):
            self.fail(0, "-", "code", detail)


def code_problems(ledger: VerifiedLedger, artifact: dict[str, Any] | None = None) -> list[str]:
    """What differs between the deployed code and the artifact (`Verifier.check_code`; default:
    SwarmLedger's)."""
    artifact = artifact or load_artifact()
    references: dict[str, list[dict[str, int]]] = artifact.get("immutableReferences", {})
    expected = bytes.fromhex(artifact["deployedBytecode"].removeprefix("0x"))
    code = bytes(ledger.w3.eth.get_code(ledger.address))
    problems = masked_code_differences(code, expected, references)
    if problems:
        return problems
    params = asdict(ledger.params())
    held: dict[str, Any] = {}
    for name, refs in references.items():
        values = {code[ref["start"] : ref["start"] + ref["length"]] for ref in refs}
        field_name = _snake(name)
        if len(values) != 1:
            problems.append(f"immutable {name} holds {len(values)} different values in the code")
            continue
        if field_name not in params:
            problems.append(f"immutable {name} has no counterpart in params()")
            continue
        value = _as_param(values.pop(), params[field_name])
        held[field_name] = value
        if _norm(value) != _norm(params[field_name]):
            problems.append(f"immutable {name}: params() reports {params[field_name]!r}, the code holds {value!r}")
    # a ledger without a deploy-block immutable (PipelinedLedger) is looked for at params' deploy block
    return problems or _deployment_differences(ledger, artifact, {"deploy_block": params["deploy_block"]} | held)


def _deployment_differences(ledger: VerifiedLedger, artifact: dict[str, Any], held: dict[str, Any]) -> list[str]:
    """The constructor arguments of the transaction that created the ledger against what its code holds."""
    from eth_abi import decode

    w3, address = ledger.w3, ledger.address
    block = w3.eth.get_block(int(held.get("deploy_block", 0)), full_transactions=True)
    creation = bytes.fromhex(artifact["bytecode"].removeprefix("0x"))
    for tx in block["transactions"]:
        if isinstance(tx, bytes) or tx.get("to"):  # a creation has no recipient (None or empty)
            continue
        created = w3.eth.get_transaction_receipt(tx["hash"]).get("contractAddress")
        if created is None or str(created).lower() != address.lower():
            continue
        raw: Any = tx.get("input", tx.get("data", b""))  # eth-tester names it data
        data = bytes.fromhex(raw.removeprefix("0x")) if isinstance(raw, str) else bytes(raw)
        if not data.startswith(creation):
            return ["the deployment transaction did not run the artifact's creation code"]
        inputs = next(item["inputs"] for item in artifact["abi"] if item["type"] == "constructor")
        args = decode([abi_type(i) for i in inputs], data[len(creation) :])
        wanted = _named_args(inputs, args)
        wanted["allowlist_enabled"] = len(wanted.pop("allowlist", ())) > 0
        wanted["deployer"] = tx["from"]
        if wanted.get("max_samples") == 0:  # the contract stores 0 as "no cap below uint32's maximum"
            wanted["max_samples"] = 2**32 - 1
        diffs = []
        for key, value in wanted.items():
            if key in held and _norm(held[key]) != _norm(value):
                diffs.append(f"{key}: the deployment set {value!r}, the code holds {held[key]!r}")
        return diffs
    return [f"no transaction in block {held.get('deploy_block')} created the ledger {address}"]


def _named_args(inputs: list[dict[str, Any]], values: Any) -> dict[str, Any]:
    """Decoded constructor arguments by snake_case name, the fields of a struct argument flattened."""
    named: dict[str, Any] = {}
    for item, value in zip(inputs, values):
        if item["type"] == "tuple":
            named.update(_named_args(item["components"], value))
        else:
            named[_snake(item["name"])] = value
    return named


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.lstrip("_")).lower()


def _as_param(word: bytes, like: object) -> object:
    """An immutable's 32-byte word read as the type params() reports it in."""
    if isinstance(like, bool):
        return int.from_bytes(word, "big") != 0
    if isinstance(like, (bytes, bytearray)):
        return bytes(word[-len(like) :]) if like else bytes(word)
    if isinstance(like, str):  # an address
        return "0x" + word[-20:].hex()
    return int.from_bytes(word, "big")


def _norm(value: object) -> object:
    return value.lower() if isinstance(value, str) else bytes(value) if isinstance(value, (bytes, bytearray)) else value


def _finalizing_bitmap(ledger: VerifiedLedger, r: int, digest: bytes, n: int) -> bytes | None:
    counts: dict[tuple[bytes, bytes], int] = {}
    for a in ledger.attestations(r):
        key = (bytes(a.aggregate_digest), bytes(a.included))
        counts[key] = counts.get(key, 0) + 1
    for (d, bm), count in counts.items():
        if d == digest and 2 * count > n:
            return bm
    return None


# ------------------------------------------------------------------ secure aggregation


@dataclass(frozen=True)
class SecureRoundCheck:
    """A secure round recomputed from the chain's digests and an archive of its frames: the sum
    (mod 2^bits) of the survivors' residues, who is in it, and every member named (by address)
    with what of its own did not fit; `failure` says why the sum could not be recomputed."""

    round: int
    total: Any  # the unmasked sum as `unmask.verify_round` gives it, None on failure
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    faults: dict[str, str]
    failure: str | None


def _members(members: RoundMembers, indices: list[int]) -> str:
    return ", ".join(f"member {i} ({members.addresses[i]})" for i in indices)


def verify_secure_round(
    ledger: LedgerClient, round: int, archive: RangedBlobSource, *, bits: int, dim: int, counted_members: int
) -> SecureRoundCheck:
    """The members and each step's set from the chain (`node.chain.secure_steps`, as the members
    read them), every frame fetched from `archive` and checked against its digest, the COMPLAINT
    frames from the chain itself, then `unmask.verify_round`, the function members unmask with
    (it settles the complaints with `complaints.settle`, as the members do: a dealer a complaint
    holds against, and a false complainer, are named). A frame the archive lacks or holds
    other bytes for names its sender (left out of that step's set); a blob over its step's bound
    is never read whole. U1, U2 and U3 are the chain's (`secure_steps.agreed`, the members' code);
    an archive lacking a KEYS frame of U1 or a dealing bundle of U2 is a `failure` ("archive
    incomplete") naming that sender only: the members all held it (one that lacked one fetched it
    from its acknowledgers or sat out), so the sets it leaves are not theirs and no revealer can
    be judged by them. A
    round that cannot be checked (its members make no round, a chain read fails) is a `failure`,
    never an exception."""
    try:
        members = round_members(ledger, round)
        session = round_session(ledger, round)
        setup = round_setup(session, members, bits, dim, counted_members=counted_members)
        at = ledger.block_number()
        steps = chain_steps(ledger, round, members, at=at)
        complaints = chain_complaints(ledger, round, members, at=at)
        sets = {step: agreed(steps, step, setup.threshold) for step in (Step.KEYS, Step.DEALING, Step.MASKED)}
        fetched = fetch_archive(
            steps,
            complaints,
            lambda digest, bound: read_within(archive, digest.hex(), bound),
            bits=bits,
            dim=dim,
            agreed=sets,
        )
    except Exception as exc:
        return SecureRoundCheck(round, None, (), (), {}, _why(exc))
    frames, named = fetched.archive, dict(steps.repeated) | fetched.faults

    def by_address(faults: dict[int, str]) -> dict[str, str]:
        return {members.addresses[i]: reason for i, reason in sorted(faults.items())}

    # every member held every KEYS frame of U1 and dealing bundle of U2 (one lacking one sat out):
    # without one, U1 or U2 here is not the members', and the revealers' openings cannot be judged
    lacking = sorted(fetched.unfetched[Step.KEYS] | fetched.unfetched[Step.DEALING])
    if lacking:
        return SecureRoundCheck(
            round,
            None,
            (),
            (),
            by_address({i: named[i] for i in lacking}),
            f"archive incomplete: no blob matching the KEYS or DEALING digest on chain of {_members(members, lacking)}"
            " (in U1 or U2: t members held it)",
        )

    try:
        result = verify_round(setup, frames, sets[Step.MASKED])
    except RoundFailed as exc:
        return SecureRoundCheck(round, None, (), (), by_address(named | dict(exc.faults)), str(exc))
    return SecureRoundCheck(
        round,
        result.total,
        tuple(members.addresses[i] for i in result.survivors),
        tuple(members.addresses[i] for i in result.dropped),
        by_address(named | dict(result.faults)),
        None,
    )
