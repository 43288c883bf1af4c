"""The peer's vetting room: each commitment of a round held to the rulebook (node/rules.py), the
rules `swarm verify` applies too. Rules 1 to 3 (registration, sample count, privacy policy) from
the chain before anything is fetched; rules 4 to 6 (decoding, binding, release) on each fetched
blob, through the reader the agreement step decodes with."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, cast

import torch

from node.chain.records import Commitment
from node.peer.ports import LedgerPort
from node.protocol.blob import sha256
from node.protocol.settings import SharedSettings
from node.rules import BlobRefused, Rulebook, Verdict

log = logging.getLogger("swarm.peer")

CLOSED_SETS_KEPT = 8  # rounds whose whole sets are kept (`Vetter.closed_round`): a history older than that is read

# Rule 1 for (committer address, its registered peer id), blocking: the registry's `ownership`.
Ownership: TypeAlias = Callable[[str, bytes], Verdict | None]
# A commitment's registered peer id, and why it is left out (None: it is not).
Vetted: TypeAlias = tuple[bytes, Verdict | None]


class Vetter:
    """Vets the commitments a peer meets, for the peer `me` (whose own commits it trusts).

    `call` runs a blocking call off the event loop (the peer's `chain`: ledger reads and the
    rules' computations); `ownership` None counts every registration (the in-memory tests, whose
    fake chain has no signatures). Kept between rounds, per committer: its peer id and its commits
    so far, which never change once on chain; verdicts are kept for their round and the next."""

    def __init__(
        self,
        ledger: LedgerPort,
        shared: SharedSettings,
        num_params: int,
        *,
        me: str,
        call: Callable[..., Awaitable[Any]],
        ownership: Ownership | None = None,
    ) -> None:
        self.ledger = ledger
        self.shared = shared
        self.num_params = num_params
        self.me = me
        self.ownership = ownership
        self._call = call
        self._rulebook: Rulebook | None = None
        self._peer_ids: dict[str, bytes] = {}  # committer address -> its registered peer id
        self._histories: dict[str, list[Commitment]] = {}  # committer address -> its commits so far
        self._complete_through: dict[str, int] = {}  # committer address -> its history holds every commit to this round
        self._closed_sets: dict[int, list[Commitment]] = {}  # round -> its whole set (`closed_round`), the last few
        self._vetted: dict[tuple[int, str, bytes], Vetted] = {}

    async def rulebook(self) -> Rulebook:
        """The swarm's rules: the genesis settings and the ledger's maxSamples (read once)."""
        if self._rulebook is None:
            params = await self._call(self.ledger.params)
            self._rulebook = Rulebook(self.shared, self.num_params, int(params.max_samples))
        return self._rulebook

    async def vet(self, r: int, c: Commitment) -> Vetted:
        """Commitment c's peer id and its verdict under rules 1 to 3, read once per round: both rest
        on chain data fixed once c is on chain (registrations precede commits, the committer's
        history up to round r), so a verdict made while the round was open holds."""
        key = (r, c.peer, bytes(c.digest))
        if key not in self._vetted:
            raw = self._peer_ids.get(c.peer) or bytes(await self._call(self.ledger.peer_id_of, c.peer))
            if raw:
                self._peer_ids[c.peer] = raw  # an account registers once: its peer id never changes
            verdict = None if c.peer == self.me else await self._rules_1_to_3(r, c, raw)
            if verdict is not None:
                log.warning("round %d: leaving out %s: %s: %s", r, c.peer, verdict.check, verdict.reason)
            self._vetted = {k: v for k, v in self._vetted.items() if k[0] >= r - 1}  # older rounds are over
            self._vetted[key] = (raw, verdict)
        return self._vetted[key]

    async def update_reader(self, commitments: list[Commitment]) -> Callable[[bytes], torch.Tensor]:
        """What the agreement step decodes a round's fetched blobs with: rules 4 to 6 against the
        commitment whose digest the bytes have (a digest is unique in a round); BlobRefused (a
        BlobError, so the blob is left out as malformed) when one is broken."""
        rulebook = await self.rulebook()
        by_digest = {bytes(c.digest): c for c in commitments}

        def read(data: bytes) -> torch.Tensor:
            c = by_digest.get(sha256(data))
            if c is None:  # the fetch checked the digest: only a store that lies gets here
                raise BlobRefused(Verdict("blob", "its bytes match no commitment of the round"))
            return rulebook.read_update(data, c)

        return read

    async def _rules_1_to_3(self, r: int, c: Commitment, peer_id: bytes) -> Verdict | None:
        """Rule 1, a squatter's commit (its committer does not own its peer id) left out unfetched
        (registrations precede commits, so every honest peer decides alike); then rules 2 and 3,
        from the committer's commits through round r (chain data only). Both in one call off the
        event loop: a thread hop costs more CPU than a cached verdict (docs/SCALING.md)."""
        rulebook = await self.rulebook()
        failure: Exception | None = None
        try:
            counts: list[int] | None = [int(h.num_samples) for h in await self._history_through(c) if h.round <= r]
        except Exception as exc:  # a squatter is left out on rule 1 all the same; anyone else, raised below
            counts, failure = None, exc
        ownership = self.ownership

        def verdict() -> Verdict | None:
            squatter = ownership(c.peer, peer_id) if ownership is not None else None
            return squatter if squatter is not None or counts is None else rulebook.commit_verdict(c, counts)

        found = cast(Verdict | None, await self._call(verdict))
        if found is None and failure is not None:
            raise failure
        return found

    def closed_round(self, r: int, commitments: list[Commitment]) -> None:
        """Round r is closed and `commitments` is its whole set (read after the close: the chain
        takes no more): a committer's history known through an earlier round then extends through
        this one without reading its logs (`_history_through`)."""
        self._closed_sets[r] = list(commitments)
        for old in [k for k in self._closed_sets if k <= r - CLOSED_SETS_KEPT]:
            del self._closed_sets[old]

    async def _history_through(self, c: Commitment) -> list[Commitment]:
        """Committer c.peer's commits up to c at least, kept between rounds. Rounds whose whole set
        this peer saw (`closed_round`) extend a history without a request (at most one commit per
        peer and round: the contract refuses a second); otherwise the blocks since the last commit
        we knew of are read."""
        known = self._histories.get(c.peer, [])
        if self._holds(known, c):
            return known
        through = self._complete_through.get(c.peer)
        between = range(through + 1, c.round) if through is not None and through < c.round else None
        if between is not None and all(j in self._closed_sets for j in between):
            newer = [h for j in between for h in self._closed_sets[j] if h.peer == c.peer] + [c]
        else:
            since = max((h.block_number for h in known), default=None)
            newer = await self._call(self.ledger.commit_history, c.peer, None if since is None else since + 1)
        rounds = {h.round for h in known}
        known = known + [h for h in newer if h.round not in rounds]
        self._histories[c.peer] = known
        if self._holds(known, c):  # every commit before c's block is in: the history is whole through c's round
            self._complete_through[c.peer] = c.round
        return known

    @staticmethod
    def _holds(history: list[Commitment], c: Commitment) -> bool:
        return any(h.round == c.round and h.digest == c.digest for h in history)
