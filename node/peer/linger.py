"""After its last round a peer serves on, for those who still need the round's model from it.

A follower of the last round, or a participant that saw the round end late (a loaded machine, a
lagging endpoint: once 29 s after the others in the testnet box), fetches the finalized model from
the peers that hold it. They used to leave after a fixed `linger` (5 s) and the late one then found no
holder. Now a peer serves at least `linger` seconds, and on, up to `linger_max`, while a participant of
the last round has not announced the model this peer holds (its HAVE: it holds the model, so it
needs nobody). Followers are not on the chain as such, so only the floor is theirs."""

from __future__ import annotations

import logging
from collections.abc import Collection

import trio

from node.peer.ports import HostPort

log = logging.getLogger(__name__)

CHECK_INTERVAL = 0.25  # seconds between looks at who announced the model (a dict lookup each)


def lacking(host: HostPort, digest: str, participants: Collection[str], me: str) -> list[str]:
    """The participants other than `me` that have not announced `digest`."""
    holders = set(host.providers(digest))
    return [p for p in participants if p != me and p not in holders]


async def serve_on(
    host: HostPort, digest: str | None, participants: Collection[str], me: str, *, floor: float, cap: float
) -> list[str]:
    """Return after `floor` seconds, or later (at most `cap` seconds in all) while a participant
    has not announced `digest`, the model of the last round this peer holds (None: it holds none,
    so only the floor is served). Returns the participants that had not announced it when it left."""
    await trio.sleep(floor)
    if digest is None:
        return []
    missing = lacking(host, digest, participants, me)
    if not missing or cap <= floor:
        return missing
    log.info(
        "serving on (at most %.0f s more): %d participant(s) of the last round have not announced its model %s",
        cap - floor,
        len(missing),
        digest[:16],
    )
    with trio.move_on_after(cap - floor) as waited:
        while lacking(host, digest, participants, me):
            await trio.sleep(CHECK_INTERVAL)
    missing = lacking(host, digest, participants, me)
    if waited.cancelled_caught and missing:
        log.warning("leaving after %.0f s: %s never announced the last round's model", cap, ", ".join(missing))
    return missing
