"""The votes on a round of the one-transaction-per-round ledger (contracts/PipelinedLedger.sol; docs/
LEDGER.md, "One transaction per round"), counted off chain as the contract counts them: a vote on
round r rides in a round r + 1 commit, or in a final `vote` on r, and counts when its sender took
part in r and has not voted on r before. Counted votes are what today's attestations are to the
agreement step (node/peer/agree.py: holders, focal-set candidates) and to `swarm verify`, so they
come out as `Attestation` records, each with its key's tally once it is counted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from node.chain.records import Attestation

if TYPE_CHECKING:  # node.chain.pipelined counts its votes here: an import at run time would be a cycle
    from node.chain.pipelined import FinalVote, VotedCommit


def votes_on(
    round_commits: Sequence[VotedCommit], next_commits: Sequence[VotedCommit], final_votes: Sequence[FinalVote]
) -> list[Attestation]:
    """The counted votes on a round, in chain order, from its commits (who took part), the next
    round's commits and the final votes on it. A vote from a member that did not commit in the round
    (it sat the round out: its commit only names the base it trained from) or that voted on it
    already is left out."""
    participants = {c.peer for c in round_commits}
    cast: list[tuple[int, int, str, bytes, bytes]] = [
        (c.block_number, c.log_index, c.peer, c.vote_digest, c.included) for c in next_commits
    ] + [(v.block_number, v.log_index, v.peer, v.aggregate_digest, v.included) for v in final_votes]
    voted: set[str] = set()
    tally: dict[tuple[bytes, bytes], int] = {}
    counted: list[Attestation] = []
    for block, _, peer, digest, included in sorted(cast, key=lambda v: (v[0], v[1])):
        if peer not in participants or peer in voted:
            continue
        voted.add(peer)
        tally[digest, included] = tally.get((digest, included), 0) + 1
        counted.append(Attestation(peer, digest, included, tally[digest, included], block))
    return counted


def majority(votes: Sequence[Attestation], participants: int) -> Attestation | None:
    """The vote that gave its key a strict majority of the round's `participants`: the one whose
    transaction finalizes the round on chain; None while no key has one."""
    return next((v for v in votes if v.votes > participants // 2), None)


def leading(votes: Sequence[Attestation]) -> Attestation | None:
    """The last counted vote of the key with the most votes so far (ties: the key voted first), the
    vote a peer compares its own with before it commits the next round; None without votes."""
    best: Attestation | None = None
    for v in votes:
        if best is None or v.votes > best.votes or _key(v) == _key(best):
            best = v
    return best


def _key(vote: Attestation) -> tuple[bytes, bytes]:
    return vote.aggregate_digest, vote.included
