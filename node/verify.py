"""`swarm verify`: re-check every round of a swarm from the chain and an archive of blobs,
trusting no peer.

For every round: each committed blob matches its on-chain digest; the aggregate recomputed
from the included blobs (ledger order, the finalizing bitmap) matches the finalized digest;
each commit names the swarm's privacy policy (from the genesis blob, whose digest is on chain) and
records at least what that policy spends after the peer's commits so far: the local mechanism's
whole-update eps and, with DP-SGD, the record-level eps composed over the committed sample counts
(one-sided: recording more is allowed, less is a failure); each committed blob decodes (a
malformed one is named: check "blob"); each decodable update is a possible output of the policy's
mechanism where its output has a checkable shape (`wire.check_release`, the peers' own rule:
`Mechanism.release_violation`: Duchi, LDP-FL and low-eps HM in their two-point sets, PM, HM and
the exponential mechanism within their range, Laplace and the Gaussian within their bound,
sampling with at most k non-zeros). Whether the
noise was really drawn (Gaussian, Laplace, PNPM magnitudes, a value inside PM's range) cannot be
checked from the release: it rests on each peer's own software. The genesis blob anchors the
shared settings (model, aggregation rule): its digest is on chain. Each participant's registration
must be signed by the key of the peer id it names and be that peer id's first such registration
(check "registration", node.chain.registration).

No finalized aggregate may include a commit that honest peers leave out (check "aggregate", and
`aggregate_ok` false even when the recomputed digest matches): one that breaks the policy, comes
from an account whose registration does not verify, or releases what the mechanism cannot output.
A malformed or missing included blob fails the recomputation itself. Every exception inside a
check is a named failure of its round (and of its committer, where there is one), never the end
of verification.

The ledger opens the next round as soon as one ends, so a finished swarm leaves a last round that
is open with no commitment: it is reported as `not_started`, not as a round (nothing to check).
The archive may be several folders (`ArchiveStores`): every peer's blob store, for example.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

import mechanisms
from mechanisms.accounting import cumulative_spend
from mechanisms.record_level import record_level_spend
from node.chain.client import LedgerClient, load_artifact
from node.chain.records import Commitment, RoundInfo
from node.chain.registration import Registration, registration_problem
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


class BlobSource(Protocol):
    """Where verify reads blobs: an archive folder's store, or any store with `get`."""

    def get(self, digest: str) -> bytes | None: ...


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


