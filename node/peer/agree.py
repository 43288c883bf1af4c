"""Fetch a closed round's blobs and agree on which go into the aggregate (docs/NODE.md,
"Agreement on the set").

Peers whose fetch deadlines expire at different moments would attest different bitmaps and no
(digest, bitmap) would reach a majority. So a peer reads the round's attestations while it
fetches. An attestation is a possible focal set only if its bitmap includes the peer's own blob
AND every blob the peer holds valid, and no blob the peer found malformed: a peer never votes a
set that leaves out a blob it fetched itself, so an attester cannot censor a blob by attesting
first without it. Of the possible focal sets, one that no other contains wins (supersets first),
the earliest in chain order among those. The focal set is re-chosen from the chain and from
what the peer holds every time it is read, so a blob fetched later drops every set without it.

The steps, in order (`Agreement.run`):

1. `fetch_round_set`: every blob of the on-chain set, while `watch_attestations` learns holders
   (an attester holds the blobs it included, so a blob unreachable at its committer, or that its
   committer served corrupted, is fetched from them: node/peer/fetching.py); ends when every blob
   is settled (fetched or malformed) or at the deadline. No attestation cuts this step short: a
   set that leaves a slow blob out must not stop us waiting for it.
2. `complete_focal_set`: what of the focal set is still missing, from its attesters, for at most
   one more `fetch_timeout`: this is how peers that missed a blob converge on the set of those
   that hold it.
3. `decide`: the inclusion bitmap (`decide_inclusion`): the focal set if we hold all of it, else
   what we fetched ourselves. Both are exactly the blobs we hold, since a focal set contains them.

`RoundBlobs` holds what the peer knows and decides from it without any I/O, so the decisions are
testable without trio; `Agreement` does the waiting, every wait under a deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import torch
import trio

from node.chain.records import Attestation, Commitment
from node.peer.fetching import REQUEST_SHARE, RETRY_INTERVAL, BlobUnavailable, Holders, Obtain, fetch_from_holders
from node.protocol.blob import BlobError
from node.protocol.wire import decode_bitmap

log = logging.getLogger("swarm.peer")

WATCH_INTERVAL = 0.5  # seconds between two reads of the round's attestations


# ------------------------------------------------------------------ decisions (no I/O)


def acceptable(bits: list[bool], mine: int, have: list[bool], malformed: list[bool]) -> bool:
    """Whether a peer may adopt `bits` as its focal set: it includes the peer's own blob and
    every blob the peer holds, and no blob the peer found malformed (or refused)."""
    return (
        bits[mine] and all(b or not h for b, h in zip(bits, have)) and not any(b and m for b, m in zip(bits, malformed))
    )


def choose_focal(
    bitmaps: Sequence[list[bool]], mine: int, have: list[bool], malformed: list[bool] | None = None
) -> list[bool] | None:
    """The focal set: of the acceptable bitmaps (chain order), the first that no other acceptable
    bitmap strictly contains; None if none is acceptable."""
    bad = malformed if malformed is not None else [False] * len(have)
    candidates = [list(bits) for bits in bitmaps if acceptable(list(bits), mine, have, bad)]

    def contained(a: list[bool], b: list[bool]) -> bool:  # a is a strict subset of b
        return a != b and all(y or not x for x, y in zip(a, b))

    return next((a for a in candidates if not any(contained(a, b) for b in candidates)), None)


def decide_inclusion(have: list[bool], focal: list[bool] | None) -> list[bool]:
    """The bitmap to attest: the focal set if every blob of it was fetched, else what was."""
    if focal is not None and all(have[i] for i in range(len(have)) if focal[i]):
        return list(focal)
    return list(have)


class NothingToAggregate(RuntimeError):
    """Every blob of the round's set was left out (unreachable or malformed), ours included."""


