"""`swarm verify`: re-check every round of a swarm from the chain and an archive of blobs,
trusting no peer.

For every round: each committed blob matches its on-chain digest; the aggregate recomputed
from the included blobs (ledger order, the finalizing bitmap) matches the finalized digest;
each commit names the swarm's privacy policy (from the genesis blob, whose digest is on chain) and
records at least what that policy spends after the peer's commits so far: the local mechanism's
whole-update eps and, with DP-SGD, the record-level eps composed over the committed sample counts
(one-sided: recording more is allowed, less is a failure); no finalized aggregate includes a
commit that breaks the policy; each decodable
update is a possible output of the committed mechanism where its output has a checkable shape
(`Mechanism.release_violation`: Duchi, LDP-FL and low-eps HM in their two-point sets, PM, HM and
the exponential mechanism within their range, sampling with at most k non-zeros). Whether the
noise was really drawn (Gaussian, Laplace, PNPM magnitudes, a value inside PM's range) cannot be
checked from the release: it rests on each peer's own software. The genesis blob anchors the
shared settings (model, aggregation rule): its digest is on chain.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch

import mechanisms
from mechanisms.accounting import cumulative_spend
from mechanisms.record_level import record_level_spend
from node.chain.client import LedgerClient
from node.protocol import policy, wire
from node.protocol.blob import BlobError, decode_blob, sha256
from node.protocol.settings import SharedSettings
from node.protocol.wire import decode_bitmap, eps_from_micro


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
    eps_ok: int = 0  # commits that name the policy and record at least what it spends
    releases_ok: int = 0  # decoded blobs whose values the committed mechanism could have output


@dataclass
class VerifyReport:
    ledger: str
    rounds: list[RoundCheck] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    peers: dict[str, dict] = field(default_factory=dict)

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
        }


class BlobSource(Protocol):
    """Where verify reads blobs: an archive folder's store, or any store with `get`."""

    def get(self, digest: str) -> bytes | None: ...


