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

1. `fetch_round_set`: every blob of the on-chain set, while `watch_attestations` (reading the
   attestations whenever the ledger moves, and every WATCH_INTERVAL while the chain is polled)
   learns holders (an attester holds the blobs it included, so a blob unreachable at its
   committer, or that its committer served corrupted, is fetched from them:
   node/peer/fetching.py); ends when every blob
   is settled (fetched, malformed or withheld; one not awaited is not waited for) or at the
   deadline. No attestation cuts this step short: a set that leaves a slow blob out must not stop
   us waiting for it.
2. `complete_focal_set`: what of the focal set is still missing, from its attesters, for at most
   one more `fetch_timeout`: this is how peers that missed a blob converge on the set of those
   that hold it.
3. `decide`: the inclusion bitmap (`decide_inclusion`): the focal set if we hold all of it, else
   what we fetched ourselves. Both are exactly the blobs we hold, since a focal set contains them.
   Every blob left out is named with its reason in `RoundBlobs.left_out`.

Withholding costs the withholder, not the swarm. A committer claims to hold its blob when it
announces it (a HAVE: an honest committer announces only once it stored the blob, after its commit)
or attests a set including it (it attests only after its own fetch step); the claim is probed at
once, one request to the committer. If the committer then fails to serve it to us (refuses it or
serves other bytes; or, on a regular try, serves nothing until the try's timeout) while nobody else
claims the blob (no other attester included it, nobody else announced it), the blob is *withheld*
`CLAIM_PATIENCE` of `fetch_timeout` after the claim (time for other claims to land): left out and
waited for in neither step, unless somebody else claims it after all (then it is fetched from them
like any blob). A withholder that announces its blob is thus left out at the close, whether or not
it ever attests: it costs a round that patience, not a `fetch_timeout` (nor, as its own early
attestation used to, a second one to complete that attested set). A transfer still running is no
failure: a slow honest blob is waited for as before, so an early attestation without it still
cannot censor it; a committer that answers nothing at all costs step 1's `fetch_timeout` (its last
try fails at that deadline), never the second. A committer that neither announces nor attests its
blob, and does not serve it, cannot be told from an honest one we cannot reach: it costs step 1's
`fetch_timeout` in its first `NOT_AWAITED_AFTER` rounds. A committer
whose blob reached us from nobody in `NOT_AWAITED_AFTER` rounds in a row is *not awaited*
(`Withholding`): its blob is still asked for while the step lasts, and included if it arrives, but
nothing waits for it unless someone else claims to hold it; one of its blobs arriving (here, or in
a prefetch while a round is open) makes it awaited again. Peers need not agree on who is awaited or
withheld: that only sets how long each waits; which sets each may vote is unchanged (a peer votes
every blob it holds), and the majority attestation decides as before. A committer that serves its
blob to some peers only, after claiming it, can still split a round's votes that way (docs/THREATS.md).

`RoundBlobs` holds what the peer knows and decides from it without any I/O, so the decisions are
testable without trio; `Agreement` does the waiting, every wait under a deadline.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import torch
import trio

from node.chain.records import Attestation, Commitment
from node.peer.fetching import REQUEST_SHARE, RETRY_INTERVAL, BlobUnavailable, Holders, Obtain, fetch_from_holders
from node.protocol.blob import BlobError
from node.protocol.wire import decode_bitmap
from p2p import FetchTimeout

log = logging.getLogger("swarm.peer")