@dataclass
class RoundBlobs:
    """What a peer knows of a closed round's blobs while it fetches them. Index i is participant
    i of the round (the bit order of inclusion bitmaps); `mine` is this peer's index."""

    peer_ids: list[str]  # libp2p peer id of each participant (its committer)
    mine: int
    vectors: list[torch.Tensor | None] = field(default_factory=list)
    malformed: list[bool] = field(default_factory=list)  # right digest, unusable content (or refused)
    # why blob i is left out (malformed or refused): one line naming the round, the participant,
    # its committer and peer id, and the reason; None while it is not left out
    left_out: list[str | None] = field(default_factory=list)
    holders: list[list[str]] = field(default_factory=list)  # attesters that included blob i hold it
    bitmaps: list[list[bool]] = field(default_factory=list)  # the round's attested bitmaps, chain order

    def __post_init__(self) -> None:
        n = len(self.peer_ids)
        if not 0 <= self.mine < n:
            raise ValueError(f"own index {self.mine} is not among {n} participants")
        self.vectors = self.vectors or [None] * n
        self.malformed = self.malformed or [False] * n
        self.left_out = self.left_out or [None] * n
        self.holders = self.holders or [[] for _ in range(n)]

    @property
    def n(self) -> int:
        return len(self.peer_ids)

    def is_settled(self, i: int) -> bool:
        """Nothing more to fetch for blob i: we have it, or it is malformed."""
        return self.vectors[i] is not None or self.malformed[i]

    def settled(self, wanted: list[bool]) -> bool:
        return all(self.is_settled(i) for i in range(self.n) if wanted[i])

    def done(self) -> bool:
        """Fetching can stop: every blob is settled. (A focal set does not end step 1: see the module doc.)"""
        return self.settled([True] * self.n)

    def have(self) -> list[bool]:
        return [v is not None for v in self.vectors]

    @property
    def focal(self) -> list[bool] | None:
        """The focal set now: from the attestations read so far and the blobs held now (`choose_focal`)."""
        return choose_focal(self.bitmaps, self.mine, self.have(), self.malformed)

    def learn(self, attestations: Sequence[Attestation], index: dict[str, int]) -> None:
        """Read the round's attestations (chain order, the whole list each time): every attester
        holds the blobs it included; the bitmaps are the candidates for the focal set."""
        self.bitmaps = [decode_bitmap(a.included, self.n) for a in attestations]
        for a, bits in zip(attestations, self.bitmaps):
            attester = self.peer_ids[index[a.peer]]
            for i in range(self.n):
                if bits[i] and attester not in self.holders[i]:
                    self.holders[i].append(attester)

    def providers(self, i: int, announced: list[str]) -> list[str]:
        """Who holds blob i: its committer, the attesters that included it, and whoever announced
        it (asked in a random order, around those that failed: node/peer/fetching.py)."""
        found = [self.peer_ids[i], *self.holders[i]]
        return found + [p for p in announced if p not in found]

    def decide(self) -> list[bool]:
        return decide_inclusion(self.have(), self.focal)


# ------------------------------------------------------------------ waiting (trio)