def verify(ledger: LedgerClient, archive: BlobSource) -> VerifyReport:
    """`ledger`: a read-only LedgerClient; `archive`: a blob store holding the run's blobs.
    Whatever goes wrong inside a check is a named failure of the report, never an exception."""

    report = VerifyReport(ledger=ledger.address)
    try:
        report.failures.extend(check_code(ledger))
    except Exception as exc:
        report.failures.append(Failure(0, "-", "code", f"the deployed code could not be checked: {_why(exc)}"))
    try:
        _verify_rounds(ledger, archive, report)
    except Exception as exc:  # outside any one round: genesis, parameters, the final eps totals
        report.failures.append(Failure(0, "-", "verify", f"verification stopped: {_why(exc)}"))
    return report


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _verify_rounds(ledger: LedgerClient, archive: BlobSource, report: VerifyReport) -> None:
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
        return
    try:
        tensors, meta = decode_blob(genesis, max_size=1 << 31, expected=None)
        shared = SharedSettings.from_dict(json.loads(meta["swarm"]))
    except Exception as exc:
        report.failures.append(Failure(0, "-", "genesis", f"the genesis blob is unreadable: {_why(exc)}"))
        return
    num_params = tensors[wire.VECTOR].numel()
    genesis_vector = tensors[wire.VECTOR].to(torch.float32)
    privacy = shared.privacy
    try:
        committed: mechanisms.Mechanism | None = mechanisms.from_params(dict(privacy.mechanism))
    except (ValueError, KeyError, TypeError) as exc:
        report.failures.append(Failure(0, "-", "genesis", f"the genesis privacy policy builds no mechanism: {exc}"))
        return
    counts_by_peer: dict[str, list[int]] = {}
    last_eps: dict[str, tuple[int, int]] = {}
    registrations: list[Registration] | None = None  # read once, at the first commitment
    unregistered: set[str] = set()  # committers whose registration does not verify: peers leave them out

    def check_registration(r: int, peer: str) -> bool:
        """A participant's registration must bind it to its peer id: signed by the peer id's key,
        and the first such registration of that peer id (node.chain.registration). False (and a
        failure "registration") when it does not."""
        nonlocal registrations
        try:
            if registrations is None:
                registrations = ledger.registrations()
            problem = registration_problem(peer, registrations, ledger.chain_id(), ledger.address)
        except Exception as exc:
            problem = f"the registration could not be checked: {_why(exc)}"
        if problem is not None:
            report.failures.append(Failure(r, peer, "registration", problem))
        return problem is None

    def check_commit(r: int, c: Commitment, check: RoundCheck) -> tuple[torch.Tensor | None, list[str]]:
        """One commitment of round r: its blob, registration, policy and release. Returns its
        decoded update (None if unusable) and why honest peers leave it out (node/peer/peer.py
        `_vet`, node/peer/agree.py): each reason is also a failure naming the committer here."""
        peer = c.peer
        refused: list[str] = []
        if peer not in counts_by_peer and not check_registration(r, peer):  # its first commitment: who is it?
            unregistered.add(peer)
        if peer in unregistered:
            refused.append("comes from an account whose registration does not verify")
        counts = counts_by_peer.setdefault(peer, [])
        counts.append(int(c.num_samples))
        last_eps[peer] = (int(c.eps_micro), int(c.record_eps_micro))
        digest = bytes(c.digest)
        vector, data = None, None
        try:
            data = archive.get(digest.hex())
        except Exception as exc:  # the archive's own trouble: this blob is unusable, the rest goes on
            report.failures.append(Failure(r, peer, "blob", f"the archive could not read the blob: {_why(exc)}"))
        if data is not None and sha256(data) != digest:  # tampered archive: fails whatever the bitmap
            detail = f"archived blob altered: its bytes hash to {sha256(data).hex()[:16]}..., not the committed digest"
            report.failures.append(Failure(r, peer, "blob", detail))
        elif data is not None:
            try:
                vector, _ = wire.read_vector(data, num_params, kind="update")
                check.blobs_ok += 1
            except BlobError as exc:  # committed, so published: every peer left it out as malformed
                detail = f"round {r}: blob {digest.hex()[:16]} of {peer} matches its digest but is malformed: {exc}"
                report.failures.append(Failure(r, peer, "blob", detail))
        # the policy: its mechanism, and at least what its commits so far spend (one-sided)
        try:
            broken = policy.commit_violation(
                privacy, num_params, c.mechanism, int(c.eps_micro), int(c.record_eps_micro), counts, one_sided=True
            )
        except Exception as exc:  # peers leave out a commit whose check raises (peer.py _policy_violation)
            broken = ("policy", f"the commit could not be checked against the policy: {_why(exc)}")
        if broken is None:
            check.eps_ok += 1
        else:
            report.failures.append(Failure(r, peer, broken[0], broken[1]))
            refused.append("breaks the policy")
        # the one release rule of the peers (wire.check_release): a possible output of the policy's mechanism
        if vector is not None:
            try:
                wire.check_release(vector, committed)
                check.releases_ok += 1
            except BlobError as exc:
                report.failures.append(Failure(r, peer, "release", str(exc)))
                refused.append("is not a possible output of the swarm's mechanism")
            except Exception as exc:
                detail = f"the release could not be checked: {_why(exc)}"
                report.failures.append(Failure(r, peer, "release", detail))
                refused.append("could not be checked as a release")
        try:
            spend = cumulative_spend(dict(privacy.mechanism), num_params, len(counts))
            entry = report.peers.setdefault(peer, {})
            entry.update(protects=spend.protects, delta=spend.delta)
            if privacy.dp_sgd is not None:
                record = record_level_spend(privacy.dp_sgd, counts)
                entry.update(record_protects=record.protects, record_delta=record.delta)
        except Exception as exc:
            report.failures.append(Failure(r, peer, "eps", f"the spend could not be computed: {_why(exc)}"))
        return vector, refused

    def check_round(r: int, info: RoundInfo, check: RoundCheck, previous: torch.Tensor) -> torch.Tensor | None:
        """Round r's checks; the model recomputed from its included blobs if it finalized, else None."""
        commitments = ledger.commitments(r)
        check.participants = len(commitments)
        vectors: list[torch.Tensor | None] = []
        refusals: list[list[str]] = []
        for c in commitments:
            try:
                vector, refused = check_commit(r, c, check)
            except Exception as exc:  # whatever else a hostile chain or archive makes a check raise
                report.failures.append(Failure(r, c.peer, "commit", f"the commit could not be checked: {_why(exc)}"))
                vector, refused = None, []
            vectors.append(vector)
            refusals.append(refused)

        if info.state.name != "FINALIZED":
            return None
        finalized = info.finalized_digest  # set for every finalized round (RoundInfo)
        if finalized is None:
            report.failures.append(Failure(r, "-", "aggregate", "finalized round without a finalized digest"))
            check.aggregate_ok = False
            return None
        bitmap = _finalizing_bitmap(ledger, r, finalized, len(commitments))
        if bitmap is None:
            report.failures.append(
                Failure(r, "-", "attestation", "no majority attestation found for the finalized digest")
            )
            check.aggregate_ok = False
            return None
        included = decode_bitmap(bitmap, len(commitments))
        check.included = sum(included)
        # what honest peers leave out, included anyway: the majority did not follow the peers' rules
        dishonest = False
        for c, inc, refused in zip(commitments, included, refusals):
            if inc and refused:
                dishonest = True
                detail = (
                    f"the finalized aggregate includes a commit that {' and '.join(refused)}: honest peers leave it out"
                )
                report.failures.append(Failure(r, c.peer, "aggregate", detail))
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
            return None
        recomputed = wire.next_global(
            shared,
            previous,
            [v for v, inc in zip(vectors, included) if inc and v is not None],  # none missing: checked above
            [int(c.num_samples) for c, inc in zip(commitments, included) if inc],
        )
        digest = sha256(wire.model_blob(recomputed, r))
        if digest == finalized:
            # the chain's model, so the next round starts from it, whether or not it was honest
            check.aggregate_ok = not dishonest
            return recomputed
        check.aggregate_ok = False
        report.failures.append(
            Failure(
                r,
                "-",
                "aggregate",
                f"recomputed aggregate {digest.hex()[:16]}... differs "
                f"from the finalized digest {finalized.hex()[:16]}...",
            )
        )
        return None

    global_vector: torch.Tensor | None = genesis_vector
    current = ledger.current_round()
    for r in range(1, current + 1):
        check = RoundCheck(round=r, state="unknown")
        try:
            info = ledger.round_info(r)
        except Exception as exc:
            report.rounds.append(check)
            report.failures.append(Failure(r, "-", "round", f"the round could not be read: {_why(exc)}"))
            global_vector = None
            continue
        if r == current and info.state.name == "OPEN" and info.participant_count == 0:
            report.not_started = r  # opened when the previous round ended; nobody committed (yet)
            continue
        report.rounds.append(check)
        check.state = info.state.name.lower()
        recomputed = None
        if global_vector is None:
            if info.state.name == "FINALIZED":
                check.aggregate_ok = False
                report.failures.append(
                    Failure(r, "-", "aggregate", "not recomputed: the previous finalized model is not known")
                )
        else:
            try:
                recomputed = check_round(r, info, check, global_vector)
            except Exception as exc:  # whatever a hostile chain or archive makes a check raise
                check.aggregate_ok = False if info.state.name == "FINALIZED" else check.aggregate_ok
                report.failures.append(Failure(r, "-", "round", f"the round could not be checked: {_why(exc)}"))
        if info.state.name == "FINALIZED":
            try:
                global_vector = _next_model(archive, report, r, info.finalized_digest, recomputed, num_params)
            except Exception as exc:  # the archive's own trouble reading the model: go on from ours
                detail = f"the finalized model could not be read from the archive: {_why(exc)}"
                report.failures.append(Failure(r, "-", "aggregate-blob", detail))
                global_vector = recomputed

    for peer, (eps_micro, record_micro) in last_eps.items():
        try:
            on_chain = int(ledger.eps_spent(peer))
            record_on_chain = int(ledger.record_eps_spent(peer))
        except Exception as exc:  # one peer's totals unreadable: named, the others are still checked
            report.failures.append(Failure(0, peer, "eps", f"the eps totals could not be read: {_why(exc)}"))
            continue
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


