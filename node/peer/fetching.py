"""Fetching one blob from the peers that hold it, around those that lie or say nothing.

Holders are asked one per try, in a random order: no holder, a liar included, is always asked
first (the order is no secret: it only spreads the asking). A holder whose try failed, because
it served bytes that do not hash to the digest or served nothing in time, is blamed in the log
and skipped for that blob while other holders are left to ask (one that said it does not hold the
blob is skipped the same way, logged at INFO: `Holders.blame`). A try gets `request_timeout`
while other holders wait their turn, and the time left when it asks the last of them: a silent
holder costs one short try, an honest sole holder on a slow link is never cut short.

The host (p2p.host) may add holders of its own (those that announced it, then other connected
peers) to a try, and checks each piece against the hashes its holder declared and the whole blob
against the digest: a holder caught lying inside a try is named by the host (`host.blames`, a
warning) and dropped from it, its pieces asked of the others, so one liar among the holders of a
striped blob does not spoil the try (docs/P2P.md, "Piece hashes"). A try ends in DigestMismatch
only when no holder it reached served bytes that hash to the digest.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import trio

from node.peer.ports import HostPort, StorePort
from p2p import BlobNotHeld, DigestMismatch

log = logging.getLogger("swarm.peer")

RETRY_INTERVAL = 0.5  # seconds between two passes over a blob's holders (others may have appeared)
REQUEST_SHARE = 0.5  # of fetch_timeout: the longest one holder is asked while other holders wait their turn

# Asks `providers` (the first of them first) for a blob by hex digest, within `timeout` seconds.
Obtain = Callable[[str, list[str], float], Awaitable[bytes]]

_ORDER = random.SystemRandom()


def shuffled(holders: list[str]) -> list[str]:
    """`holders` in a random order."""
    return _ORDER.sample(holders, len(holders))


async def obtain(
    store: StorePort, host: HostPort, digest_hex: str, providers: list[str], *, max_size: int, timeout: float
) -> bytes:
    """A blob from our store, else fetched from `providers` (then anyone who announced it)."""
    data = store.get(digest_hex)
    if data is not None:
        return data
    return await host.fetch(digest_hex, providers=providers, max_size=max_size, timeout=timeout)


@contextlib.asynccontextmanager
async def round_fetches() -> AsyncIterator[trio.Nursery]:
    """A nursery for a round's prefetches (`Peer._prefetch`): they run on past the round's close,
    into the agreement step whose fetches join them, and are cancelled when the body ends. The
    body's own exception comes out as itself, not in an ExceptionGroup: the prefetches never raise
    (each catches its errors), and the callers of a round handle its errors by type (WrongRound:
    read the chain's round again)."""
    try:
        async with trio.open_nursery() as nursery:
            yield nursery
            nursery.cancel_scope.cancel()  # what is still running was not needed
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            only = group.exceptions[0]
            raise only from only.__cause__  # its own cause kept, the group's wrapping not shown
        raise


class Prefetch:
    """The two scopes of one round's prefetch (`Peer._prefetch`, a task in the round's
    `round_fetches` nursery): `watching` ends its loop that starts a fetch as each commit lands (the
    round closed: the fetches run on into the agreement step), `whole` ends the fetches too (a
    follower aggregates nothing). Either may be cancelled before the task entered it."""

    def __init__(self) -> None:
        self.whole = trio.CancelScope()
        self.watching = trio.CancelScope()


class BlobUnavailable(Exception):
    """No holder served the blob before the deadline."""


class Holders:
    """Who failed one blob (`what` names it in the log), and whom to ask next."""

    def __init__(self, what: str, *, order: Callable[[list[str]], list[str]] = shuffled) -> None:
        self.what = what
        self.blamed: dict[str, str] = {}  # holder -> what it did, skipped while others are left
        self.warned: set[str] = set()  # warned about once (a failure other than "not held"), then quietly
        self._order = order

    def fresh(self, known: list[str]) -> list[str]:
        """The holders of `known` not blamed, in a random order."""
        return self._order([h for h in dict.fromkeys(known) if h not in self.blamed])

    def next(self, known: list[str]) -> tuple[str | None, int]:
        """The holder to ask next and how many unblamed holders there are, itself included. Once
        every known holder is blamed they are all asked again: a busy holder may answer now, and a
        blob of several pieces may have failed for another holder's piece."""
        fresh = self.fresh(known)
        if not fresh:
            self.blamed.clear()
            fresh = self.fresh(known)
        return (fresh[0] if fresh else None), len(fresh)

    def blame(self, holder: str, exc: Exception) -> None:
        """Skip `holder` while others are left. Logged as a warning the first time it fails us, unless
        everyone asked said they do not hold the blob (BlobNotHeld): a committer's fetchers see its
        commit as soon as it does (at `chain.confirmations` deep) and ask before it has stored the blob,
        so that answer is "not yet" (logged at INFO); one that never serves is named by the agreement
        step (withheld, or left out: node/peer/agree.py)."""
        if isinstance(exc, DigestMismatch):
            deed = "served bytes that do not hash to the digest"
        else:
            deed = "does not hold it (yet)" if isinstance(exc, BlobNotHeld) else "served nothing"
        self.blamed[holder] = f"{deed}: {exc}"
        warn = holder not in self.warned and not isinstance(exc, BlobNotHeld)
        if warn:
            self.warned.add(holder)
        level = logging.WARNING if warn else logging.INFO
        log.log(level, "%s: holder %s %s (%s); asking the others first", self.what, holder, deed, exc)


async def fetch_from_holders(
    obtain: Obtain,
    digest_hex: str,
    holders: Holders,
    known: Callable[[], list[str]],
    *,
    deadline: float,
    request_timeout: float,
) -> bytes:
    """The blob `digest_hex` from the holders `known()` names (read again before every try),
    asked as the module says, until trio time `deadline`; BlobUnavailable after it."""
    while True:
        left = deadline - trio.current_time()
        candidates = known()
        holder, unblamed = holders.next(candidates)
        if left <= 0:
            raise BlobUnavailable(f"{holders.what}: no holder of {len(candidates)} served it in time")
        if holder is None:  # nobody known yet: announcements or attestations may name one
            await trio.sleep(min(RETRY_INTERVAL, left))
            continue
        try:
            return await obtain(digest_hex, [holder], left if unblamed == 1 else min(request_timeout, left))
        except Exception as exc:  # P2PError from the host; anything else a holder caused counts alike
            holders.blame(holder, exc)
        if not holders.fresh(candidates):  # a whole pass failed: give holders a moment
            await trio.sleep(min(RETRY_INTERVAL, max(0.0, deadline - trio.current_time())))
