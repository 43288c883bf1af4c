"""A second RPC endpoint as a witness of the first (`swarm node --rpc-url A --rpc-url B`).

A peer trusts what its endpoint answers; one that lies (a made-up receipt, a chain of its own)
can make it act on a chain that is not the swarm's. With a witness the peer holds the two to one
chain: their chain ids, the hash of a block both have (REORG_DEPTH below the lower head, read
again once before it counts, so a reorganisation at the tip is not taken for a lie; every
CHECK_INTERVAL seconds), and its own commit, which the witness's `Committed` events must hold once
the witness has reached the commit's block. When they disagree the peer stops acting
(`EndpointsDisagree`: `swarm node` ends in one line, exit status 2); which of the two lies it
cannot know. A witness that does not answer is only logged: the peer's deadlines are on its
primary endpoint.
"""

from __future__ import annotations

import logging
import time

import trio

from node.chain.client import LedgerClient
from node.chain.errors import LedgerError

log = logging.getLogger("swarm.node")

REORG_DEPTH = 3  # blocks below the lower of the two heads where they are compared
CHECK_INTERVAL = 2.0  # seconds between two comparisons
COMMIT_LAG = 60.0  # seconds the witness may take to reach the block of our commit
LAG_POLL = 0.5  # seconds between two looks at a lagging witness


class EndpointsDisagree(RuntimeError):
    """The two RPC endpoints answered differently about the same chain: the peer stops."""


def _hex(value: bytes | None) -> str:
    return "no block" if value is None else "0x" + value.hex()


class Witness:
    """The peer's `primary` ledger client held to a second endpoint's, `witness` (read-only);
    `urls` names the two in what is said."""

    def __init__(self, primary: LedgerClient, witness: LedgerClient, urls: tuple[str, str]) -> None:
        self.primary = primary
        self.witness = witness
        self.urls = urls
        self._suspect: tuple[int, bytes | None, bytes | None] | None = None  # a difference seen once

    def _disagree(self, what: str) -> EndpointsDisagree:
        a, b = self.urls
        return EndpointsDisagree(
            f"the RPC endpoints {a} and {b} disagree: {what}; one of them lies or they serve different chains, "
            "so this peer stops"
        )

    def compare_chains(self) -> None:
        """Their chain ids, then one block both have (blocking)."""
        ids = self.primary.chain_id(), self.witness.chain_id()
        if ids[0] != ids[1]:
            raise self._disagree(f"chain id {ids[0]} against {ids[1]}")
        self.compare_blocks()

    def compare_blocks(self) -> None:
        """The hash of a block both endpoints have, REORG_DEPTH below the lower head (blocking).
        A difference counts when it is seen again at the next comparison of the same block."""
        if self._suspect is not None:
            height = self._suspect[0]
        else:
            height = min(self.primary.block_number(), self.witness.block_number()) - REORG_DEPTH
            if height < 0:
                return
        found = height, self.primary.block_hash(height), self.witness.block_hash(height)
        if found[1] == found[2] and found[1] is not None:
            self._suspect = None
            return
        if self._suspect is None:
            log.info("the RPC endpoints differ on block %d; reading it again before that counts", height)
            self._suspect = found
            return
        raise self._disagree(f"block {height} is {_hex(found[1])} at the first and {_hex(found[2])} at the second")

    async def watch(self) -> None:
        """Compare the two every CHECK_INTERVAL, for the peer's life (EndpointsDisagree ends it)."""
        while True:
            try:
                await trio.to_thread.run_sync(self.compare_blocks)
            except LedgerError as exc:  # an endpoint that does not answer: the peer's own deadlines decide
                log.warning("comparing the two RPC endpoints failed, trying again: %s", exc)
            await trio.sleep(CHECK_INTERVAL)

    def confirm_commit(self, r: int, address: str, digest: bytes, block: int) -> None:
        """Our commit of `digest` in round r, which the primary holds in `block`, must be in the
        witness's Committed events once the witness has reached that block (blocking). Reads that
        fail are tried again for COMMIT_LAG seconds (logs may lag a block); after that a witness
        that reached the block without showing the commit disagrees, one that never reached it is
        only logged."""
        deadline = time.monotonic() + COMMIT_LAG
        reached = False
        while True:
            try:
                if self.witness.block_number() >= block:
                    reached = True
                    if any(c.peer == address and bytes(c.digest) == digest for c in self.witness.commitments(r)):
                        return
                    raise self._disagree(
                        f"our commit of round {r} ({digest.hex()[:16]}) is in block {block} of the "
                        "first, not on the second"
                    )
            except LedgerError as exc:
                log.debug("the witness endpoint could not be read: %s", exc)
            if time.monotonic() >= deadline:
                if reached:
                    raise self._disagree(
                        f"our commit of round {r} ({digest.hex()[:16]}) is in block {block} of the first; the second "
                        f"reached that block but its logs do not show the commit within {COMMIT_LAG:g} s"
                    )
                log.warning(
                    "the witness endpoint %s did not reach block %d within %g s: our commit of round %d is not "
                    "checked there",
                    self.urls[1],
                    block,
                    COMMIT_LAG,
                    r,
                )
                return
            time.sleep(LAG_POLL)
