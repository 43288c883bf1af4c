"""In-memory stand-ins for the ledger and the libp2p host, for unit tests of the round state
machine's event orders only (the real chain and network are exercised by tests/e2e).

`FakeChain` keeps the SwarmLedger's round rules (contracts/SwarmLedger.sol): OPEN -> CLOSED ->
FINALIZED or ABORTED, commitments in order, a strict majority of participants attesting the same
(digest, bitmap) finalizes, refusals raise the client's `node.chain.errors` classes. Blocks follow
a clock (`now`, trio's mock clock in the tests), and so do their timestamps: a window's seconds
(block_time x its blocks) pass with its blocks. `FakeLedger` is one account's client on it.

`FakeNetwork` connects `FakeHost`s: a fetch asks the providers it is given, then those that
announced the digest (a fake host dials nobody else), and every transfer takes the digest's
delay in trio time; a host can be unreachable, a transfer can stall forever.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from node.chain import errors
from node.chain.records import Attestation, Commitment, RoundInfo, RoundState, SwarmParams
from node.chain.registration import registration_message
from node.protocol.wire import encode_bitmap
from p2p import BlobNotFound, BlobTooLarge, DigestMismatch, FetchTimeout, peer_id_from_bytes
from p2p.store import MemoryBlobStore, sha256_hex

GAS = 50_000  # what every fake receipt reports
FAKE_CHAIN_ID = 31337  # what a fake ledger's registration message names
FAKE_LEDGER = "0x" + "5a" * 20


@dataclass
class _Round:
    number: int
    opened_block: int
    base_round: int  # last finalized round when this one opened (0 = genesis)
    state: RoundState = RoundState.OPEN
    closed_block: int = 0
    ended_block: int = 0
    commitments: list[Commitment] = field(default_factory=list)
    attestations: list[Attestation] = field(default_factory=list)
    votes: Counter[tuple[bytes, bytes]] = field(default_factory=Counter)
    outcome: bytes | None = None  # the finalized digest


@dataclass
class _Account:
    peer_id: bytes
    eps_micro: int = 0
    record_eps_micro: int = 0
    last_commit_round: int = 0
    last_attest_round: int = 0


class FakeChain:
    """The ledger's state and rules, in memory. Create it inside trio when `now` is trio's clock."""

    def __init__(
        self,
        *,
        genesis_digest: bytes,
        min_peers: int,
        commit_window: int = 5,
        attest_window: int = 40,
        eps_cap_micro: int = 10**12,
        eps_step_micro: int = 0,
        record_eps_cap_micro: int = 0,
        max_samples: int = 2**32 - 1,
        now: Callable[[], float] = trio.current_time,
        block_time: float = 1.0,
        secure_aggregation: bool = False,
    ) -> None:
        self._now, self._block_time = now, block_time
        self.params = SwarmParams(
            min_peers,
            commit_window,
            attest_window,
            eps_cap_micro,
            0,
            eps_step_micro,
            record_eps_cap_micro,
            10**13 if record_eps_cap_micro else 0,
            genesis_digest,
            False,
            "0x0",
            0,
            max_samples,
            math.ceil(commit_window * block_time),
            math.ceil(attest_window * block_time),
            secure_aggregation,
        )
        self.accounts: dict[str, _Account] = {}
        self.signatures: dict[str, bytes] = {}  # registration signatures, unchecked like on chain
        self.rounds = [_Round(1, self.block_number(), 0)]
        self.transactions: list[tuple[float, str, str, int]] = []  # (time, sender, function, round) of mined ones
        self._lock = threading.Lock()

    def block_number(self) -> int:
        return int(self._now() / self._block_time)

    def _time(self, block: int) -> int:
        """A block's timestamp (0 for block 0: a round not closed yet)."""
        return int(block * self._block_time)

    @property
    def live(self) -> _Round:
        return self.rounds[-1]

    def round(self, r: int) -> _Round:
        if r == 0 or r > self.live.number:
            raise errors.WrongRound(given=r, current=self.live.number)
        return self.rounds[r - 1]

    def base_round(self) -> int:
        return self.live.base_round

    # ---------------------------------------------------------------- transactions
    def register(self, sender: str, peer_id: bytes, signature: bytes = b"") -> dict[str, int]:
        # like the contract: peer ids are not unique, the signature is kept unchecked (off chain)
        with self._lock:
            if sender in self.accounts:
                raise errors.AlreadyRegistered(account=sender)
            if not 0 < len(peer_id) <= 128:
                raise errors.InvalidPeerId(length=len(peer_id))
            if len(signature) > 128:
                raise errors.InvalidSignature(length=len(signature))
            self.accounts[sender] = _Account(bytes(peer_id))
            self.signatures[sender] = bytes(signature)
            return self._mined(sender, "register", 0)

    def commit(
        self,
        sender: str,
        r: int,
        digest: bytes,
        num_samples: int,
        eps_micro: int,
        mechanism: bytes,
        record_eps_micro: int = 0,
    ) -> dict[str, int]:
        with self._lock:
            account = self.accounts.get(sender)
            if account is None:
                raise errors.NotRegistered(account=sender)
            live = self.live
            if r != live.number:
                raise errors.WrongRound(given=r, current=live.number)
            if account.last_commit_round == r:
                raise errors.AlreadyCommitted(round=r, peer=sender)
            window_over = self.block_number() > live.opened_block + self.params.commit_window
            if live.state is not RoundState.OPEN or (window_over and len(live.commitments) >= self.params.min_peers):
                raise errors.CommitWindowClosed(round=r)
            step = self.params.eps_step_micro
            if step and eps_micro != account.eps_micro + step:
                raise errors.EpsNotPolicy(expectedMicro=account.eps_micro + step, givenMicro=eps_micro)
            if eps_micro < account.eps_micro:
                raise errors.EpsDecreasing(previousMicro=account.eps_micro, givenMicro=eps_micro)
            if eps_micro > self.params.eps_cap_micro:
                raise errors.EpsOverCap(givenMicro=eps_micro, capMicro=self.params.eps_cap_micro)
            if record_eps_micro < account.record_eps_micro:
                raise errors.RecordEpsDecreasing(previousMicro=account.record_eps_micro, givenMicro=record_eps_micro)
            if record_eps_micro > self.params.record_eps_cap_micro:
                raise errors.RecordEpsOverCap(givenMicro=record_eps_micro, capMicro=self.params.record_eps_cap_micro)
            if int.from_bytes(digest, "big") <= 1 or len(digest) != 32:
                raise errors.InvalidDigest(digest=bytes(digest).hex())
            if num_samples < 1:
                raise errors.InvalidNumSamples(numSamples=num_samples)
            if num_samples > self.params.max_samples:
                raise errors.NumSamplesOverCap(numSamples=num_samples, maxSamples=self.params.max_samples)
            if any(c.digest == bytes(digest) for c in live.commitments):
                raise errors.DuplicateDigest(round=r, digest=bytes(digest).hex())
            account.eps_micro, account.last_commit_round = eps_micro, r
            account.record_eps_micro = record_eps_micro
            index = len(live.commitments)
            block = self.block_number()
            live.commitments.append(
                Commitment(
                    sender, index, bytes(digest), num_samples, eps_micro, bytes(mechanism), block, record_eps_micro, r
                )
            )
            return self._mined(sender, "commit", r)

    def close_round(self, sender: str, r: int) -> dict[str, int]:
        with self._lock:
            live = self.live
            if r != live.number:
                raise errors.WrongRound(given=r, current=live.number)
            if live.state is not RoundState.OPEN:
                raise errors.RoundNotOpen(round=r, state=live.state.name)
            last_block = live.opened_block + self.params.commit_window
            if self.block_number() <= last_block and len(live.commitments) < len(self.accounts):
                ends_at = self._time(live.opened_block) + self.params.commit_window_seconds
                raise errors.CommitWindowOpen(round=r, lastBlock=last_block, endsAt=ends_at)
            if len(live.commitments) < self.params.min_peers:
                raise errors.QuorumNotMet(round=r, committed=len(live.commitments), minPeers=self.params.min_peers)
            live.state, live.closed_block = RoundState.CLOSED, self.block_number()
            return self._mined(sender, "closeRound", r)

    def attest(self, sender: str, r: int, digest: bytes, included: bytes) -> dict[str, int]:
        with self._lock:
            past = self._check_closed(r)
            if past is not None:
                raise errors.RoundNotClosed(round=r, state=past.name)
            live = self.live
            account = self.accounts.get(sender)
            if account is None or account.last_commit_round != r:
                raise errors.NotParticipant(round=r, account=sender)
            if account.last_attest_round == r:
                raise errors.AlreadyAttested(round=r, peer=sender)
            if int.from_bytes(digest, "big") <= 1 or len(digest) != 32:
                raise errors.InvalidDigest(digest=bytes(digest).hex())
            count = len(live.commitments)
            expected = (count + 7) // 8
            if len(included) != expected or (count % 8 and included[-1] >> (count % 8)):
                raise errors.MalformedBitmap(round=r, length=len(included), expectedLength=expected)
            account.last_attest_round = r
            key = (bytes(digest), bytes(included))
            live.votes[key] += 1
            votes = live.votes[key]
            live.attestations.append(Attestation(sender, key[0], key[1], votes, self.block_number()))
            receipt = self._mined(sender, "attest", r)
            if 2 * votes > count:
                live.state, live.outcome = RoundState.FINALIZED, key[0]
                self._open_next(base_round=r)
            return receipt

    def abort_round(self, sender: str, r: int) -> dict[str, int]:
        with self._lock:
            past = self._check_closed(r)
            if past is RoundState.FINALIZED:
                raise errors.RoundAlreadyFinalized(round=r)
            if past is not None:
                raise errors.RoundNotClosed(round=r, state=past.name)
            last_block = self.live.closed_block + self.params.attest_window
            if self.block_number() <= last_block:
                ends_at = self._time(self.live.closed_block) + self.params.attest_window_seconds
                raise errors.AbortTooEarly(round=r, lastBlock=last_block, endsAt=ends_at)
            self.live.state = RoundState.ABORTED
            receipt = self._mined(sender, "abortRound", r)
            self._open_next(base_round=self.live.base_round)
            return receipt

    def _check_closed(self, r: int) -> RoundState | None:
        """None if round r is the live round and closed; else the state that refuses it."""
        state = self.round(r).state
        return None if r == self.live.number and state is RoundState.CLOSED else state

    def _open_next(self, *, base_round: int) -> None:
        block = self.block_number()
        self.live.ended_block = block
        self.rounds.append(_Round(self.live.number + 1, block, base_round))

    def _mined(self, sender: str, fn: str, r: int) -> dict[str, int]:
        self.transactions.append((self._now(), sender, fn, r))
        return {"gasUsed": GAS, "blockNumber": self.block_number()}

    # ---------------------------------------------------------------- views
    def round_info(self, r: int) -> RoundInfo:
        rnd = self.round(r)
        n = len(rnd.commitments)
        opened_at, closed_at = self._time(rnd.opened_block), self._time(rnd.closed_block)
        return RoundInfo(
            r, rnd.state, rnd.opened_block, rnd.closed_block, rnd.ended_block, n, rnd.outcome, opened_at, closed_at
        )

    def last_finalized(self) -> tuple[int, bytes]:
        base = self.live.base_round
        return base, (self.params.genesis_digest if base == 0 else self.rounds[base - 1].outcome or b"")


