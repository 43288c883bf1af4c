"""Piece hashes and the state of one blob fetch striped over several holders.

A blob is cut into pieces of `wire.PIECE_SIZE` bytes; a holder answers OPEN with the blob's size and the
sha256 of every piece (its *piece list*). The digest a fetch asks for stays the sha256 of the whole blob,
as the ledger commits it, so a piece list cannot be checked against the digest before the pieces are in.
What makes the scheme sound (the argument in full: docs/P2P.md, "Piece hashes"):

- Every piece is checked, as it arrives, against the list its sender declared. An honest holder's
  pieces always match its own list, so a mismatch proves the sender lied: it is blamed, dropped from the
  fetch, and the piece is asked of another holder.
- The lists themselves are claims. Holders are grouped by the list they declared; the fetch follows the
  list declared by the most holders still in it. Once every piece matches the followed list, the whole
  blob's sha256 decides: equal to the digest, the list is the blob's and every holder that declared
  another one lied; different, the followed list is not the blob's (pieces matching the blob's own list
  make the blob) and every holder that declared it lied. Either way a holder is blamed only on proof.
- For a blob of one piece the list is the digest itself, so a false one is refused at once.

Pieces verified under one list are kept when the fetch moves to another list that has the same hash
at that index: only the pieces on which two lists disagree are fetched twice.
"""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import trio

from . import wire


class HolderFailed(Exception):
    """One holder could not serve the blob; the fetch moves on to the others."""

    def __init__(self, reason: str, declared_size: int | None = None) -> None:
        super().__init__(reason)
        self.declared_size = declared_size


class HolderLied(HolderFailed):
    """A holder's answer contradicts its own piece list or the digest: it is blamed."""


class HolderDoesNotHold(HolderFailed):
    """A holder answered NOT_FOUND to the OPEN: it does not hold the blob (or not yet)."""


def piece_range(size: int, index: int) -> tuple[int, int]:
    """(offset, length) of piece `index` of a blob of `size` bytes."""
    offset = index * wire.PIECE_SIZE
    return offset, min(wire.PIECE_SIZE, size - offset)


def piece_hashes(read: Callable[[int, int], bytes | None], size: int) -> bytes | None:
    """The concatenated sha256 of each piece of a blob of `size` bytes, reading it with `read(offset,
    length)`; None if a read comes back short (the blob went away meanwhile)."""
    hashes = []
    for index in range(wire.piece_count(size)):
        offset, length = piece_range(size, index)
        data = read(offset, length)
        if data is None or len(data) != length:
            return None
        hashes.append(hashlib.sha256(data).digest())
    return b"".join(hashes)


@dataclass(frozen=True)
class PieceList:
    """What a holder declared for a blob: its size and the sha256 of each of its pieces."""

    size: int
    hashes: bytes  # DIGEST_SIZE bytes per piece, in order

    @property
    def count(self) -> int:
        return len(self.hashes) // wire.DIGEST_SIZE

    def hash(self, index: int) -> bytes:
        return self.hashes[index * wire.DIGEST_SIZE : (index + 1) * wire.DIGEST_SIZE]

    def range(self, index: int) -> tuple[int, int]:
        return piece_range(self.size, index)