WATCH_INTERVAL = 0.5  # seconds between two looks at who announced the unsettled blobs (gossip, no request)
# Where the ledger's events are pushed (a subscription), the attestations are read again on each
# event, and otherwise only this many seconds after the last read (a fallback); while the chain is
# polled, every WATCH_INTERVAL as well (a poll may see an attestation's block before its log).
ATTESTATIONS_REREAD = 2.0
# Of fetch_timeout: how long after its committer claimed it (announced it, or attested a set including it) a blob
# nobody else claims is waited for before it is withheld (see the module doc): time for the claims
# of others (attestations, announcements) to land, should the committer have served some of them.
CLAIM_PATIENCE = 0.02
NOT_AWAITED_AFTER = 2  # rounds in a row a committer's blob reached us from nobody: then it is not awaited


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
    announcers: list[list[str]] = field(default_factory=list)  # who announced blob i (a HAVE), as last read
    bitmaps: list[list[bool]] = field(default_factory=list)  # the round's attested bitmaps, chain order
    awaited: list[bool] = field(default_factory=list)  # False: nothing waits for blob i (`Withholding`)
    # trio time we first saw blob i's committer announce it or attest a set including it (it claims to hold it)
    claimed_at: list[float | None] = field(default_factory=list)
    # trio time its committer last failed to serve blob i to us (answered without it, or not at all)
    unserved_at: list[float | None] = field(default_factory=list)
    # claimed by its committer, not served by it, claimed by nobody else (when marked: `is_settled`)
    withheld: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.peer_ids)
        if not 0 <= self.mine < n:
            raise ValueError(f"own index {self.mine} is not among {n} participants")
        self.vectors = self.vectors or [None] * n
        self.malformed = self.malformed or [False] * n
        self.left_out = self.left_out or [None] * n
        self.holders = self.holders or [[] for _ in range(n)]
        self.announcers = self.announcers or [[] for _ in range(n)]
        self.awaited = self.awaited or [True] * n
        self.claimed_at = self.claimed_at or [None] * n
        self.unserved_at = self.unserved_at or [None] * n
        self.withheld = self.withheld or [False] * n

    @property
    def n(self) -> int:
        return len(self.peer_ids)

    def is_settled(self, i: int) -> bool:
        """Nothing more to fetch for blob i: we have it, or it is malformed, or withheld while
        nobody but its committer claims it (a later claim by another makes it a blob to fetch again)."""
        return self.vectors[i] is not None or self.malformed[i] or (self.withheld[i] and not self.claimed_by_others(i))

    def claimed_by_others(self, i: int) -> bool:
        """A peer other than blob i's committer claims to hold it: an attester that included it, or
        one that announced it (a peer announces what it fetched)."""
        return any(h != self.peer_ids[i] for h in self.holders[i] + self.announcers[i])

    def awaits(self, i: int) -> bool:
        """Blob i keeps a step waiting: it is not settled, and awaited or claimed by someone else."""
        return not self.is_settled(i) and (self.awaited[i] or self.claimed_by_others(i))

    def settled(self, wanted: list[bool]) -> bool:
        """Nothing of `wanted` is left to wait for."""
        return not any(self.awaits(i) for i in range(self.n) if wanted[i])

    def done(self) -> bool:
        """Fetching can stop: nothing is left to wait for. (A focal set does not end step 1: see the module doc.)"""
        return self.settled([True] * self.n)

    def have(self) -> list[bool]:
        return [v is not None for v in self.vectors]

    @property
    def focal(self) -> list[bool] | None:
        """The focal set now: from the attestations read so far and the blobs held now (`choose_focal`)."""
        return choose_focal(self.bitmaps, self.mine, self.have(), self.malformed)

    def learn(self, attestations: Sequence[Attestation], index: dict[str, int], now: float) -> list[int]:
        """Read the round's attestations (chain order, the whole list each time) at trio time
        `now`: every attester holds the blobs it included, its own among them (a claim); the
        bitmaps are the candidates for the focal set. Returns the blobs claimed for the first time."""
        self.bitmaps = [decode_bitmap(a.included, self.n) for a in attestations]
        claimed = []
        for a, bits in zip(attestations, self.bitmaps):
            k = index[a.peer]
            if bits[k] and self.claimed_at[k] is None:
                self.claimed_at[k] = now
                claimed.append(k)
            for i in range(self.n):
                if bits[i] and self.peer_ids[k] not in self.holders[i]:
                    self.holders[i].append(self.peer_ids[k])
        return claimed

    def hear(self, i: int, announcers: list[str], now: float) -> bool:
        """Who announced blob i, as read at trio time `now`; whether that is its committer's
        first claim to hold it (its own announcement)."""
        self.announcers[i] = list(announcers)
        if self.peer_ids[i] in announcers and self.claimed_at[i] is None:
            self.claimed_at[i] = now
            return True
        return False

    def _withholding(self, i: int) -> float | None:
        """When blob i's committer claimed it, if blob i is a withholding candidate: unsettled, its
        committer failed to serve it to us after claiming it, and nobody else claims it."""
        claimed, unserved = self.claimed_at[i], self.unserved_at[i]
        if claimed is None or unserved is None or unserved < claimed:
            return None
        return None if self.is_settled(i) or self.claimed_by_others(i) else claimed

    def next_due(self, patience: float, now: float) -> float | None:
        """When the patience of the next claim still to come due runs out (trio time; None: none):
        a blob its committer alone claims, unsettled, whose committer may have failed us by then."""
        due = [
            t + patience
            for i, t in enumerate(self.claimed_at)
            if t is not None and not self.is_settled(i) and not self.claimed_by_others(i) and t + patience > now
        ]
        return min(due, default=None)

    def withhold_overdue(self, now: float, patience: float) -> list[int]:
        """Mark withheld every candidate (`_withholding`) claimed at least `patience` ago; the ones
        marked now."""
        due = [i for i in range(self.n) if (t := self._withholding(i)) is not None and t + patience <= now]
        for i in due:
            self.withheld[i] = True
        return due

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
        awaited: Sequence[bool] = (),
        ledger_news: Callable[[float], Awaitable[bool | None]] | None = None,
    ) -> None:
        self.round = round
        self.commitments = commitments
        self.index = {c.peer: i for i, c in enumerate(commitments)}
        self.blobs = RoundBlobs(peer_ids, mine=self.index[me], awaited=list(awaited))
        self.refused: set[int] = set()  # left out unfetched: never asked for
        for i, reason in enumerate(refused):  # breaks the policy, or a squatter's: never fetched or included
            if reason is not None:
                why = ": ".join(map(str, reason)) if isinstance(reason, tuple) else str(reason)
                self.blobs.malformed[i] = True
                self.blobs.left_out[i] = f"round {round}: {self.who(i)} is refused unfetched: {why}"
                self.refused.add(i)
        self.fetch_timeout = fetch_timeout
        self.patience = CLAIM_PATIENCE * fetch_timeout
        # who failed each blob, kept over both fetch steps: a committer that served us bad bytes
        # or nothing is asked again only after the attesters that hold its blob
        self._holders = [
            Holders(f"round {round}: blob {self._digest(i)[:16]} of {self.who(i)}") for i in range(len(commitments))
        ]
        self._obtain = obtain
        self._announced = announced
        self._read_update = read_update
        self._read_attestations = read_attestations
        # requests for blob i that ask its committer, in flight: a claim made meanwhile waits for
        # their answer instead of asking the committer for the same bytes a second time
        self._asking = [0] * len(commitments)
        self._step: tuple[list[bool], trio.CancelScope] | None = None  # the running step's wanted blobs and scope
        # returns once the ledger emitted an event (an attestation among them), or after the seconds
        # given: whether it did (None: cannot tell, so the attestations are read again)
        self._ledger_news: Callable[[float], Awaitable[bool | None]] = ledger_news or trio.sleep

    def who(self, i: int) -> str:
        """Participant i, as the log and `RoundBlobs.left_out` name it."""
        return f"participant {i} ({self.commitments[i].peer}, peer {self.blobs.peer_ids[i]})"

    def _digest(self, i: int) -> str:
        return bytes(self.commitments[i].digest).hex()

    async def run(self) -> list[bool]:
        """Steps 1 to 3: the inclusion bitmap this peer attests; `self.blobs.vectors` holds the blobs."""
        await self.fetch_round_set()
        await self.complete_focal_set()
        return self.decide()

    async def fetch_round_set(self) -> None:
        """Step 1: every blob of the on-chain set, for at most `fetch_timeout`. A committer that
        claimed its blob before this step ended and has not served it to us by then failed us."""
        await self._fetch_until(trio.current_time() + self.fetch_timeout, [True] * self.blobs.n)
        now = trio.current_time()
        for i in range(self.blobs.n):
            if self.blobs.claimed_at[i] is not None and not self.blobs.is_settled(i):
                self.blobs.unserved_at[i] = now

    async def complete_focal_set(self) -> None:
        """Step 2: the rest of the focal set (its attesters hold it), for at most one more `fetch_timeout`."""
        focal = self.blobs.focal
        if focal is not None and not self.blobs.settled(focal):
            await self._fetch_until(trio.current_time() + self.fetch_timeout, focal)

    def decide(self) -> list[bool]:
        """Step 3: the focal set if we hold all of it, else what we fetched ourselves; every blob
        left out is named with its reason (`RoundBlobs.left_out`)."""
        included = self.blobs.decide()
        for i in range(self.blobs.n):
            if not included[i] and self.blobs.left_out[i] is None:
                why = f"round {self.round}: blob {self._digest(i)[:16]} of {self.who(i)} {self._missing(i)}, left out"
                log.warning("%s", why)
                self.blobs.left_out[i] = why
        if not any(included):
            raise NothingToAggregate(f"round {self.round}: every blob of the set was left out, ours included")
        return included

    def _missing(self, i: int) -> str:
        """Why blob i, which nobody served us, is missing."""
        if self.blobs.withheld[i] and not self.blobs.claimed_by_others(i):
            return (
                "is withheld: its committer announced it or attested a set including it (it claims to hold it) "
                "but did not serve it to us, and nobody else claims it"
            )
        if not self.blobs.awaited[i]:
            return (
                f"was not awaited (its committer served its blob to nobody in {NOT_AWAITED_AFTER} rounds in a "
                "row) and did not arrive"
            )
        return f"was served by nobody within the fetch timeout ({self.fetch_timeout:g} s)"

    def served(self, i: int) -> bool | None:
        """Whether blob i reached us (malformed counts: its bytes came); None if it was never asked
        for (refused unfetched, or our own)."""
        if i in self.refused or i == self.blobs.mine:
            return None
        return self.blobs.vectors[i] is not None or self.blobs.malformed[i]

    async def _fetch_until(self, deadline: float, wanted: list[bool]) -> None:
        """Fetch the unsettled blobs of `wanted` until nothing of `wanted` is left to wait for, or the
        deadline (blobs not awaited are asked for meanwhile, and kept if they arrive)."""
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                self._step = (wanted, nursery.cancel_scope)
                for i in range(self.blobs.n):
                    if wanted[i] and not self.blobs.is_settled(i):
                        nursery.start_soon(self.fetch_blob, i, wanted, nursery.cancel_scope, deadline)
                nursery.start_soon(self.watch_attestations, wanted, nursery)

    async def fetch_blob(self, i: int, wanted: list[bool], scope: trio.CancelScope, deadline: float) -> None:
        """Fetch blob i until we have it or it proves malformed or withheld (or the step ends),
        from its holders (node/peer/fetching.py): those learnt meanwhile are asked too."""
        blobs = self.blobs
        digest_hex = self._digest(i)
        while not blobs.is_settled(i):
            try:
                data = await fetch_from_holders(
                    functools.partial(self._ask, i),
                    digest_hex,
                    self._holders[i],
                    lambda: blobs.providers(i, self._announced(digest_hex)),
                    deadline=deadline,
                    request_timeout=REQUEST_SHARE * self.fetch_timeout,
                )
                self._accept(i, data)
            except BlobUnavailable:  # the step's deadline, which ends this step anyway
                return
            except Exception as exc:  # not the holders': try again until cancelled
                log.info("round %d: reading blob %s failed: %s", self.round, digest_hex[:12], exc)
                await trio.sleep(RETRY_INTERVAL)
        if blobs.settled(wanted):
            scope.cancel()

    def _accept(self, i: int, data: bytes) -> None:
        """Blob i's bytes (its digest checked): its vector, or malformed."""
        try:
            self.blobs.vectors[i] = self._read_update(data)
        except BlobError as exc:  # right digest, unusable content: nobody can use it
            # every decode failure is a BlobError (node.protocol.blob, wire.read_vector), and so
            # is a release the swarm's mechanism cannot output (release.check_release): left out
            # here as on every peer; what is logged and kept names the round, the participant,
            # its committer and peer id, and the blob
            why = f"round {self.round}: blob {self._digest(i)[:16]} of {self.who(i)} is malformed, left out: {exc}"
            log.warning("%s", why)
            self.blobs.left_out[i] = why
            self.blobs.malformed[i] = True

    async def _ask(
        self, i: int, digest_hex: str, providers: list[str], timeout: float, *, slow_fails: bool = True
    ) -> bytes:
        """Ask `providers` for blob i (fetching.Obtain), noting when its committer failed to serve
        it: refused it, served other bytes or, unless `slow_fails` is False, nothing in time."""
        committer = self.blobs.peer_ids[i] in providers
        self._asking[i] += committer
        try:
            return await self._obtain(digest_hex, providers, timeout)
        except Exception as exc:
            if committer and (slow_fails or not isinstance(exc, FetchTimeout)):
                self.blobs.unserved_at[i] = trio.current_time()
                self._settle()  # a failure after the claim's patience ran out decides now
            raise
        finally:
            self._asking[i] -= committer

    async def _probe(self, i: int, wanted: list[bool], scope: trio.CancelScope) -> None:
        """Ask blob i's committer for it once, right after its claim: it serves it, or its refusal
        makes the blob a withholding candidate at once. A transfer that is only slow counts for
        nothing here: an honest sole holder on a slow link is never cut short (node/peer/fetching.py)."""
        with contextlib.suppress(Exception):
            timeout = REQUEST_SHARE * self.fetch_timeout
            self._accept(i, await self._ask(i, self._digest(i), [self.blobs.peer_ids[i]], timeout, slow_fails=False))
        if self.blobs.settled(wanted):
            scope.cancel()

    async def watch_attestations(self, wanted: list[bool], nursery: trio.Nursery) -> None:
        """Read the attestations when the ledger moves (at least every ATTESTATIONS_REREAD, and
        every WATCH_INTERVAL while `ledger_news` cannot tell), and who announced the unsettled
        blobs (every WATCH_INTERVAL): holders, claims (each new one probed at once, unless its
        committer is being asked already), focal candidates; mark the overdue claims withheld;
        stop once nothing of `wanted` is left to wait for."""
        moved: bool | None = True
        reread_at = trio.current_time()
        attestations: list[Attestation] = []
        while True:
            if moved is not False or trio.current_time() >= reread_at:
                attestations = await self._read_attestations()
                reread_at = trio.current_time() + ATTESTATIONS_REREAD
            now = trio.current_time()
            claimed = self.blobs.learn(attestations, self.index, now)
            for i in range(self.blobs.n):
                if not self.blobs.is_settled(i) and self.blobs.hear(i, self._announced(self._digest(i)), now):
                    claimed.append(i)
            for i in dict.fromkeys(claimed):
                if not self.blobs.is_settled(i) and not self._asking[i]:  # else that request's answer tells
                    nursery.start_soon(self._probe, i, wanted, nursery.cancel_scope)
            self._withhold_overdue()
            if self.blobs.settled(wanted):
                break
            due = self.blobs.next_due(self.patience, now)
            moved = await self._ledger_news(WATCH_INTERVAL if due is None else min(WATCH_INTERVAL, max(0.0, due - now)))
        nursery.cancel_scope.cancel()

    def _settle(self) -> None:
        """Mark the overdue claims withheld now, and end the running step if nothing it wants is
        left to wait for."""
        self._withhold_overdue()
        if self._step is not None and self.blobs.settled(self._step[0]):
            self._step[1].cancel()

    def _withhold_overdue(self) -> None:
        """Mark (and log) withheld the blobs whose committer claimed them and then failed us,
        `patience` after the claim, and that nobody else claims (as last read: called right after
        the attestations and announcements were, or after a failed request)."""
        for i in self.blobs.withhold_overdue(trio.current_time(), self.patience):
            log.warning(
                "round %d: %s claimed its blob %s (announced it or attested it), did not serve it to us, and "
                "nobody else claims it: withheld, not waited for",
                self.round,
                self.who(i),
                self._digest(i)[:16],
            )


class Withholding:
    """Per committer, how many rounds in a row its blob reached this peer from nobody. One that
    reached NOT_AWAITED_AFTER is not awaited (`awaited`) until one of its blobs arrives (`served`:
    in a round's agreement step, or a prefetch while a round is open)."""

    def __init__(self) -> None:
        self.missed: dict[str, int] = {}  # committer address -> rounds in a row

    def awaited(self, committer: str) -> bool:
        return self.missed.get(committer, 0) < NOT_AWAITED_AFTER

    def served(self, committer: str) -> None:
        self.missed.pop(committer, None)

    def record(self, agreement: Agreement) -> None:
        """What a round's agreement step saw: who served its blob, and who served it to nobody."""
        for i, c in enumerate(agreement.commitments):
            served = agreement.served(i)
            if served:
                self.served(c.peer)
            elif served is False:
                self.missed[c.peer] = self.missed.get(c.peer, 0) + 1
                if self.missed[c.peer] == NOT_AWAITED_AFTER:
                    log.warning(
                        "round %d: %s served its blob to nobody in %d rounds in a row: not awaited from now on, "
                        "until one of its blobs arrives",
                        agreement.round,
                        agreement.who(i),
                        NOT_AWAITED_AFTER,
                    )