@dataclass
class FakeAccount:
    address: str


class FakeLedger:
    """One account's ledger client on a FakeChain (the methods node.peer.ports.LedgerPort names)."""

    def __init__(self, chain: FakeChain, address: str) -> None:
        self.chain = chain
        self.account = FakeAccount(address)

    def block_number(self) -> int:
        return self.chain.block_number()

    def activity(self, from_block: int, to_block: int) -> bool:
        # The fake's blocks are slices of time that hold several transactions, one of which may
        # come after a read in the same block: say yes, and the peer re-reads on every new block.
        return True

    def params(self) -> SwarmParams:
        return self.chain.params

    def peer_id_of(self, address: str) -> bytes:
        account = self.chain.accounts.get(address)
        return b"" if account is None else account.peer_id

    def current_round(self) -> int:
        return self.chain.live.number

    def last_finalized(self) -> tuple[int, bytes]:
        return self.chain.last_finalized()

    def finalized_digest(self, round: int) -> bytes | None:
        return self.chain.rounds[round - 1].outcome if 0 < round <= len(self.chain.rounds) else None

    def round_info(self, round: int) -> RoundInfo:
        return self.chain.round_info(round)

    def participants(self, round: int) -> list[str]:
        return [c.peer for c in self.chain.round(round).commitments]

    def commitments(self, round: int) -> list[Commitment]:
        return list(self.chain.round(round).commitments)

    def commit_history(self, address: str, from_block: int | None = None) -> list[Commitment]:
        start = 0 if from_block is None else from_block
        return [
            c for rnd in self.chain.rounds for c in rnd.commitments if c.peer == address and c.block_number >= start
        ]

    def attestations(self, round: int) -> list[Attestation]:
        rnd = self.chain.round(round)
        return [] if rnd.state is RoundState.OPEN else list(rnd.attestations)

    def registration_message(self, address: str) -> bytes:
        return registration_message(FAKE_CHAIN_ID, FAKE_LEDGER, address)

    def register(self, peer_id: bytes, signature: bytes = b"") -> dict[str, int]:
        return self.chain.register(self.account.address, peer_id, signature)

    def commit(
        self,
        round: int,
        digest: bytes,
        num_samples: int,
        eps_micro: int,
        mechanism: bytes,
        record_eps_micro: int = 0,
    ) -> dict[str, int]:
        return self.chain.commit(
            self.account.address, round, digest, num_samples, eps_micro, mechanism, record_eps_micro
        )

    def close_round(self, round: int) -> dict[str, int]:
        return self.chain.close_round(self.account.address, round)

    def attest(self, round: int, aggregate_digest: bytes, included: bytes) -> dict[str, int]:
        return self.chain.attest(self.account.address, round, aggregate_digest, included)

    def attest_flags(self, round: int, aggregate_digest: bytes, included: list[bool]) -> dict[str, int]:
        """attest() with the bitmap given as flags (encoded like the peer encodes it)."""
        return self.attest(round, aggregate_digest, encode_bitmap(included))

    def abort_round(self, round: int) -> dict[str, int]:
        return self.chain.abort_round(self.account.address, round)


