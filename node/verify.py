"""`swarm verify`: re-check every round of a swarm from the chain and an archive of blobs,
trusting no peer.

For every round: each committed blob matches its on-chain digest; the aggregate recomputed
from the included blobs (ledger order, the finalizing bitmap) matches the finalized digest;
each peer's recorded eps follows from the mechanism parameters it committed; each decodable
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
from node.chain.client import LedgerClient
from node.protocol import wire
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
    eps_ok: int = 0
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
    commits_by_peer: dict[str, int] = {}
    last_eps: dict[str, int] = {}

    for r in range(1, ledger.current_round() + 1):
        info = ledger.round_info(r)
        check = RoundCheck(round=r, state=info.state.name.lower())
        report.rounds.append(check)
        commitments = ledger.commitments(r)
        check.participants = len(commitments)
        vectors: list[torch.Tensor | None] = []
        for c in commitments:
            peer = c.peer
            commits_by_peer[peer] = commits_by_peer.get(peer, 0) + 1
            last_eps[peer] = int(c.eps_micro)
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
            # eps: the k-th commit of this peer must record cumulative_spend(params, d, k)
            committed: mechanisms.Mechanism | None = None
            try:
                mech = json.loads(bytes(c.mechanism).decode())
                committed = mechanisms.from_params(mech)
                spend = cumulative_spend(mech, num_params, commits_by_peer[peer])
                expected = wire.eps_to_micro(spend.epsilon)
                # one micro-eps of slack: the last float digit of a spend may differ across math libraries
                if abs(expected - int(c.eps_micro)) > 1:
                    report.failures.append(
                        Failure(
                            r,
                            peer,
                            "eps",
                            f"ledger records {eps_from_micro(int(c.eps_micro)):.6f}, the "
                            f"committed mechanism {mech} gives {eps_from_micro(expected):.6f}",
                        )
                    )
                else:
                    check.eps_ok += 1
                report.peers.setdefault(peer, {}).update(protects=spend.protects, delta=spend.delta)
            except (ValueError, KeyError, TypeError) as exc:
                report.failures.append(Failure(r, peer, "eps", f"committed mechanism parameters unusable: {exc}"))
            if vector is not None and committed is not None:  # unusable parameters: already an eps failure
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

    for peer, eps_micro in last_eps.items():
        on_chain = int(ledger.eps_spent(peer))
        entry = report.peers.setdefault(peer, {})
        entry.update(eps_spent=eps_from_micro(on_chain), commits=commits_by_peer[peer])
        if on_chain != eps_micro:
            report.failures.append(
                Failure(0, peer, "eps", f"epsSpent {on_chain} differs from the last commitment {eps_micro}")
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