def verify(ledger: LedgerClient, archive: BlobSource) -> VerifyReport:
    """`ledger`: a read-only LedgerClient; `archive`: a blob store holding the run's blobs."""

    report = VerifyReport(ledger=ledger.address)
    params = ledger.params()
    genesis_digest = bytes(params.genesis_digest)
    genesis = archive.get(genesis_digest.hex())
    if genesis is None or sha256(genesis) != genesis_digest:
        report.failures.append(
            Failure(
                0,
                "-",
                "genesis",
                f"genesis blob {genesis_digest.hex()} missing from the archive or not matching the ledger's digest",
            )
        )
        return report

    tensors, meta = decode_blob(genesis, max_size=1 << 31, expected=None)
    shared = SharedSettings.from_dict(json.loads(meta["swarm"]))
    num_params = tensors[wire.VECTOR].numel()
    global_vector = tensors[wire.VECTOR].to(torch.float32)
    privacy = shared.privacy
    try:
        committed: mechanisms.Mechanism | None = mechanisms.from_params(dict(privacy.mechanism))
    except (ValueError, KeyError, TypeError) as exc:
        report.failures.append(Failure(0, "-", "genesis", f"the genesis privacy policy builds no mechanism: {exc}"))
        return report
    counts_by_peer: dict[str, list[int]] = {}
    last_eps: dict[str, tuple[int, int]] = {}

    for r in range(1, ledger.current_round() + 1):
        info = ledger.round_info(r)
        check = RoundCheck(round=r, state=info.state.name.lower())
        report.rounds.append(check)
        commitments = ledger.commitments(r)
        check.participants = len(commitments)
        vectors: list[torch.Tensor | None] = []
        breaks_policy: list[bool] = []
        for c in commitments:
            peer = c.peer
            counts = counts_by_peer.setdefault(peer, [])
            counts.append(int(c.num_samples))
            last_eps[peer] = (int(c.eps_micro), int(c.record_eps_micro))
            data = archive.get(bytes(c.digest).hex())
            vector = None
            if data is None:
                detail = "blob missing from the archive"
            elif sha256(data) != bytes(c.digest):
                detail = (
                    f"archived blob altered: its bytes hash to {sha256(data).hex()[:16]}..., not the committed digest"
                )
            else:
                try:
                    vector, _ = wire.read_vector(data, num_params, kind="update")
                    check.blobs_ok += 1
                    detail = ""
                except BlobError as exc:
                    detail = f"blob matches its digest but is malformed: {exc}"
            vectors.append(vector)
            if data is not None and sha256(data) != bytes(c.digest):  # tampered archive: fails whatever the bitmap
                report.failures.append(Failure(r, peer, "blob", detail))
            # the policy: its mechanism, and at least what its commits so far spend (one-sided)
            broken = policy.commit_violation(
                privacy, num_params, c.mechanism, int(c.eps_micro), int(c.record_eps_micro), counts, one_sided=True
            )
            breaks_policy.append(broken is not None)
            if broken is None:
                check.eps_ok += 1
            else:
                report.failures.append(Failure(r, peer, broken[0], broken[1]))
            spend = cumulative_spend(dict(privacy.mechanism), num_params, len(counts))
            entry = report.peers.setdefault(peer, {})
            entry.update(protects=spend.protects, delta=spend.delta)
            if privacy.dp_sgd is not None:
                record = record_level_spend(privacy.dp_sgd, counts)
                entry.update(record_protects=record.protects, record_delta=record.delta)
            if vector is not None and committed is not None:
                violation = committed.release_violation(vector)
                if violation is None:
                    check.releases_ok += 1
                else:
                    detail = f"not a possible output of the committed {committed!r}: {violation}"
                    report.failures.append(Failure(r, peer, "release", detail))

        if info.state.name != "FINALIZED":
            continue
        finalized = info.finalized_digest  # set for every finalized round (RoundInfo)
        if finalized is None:
            report.failures.append(Failure(r, "-", "aggregate", "finalized round without a finalized digest"))
            check.aggregate_ok = False
            continue
        bitmap = _finalizing_bitmap(ledger, r, finalized, len(commitments))
        if bitmap is None:
            report.failures.append(
                Failure(r, "-", "attestation", "no majority attestation found for the finalized digest")
            )
            check.aggregate_ok = False
            continue
        included = decode_bitmap(bitmap, len(commitments))
        check.included = sum(included)
        for c, inc, against_policy in zip(commitments, included, breaks_policy):
            if inc and against_policy:
                report.failures.append(
                    Failure(r, c.peer, "aggregate", "the finalized aggregate includes a commit that breaks the policy")
                )
        unusable = [c.peer for c, inc, v in zip(commitments, included, vectors) if inc and v is None]
        for peer in unusable:
            report.failures.append(
                Failure(
                    r,
                    peer,
                    "blob",
                    "included in the finalized aggregate but missing or "
                    "invalid in the archive: the aggregate cannot be recomputed",
                )
            )
        if unusable:
            check.aggregate_ok = False
            continue
        recomputed = wire.next_global(
            shared,
            global_vector,
            [v for v, inc in zip(vectors, included) if inc and v is not None],  # none missing: checked above
            [int(c.num_samples) for c, inc in zip(commitments, included) if inc],
        )
        digest = sha256(wire.model_blob(recomputed, r))
        check.aggregate_ok = digest == finalized
        if not check.aggregate_ok:
            report.failures.append(
                Failure(
                    r,
                    "-",
                    "aggregate",
                    f"recomputed aggregate {digest.hex()[:16]}... differs "
                    f"from the finalized digest {finalized.hex()[:16]}...",
                )
            )
        global_vector = recomputed

    for peer, (eps_micro, record_micro) in last_eps.items():
        on_chain = int(ledger.eps_spent(peer))
        record_on_chain = int(ledger.record_eps_spent(peer))
        entry = report.peers.setdefault(peer, {})
        entry.update(eps_spent=eps_from_micro(on_chain), commits=len(counts_by_peer[peer]))
        if privacy.dp_sgd is not None:
            entry.update(record_eps_spent=eps_from_micro(record_on_chain))
        if (on_chain, record_on_chain) != (eps_micro, record_micro):
            report.failures.append(
                Failure(
                    0,
                    peer,
                    "eps",
                    f"epsSpent {on_chain} / recordEpsSpent {record_on_chain} differ from the last commitment "
                    f"{eps_micro} / {record_micro}",
                )
            )
    return report


def _finalizing_bitmap(ledger: LedgerClient, r: int, digest: bytes, n: int) -> bytes | None:
    counts: dict[tuple[bytes, bytes], int] = {}
    for a in ledger.attestations(r):
        key = (bytes(a.aggregate_digest), bytes(a.included))
        counts[key] = counts.get(key, 0) + 1
    for (d, bm), count in counts.items():
        if d == digest and 2 * count > n:
            return bm
    return None