# -------------------------------------------------------------------------------- network


@dataclass(frozen=True)
class Transfer:
    time: float  # trio time the blob arrived
    digest: str
    provider: str
    receiver: str


class FakeNetwork:
    """Who holds what, who announced what, who is reachable, and how long each blob takes."""

    def __init__(self) -> None:
        self.hosts: dict[str, FakeHost] = {}
        self.announced: dict[str, list[str]] = {}
        self.unreachable: set[str] = set()  # peer ids that serve nobody (gone, or behind a wall)
        self.delays: dict[str, float] = {}  # digest -> seconds a transfer takes (math.inf: stalls forever)
        self.transfers: list[Transfer] = []

    def join(self, peer_id_bytes: bytes, store: MemoryBlobStore) -> FakeHost:
        host = FakeHost(self, peer_id_bytes, store)
        self.hosts[host.peer_id] = host
        return host

    def delay(self, digest: str, seconds: float) -> None:
        self.delays[digest] = seconds

    def stall(self, digest: str) -> None:
        """Every transfer of `digest` hangs until the fetcher's own timeout."""
        self.delays[digest] = math.inf

    def providers_of(self, digest: str, receiver: str) -> list[str]:
        """Who served `digest` to `receiver`, in order."""
        return [t.provider for t in self.transfers if t.digest == digest and t.receiver == receiver]


