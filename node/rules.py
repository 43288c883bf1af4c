"""The rulebook: every rule that decides whether a commit counts. Every peer (node/peer/vetting.py)
and `swarm verify` (node/verify.py) apply these and nothing else, so they reach the same verdict on
every commit. Each rule is a pure function of chain data and blob bytes and answers with a
`Verdict` (the check's name and why) or None.

The rules, in the order a commit meets them; its verdict is the first one it breaks:
1. "registration": its committer owns the peer id it registered, i.e. holds the first registration
   of that peer id, in chain order, signed by the peer id's own key (`PeerIdOwners`).
2. "samples": its numSamples, the weight FedAvg gives it and the record count its record-level
   eps is computed for, is 1 to the swarm's cap: the smaller of the genesis's max_samples and the
   ledger's maxSamples (the contract refuses past its own).
3. "mechanism", "eps", "record-eps": it names the swarm's privacy policy (in the genesis) and
   records exactly what that policy charges after the committer's commits so far, neither less nor
   more (`policy.privacy_spend`); "policy" when the check itself raises.
Rules 1 to 3 read the chain only: a peer applies them before fetching anything and leaves a commit
that breaks one out unfetched. The rest hold the blob, once its bytes match the committed digest:
4. "blob": it decodes as an update of the swarm's model (`wire.read_vector`: one float32 vector of
   the model's size, values inside the exact aggregation's bound).
5. "binding": it names the round and the committer of its commit. Both are inside the blob, so in
   its digest: a blob replayed from an earlier round, or copied from another committer (a pending
   commit's digest included), breaks it.
6. "release": it is a possible output of the swarm's mechanism (`release.check_release`).
On a PipelinedLedger (docs/LEDGER.md "One transaction per round") one more, from the chain:
"base": a commit of round r names, as the model it trained from (its vote digest), round r - 1's
finalized digest, when r - 1 finalized (`base_verdict`); its vote lost otherwise, and the update
with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch

from node.chain.records import Commitment
from node.chain.registration import Registration, resolve, signature_verifies
from node.protocol import policy, release, wire
from node.protocol.blob import BlobError
from node.protocol.settings import PrivacyPolicy, SharedSettings


class Verdict(NamedTuple):
    """Why a commit does not count: the broken rule's check name and the reason."""

    check: str
    reason: str


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------ rule 1: who owns a peer id


class PeerIdOwners:
    """Who owns each peer id: the first registration of it, in chain order, whose signature by the
    peer id's key verifies (`registration.resolve`, the primitive). Fed in chain order, all at once
    (`swarm verify`) or block range by block range (the peer's registry)."""

    def __init__(self, chain_id: int, ledger: str) -> None:
        self.chain_id = chain_id
        self.ledger = ledger
        self.owners: dict[bytes, Registration] = {}  # peer id -> the registration that owns it
        self._registered: dict[str, Registration] = {}  # account (lower case) -> its registration

    def add(self, registrations: Iterable[Registration]) -> list[Registration]:
        """Take the next registrations (chain order); returns those that own nothing: signed by
        another key than their peer id's (a squatter's), or later than the peer id's owner."""
        batch = list(registrations)
        self.owners.update(resolve([r for r in batch if r.peer_id not in self.owners], self.chain_id, self.ledger))
        for reg in batch:
            self._registered.setdefault(reg.address.lower(), reg)  # the contract takes one per account
        return [r for r in batch if self.owners.get(r.peer_id) != r]

    def knows(self, address: str) -> bool:
        return address.lower() in self._registered

    def verdict(self, address: str, peer_id: bytes) -> Verdict | None:
        """Rule 1 for a commit from `address`, whose registered peer id the ledger says is `peer_id`."""
        own = self._registered.get(address.lower())
        if own is None:
            return Verdict("registration", f"{address} has no Registered event")
        named = f"peer id 0x{own.peer_id.hex()}"
        if own.peer_id != bytes(peer_id):
            return Verdict("registration", f"{address} registered {named}, not 0x{bytes(peer_id).hex()}")
        owner = self.owners.get(own.peer_id)
        if owner == own:
            return None
        if owner is None or not signature_verifies(own.peer_id, own.signature, self.chain_id, self.ledger, own.address):
            return Verdict(
                "registration",
                f"{address} does not own {named}: its registration does not verify, it is not signed by the peer "
                "id's key (a peer id registered without its key)",
            )
        return Verdict(
            "registration",
            f"{address} does not own {named}: it resolves to {owner.address}, registered first with a valid signature",
        )


# ------------------------------------------------------------------ rules 2 and 3: the commit


def samples_verdict(num_samples: int, max_samples: int) -> Verdict | None:
    """Rule 2: a commit claims 1 to `max_samples` samples (the swarm's cap, `Rulebook.max_samples`)."""
    if 1 <= num_samples <= max_samples:
        return None
    return Verdict("samples", f"claims {num_samples} samples, outside 1 to the swarm's cap {max_samples}")


