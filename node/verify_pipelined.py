"""`swarm verify` on a pipelined deployment (contracts/PipelinedLedger.sol; docs/LEDGER.md "One
transaction per round").

Today's `Verifier` runs unchanged on a `PipelinedClient`, whose reads give what SwarmLedger's
storage gives: the rounds and their outcomes, each round's commits in participant order (as many as
its RoundClosed counts, else the round cannot be read: check "round") with each mechanism resolved
(an empty one is the member's last named one), and the counted votes as attestations. So every
commit is held to the same rulebook (registration, samples, mechanism, eps, record-eps, blob,
binding, release), each archived blob to its digest, each finalized aggregate recomputed from the
included blobs to the finalized digest (and the archived model to it), and each member's eps total
to its last commit. What this ledger adds, checked here:
- the base rule (`node.rules.base_verdict`): a commit of r trained from another model than r - 1's
  finalized one is left out by honest peers; a finalized aggregate that includes it fails
  (check "aggregate");
- "code": the deployed code is the PipelinedLedger artifact's, its immutables those of the
  constructor arguments of the transaction that created it;
- "finalization": the key (digest, bitmap) that a strict majority of a finalized round's
  participants voted, each counted once (`node.chain.votes.majority` over the votes its client
  counts as the contract does), is the vote of the transaction holding its RoundFinalized event,
  which the round's finalized digest is read from;
- "abort": an aborted round went with its neighbour in one transaction (the voting round with the
  open round trained from it: the cascade), and no key had a majority of the voting round's votes.
Secure aggregation does not run on this ledger: a genesis that names it is a failure "genesis".
"""

from __future__ import annotations

import torch

from node.chain.pipelined import PipelinedClient, load_pipelined_artifact
from node.chain.records import Commitment, RoundInfo, RoundState
from node.chain.votes import majority
from node.rules import Verdict, base_verdict
from node.verify import BlobSource, Commit, RoundCheck, Swarm, Verifier, VerifyReport, code_problems


def verify_pipelined(ledger: PipelinedClient, archive: BlobSource) -> VerifyReport:
    """`node.verify.verify` for a PipelinedLedger: `ledger` a read-only `PipelinedClient`.
    Whatever goes wrong inside a check is a named failure of the report, never an exception."""
    return PipelinedVerifier(ledger, archive).run()


class PipelinedVerifier(Verifier):
    """`Verifier` with the pipelined ledger's code, finalization and abort checks."""

    def __init__(self, ledger: PipelinedClient, archive: BlobSource) -> None:
        super().__init__(ledger, archive)
        self.pipelined = ledger
        self.bases: dict[int, bytes | None] = {}  # round -> its finalized digest (None: it did not finalize)
        self.claims: dict[int, dict[tuple[str, bytes], bytes]] = {}  # round -> (committer, digest) -> its base

    def check_code(self) -> None:
        for detail in code_problems(self.pipelined, load_pipelined_artifact()):
            self.fail(0, "-", "code", detail)

    def read_genesis(self) -> Swarm | None:
        swarm = super().read_genesis()
        if swarm is not None and swarm.secure is not None:
            self.fail(
                0, "-", "genesis", "the genesis names secure aggregation, which the pipelined ledger does not run"
            )
            return None
        return swarm

    def check_commit(self, swarm: Swarm, r: int, commit: Commit, check: RoundCheck) -> None:
        """The rulebook's rules, then the base rule (`rules.base_verdict`). A commit trained from
        another base is no misconduct (its vote lost): it is a failure only where a finalized
        aggregate includes it (check "aggregate", as for any commit honest peers leave out)."""
        super().check_commit(swarm, r, commit, check)
        verdict = self.base_verdict(r, commit.commitment)
        if verdict is not None:
            commit.broken.append(verdict)

    def base_verdict(self, r: int, c: Commitment) -> Verdict | None:
        """None in round 1 and after a round that did not finalize (aborted: r opened from an older
        model), as the peers apply it."""
        if r == 1:
            return None
        if r - 1 not in self.bases:
            info = self.pipelined.round_info(r - 1)
            self.bases[r - 1] = info.finalized_digest if info.state is RoundState.FINALIZED else None
        base = self.bases[r - 1]
        if base is None:
            return None
        if r not in self.claims:
            self.claims[r] = {(v.peer, v.digest): v.vote_digest for v in self.pipelined.voted_commits(r)}
        claim = self.claims[r].get((c.peer, bytes(c.digest)))
        return None if claim is None else base_verdict(r, claim, base)

    def check_round(
        self, swarm: Swarm, info: RoundInfo, check: RoundCheck, previous: torch.Tensor | None
    ) -> torch.Tensor | None:
        model = super().check_round(swarm, info, check, previous)
        try:
            if info.state is RoundState.FINALIZED:
                self.check_finalization(info)
            elif info.state is RoundState.ABORTED:
                self.check_abort(info)
        except Exception as exc:  # whatever a hostile chain makes a read raise
            self.fail(
                info.round, "-", "round", f"the round's outcome could not be checked: {type(exc).__name__}: {exc}"
            )
        return model

    def check_finalization(self, info: RoundInfo) -> None:
        """The majority's key of the counted votes is the finalizing transaction's vote."""
        r, n = info.round, info.participant_count
        winner = majority(self.pipelined.attestations(r), n)
        voted = self.pipelined.finalized(r)
        if winner is None:
            self.fail(r, "-", "finalization", f"finalized on chain, but no key has a strict majority of its {n} votes")
        elif (winner.aggregate_digest, winner.included) != voted or winner.block_number != info.ended_block:
            detail = f"the majority's key ({winner.aggregate_digest.hex()[:16]}..., bitmap {winner.included.hex()}, "
            detail += f"block {winner.block_number}) is not the vote of the transaction holding RoundFinalized "
            detail += f"(block {info.ended_block})"
            self.fail(r, "-", "finalization", detail)

    def check_abort(self, info: RoundInfo) -> None:
        """An abort took the voting round and the open round together, with no majority before it."""
        r = info.round
        partner: RoundInfo | None
        if info.closed_block:  # the voting round: the open round after it goes with it
            partner = self.pipelined.round_info(r + 1)
            if majority(self.pipelined.attestations(r), info.participant_count) is not None:
                self.fail(r, "-", "abort", "aborted although a strict majority of its participants voted one key")
        else:  # the open round, aborted with the voting round before it (it never closed)
            partner = self.pipelined.round_info(r - 1) if r > 1 else None
        if partner is None or partner.state is not RoundState.ABORTED or partner.ended_block != info.ended_block:
            self.fail(r, "-", "abort", "aborted alone: not with its voting round or the open round trained from it")