class FakeHost:
    """A libp2p host on a FakeNetwork (what node.peer.ports.HostPort names)."""

    def __init__(self, network: FakeNetwork, peer_id_bytes: bytes, store: MemoryBlobStore) -> None:
        self.network = network
        self.peer_id_bytes = bytes(peer_id_bytes)
        self.peer_id = peer_id_from_bytes(self.peer_id_bytes)
        self.store = store
        self.bytes_served = 0
        self.bytes_fetched = 0

    async def announce_blob(self, digest: str, *, later: bool = False) -> None:
        if not self.store.has(digest):
            raise ValueError(f"cannot announce {digest}: it is not in this host's store")
        holders = self.network.announced.setdefault(digest, [])
        if self.peer_id not in holders:
            holders.append(self.peer_id)
        await trio.lowlevel.checkpoint()

    def blob_coming(self, digest: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # the fake serves straight from the store: nothing to wait for

    def providers(self, digest: str) -> list[str]:
        return list(self.network.announced.get(digest, []))

    async def fetch(
        self,
        digest: str,
        *,
        providers: list[str] | None = None,
        max_size: int | None = None,
        timeout: float = 60.0,
        announce: bool = True,
    ) -> bytes:
        data = self.store.get(digest)
        if data is not None:
            return data
        candidates = [p for p in dict.fromkeys([*(providers or []), *self.providers(digest)]) if p != self.peer_id]
        source: FakeHost | None = None
        try:
            with trio.fail_after(timeout):
                for provider in candidates:
                    source = self.network.hosts.get(provider)
                    if provider in self.network.unreachable or source is None or not source.store.has(digest):
                        continue
                    await trio.sleep(self.network.delays.get(digest, 0.0))  # the transfer
                    data = source.store.get(digest)
                    if data is not None:
                        break
        except trio.TooSlowError:
            raise FetchTimeout(f"blob {digest[:16]}: fetch did not finish within {timeout}s") from None
        if data is None or source is None:
            raise BlobNotFound(f"blob {digest[:16]}: none of {len(candidates)} providers served it")
        if max_size is not None and len(data) > max_size:
            raise BlobTooLarge(f"blob {digest[:16]} is {len(data)} bytes, above {max_size}")
        if sha256_hex(data) != digest:
            raise DigestMismatch(f"blob {digest[:16]}: the bytes received hash to something else")
        self.store.put(data)
        source.bytes_served += len(data)
        self.bytes_fetched += len(data)
        self.network.transfers.append(Transfer(trio.current_time(), digest, source.peer_id, self.peer_id))
        if announce:
            await self.announce_blob(digest)
        return data