def policy_verdict(
    privacy: PrivacyPolicy,
    num_params: int,
    mechanism: bytes,
    eps_micro: int,
    record_eps_micro: int,
    sample_counts: Sequence[int],
) -> Verdict | None:
    """Rule 3: the commit names the policy's mechanism and records exactly what the policy charges
    after one release per entry of `sample_counts` (the committer's counts, this commit's last): a
    pure mechanism's figure to the micro-eps, an accountant's within `policy.tolerance`. More is no
    more acceptable than less: the figure is a record, not a bid."""
    want = wire.canonical(dict(privacy.mechanism))
    if bytes(mechanism) != want.encode():
        shown = bytes(mechanism[:200]).decode("utf-8", "replace")
        return Verdict("mechanism", f"committed mechanism {shown} is not the swarm's policy {want}")
    spent = policy.privacy_spend(privacy, num_params, sample_counts)
    exact = policy.eps_step_micro(dict(privacy.mechanism), num_params) > 0  # multiples of the step: no slack
    for check, what, given, expected, slack in (
        ("eps", "whole-update eps", eps_micro, spent.eps_micro, 0 if exact else policy.tolerance(spent.eps_micro)),
        (
            "record-eps",
            "record-level eps",
            record_eps_micro,
            spent.record_eps_micro,
            policy.tolerance(spent.record_eps_micro) if privacy.dp_sgd else 0,
        ),
    ):
        if abs(given - expected) > slack:
            return Verdict(
                check,
                f"records {what} {wire.eps_from_micro(given):.6f} where the policy spends "
                f"{wire.eps_from_micro(expected):.6f} after {len(sample_counts)} release(s)",
            )
    return None


# ------------------------------------------------------------------ rules 4 to 6: the blob


class BlobRefused(BlobError):
    """An update blob that breaks rule 4, 5 or 6 (a BlobError: every peer leaves it out as it
    leaves out a malformed blob)."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


def binding_verdict(meta: dict[str, str], c: Commitment) -> Verdict | None:
    """Rule 5: the blob names the round and the committer of commit `c`."""
    named_round, named_committer = meta.get("round"), meta.get("committer")
    if named_round != str(c.round) or str(named_committer).lower() != c.peer.lower():
        return Verdict(
            "binding",
            f"the blob names round {named_round!r} and committer {named_committer!r}, but is committed in round "
            f"{c.round} by {c.peer}: a replayed or copied blob",
        )
    return None


def base_verdict(r: int, claim: bytes, base: bytes) -> Verdict | None:
    """The base rule for a commit of round r on a PipelinedLedger whose vote digest is `claim`,
    round r - 1 having finalized `base`."""
    if bytes(claim) == bytes(base):
        return None
    return Verdict(
        "base",
        f"trained from another base: its commit names {bytes(claim).hex()[:16]} as the model it trained from, "
        f"round {r - 1} finalized {bytes(base).hex()[:16]}",
    )


class Rulebook:
    """The rules of one swarm: its genesis settings (the privacy policy, the sample cap, the model's
    size) and its ledger's maxSamples. Raises ValueError when the policy builds no mechanism."""

    def __init__(self, shared: SharedSettings, num_params: int, max_samples: int) -> None:
        self.privacy = shared.privacy
        self.num_params = num_params
        self.max_samples = min(shared.max_samples, max_samples)  # a deployment may be laxer than its genesis
        self.mechanism = release.swarm_mechanism(shared)

    def commit_verdict(self, c: Commitment, sample_counts: Sequence[int]) -> Verdict | None:
        """Rules 2 and 3 for commit `c`, whose committer committed `sample_counts` up to it (its
        own last). Whatever the check raises is a verdict ("policy"): it is a pure function of
        chain data, so it raises alike on every peer and in `swarm verify`."""
        try:
            return samples_verdict(int(c.num_samples), self.max_samples) or policy_verdict(
                self.privacy, self.num_params, c.mechanism, int(c.eps_micro), int(c.record_eps_micro), sample_counts
            )
        except Exception as exc:
            return Verdict("policy", f"the commit could not be checked against the policy: {_why(exc)}")

    def update_verdict(self, data: bytes, c: Commitment) -> tuple[torch.Tensor | None, Verdict | None]:
        """Rules 4 to 6 for the blob of commit `c` (its bytes already match the digest): its vector
        when it decodes (None for a malformed blob), and the verdict."""
        try:
            vector, meta = wire.read_vector(data, self.num_params, kind="update")
        except BlobError as exc:
            return None, Verdict("blob", f"malformed: {exc}")
        verdict = binding_verdict(meta, c)
        if verdict is None:
            try:
                release.check_release(vector, self.mechanism)
            except BlobError as exc:
                verdict = Verdict("release", str(exc))
            except Exception as exc:  # the same bytes raise alike everywhere: refused, not a crash
                verdict = Verdict("release", f"the release could not be checked: {_why(exc)}")
        return vector, verdict

    def read_update(self, data: bytes, c: Commitment) -> torch.Tensor:
        """The vector of commit `c`'s blob if it breaks none of rules 4 to 6; else BlobRefused."""
        vector, verdict = self.update_verdict(data, c)
        if verdict is not None or vector is None:
            raise BlobRefused(verdict or Verdict("blob", "malformed"))
        return vector