class PieceFetch:
    """The state of one blob fetch shared by the holders serving it at once.

    Pieces of the followed list (`current`) are handed out on demand (`take`), so a fast holder takes
    more of them than a slow one; a holder has at most min(`pipeline_depth`, `share`) pieces outstanding,
    `share` being its part of the blob when split among `spread` holders, so even a blob of a few pieces
    is split. Once no piece is left to hand out, an idle holder takes a duplicate of a piece still
    outstanding at another holder (at most one duplicate per piece), so a holder that slowed down does
    not hold up the end; whichever verified copy arrives first is kept. Pieces of a holder that fails go
    back to the front of the queue (`give_back`). Only holders that declared the followed list are
    handed pieces; the others wait (`follows`) until the fetch moves to their list."""

    def __init__(self, digest: str, limit: int, spread: int, blamed: Callable[[str, str], None]) -> None:
        self.digest = digest
        self.limit = limit
        self.spread = spread  # holders the pieces are shared among
        self._blamed_hook = blamed  # told (holder, reason) at each blame
        self.changed = trio.Event()  # set when the followed list changes, pieces come back or a holder ends
        self.claims: dict[str, PieceList] = {}  # holder -> the list it declared
        self.refuted: set[PieceList] = set()  # lists whose complete pieces did not hash to the digest
        self.blamed: dict[str, str] = {}  # holder -> what it did (proved): dropped from this fetch
        self.failures: dict[str, str] = {}  # holder -> why it could not serve (nothing proved)
        self.not_held: set[str] = set()  # the holders of `failures` that answered NOT_FOUND
        self.declared: dict[str, int] = {}  # holder -> a size it declared above the limit
        self.contributors: dict[str, None] = {}  # holders whose pieces are in the buffer (in order)
        self.received = 0  # verified bytes put in the buffer, all lists together
        self.current: PieceList | None = None  # the list followed now
        self.confirmed = False  # the whole blob hashed to the digest: the followed list is the blob's
        self._held: PieceList | None = None  # the list the buffer's pieces were verified against
        self.buffer = bytearray()
        self.have: list[bool] = []  # per piece of _held: in the buffer, verified
        self.missing = 0
        self.share = 1  # pieces one holder may have outstanding: about 1/spread of the blob
        self.pending: collections.deque[int] = collections.deque()  # piece indices not yet handed out
        self.outstanding: dict[int, set[str]] = {}  # piece index -> holders asked

    @property
    def complete(self) -> bool:
        """Every piece of the followed list is in, verified against it."""
        return self.current is not None and self.missing == 0

    def follows(self, holder: str) -> bool:
        """Whether `holder` declared the list followed now (and is not blamed)."""
        return self.current is not None and holder not in self.blamed and self.claims.get(holder) == self.current

    # ---- declarations ---------------------------------------------------------------------
    def declare(self, holder: str, size: int, hashes: bytes) -> None:
        """Record what `holder` answered to OPEN. Raises HolderFailed for a size above the limit and
        HolderLied for a list that is provably not the blob's."""
        if size > self.limit:
            raise HolderFailed(f"declares {size} bytes, above the limit of {self.limit}", size)
        claim = PieceList(size, hashes)
        earlier = self.claims.get(holder)
        if earlier is not None and earlier != claim:
            raise HolderLied("declared two different piece lists for one digest")
        # A blob of one piece: that piece's hash is the blob's sha256, so it must be the digest.
        whole = hashes if claim.count == 1 else hashlib.sha256(b"").digest() if claim.count == 0 else None
        if whole is not None and whole.hex() != self.digest:
            raise HolderLied("declared a blob of one piece whose hash is not the digest")
        if claim in self.refuted:
            raise HolderLied("declared piece hashes whose pieces do not hash to the digest")
        self.claims[holder] = claim
        self._choose()

    def fail(self, holder: str, exc: HolderFailed) -> None:
        """`holder` stopped serving this fetch: blamed for a lie, else counted as a failure."""
        if isinstance(exc, HolderLied):
            self.blame(holder, str(exc))
        else:
            self.failures[holder] = str(exc)
            if isinstance(exc, HolderDoesNotHold):
                self.not_held.add(holder)
            else:
                self.not_held.discard(holder)
            if exc.declared_size is not None:
                self.declared[holder] = exc.declared_size
            self._choose()

    def blame(self, holder: str, reason: str) -> None:
        """Drop `holder` from this fetch for `reason` (proved): the pieces outstanding at it alone wait
        to be handed out again, so an honest holder gone idle takes them (not only a duplicate taker
        that may stall in turn)."""
        if holder in self.blamed:
            return
        self.blamed[holder] = reason
        self._blamed_hook(holder, reason)
        for index, asked in list(self.outstanding.items()):
            if holder in asked:
                asked.discard(holder)
                if not asked:
                    del self.outstanding[index]
                    self.pending.appendleft(index)
        self.changed.set()
        self._choose()

    def _support(self, claim: PieceList) -> int:
        """Holders still in the fetch that declared `claim`."""
        return sum(1 for h, c in self.claims.items() if c == claim and h not in self.blamed and h not in self.failures)

    def _choose(self) -> None:
        """Follow the unrefuted list most holders still in the fetch declared; the current one on a tie."""
        if self.confirmed:
            return
        support = {c: self._support(c) for c in set(self.claims.values()) - self.refuted}
        best = max(support.values(), default=0)
        if self.current is not None and support.get(self.current, 0) == best > 0:
            return
        ranked = [c for c, n in support.items() if n == best and best > 0]
        # Ties between new lists: the one declared first (claims keep declaration order).
        first = next((c for c in self.claims.values() if c in ranked), None)
        self._follow(first)

    def _follow(self, claim: PieceList | None) -> None:
        """Make `claim` the followed list, keeping every verified piece it shares with the buffer's list."""
        self.current = claim
        self.changed.set()
        if claim is None or claim == self._held:
            if claim is not None:
                self._requeue()
            return
        old, old_buffer, old_have = self._held, self.buffer, self.have
        self._held = claim
        self.buffer = bytearray(claim.size) if old is None or old.size != claim.size else old_buffer
        self.have = [False] * claim.count
        for index in range(claim.count):
            kept = old is not None and index < old.count and old_have[index] and old.hash(index) == claim.hash(index)
            if kept and old is not None and old.range(index) == claim.range(index):
                offset, length = claim.range(index)
                if self.buffer is not old_buffer:
                    self.buffer[offset : offset + length] = old_buffer[offset : offset + length]
                self.have[index] = True
        self.missing = self.have.count(False)
        self.share = max(1, math.ceil(self.missing / self.spread))
        self._requeue()

    def _requeue(self) -> None:
        """Every missing piece of the followed list waits to be handed out again."""
        self.outstanding.clear()
        self.pending = collections.deque(i for i, got in enumerate(self.have) if not got)

    # ---- pieces ---------------------------------------------------------------------------
    def take(self, holder: str, in_flight: int) -> int | None:
        """The next piece for `holder` (which has `in_flight` pieces outstanding) to ask for, or None.
        A holder has at most `share` pieces outstanding, so a small blob (fewer pieces than
        pipeline_depth) is still split among the holders instead of going to the first one."""
        if not self.follows(holder):
            return None
        while self.pending and self.have[self.pending[0]]:  # came in meanwhile from a list followed before
            self.pending.popleft()
        if self.pending and in_flight < self.share:
            index = self.pending.popleft()
            self.outstanding[index] = {holder}
            return index
        if in_flight == 0:  # the end of the fetch: duplicate a piece another holder has not delivered yet
            for index, asked in self.outstanding.items():
                if holder not in asked and len(asked) < 2:
                    asked.add(holder)
                    return index
        return None

    def arriving(self, holder: str, index: int) -> None:
        """Piece `index` comes from `holder` unasked (with its SIZE: a FIRST request): outstanding there,
        as if `take` had handed it out, when the followed list still misses it. Else it is taken as it
        comes (`deliver` keeps what the followed list can use, checks it against the holder's list)."""
        if not self.follows(holder) or self.have[index]:
            return
        if index in self.pending:
            self.pending.remove(index)
        self.outstanding.setdefault(index, set()).add(holder)

    def deliver(self, holder: str, index: int, data: memoryview) -> None:
        """Piece `index` from `holder`: checked against the hash `holder` declared for it (HolderLied if
        it differs), then kept if the followed list has the same hash there and the piece is missing.
        Hashed in the event loop, like the whole blob: a worker thread per piece measured slower on a
        loaded machine (docs/P2P.md, "Piece hashes")."""
        claim = self.claims[holder]
        if hashlib.sha256(data).digest() != claim.hash(index):
            raise HolderLied(f"served piece {index} not matching the hash it declared for it")
        held = self._held
        if held is None or index >= held.count or held.hash(index) != claim.hash(index):
            return  # a piece of a list no longer followed, and not shared with the followed one
        offset, length = held.range(index)
        if length != len(data):
            return
        self.outstanding.pop(index, None)
        if self.have[index]:
            return  # a duplicate that arrived second
        self.buffer[offset : offset + length] = data
        self.have[index] = True
        self.missing -= 1
        self.received += length
        self.contributors[holder] = None

    def give_back(self, holder: str, unfinished: collections.deque[int]) -> None:
        """Pieces `holder` will not deliver: requeued unless another holder is fetching them too."""
        for index in reversed(unfinished):
            asked = self.outstanding.get(index)
            if asked is None or holder not in asked:
                continue  # delivered by another holder meanwhile, or handed out anew since
            asked.discard(holder)
            if not asked:
                del self.outstanding[index]
                self.pending.appendleft(index)
                self.changed.set()

    def finish(self) -> bytes | None:
        """Once `complete`: the blob if its sha256 is the digest (every holder that declared another
        list is blamed), else None with the followed list refuted and its holders blamed."""
        assert self.current is not None
        data = bytes(self.buffer)
        # One piece (or none): `declare` held its hash to the digest and `deliver` the piece to its hash.
        if self.current.count <= 1 or hashlib.sha256(data).hexdigest() == self.digest:
            self.confirmed = True
            for holder, claim in self.claims.items():
                if claim != self.current:
                    self.blame(holder, "declared piece hashes that are not the blob's")
            return data
        refuted = self.current
        self.refuted.add(refuted)
        for holder, claim in list(self.claims.items()):
            if claim == refuted:
                self.blame(holder, "served pieces matching its piece hashes that together do not hash to the digest")
        self._choose()
        return None