def _next_model(
    archive: BlobSource,
    report: VerifyReport,
    r: int,
    finalized: bytes | None,
    recomputed: torch.Tensor | None,
    num_params: int,
) -> torch.Tensor | None:
    """The model the round after finalized round r starts from. The archived model blob is checked
    against the finalized digest (check "aggregate-blob"); when round r could not be recomputed,
    verification goes on from that archived model (digest checked), else from nothing (None)."""
    if finalized is None:
        return recomputed
    data = archive.get(finalized.hex())
    if data is None:
        report.failures.append(
            Failure(r, "-", "aggregate-blob", f"finalized model {finalized.hex()} not in the archive")
        )
        return recomputed
    if sha256(data) != finalized:
        report.failures.append(
            Failure(
                r,
                "-",
                "aggregate-blob",
                f"archived model altered: its bytes hash to {sha256(data).hex()[:16]}..., "
                f"not the finalized digest {finalized.hex()[:16]}...",
            )
        )
        return recomputed
    try:
        vector, meta = wire.read_vector(data, num_params, kind="model")
    except BlobError as exc:
        report.failures.append(Failure(r, "-", "aggregate-blob", f"finalized model blob unreadable: {exc}"))
        return recomputed
    if meta.get("round") != str(r):
        report.failures.append(
            Failure(r, "-", "aggregate-blob", f"finalized model blob names round {meta.get('round')!r}, not {r}")
        )
    return recomputed if recomputed is not None else vector.to(torch.float32)


