"""What the round state machine needs of the world, and nothing more: the ledger client, the
libp2p host, the blob store, and a way to run blocking work off the event loop.

`node.chain.client.LedgerClient`, `p2p.host.SwarmHost` and the `p2p.store` stores satisfy these
Protocols structurally; the unit tests (tests/node/peer/fakes.py) satisfy them in memory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeAlias, TypeVar

from node.chain.records import Attestation, Commitment, RoundInfo, SwarmParams

T = TypeVar("T")

Receipt: TypeAlias = Mapping[str, Any]  # a mined transaction's receipt; the peer reads "gasUsed"

# Runs a blocking call without blocking the trio loop: `trio.to_thread.run_sync` in production.
RunSync: TypeAlias = Callable[[Callable[[], Any]], Awaitable[Any]]


class OffLoop(Protocol):
    """`fn(*args, **kwargs)`, a blocking call, run without blocking the trio loop: how the peer's
    rooms reach the ledger and run their computations (`Peer.chain`, which also waits out an RPC
    outage)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]: ...


class Account(Protocol):
    """The Ethereum account a ledger client sends its transactions from."""

    @property
    def address(self) -> str: ...


class LedgerPort(Protocol):
    """The SwarmLedger calls a peer makes (synchronous, like `LedgerClient`; the peer runs them
    through its RunSync). Refusals raise `node.chain.errors.LedgerError` subclasses."""

    @property
    def account(self) -> Account | None: ...  # None: a read-only client, of no use to a peer

    # views
    def block_number(self) -> int: ...  # cheap: peers poll it to learn when the chain moved
    def activity(self, from_block: int, to_block: int) -> bool: ...  # any ledger event in those blocks
    def params(self) -> SwarmParams: ...
    def peer_id_of(self, address: str) -> bytes: ...
    def registration_message(self, address: str) -> bytes: ...  # what the libp2p key signs to register
    def current_round(self) -> int: ...
    def last_finalized(self) -> tuple[int, bytes]: ...
    def finalized_digest(self, round: int) -> bytes | None: ...
    def round_info(self, round: int) -> RoundInfo: ...
    def participants(self, round: int) -> list[str]: ...
    def commitments(self, round: int) -> list[Commitment]: ...
    def commit_history(self, address: str, from_block: int | None = None) -> list[Commitment]: ...
    def attestations(self, round: int) -> list[Attestation]: ...

    # transactions
    def register(self, peer_id: bytes, signature: bytes) -> Receipt: ...
    def commit(
        self,
        round: int,
        digest: bytes,
        num_samples: int,
        eps_micro: int,
        mechanism: bytes,
        record_eps_micro: int = 0,
    ) -> Receipt: ...
    def close_round(self, round: int) -> Receipt: ...
    def attest(self, round: int, aggregate_digest: bytes, included: bytes) -> Receipt: ...
    def abort_round(self, round: int) -> Receipt: ...


class HostPort(Protocol):
    """The libp2p host as a peer uses it: announce what it holds, find and fetch blobs by
    digest (hex sha256), and count the bytes it moved. Fetch errors are `p2p.P2PError`s."""

    @property
    def peer_id_bytes(self) -> bytes: ...
    @property
    def bytes_served(self) -> int: ...
    @property
    def bytes_fetched(self) -> int: ...

    async def announce_blob(self, digest: str, *, later: bool = False) -> None: ...
    def blob_coming(self, digest: str) -> AbstractContextManager[None]: ...  # OPENs for it wait while it runs
    def providers(self, digest: str) -> list[str]: ...
    async def fetch(
        self, digest: str, *, providers: list[str] | None = None, max_size: int | None = None, timeout: float = 60.0
    ) -> bytes: ...


class StorePort(Protocol):
    """The peer's content-addressed blob store (the host serves from the same store)."""

    def put(self, data: bytes) -> str: ...
    def get(self, digest: str) -> bytes | None: ...
    def has(self, digest: str) -> bool: ...


class PoisonableStore(StorePort, Protocol):
    """A store that serves other bytes for some digests (`--fault wrong-bytes`, node/peer/faults.py)."""

    def poison(self, digest: str) -> None: ...