class Agreement:
    """The fetch-and-agree step of one closed round, for the participant `me`."""

    def __init__(
        self,
        round: int,
        commitments: list[Commitment],
        peer_ids: list[str],
        *,
        me: str,
        fetch_timeout: float,
        obtain: Obtain,
        announced: Callable[[str], list[str]],
        read_update: Callable[[bytes], torch.Tensor],
        read_attestations: Callable[[], Awaitable[list[Attestation]]],
        refused: Sequence[object | None] = (),
    ) -> None:
        self.round = round
        self.commitments = commitments
        self.index = {c.peer: i for i, c in enumerate(commitments)}
        self.blobs = RoundBlobs(peer_ids, mine=self.index[me])
        for i, reason in enumerate(refused):  # breaks the policy, or a squatter's: never fetched or included
            if reason is not None:
                why = ": ".join(map(str, reason)) if isinstance(reason, tuple) else str(reason)
                self.blobs.malformed[i] = True
                self.blobs.left_out[i] = f"round {round}: {self._who(i)} is refused unfetched: {why}"
        self.fetch_timeout = fetch_timeout
        # who failed each blob, kept over both fetch steps: a committer that served us bad bytes
        # or nothing is asked again only after the attesters that hold its blob
        self._holders = [
            Holders(f"round {round}: blob {bytes(c.digest).hex()[:16]} of {self._who(i)}")
            for i, c in enumerate(commitments)
        ]
        self._obtain = obtain
        self._announced = announced
        self._read_update = read_update
        self._read_attestations = read_attestations

    def _who(self, i: int) -> str:
        """Participant i, as the log and `RoundBlobs.left_out` name it."""
        return f"participant {i} ({self.commitments[i].peer}, peer {self.blobs.peer_ids[i]})"

    async def run(self) -> list[bool]:
        """Steps 1 to 3: the inclusion bitmap this peer attests; `self.blobs.vectors` holds the blobs."""
        await self.fetch_round_set()
        await self.complete_focal_set()
        return self.decide()

    async def fetch_round_set(self) -> None:
        """Step 1: every blob of the on-chain set, for at most `fetch_timeout`."""
        await self._fetch_until(trio.current_time() + self.fetch_timeout, [True] * self.blobs.n)

    async def complete_focal_set(self) -> None:
        """Step 2: the rest of the focal set (its attesters hold it), for at most one more `fetch_timeout`."""
        focal = self.blobs.focal
        if focal is not None and not self.blobs.settled(focal):
            await self._fetch_until(trio.current_time() + self.fetch_timeout, focal)

    def decide(self) -> list[bool]:
        """Step 3: the focal set if we hold all of it, else what we fetched ourselves."""
        included = self.blobs.decide()
        if not any(included):
            raise NothingToAggregate(f"round {self.round}: every blob of the set was left out, ours included")
        return included

    async def _fetch_until(self, deadline: float, wanted: list[bool]) -> None:
        """Fetch the unsettled blobs of `wanted` until all of `wanted` is settled, or the deadline."""
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                for i in range(self.blobs.n):
                    if wanted[i] and not self.blobs.is_settled(i):
                        nursery.start_soon(self.fetch_blob, i, wanted, nursery.cancel_scope, deadline)
                nursery.start_soon(self.watch_attestations, wanted, nursery.cancel_scope)

    async def fetch_blob(self, i: int, wanted: list[bool], scope: trio.CancelScope, deadline: float) -> None:
        """Fetch blob i until we have it or it proves malformed (or the deadline cancels us),
        from its holders (node/peer/fetching.py): those learnt meanwhile are asked too."""
        blobs = self.blobs
        digest_hex = bytes(self.commitments[i].digest).hex()
        while not blobs.is_settled(i):
            try:
                data = await fetch_from_holders(
                    self._obtain,
                    digest_hex,
                    self._holders[i],
                    lambda: blobs.providers(i, self._announced(digest_hex)),
                    deadline=deadline,
                    request_timeout=REQUEST_SHARE * self.fetch_timeout,
                )
                blobs.vectors[i] = self._read_update(data)
            except BlobError as exc:  # right digest, unusable content: nobody can use it
                # every decode failure is a BlobError (node.protocol.blob, wire.read_vector), and so
                # is a release the swarm's mechanism cannot output (release.check_release): left out
                # here as on every peer; what is logged and kept names the round, the participant,
                # its committer and peer id, and the blob
                why = f"round {self.round}: blob {digest_hex[:16]} of {self._who(i)} is malformed, left out: {exc}"
                log.warning("%s", why)
                blobs.left_out[i] = why
                blobs.malformed[i] = True
            except BlobUnavailable:  # the step's deadline, which ends this step anyway
                return
            except Exception as exc:  # not the holders': try again until cancelled
                log.info("round %d: reading blob %s failed: %s", self.round, digest_hex[:12], exc)
                await trio.sleep(RETRY_INTERVAL)
        if blobs.settled(wanted):
            scope.cancel()

    async def watch_attestations(self, wanted: list[bool], scope: trio.CancelScope) -> None:
        """Read the attestations every WATCH_INTERVAL (holders, focal candidates); stop once `wanted` is settled."""
        self.blobs.learn(await self._read_attestations(), self.index)
        while not self.blobs.settled(wanted):  # or until the step's deadline cancels us
            await trio.sleep(WATCH_INTERVAL)
            self.blobs.learn(await self._read_attestations(), self.index)
        scope.cancel()
