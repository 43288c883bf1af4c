"""How a failed try at one holder is logged and skipped (node/peer/fetching.py `Holders.blame`). A
holder that said it does not hold the blob (`BlobNotHeld`: a committer asked between its commit and
storing its blob, which its fetchers see at the same depth) is logged at INFO, never as a warning;
any other failure (silence, a refusal, other bytes) warns once per holder, then at INFO. Either way
the holder is skipped while others are left."""

from __future__ import annotations

import logging

from node.peer.fetching import Holders
from p2p import BlobNotFound, BlobNotHeld, DigestMismatch

WHAT = "round 1: blob abab of participant 2"


def blames(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if "asking the others first" in r.getMessage()]


def test_not_held_is_info_and_other_failures_warn_once_per_holder(caplog):
    holders = Holders(WHAT, order=list)
    with caplog.at_level(logging.INFO, logger="swarm.peer"):
        holders.blame("A", BlobNotHeld("blob abab: no provider served it (A: not found: abab)"))
        holders.blame("A", BlobNotHeld("blob abab: no provider served it (A: not found: abab)"))
        holders.blame("A", BlobNotFound("blob abab: no provider served it (A: no answer within 5s)"))
        holders.blame("A", BlobNotFound("blob abab: no provider served it (A: no answer within 5s)"))
        holders.blame("B", DigestMismatch("blob abab: no holder served bytes that hash to it"))
    logged = blames(caplog)
    assert [level for level, _ in logged] == [logging.INFO] * 2 + [logging.WARNING, logging.INFO, logging.WARNING]
    assert all("holder A does not hold it (yet)" in text for _, text in logged[:2])
    assert "holder A served nothing" in logged[2][1] and logged[2][1].startswith(WHAT)
    assert "holder B served bytes that do not hash to the digest" in logged[4][1]


def test_a_holder_that_does_not_hold_it_is_skipped_while_others_are_left():
    holders = Holders(WHAT, order=list)
    holders.blame("A", BlobNotHeld("blob abab: no provider served it (A: not found: abab)"))
    assert holders.next(["A", "C"]) == ("C", 1)
    holders.blame("C", BlobNotHeld("blob abab: no provider served it (C: not found: abab)"))
    assert holders.next(["A", "C"]) == ("A", 2)  # everyone failed: all are asked again (one may hold it now)