# ------------------------------------------------------------------ the deployed code


def check_code(ledger: LedgerClient) -> list[Failure]:
    """The runtime code at the ledger address is the artifact's deployedBytecode, up to the
    immutables (masked out at the artifact's `immutableReferences`); each immutable holds one value
    across its uses, the value `params()` reports; and the deployment transaction (at params'
    deploy block, from its deployer) ran the artifact's creation code with constructor arguments
    that are those values. A chain or state file whose code (or an immutable) was patched fails
    with check "code"."""
    artifact = load_artifact()
    references: dict[str, list[dict[str, int]]] = artifact.get("immutableReferences", {})
    expected = bytes.fromhex(artifact["deployedBytecode"].removeprefix("0x"))
    code = bytes(ledger.w3.eth.get_code(ledger.address))
    fail = [Failure(0, "-", "code", detail) for detail in _code_differences(code, expected, references)]
    if fail:
        return fail
    params = asdict(ledger.params())
    held: dict[str, Any] = {}
    for name, refs in references.items():
        values = {code[ref["start"] : ref["start"] + ref["length"]] for ref in refs}
        field_name = _snake(name)
        if len(values) != 1:
            fail.append(Failure(0, "-", "code", f"immutable {name} holds {len(values)} different values in the code"))
            continue
        word = values.pop()
        if field_name not in params:
            fail.append(Failure(0, "-", "code", f"immutable {name} has no counterpart in params()"))
            continue
        value = _as_param(word, params[field_name])
        held[field_name] = value
        if _norm(value) != _norm(params[field_name]):
            fail.append(
                Failure(
                    0,
                    "-",
                    "code",
                    f"immutable {name}: params() reports {params[field_name]!r}, the code holds {value!r}",
                )
            )
    if not fail:
        fail += [Failure(0, "-", "code", d) for d in _deployment_differences(ledger, artifact, held)]
    return fail


def _code_differences(code: bytes, expected: bytes, references: dict[str, list[dict[str, int]]]) -> list[str]:
    if not references:
        return ["the contract artifact records no immutableReferences: run python scripts/compile_contracts.py"]
    if len(code) != len(expected):
        return [f"the code at the ledger address is {len(code)} bytes, the artifact's {len(expected)}"]
    masked, reference = bytearray(code), bytearray(expected)
    for refs in references.values():
        for ref in refs:
            masked[ref["start"] : ref["start"] + ref["length"]] = bytes(ref["length"])
            reference[ref["start"] : ref["start"] + ref["length"]] = bytes(ref["length"])
    if masked != reference:
        first = next(i for i, (a, b) in enumerate(zip(masked, reference)) if a != b)
        return [f"the code at the ledger address differs from the artifact's deployedBytecode (first at byte {first})"]
    return []


def _deployment_differences(ledger: LedgerClient, artifact: dict[str, Any], held: dict[str, Any]) -> list[str]:
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
        args = decode([_abi_type(i) for i in inputs], data[len(creation) :])
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


def _abi_type(item: dict[str, Any]) -> str:
    """An ABI input's canonical type, tuples (structs) spelled out."""
    if item["type"].startswith("tuple"):
        return "(" + ",".join(_abi_type(c) for c in item["components"]) + ")" + item["type"][len("tuple") :]
    return str(item["type"])


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


def _finalizing_bitmap(ledger: LedgerClient, r: int, digest: bytes, n: int) -> bytes | None:
    counts: dict[tuple[bytes, bytes], int] = {}
    for a in ledger.attestations(r):
        key = (bytes(a.aggregate_digest), bytes(a.included))
        counts[key] = counts.get(key, 0) + 1
    for (d, bm), count in counts.items():
        if d == digest and 2 * count > n:
            return bm
    return None
