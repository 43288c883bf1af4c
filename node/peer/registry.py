"""The peer's view of the ledger's registrations: who may talk to it, and who owns which peer id
(rule 1 of the rulebook, node/rules.py)."""

from __future__ import annotations

import logging
import threading

import trio
from web3 import Web3

from node.chain.client import LOG_CHUNK_BLOCKS, LedgerClient
from node.chain.errors import LedgerError
from node.chain.pipelined import PipelinedClient
from node.chain.registration import Registration
from node.chain.subscription import ChainFeed, LedgerLog
from node.rules import PeerIdOwners, Verdict
from p2p import peer_id_from_bytes

log = logging.getLogger("swarm.node")

# the events a refresh reads: with a subscription, only a log of one of them calls for a refresh
REGISTRY_TOPICS = frozenset(
    bytes(Web3.keccak(text=e)) for e in ("Registered(address,bytes,bytes)", "AllowlistChanged(address,bool)")
)
# with a subscription, a refresh at least this often anyway (seconds): a safety net, not the way
# a registration is seen
REFRESH_ANYWAY_S = 60.0


class RegistryCache:
    """The admission predicate p2p asks on every stream and message: is this libp2p peer
    registered on the ledger, with a registration its own key signed, by an account the allowlist
    has not removed? Refreshed from the chain in the background, reading only the blocks after the
    last one it scanned (Registered and AllowlistChanged logs; never past a block the endpoint does
    not serve); unknown peers are refused until the next refresh sees them. A peer id is admitted
    once it has an owner (`rules.PeerIdOwners`: the first registration of it whose signature
    verifies); squatters' registrations, which cannot be signed by the peer id's key, own nothing.
    `disallow` refuses the owner's peer id from the next refresh on, `allow` admits it again.
    `ownership` answers rule 1 for the peer's vetting."""

    def __init__(self, ledger: LedgerClient | PipelinedClient) -> None:
        self.ledger = ledger
        self.allowed: set[str] = set()
        self.book: PeerIdOwners | None = None  # from the first refresh (it needs the chain id)
        self.removed: set[str] = set()  # accounts (lower case) the allowlist removed, until allowed again
        self.ignored = 0  # registrations that own nothing
        self.scanned_to: int | None = None  # last block whose logs were read
        self._lock = threading.Lock()  # the background refresh and `ownership` (from the peer's threads)

    def __call__(self, peer_id: str) -> bool:
        return peer_id in self.allowed

    @property
    def owners(self) -> dict[bytes, Registration]:
        """peer id -> the registration that owns it, as of the last refresh."""
        return self.book.owners if self.book is not None else {}

    def ownership(self, address: str, peer_id: bytes) -> Verdict | None:
        """Rule 1 for a commit from `address` with registered peer id `peer_id` (blocking). A
        committer's registration precedes its commit, so one refresh makes the answer final."""
        if self.book is None or not self.book.knows(address):
            self.refresh()
        assert self.book is not None  # made by the refresh
        return self.book.verdict(address, peer_id)

    def refresh(self) -> None:
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        # the head is held to monotonic, bounded progress (rawrpc.HeadGuard), and the block this
        # scan will record as read must be one the endpoint serves: a head made up within the guard's
        # credit would otherwise skip the registrations and removals of every block up to it, for good
        latest = self.ledger.block_number()
        start = self.ledger.params().deploy_block if self.scanned_to is None else self.scanned_to + 1
        if latest < start:
            return
        if self.ledger.block_hash(latest) is None:
            raise LedgerError(f"the RPC reported head block {latest} but serves no such block: not scanned")
        if self.book is not None and latest - start < LOG_CHUNK_BLOCKS and not self.ledger.activity(start, latest):
            # no event of the ledger at all in these blocks, so no registration or removal: one raw
            # eth_getLogs instead of two decoded by web3 (most of a waiting peer's CPU, every 2 s);
            # a longer range (after an outage) is read in chunks below, each answer bounded
            self.scanned_to = latest
            return
        if self.book is None:
            self.book = PeerIdOwners(self.ledger.chain_id(), self.ledger.address)
        for reg in self.book.add(self.ledger.registrations(start, latest)):
            self.ignored += 1
            log.warning(
                "ignoring the registration of %s: it does not own peer id 0x%s (not signed by its key, or not first)",
                reg.address,
                reg.peer_id.hex(),
            )
        for account, allowed in self.ledger.allowlist_changes(start, latest):
            (self.removed.discard if allowed else self.removed.add)(account.lower())
        self.allowed = {
            peer_id_from_bytes(pid) for pid, reg in self.book.owners.items() if reg.address.lower() not in self.removed
        }
        self.scanned_to = latest

    async def keep_fresh(self, interval: float = 2.0, feed: ChainFeed | None = None) -> None:
        """Refresh every `interval` seconds; while `feed`'s subscription runs, only once a pushed
        Registered or AllowlistChanged log is as deep as the ledger client reads (its
        confirmations), when the subscription (re)starts, and every REFRESH_ANYWAY_S."""
        due = trio.Event()
        deep_at: list[int] = []  # head at which a pushed registry log is deep enough to be read

        def on_log(entry: LedgerLog) -> None:
            if entry.topic in REGISTRY_TOPICS:
                deep_at.append(entry.block + self.ledger.confirmations)
                on_head(feed.head if feed is not None and feed.head is not None else 0)

        def on_head(head: int) -> None:
            if deep_at and min(deep_at) <= head:
                deep_at.clear()  # the refresh reads every block up to the head, these included
                due.set()

        if feed is not None:
            feed.on_log(on_log)
            feed.on_head(on_head)
            feed.on_live(lambda _: due.set())
        while True:  # ends when the owning nursery is cancelled at shutdown
            try:
                await trio.to_thread.run_sync(self.refresh)
            except Exception as exc:  # a transient RPC error must not take the peer down
                log.warning("registry refresh failed: %s", exc)
                await trio.sleep(interval)
                continue
            if feed is not None and feed.live:
                with trio.move_on_after(REFRESH_ANYWAY_S):
                    await due.wait()
                due = trio.Event()
            else:
                await trio.sleep(interval)
