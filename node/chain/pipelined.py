"""Client of the one-transaction-per-round prototype (contracts/PipelinedLedger.sol, docs/LEDGER.md "One
transaction per round"): a member's commit carries its vote on the round before, rounds close by
themselves, a final `vote` serves a member that does not commit in the next round. The chain layer the
pipelined round loop is to call; `swarm node` still runs SwarmLedger through `node.chain.client`.

Beside its own reads (`voted_commits`, `final_votes`, `finalized`) it answers the reads of
`node.peer.ports.LedgerPort` with `LedgerClient`'s names and meanings (`round_info`, `commitments`,
`attestations`, `params`, ...), so that the watcher, the agreement step, the catch-up and `swarm
verify` read it unchanged. The contract keeps no round history: those are built from its events
(logs filtered by the indexed round or member, several events in one request) and the live views
at one pinned block, and its settings from its creation transaction.

Synchronous like `LedgerClient` (call it from `trio.to_thread.run_sync`); transactions go through the
same `TransactionSender` (estimate on the pending block, nonces, fee bumps, confirmations), and a
refusal raises a `LedgerError` naming the contract's custom error. Reads as `LedgerClient`'s: at the
head less `confirmations` (views pinned there, logs read up to there in chunks of LOG_CHUNK_BLOCKS), the
head held by `rawrpc.HeadGuard`, logs that lag their block read again until the state accounts for them,
the endpoint's requests counted. A round's reads span that round's blocks only (`_round_logs`, from an
index of the rounds' opening blocks), so their cost does not grow with the chain's age. What no longer
changes of a round settled at the read depth is kept (`KeptRound`), and the live views are read once per
pinned block, both dropped when a read sees a reorganisation (docs/LEDGER.md, "What the client keeps")."""

from __future__ import annotations

import json
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from importlib import resources
from typing import Any, TypeVar

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_abi.exceptions import DecodingError
from eth_account.signers.local import LocalAccount
from eth_typing import HexStr
from eth_utils import event_abi_to_log_topic, keccak
from web3 import Web3
from web3.types import FilterParams, RPCEndpoint, TxReceipt

from node.chain.client import (
    DEFAULT_TX_TIMEOUT_S,
    LOG_CHUNK_BLOCKS,
    CountingHTTPProvider,
    constructor_settings,
    head_block,
    raw_call,
    raw_reader,
    read_until_complete,
)
from node.chain.codec import EventDecoder, ViewCodec
from node.chain.decoder import RevertDecoder
from node.chain.errors import LedgerError
from node.chain.mirror import LedgerMirror, MirroredLog
from node.chain.rawrpc import HeadGuard, RawRPC, header_hash
from node.chain.records import Attestation, Commitment, RoundInfo, RoundState, SwarmParams
from node.chain.registration import Registration, registration_message
from node.chain.retries import with_retries
from node.chain.sender import TransactionSender
from node.chain.votes import votes_on

ARTIFACT_NAME = (
    "PipelinedLedger.json"  # package data, written by scripts/compile_contracts.py --contract PipelinedLedger
)


# The constructor's arguments (its Settings, the genesis digest, the allowlist), after the creation code.
CONSTRUCTOR_TYPES = [
    "(uint32,uint64,uint64,uint64,uint64,uint64,uint64,uint64,uint32,uint32,uint32)",
    "bytes32",
    "address[]",
]
MEMBERS_SLOT = 2  # `_members`' storage slot, after `_live` and `_voting` (immutables take none)
ROUND_EVENTS = ("RoundOpened", "RoundClosed", "RoundFinalized", "RoundAborted")  # a round's state, in events
COMMIT_EVENTS = ("Committed", "RoundClosed", "RoundAborted")  # a round's commits and how many there are
ROUND_ENDS = ("RoundFinalized", "RoundAborted")  # no vote on the round counts after these
# the events that open a round: RoundOpened(r) (deployment, after an abort), or RoundClosed(r - 1)
ROUND_OPENINGS = ("RoundOpened", "RoundClosed")
KEPT_ROUNDS = 8  # settled rounds whose reads are kept (a peer reads the last two or three again and again)
# read once per ledger state (per pinned block where the mirror does not tell the states apart)
PINNED_VIEWS = ("currentRound", "votingRound", "openRoundCounts", "lastFinalized", "epsSpent")


T = TypeVar("T")


@lru_cache(maxsize=1)
def load_pipelined_artifact() -> dict[str, Any]:
    """The compiled prototype (ABI, bytecode) shipped inside the package."""
    artifact: dict[str, Any] = json.loads((resources.files("node.chain") / "artifacts" / ARTIFACT_NAME).read_text())
    return artifact


@dataclass(frozen=True)
class VotingRound:
    """The last closed round: `pending` while it awaits its majority (neither finalized nor aborted)."""

    round: int
    pending: bool
    participants: int


@dataclass(frozen=True)
class VotedCommit:
    """A Committed event: the update's digest and what it spent, and the vote on the round before it
    carries (the aggregate it was trained from; 32 zero bytes and no bitmap in round 1). `mechanism`
    as committed: b"" is the member's mechanism of its last commit that named one."""

    round: int
    peer: str
    index: int
    digest: bytes
    num_samples: int
    eps_micro: int
    record_eps_micro: int
    mechanism: bytes
    vote_digest: bytes
    included: bytes
    block_number: int
    log_index: int


@dataclass(frozen=True)
class NamedMechanism:
    """Where a member's commit named a mechanism (chain order), and the mechanism it named."""

    block_number: int
    log_index: int
    mechanism: bytes


@dataclass(frozen=True)
class FinalVote:
    """A Voted event: a participant's vote on `round` outside a commit (it does not commit in the next)."""

    round: int
    peer: str
    aggregate_digest: bytes
    included: bytes
    block_number: int
    log_index: int


@dataclass
class KeptRound:
    """What no longer changes of a round that settled deep enough (`PipelinedClient._settled`): its
    commits once it closed (or was aborted open), its `RoundInfo` and counted votes once it ended."""

    voted: list[VotedCommit] | None = None
    resolved: list[Commitment] | None = None
    info: RoundInfo | None = None
    attestations: list[Attestation] | None = None


class PipelinedClient:
    """One PipelinedLedger deployment; `account` None gives a read-only client. `from_block`: the
    deployment's block (logs are read from there; `deploy` sets it). `confirmations`: as
    `LedgerClient`'s, how deep the state this client reads and acts on lies."""

    def __init__(
        self,
        w3: Web3,
        address: str,
        account: LocalAccount | None = None,
        *,
        tx_timeout: float = DEFAULT_TX_TIMEOUT_S,
        confirmations: int = 0,
        from_block: int = 0,
    ) -> None:
        if isinstance(confirmations, bool) or not isinstance(confirmations, int) or confirmations < 0:
            raise ValueError(f"confirmations must be an integer >= 0, got {confirmations!r}")
        abi = load_pipelined_artifact()["abi"]
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.account = account
        self.contract = w3.eth.contract(address=self.address, abi=abi)
        self._signatures = {e["name"]: "0x" + event_abi_to_log_topic(e).hex() for e in abi if e["type"] == "event"}
        self._events_by_signature = {topic: name for name, topic in self._signatures.items()}
        self._codec, self._errors, self._events = ViewCodec(abi), RevertDecoder(abi), EventDecoder(abi)
        self._committed_topic = bytes.fromhex(self._signatures["Committed"][2:])
        self._opening_topics = frozenset(bytes.fromhex(self._signatures[n][2:]) for n in ROUND_OPENINGS)
        self.confirmations = confirmations
        self.from_block = from_block
        self.gas_used: dict[str, int] = {}  # last receipt's gasUsed per function, for benchmarks
        self._head = HeadGuard(lambda number: self.block_hash(number) is not None)
        self._raw: RawRPC | None | bool = None  # None: not made yet; False: not available
        self._params: SwarmParams | None = None  # immutable: read once
        self._chain_id: int | None = None
        self._peer_ids: dict[str, bytes] = {}  # every registered peer id up to `_registered_to` (they never change)
        self._registered_to = -1
        self._registered_lock = threading.Lock()
        # per member: the block its commits were read to, and its last commit naming a mechanism by
        # then (all that resolving a later commit needs; an earlier one is looked up again)
        self._named: dict[str, tuple[int, NamedMechanism | None]] = {}
        self._named_lock = threading.Lock()  # threads share the client: the cache changes whole
        # the round index: round r's opening block at r - 1 (rounds open in order from 1), from the
        # RoundOpened/RoundClosed logs up to `_indexed_to` (never past a read's pinned block)
        self._openings = array("q")
        self._indexed_to = -1
        self._index_lock = threading.Lock()
        self._timestamps: dict[str, int] = {}  # block hash -> timestamp
        # settled rounds' reads (the last KEPT_ROUNDS), and the views at the last pinned block, under
        # one lock; both dropped whole when a read sees a reorganisation (`_drop_kept`); `_generation`
        # counts the drops, so that a read begun before one keeps nothing
        self._kept: dict[int, KeptRound] = {}
        # the live views of one ledger state: keyed by the pinned block, or where the mirror holds the
        # blocks up to it, by the last block that changed the state (`_state_key`)
        self._pinned_views: tuple[Any, dict[Any, Any]] = (None, {})
        self._viewed_to = -1  # the latest block a live view was read at
        self._generation = 0
        self._kept_lock = threading.Lock()
        # the head a subscription pushes while it runs, else None (node.chain.subscription.ChainFeed.live_head)
        self.pushed_head: Callable[[], int | None] | None = None
        # the base fee of that head while a subscription runs (the sender builds its fees from it)
        self.pushed_base_fee: Callable[[], int | None] | None = None
        # the ledger's logs as the subscription pushed them, while it runs (`use_mirror`)
        self.mirror: LedgerMirror | None = None
        self._local = threading.local()  # per thread: its log reads sent to the endpoint
        self._read_latest = False  # a view read "latest" since the last pushed head was used
        self._tx = (
            TransactionSender(
                w3,
                account,
                RevertDecoder(abi),
                tx_timeout,
                confirmations=confirmations,
                head=self.head,
                base_fee=self._pushed_base_fee,
            )
            if account is not None
            else None
        )

    @classmethod
    def deploy(
        cls,
        w3: Web3,
        account: LocalAccount,
        *,
        min_peers: int,
        commit_window: int,
        attest_window: int,
        commit_window_seconds: int,
        attest_window_seconds: int,
        eps_cap_micro: int,
        delta: float,
        genesis_digest: bytes,
        eps_step_micro: int = 0,
        record_eps_cap_micro: int = 0,
        record_delta: float = 0.0,
        allowlist: list[str] | None = None,
        max_samples: int = 0,
        tx_timeout: float = DEFAULT_TX_TIMEOUT_S,
        confirmations: int = 0,
    ) -> PipelinedClient:
        """Deploy a prototype ledger from `account` (the settings of `LedgerClient.deploy`, without
        secure aggregation) and return a client on it."""
        settings = constructor_settings(
            min_peers=min_peers,
            commit_window=commit_window,
            attest_window=attest_window,
            commit_window_seconds=commit_window_seconds,
            attest_window_seconds=attest_window_seconds,
            eps_cap_micro=eps_cap_micro,
            delta=delta,
            genesis_digest=genesis_digest,
            eps_step_micro=eps_step_micro,
            record_eps_cap_micro=record_eps_cap_micro,
            record_delta=record_delta,
            max_samples=max_samples,
        )
        artifact = load_pipelined_artifact()
        factory = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
        constructor = factory.constructor(
            settings, bytes(genesis_digest), [Web3.to_checksum_address(a) for a in allowlist or []]
        )
        sender = TransactionSender(w3, account, RevertDecoder(artifact["abi"]), tx_timeout)
        receipt = sender.send(constructor, "deploy")
        if receipt["contractAddress"] is None:
            raise LedgerError("deploy: the receipt holds no contract address")
        client = cls(
            w3,
            receipt["contractAddress"],
            account,
            tx_timeout=tx_timeout,
            confirmations=confirmations,
            from_block=receipt["blockNumber"],
        )
        sender.head, sender.base_fee = client.head, client._pushed_base_fee  # from here on the client's
        client._tx = sender  # keeps its nonce count
        client.gas_used["deploy"] = receipt["gasUsed"]
        return client

    # ---------------------------------------------------------------- transactions

    def register(self, peer_id: bytes, signature: bytes) -> TxReceipt:
        """As `LedgerClient.register` (the peer id and its signature are in the event only)."""
        return self._transact("register", bytes(peer_id), bytes(signature))

    def commit(
        self,
        round: int,
        digest: bytes,
        num_samples: int,
        eps_micro: int,
        mechanism: bytes,
        vote_digest: bytes,
        included: bytes,
        record_eps_micro: int = 0,
    ) -> TxReceipt:
        """Commit round `round`'s update with the vote on round - 1 (`vote_digest`, `included`: the
        aggregate this update was trained from and its bitmap; 32 zero bytes and b"" in round 1).
        `mechanism` b"": the one of this member's last commit that named one (its first must).
        `round` may be the open round + 1 once the open round's window has passed: this commit then
        closes it first."""
        return self._transact(
            "commit",
            round,
            bytes(digest),
            num_samples,
            eps_micro,
            record_eps_micro,
            bytes(mechanism),
            bytes(vote_digest),
            bytes(included),
        )

    def vote(self, round: int, aggregate_digest: bytes, included: bytes) -> TxReceipt:
        """A final vote on the voting round (a participant that will not commit in the next one)."""
        return self._transact("vote", round, bytes(aggregate_digest), bytes(included))

    def close_round(self, round: int) -> TxReceipt:
        """Close the open round (anyone): the fallback when no commit closed it."""
        return self._transact("closeRound", round)

    def abort_round(self, round: int) -> TxReceipt:
        """Abort the voting round past its attestation window, and the open round with it (anyone)."""
        return self._transact("abortRound", round)

    def _transact(self, fn_name: str, *args: Any) -> TxReceipt:
        if self._tx is None:
            raise LedgerError("this client is read-only (no account): it cannot send transactions")
        receipt = self._tx.send(getattr(self.contract.functions, fn_name)(*args), fn_name)
        self.gas_used[fn_name] = receipt["gasUsed"]
        return receipt

    # ---------------------------------------------------------------- views

    def current_round(self, *, block: int | None = None) -> int:
        """The open round. Read at the latest block read (not an older one asked for), a kept round
        from it on has been undone by a reorganisation: the kept rounds are dropped."""
        at = self.block_number() if block is None and self.mirror is not None else block
        opening = self._mirrored_opening(at) if at is not None else None
        current = _opened_round(opening) if opening is not None else int(self._view("currentRound", block=at))
        with self._kept_lock:
            undone = (at is None or at >= self._viewed_to) and any(r >= current for r in self._kept)
            self._viewed_to = max(self._viewed_to, -1 if at is None else at)
        if undone:
            self._drop_kept()
        return current

    def voting_round(self, *, block: int | None = None) -> VotingRound:
        round, pending, participants = self._view("votingRound", block=block)
        return VotingRound(int(round), bool(pending), int(participants))

    def last_finalized_round(self, *, block: int | None = None) -> int:
        """The last finalized round (0: none; the model is the genesis)."""
        return int(self._view("lastFinalized", block=block))

    def open_round_participants(self, *, block: int | None = None) -> int:
        """How many members committed in the open round so far: its Committed events where the mirror
        holds them since the round opened, else the state's count."""
        at = self.block_number() if block is None and self.mirror is not None else block
        opening = self._mirrored_opening(at) if at is not None else None
        if opening is not None and at is not None:
            # the mirror holds every block from the opening to `at`: the Committed logs are all there
            round, opened = _opened_round(opening), int(opening["blockNumber"])
            return len(self._logs(("Committed",), opened, at, _round_topics(round)))
        return int(self._view("openRoundCounts", block=at)[0])

    def use_mirror(self, mirror: LedgerMirror) -> None:
        """Read the blocks `mirror` holds from it (`node.chain.mirror`); what it held wrong, when it
        starts again, drops what was kept."""
        self.mirror = mirror
        mirror.on_reset(lambda first: self._drop_kept())

    def _mirrored_opening(self, at: int) -> Any | None:
        """The last event by block `at` that opened a round (RoundOpened, RoundClosed), decoded, where
        the mirror holds every block from it to `at`; None otherwise."""
        if self.mirror is None:
            return None
        found = self.mirror.last_log(self._opening_topics, at)
        return self._decoded(found) if found is not None else None

    def eps_spent(self, address: str, *, block: int | None = None) -> int:
        """Cumulative eps committed by `address`, in micro-eps."""
        return int(self._view("epsSpent", Web3.to_checksum_address(address), block=block))

    def record_eps_spent(self, address: str, *, block: int | None = None) -> int:
        """Cumulative record-level (DP-SGD) eps committed by `address`, in micro-eps: bits 64 to 127
        of its member slot (no view returns it), read from storage at `block` (default:
        `block_number`)."""
        return (self._member_word(address, self.block_number() if block is None else block) >> 64) & (2**64 - 1)

    def _member_word(self, address: str, block: int) -> int:
        """`address`'s member slot, `_members[address]` (storage slot MEMBERS_SLOT of the mapping)."""
        key = int.from_bytes(
            keccak(abi_encode(["address", "uint256"], [Web3.to_checksum_address(address), MEMBERS_SLOT]))
        )
        word = with_retries(lambda: self.w3.eth.get_storage_at(self.address, key, block), what="member slot")
        return int.from_bytes(bytes(word), "big")

    # ---------------------------------------------------------------- the reads of `LedgerPort`, from events

    def params(self) -> SwarmParams:
        """The deployment's settings as `LedgerClient.params` gives SwarmLedger's (secure aggregation
        off). This contract keeps them in its code, not in views: they are decoded from the calldata
        of its creation transaction (the one holding the constructor's RoundOpened(1) event, which
        no later transaction emits), checked to be this artifact's creation code, and kept."""
        if self._params is None:
            self._params = self._read_params()
            # nothing of this ledger lies before its deployment: a client made on an address alone
            # (from_block 0) reads its logs from there on
            self.from_block = max(self.from_block, self._params.deploy_block)
        return self._params

    def _read_params(self) -> SwarmParams:
        at = self.block_number()
        opened = self._logs(("RoundOpened",), self.from_block, at, _round_topics(1))
        if not opened:
            raise LedgerError(f"{self.address}: no RoundOpened(1) event by block {at}: not a PipelinedLedger")
        event = opened[0]
        tx = with_retries(lambda: self.w3.eth.get_transaction(event["transactionHash"]), what="deployment")
        code = bytes.fromhex(str(load_pipelined_artifact()["bytecode"]).removeprefix("0x"))
        data = bytes(tx["input"])
        if tx.get("to") is not None or not data.startswith(code):
            raise LedgerError(f"{self.address}: not created by the PipelinedLedger artifact's creation code")
        settings, genesis, allowlist = abi_decode(CONSTRUCTOR_TYPES, data[len(code) :])
        min_peers, commit_window, attest_window, eps_cap, delta, step, record_cap, record_delta = settings[:8]
        max_samples, commit_seconds, attest_seconds = settings[8:]
        return SwarmParams(
            min_peers=min_peers,
            commit_window=commit_window,
            attest_window=attest_window,
            eps_cap_micro=eps_cap,
            delta_e18=delta,
            eps_step_micro=step,
            record_eps_cap_micro=record_cap,
            record_delta_e18=record_delta,
            genesis_digest=bytes(genesis),
            allowlist_enabled=len(allowlist) > 0,
            deployer=Web3.to_checksum_address(tx["from"]),
            deploy_block=int(event["blockNumber"]),
            max_samples=max_samples or 2**32 - 1,  # the contract's reading of 0
            commit_window_seconds=commit_seconds,
            attest_window_seconds=attest_seconds,
        )

    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(with_retries(lambda: self.w3.eth.chain_id, what="chain_id"))
        return self._chain_id

    def registration_message(self, address: str) -> bytes:
        """What `address`'s registration signature signs on this chain and ledger."""
        return registration_message(self.chain_id(), self.address, address)

    def peer_id_of(self, address: str) -> bytes:
        """The peer id `address` registered (empty if none), from its Registered event (the
        contract keeps none, and refuses a second registration): every registration is kept once
        read, read on from where the last read stopped, up to `block_number`, and only as far as
        the logs hold as many as the registered count of the state there (logs that lag are read
        again next time)."""
        address = Web3.to_checksum_address(address)
        with self._registered_lock:
            known, start = self._peer_ids.get(address), max(self._registered_to, self.from_block - 1) + 1
        if known is not None:
            return known
        at = self.block_number()
        if start > at:
            return b""
        found = {str(e["args"]["peer"]): bytes(e["args"]["peerId"]) for e in self._logs(("Registered",), start, at)}
        registered = int(self._view("openRoundCounts", block=at)[2])
        with self._registered_lock:
            self._peer_ids.update(found)
            if len(self._peer_ids) >= registered:
                self._registered_to = max(self._registered_to, at)
            return self._peer_ids.get(address, b"")

    def registrations(self, from_block: int | None = None, to_block: int | None = None) -> list[Registration]:
        """Every Registered event from `from_block` (default: the deployment's) to `to_block`
        (default: `block_number`), in chain order, signatures unchecked."""
        start = self.from_block if from_block is None else from_block
        end = self.block_number() if to_block is None else to_block
        return [
            Registration(
                str(e["args"]["peer"]),
                bytes(e["args"]["peerId"]),
                bytes(e["args"]["signature"]),
                int(e["blockNumber"]),
                int(e["logIndex"]),
            )
            for e in self._logs(("Registered",), start, end)
        ]

    def allowlist_changes(self, from_block: int | None = None, to_block: int | None = None) -> list[tuple[str, bool]]:
        """None: this contract takes no allow or disallow after its deployment (`LedgerClient`'s
        counterpart, for the peer's registry)."""
        return []

    def activity(self, from_block: int, to_block: int) -> bool:
        """Whether the ledger emitted any event in blocks from_block..to_block (every change of its
        state does): the watcher's probe, one request."""
        if to_block < from_block:
            return False
        raw = self._raw_rpc()
        if raw is not None:
            return bool(with_retries(lambda: raw.has_logs(self.address, from_block, to_block), what="activity"))
        query: FilterParams = {"address": self.address, "fromBlock": from_block, "toBlock": to_block}
        return len(with_retries(lambda: self.w3.eth.get_logs(query), what="activity")) > 0

    def round_info(self, round: int, *, block: int | None = None) -> RoundInfo:
        """Round `round` as `LedgerClient.round_info` reads SwarmLedger's, from the state and the
        events at one block (`block`, else `block_number`): OPEN while it is the current round,
        CLOSED from its RoundClosed until it is FINALIZED (its digest the vote of the transaction
        holding RoundFinalized) or ABORTED (RoundAborted: as the voting round, or as the open round
        aborted with it, which never closed: `closed_block` 0, its count from its Committed
        events); opened at RoundOpened(round) or RoundClosed(round - 1), ended at RoundFinalized or
        RoundAborted; the times are those blocks' timestamps. A round past the current one reads
        OPEN with zeros. Events that lag the state are read again (`read_until_complete`)."""
        if round < 1:
            raise ValueError(f"rounds start at 1, got {round}")
        kept = self._kept_round(round)
        if kept is not None and kept.info is not None and (block is None or kept.info.ended_block <= block):
            return kept.info
        generation = self._generation

        def read() -> tuple[RoundInfo, str | None]:
            at = self.block_number() if block is None else block
            info, missing = self._round_info_at(round, at)
            if missing is None and info.state in (RoundState.FINALIZED, RoundState.ABORTED):
                self._keep(round, generation, info.ended_block, at, info=info)
            return info, missing

        return self._until_complete(read)

    def _round_info_at(self, round: int, at: int) -> tuple[RoundInfo, str | None]:
        reads = self._endpoint_log_reads()
        current = self.current_round(block=at)
        if round > current:
            return RoundInfo(round, RoundState.OPEN, 0, 0, 0, 0, None, 0, 0), None
        events, missing = self._round_logs(round, 2, ROUND_EVENTS, (round - 1, round), at, current)
        if missing is not None:
            return _UNREAD, missing

        def first(name: str, r: int) -> Any:
            return next((e for e in events if e["event"] == name and e["args"]["round"] == r), None)

        opened = first("RoundOpened", round) or first("RoundClosed", round - 1)
        closed, finalized, aborted = (first(name, round) for name in ("RoundClosed", "RoundFinalized", "RoundAborted"))
        lagging = f"round {round}: its events by block {at} lag the state (round {current} open)"
        if opened is None:
            return _UNREAD, lagging
        opened_block, opened_at = int(opened["blockNumber"]), self._timestamp(opened)
        if round == current:
            count = self.open_round_participants(block=at)
            return RoundInfo(round, RoundState.OPEN, opened_block, 0, 0, count, None, opened_at, 0), None
        closed_block, closed_at = (int(closed["blockNumber"]), self._timestamp(closed)) if closed else (0, 0)
        if aborted is not None:
            ended = int(aborted["blockNumber"])
            count = (
                _count(closed) if closed else len(self._logs(("Committed",), opened_block, ended, _round_topics(round)))
            )
            return RoundInfo(
                round, RoundState.ABORTED, opened_block, closed_block, ended, count, None, opened_at, closed_at
            ), None
        if closed is None:
            return _UNREAD, lagging
        if finalized is not None:
            vote, missing = self._finalizing_vote(round, finalized)
            if vote is None:
                return _UNREAD, missing
            ended = int(finalized["blockNumber"])
            return RoundInfo(
                round,
                RoundState.FINALIZED,
                opened_block,
                closed_block,
                ended,
                _count(closed),
                vote[0],
                opened_at,
                closed_at,
            ), None
        held = self.mirror is not None and self._endpoint_log_reads() == reads  # all from the mirror: none lags
        if not held and self.voting_round(block=at) != VotingRound(round, True, _count(closed)):
            return _UNREAD, lagging  # the state has it ended: its RoundFinalized or RoundAborted lags
        return RoundInfo(
            round, RoundState.CLOSED, opened_block, closed_block, 0, _count(closed), None, opened_at, closed_at
        ), None

    def voted_commits(self, round: int) -> list[VotedCommit]:
        """Round `round`'s commits in participant order, with the votes they carry, read at one
        pinned block (`block_number`) within the round's span (`_round_logs`). Checked to be
        numbered 0, 1, ... (a duplicated log is an error, not a longer list) and to be as many as the
        state says at that block (the open round's count, or a closed round's `RoundClosed`; a round
        past that neither closed nor was aborted has lost its events): logs that lag are read again
        first (`read_until_complete`)."""

        kept = self._kept_round(round)
        if kept is not None and kept.voted is not None:
            return kept.voted
        generation = self._generation

        def read() -> tuple[list[VotedCommit], str | None]:
            at = self.block_number()
            current = self.current_round(block=at)
            logs, missing = self._round_logs(round, 1, COMMIT_EVENTS, (round,), at, current)
            found, lacking = self._complete_commits(round, logs, at, current)
            if missing is None and lacking is None:
                settled = _first_block(logs, ("RoundClosed", "RoundAborted"), round)
                self._keep(round, generation, settled, at, voted=found)
            return found, missing or lacking

        return self._until_complete(read)

    def _complete_commits(
        self, round: int, logs: list[Any], at: int, current: int
    ) -> tuple[list[VotedCommit], str | None]:
        """`round`'s commits among `logs` (its Committed, RoundClosed and RoundAborted events by
        block `at`, round `current` open then), and what they lack against the state."""
        found = [self._commit_of(e) for e in logs if e["event"] == "Committed" and e["args"]["round"] == round]
        if [c.index for c in found] != list(range(len(found))):
            raise LedgerError(f"round {round}: the Committed events are not numbered 0..{len(found) - 1}")
        ends = [e for e in logs if e["event"] in ("RoundClosed", "RoundAborted") and e["args"]["round"] == round]
        if round >= current:
            expected = self.open_round_participants(block=at) if round == current else 0
        elif any(e["event"] == "RoundClosed" for e in ends):
            expected = next(_count(e) for e in ends if e["event"] == "RoundClosed")
        elif ends:
            return found, None  # aborted while open (the cascade): its count is in no event
        else:
            return found, f"round {round}: neither RoundClosed nor RoundAborted by block {at}, round {current} open"
        if expected == len(found):
            return found, None
        return found, f"round {round}: {len(found)} Committed events at block {at}, {expected} in the state"

    def commitments(self, round: int) -> list[Commitment]:
        """Round `round`'s commits as `LedgerClient.commitments` gives SwarmLedger's, each with its
        mechanism resolved: an empty one is that member's mechanism of its last commit that named one.
        Kept with the commits once they are (`voted_commits`)."""
        kept = self._kept_round(round)
        if kept is not None and kept.resolved is not None:
            return kept.resolved
        voted = self.voted_commits(round)
        resolved = self._resolved(voted)
        with self._kept_lock:
            kept = self._kept.get(round)
            if kept is not None and kept.voted is voted:
                kept.resolved = resolved
        return resolved

    def participants(self, round: int) -> list[str]:
        """The participants of `round` in commit order (the order inclusion bitmaps use)."""
        return [c.peer for c in self.voted_commits(round)]

    def commit_history(self, address: str, from_block: int | None = None) -> list[Commitment]:
        """Every commit `address` made, oldest first, mechanisms resolved (one log read filtered by
        the member). `from_block`: only those from that block on. A whole history must end in the
        cumulative eps the ledger stores for `address` at the same block, and is read again until
        it does (`read_until_complete`)."""
        peer = Web3.to_checksum_address(address)
        if from_block is not None:
            logs = self._logs(("Committed",), from_block, self.block_number(), None, [_address_topic(peer)])
            return self._resolved([self._commit_of(e) for e in logs])

        def read() -> tuple[tuple[list[VotedCommit], int], str | None]:
            at = self.block_number()
            logs = self._logs(("Committed",), self.from_block, at, None, [_address_topic(peer)])
            history = [self._commit_of(e) for e in logs]
            last, stored = (history[-1].eps_micro if history else 0), self.eps_spent(peer, block=at)
            missing = (
                None
                if last == stored
                else f"{peer}: its Committed events end at eps {last}, the ledger stores {stored}"
            )
            return (history, at), missing

        history, at = self._until_complete(read)
        named = [_named_at(c) for c in history if c.mechanism]
        self._keep_named({peer: named[-1] if named else None}, at)  # the whole history up to `at`
        return self._resolved(history)

    def _resolved(self, commits: list[VotedCommit]) -> list[Commitment]:
        """`commits` (in chain order) as Commitments, an empty mechanism replaced by its member's last
        named one before it: one of `commits`, else the one before the member's first of them
        (`_named_before`)."""
        seen: set[str] = set()
        first_unnamed: dict[str, VotedCommit] = {}
        for c in commits:
            if not c.mechanism and c.peer not in seen:
                first_unnamed.setdefault(c.peer, c)
            seen.add(c.peer)
        last = self._named_before(list(first_unnamed.values()))
        resolved = []
        for c in commits:
            if c.mechanism:
                last[c.peer] = c.mechanism
            resolved.append(
                Commitment(
                    peer=c.peer,
                    index=c.index,
                    digest=c.digest,
                    num_samples=c.num_samples,
                    eps_micro=c.eps_micro,
                    mechanism=c.mechanism or last[c.peer],
                    block_number=c.block_number,
                    record_eps_micro=c.record_eps_micro,
                    round=c.round,
                )
            )
        return resolved

    def _named_before(self, commits: list[VotedCommit]) -> dict[str, bytes]:
        """Per commit's member, the mechanism of its last commit naming one before that commit: from
        the cache (read on from where it stopped, one log read filtered by those members), else,
        the cache holding a later one, looked up again from the deployment (not kept)."""
        if not commits:
            return {}
        self._read_named({c.peer for c in commits}, max(c.block_number for c in commits))
        found: dict[str, bytes] = {}
        for c in commits:
            with self._named_lock:
                _, named = self._named.get(c.peer, (c.block_number, None))
            if named is None or (named.block_number, named.log_index) > (c.block_number, c.log_index):
                logs = self._logs(("Committed",), self.from_block, c.block_number, None, [_address_topic(c.peer)])
                earlier = [_named_at(self._commit_of(e)) for e in logs]
                before = [n for n in earlier if n.mechanism and (n.block_number, n.log_index) < _position_of(c)]
                named = before[-1] if before else None
            if named is None:  # the contract refuses a first commit without one: the logs lack it
                raise LedgerError(f"{c.peer}: its round {c.round} commit names no mechanism, nor does one before")
            found[c.peer] = named.mechanism
        return found

    def _read_named(self, peers: set[str], to_block: int) -> None:
        """Read `peers`' commits up to `to_block` that no read has seen, keeping the last that names
        a mechanism."""
        before = self.from_block - 1
        with self._named_lock:
            start = min(self._named.get(p, (before, None))[0] for p in peers) + 1
        if start > to_block:
            return
        latest: dict[str, NamedMechanism] = {}
        for e in self._logs(("Committed",), start, to_block, None, [_address_topic(p) for p in sorted(peers)]):
            c = self._commit_of(e)
            if c.mechanism:
                latest[c.peer] = _named_at(c)
        self._keep_named({p: latest.get(p) for p in peers}, to_block, since=start)

    def _keep_named(self, latest: dict[str, NamedMechanism | None], to_block: int, since: int = 0) -> None:
        """Per member, the last commit naming a mechanism in blocks `since`..`to_block` (None: none
        there), read: the cache moves on to `to_block` unless a read went further meanwhile."""
        with self._named_lock:
            for peer, named in latest.items():
                read_to, kept = self._named.get(peer, (self.from_block - 1, None))
                if read_to >= to_block or read_to + 1 < since:
                    continue
                self._named[peer] = (to_block, named if named is not None and named.block_number > read_to else kept)

    def attestations(self, round: int) -> list[Attestation]:
        """The counted votes on `round`, as `LedgerClient.attestations` gives SwarmLedger's (each with
        its key's tally): `node.chain.votes.votes_on` over its commits, the next round's and its
        final votes, all from one log read at one block within the round's span, up to the vote
        that finalized it (`_finalizing_event`: the votes a transaction holds after that one the
        contract did not count) or to its RoundAborted. Kept once the round ended (`_settled`)."""
        kept = self._kept_round(round)
        if kept is not None and kept.attestations is not None:
            return kept.attestations
        generation = self._generation

        def read() -> tuple[list[Attestation], str | None]:
            at = self.block_number()
            current = self.current_round(block=at)
            names = COMMIT_EVENTS + ("Voted", "RoundFinalized")
            logs, missing_span = self._round_logs(round, 2, names, (round, round + 1), at, current)
            voters, missing = self._complete_commits(round, logs, at, current)
            after, missing_after = self._complete_commits(round + 1, logs, at, current)
            end = next((e for e in logs if e["event"] in ROUND_ENDS and e["args"]["round"] == round), None)
            last: tuple[int, int] | None = None  # the last counted vote's place, (block, log index)
            if end is not None and end["event"] == "RoundFinalized":
                vote = _finalizing_event(round, end, logs)
                if vote is None:
                    return [], f"round {round}: no vote after its RoundFinalized by block {at}"
                last = _position(vote)
            elif end is not None:  # RoundAborted: no vote after it counts
                last = (_position(end)[0], _position(end)[1] - 1)
            votes = [c for c in after if last is None or _position_of(c) <= last]
            finals = [
                self._final_vote_of(e)
                for e in logs
                if e["event"] == "Voted" and e["args"]["round"] == round and (last is None or _position(e) <= last)
            ]
            counted, lacking = votes_on(voters, votes, finals), missing_span or missing or missing_after
            if lacking is None and end is not None:
                self._keep(round, generation, int(end["blockNumber"]), at, attestations=counted)
            return counted, lacking

        return self._until_complete(read)

    def final_votes(self, round: int) -> list[FinalVote]:
        """The final votes on `round` (Voted events) up to `block_number`, in chain order."""

        def read() -> tuple[list[FinalVote], str | None]:
            logs, missing = self._round_logs(round, 2, ("Voted",), (round,), self.block_number())
            return [self._final_vote_of(e) for e in logs], missing

        return self._until_complete(read)

    def finalized(self, round: int) -> tuple[bytes, bytes] | None:
        """(digest, bitmap) round `round` was finalized with, None if it was not (at `block_number`):
        the vote of the transaction that holds its RoundFinalized event (a commit of round + 1 or a
        final vote), read again while that vote's log lags."""

        def read() -> tuple[tuple[bytes, bytes] | None, str | None]:
            events, missing = self._round_logs(round, 2, ("RoundFinalized",), (round,), self.block_number())
            if missing is not None:
                return None, missing
            return self._finalizing_vote(round, events[0]) if events else (None, None)

        return self._until_complete(read)

    def finalized_digest(self, round: int) -> bytes | None:
        kept = self._kept_round(round)
        if kept is not None and kept.info is not None:
            return kept.info.finalized_digest
        found = self.finalized(round)
        return found[0] if found else None

    def last_finalized(self) -> tuple[int, bytes]:
        """(last finalized round, its digest); (0, genesis digest) before any."""

        def read() -> tuple[tuple[int, bytes], str | None]:
            at = self.block_number()
            last = self.last_finalized_round(block=at)
            if last == 0:
                return (0, self.params().genesis_digest), None
            kept = self._kept_round(last)
            if kept is not None and kept.info is not None and kept.info.finalized_digest is not None:
                return (last, kept.info.finalized_digest), None
            events, missing = self._round_logs(last, 2, ("RoundFinalized",), (last,), at)
            vote, missing = self._finalizing_vote(last, events[0]) if events else (None, missing)
            if vote is None:
                return (last, b""), missing or f"round {last}: finalized in the state, no RoundFinalized by block {at}"
            return (last, vote[0]), None

        return self._until_complete(read)

    def _finalizing_vote(self, round: int, event: Any) -> tuple[tuple[bytes, bytes] | None, str | None]:
        """The vote that finalized `round`, whose RoundFinalized is `event`: the first Committed event
        of round + 1 or Voted event of round after it in its transaction (`_finalizing_event`; read in
        that block only), or what is missing."""
        block = int(event["blockNumber"])
        logs = self._logs(("Committed", "Voted"), block, block, _round_topics(round, round + 1))
        vote = _finalizing_event(round, event, logs)
        if vote is None:
            return None, f"round {round}: no vote in its finalizing transaction after its RoundFinalized"
        a = vote["args"]
        return (
            bytes(a["voteDigest" if vote["event"] == "Committed" else "aggregateDigest"]),
            bytes(a["included"]),
        ), None

    # ---------------------------------------------------------------- the round index

    def _round_logs(
        self,
        round: int,
        reach: int,
        names: tuple[str, ...],
        rounds: tuple[int, ...],
        at: int,
        current: int | None = None,
    ) -> tuple[list[Any], str | None]:
        """The events `names` of `rounds` (their indexed round) by block `at` (round `current` open
        there; read if needed) that lie in `round`'s span: from its opening block to the opening
        block of round + `reach` (1: the round's commits; 2: the votes on it and its end), or to
        `at` while that one is not open. The bounds come from the round index, checked against the
        openings the same read returns (where one does not hold, a reorganisation or logs that lag,
        the index forgets from that round on and the read says what is missing, to be read again).
        An index that lacks only openings this read returns anyway is fed from it; one further
        behind is fed first (`_feed_index`). [] while `round` is not open."""
        with self._index_lock:
            known = len(self._openings)
        if known < round + reach and current is None:
            current = self.current_round(block=at)
        need = known if current is None else min(round + reach, current)
        if round > known and current is not None and round > current:
            return [], None
        if known < need and not (known + 1 >= round and need == current):
            missing = self._feed_index(at, need)
            if missing is not None:
                return [], missing
        with self._index_lock:
            known = len(self._openings)
            if round <= known:
                low = self._openings[round - 1]
                if low > at:
                    return [], None
            else:  # opened after the last block indexed: this read feeds the index
                low = max(self._indexed_to, self.from_block - 1) + 1
            end = self._openings[round + reach - 1] if round + reach <= known else at + 1
        high, bounded = (end, True) if end <= at else (at, False)
        query = names + tuple(n for n in ROUND_OPENINGS if n not in names)
        query_rounds = sorted(set(rounds) | set(range(max(round - 1, 0), round + reach + 1)))
        logs = self._logs(query, low, high, _round_topics(*query_rounds))
        openings = [e for e in logs if e["event"] in ROUND_OPENINGS]
        opened = {_opened_round(e): int(e["blockNumber"]) for e in openings}
        for check, block in ((round, low if round <= known else None), (round + reach, high if bounded else None)):
            if block is not None and opened.get(check) != block:
                self._forget(check)
                return [], f"round {round}: the round index's span {low}..{high} does not hold at block {at}"
        if known < need:
            missing = self._index(openings, at, need)
            if missing is not None:
                return [], missing
        return [e for e in logs if e["event"] in names and int(e["args"]["round"]) in rounds], None

    def _feed_index(self, at: int, need: int) -> str | None:
        """Read the round openings after the last block indexed up to `at` into the index; what is
        missing if they do not reach round `need`, open by `at` (`_index`)."""
        with self._index_lock:
            start = max(self._indexed_to, self.from_block - 1) + 1
        return self._index(self._logs(ROUND_OPENINGS, start, at) if start <= at else [], at, need)

    def _index(self, openings: list[Any], at: int, need: int) -> str | None:
        """Take `openings` (every RoundOpened/RoundClosed event after the last block indexed up to
        `at`, in chain order; others' rounds may be among them) into the index; what is missing if
        they do not reach round `need`, open by `at` (logs that lag: the index is read on from its
        opening before its last next time). An opening that moved, or one taken back, drops the kept
        rounds (`_drop_kept`)."""
        reorganised = False
        with self._index_lock:
            for e in openings:
                round, block = _opened_round(e), int(e["blockNumber"])
                if round <= len(self._openings) and self._openings[round - 1] == block:
                    continue  # indexed already (another thread's read)
                if round > len(self._openings) + 1:
                    break  # an opening lacks: logs that lag
                reorganised = reorganised or round <= len(self._openings)  # a round that opened elsewhere
                del self._openings[round - 1 :]  # from there on
                self._openings.append(block)
            else:
                self._indexed_to = max(self._indexed_to, at)
            reached = len(self._openings) >= need
            if not reached:
                # logs that lag, or an opening that moved before the last one indexed (a reorganisation
                # deeper than this read reached back): the next read goes on from the opening before
                # the last, a round further back each time, so that one that moved earlier is found
                reorganised = reorganised or len(self._openings) > 1
                del self._openings[-1:]
                self._indexed_to = self._openings[-1] - 1 if self._openings else -1
            known = len(self._openings)
        if reorganised:
            self._drop_kept()
        if reached:
            return None
        return f"the round index reaches round {known} by block {at}, round {need} is open"

    def _forget(self, round: int) -> None:
        """The index's opening of `round` does not hold: forget it and the rounds after, and read on
        from the opening before it; the kept rounds go with it (`_drop_kept`)."""
        with self._index_lock:
            del self._openings[max(round - 1, 0) :]
            self._indexed_to = self._openings[-1] - 1 if self._openings else -1
        self._drop_kept()

    # ---------------------------------------------------------------- what is kept of settled rounds

    def _settled(self, block: int, at: int) -> bool:
        """Whether a round's end (its close, for its commits) mined in `block` no longer changes,
        read at pinned block `at`: with `confirmations` k > 0 at once (`at` lies k deep, where this
        client takes nothing to change: its transactions count there too); with 0, once a block lies
        on it (the head's own block is the one most often replaced). A deeper reorganisation is
        seen by the round index or the open round (`_drop_kept`)."""
        return block <= at - (0 if self.confirmations else 1)

    def _kept_round(self, round: int) -> KeptRound | None:
        with self._kept_lock:
            return self._kept.get(round)

    def _keep(self, round: int, generation: int, settled: int | None, at: int, **reads: Any) -> None:
        """Keep `reads` of `round` (KeptRound's fields) once it settled in block `settled` as read at
        `at`, unless a reorganisation was seen since the read began (`generation`); the last
        KEPT_ROUNDS rounds only."""
        if settled is None or not self._settled(settled, at):
            return
        with self._kept_lock:
            if generation != self._generation:
                return
            kept = self._kept.setdefault(round, KeptRound())
            for name, value in reads.items():
                setattr(kept, name, value)
            for old in sorted(self._kept)[:-KEPT_ROUNDS]:
                del self._kept[old]

    def _drop_kept(self) -> None:
        """A reorganisation seen (an opening moved, or a kept round open again): forget every kept
        round and the pinned block's views."""
        with self._kept_lock:
            self._kept.clear()
            self._pinned_views = (None, {})
            self._generation += 1

    def _until_complete(self, read: Callable[[], tuple[T, str | None]]) -> T:
        """`read_until_complete`, the pinned block's views read again before each retry (what is
        missing may be a view that a reorganisation at the same height changed)."""

        def again() -> tuple[T, str | None]:
            value, missing = read()
            if missing is not None:
                with self._kept_lock:
                    self._pinned_views = (None, {})
            return value, missing

        return read_until_complete(again)

    # ---------------------------------------------------------------- the head and the endpoint

    def block_number(self) -> int:
        """The block this client reads the chain at: the head less `confirmations`, where a mirror
        is read the block before a fresh head not held whole yet (`LedgerMirror.readable`)."""
        at = max(0, self.head() - self.confirmations)
        return self.mirror.readable(at) if self.mirror is not None else at

    def head(self) -> int:
        """The chain's head, never behind one read before (`rawrpc.HeadGuard`): a subscription's
        pushed head while one runs (`pushed_head`, as `LedgerClient.head` takes it), else polled."""
        pushed = self.pushed_head() if self.pushed_head is not None else None
        if pushed is None:
            return self._polled_head()
        if self._read_latest:  # a view at "latest" may have seen blocks not pushed yet: ask once
            self._read_latest = False
            self._polled_head()
        last = self._head.last
        return pushed if last is None or pushed >= last else last

    def _polled_head(self) -> int:
        return self._head.check(lambda: with_retries(lambda: head_block(self.w3), what="block_number"))

    def take_head(self, head: int) -> int:
        """A head learnt otherwise than by asking (a subscription's newHeads), held to the same
        guard as a polled one: the head taken, which is `head` or the last one (`HeadRefused`)."""
        return self._head.check(lambda: head)

    def take_head_at_once(self, head: int) -> int | None:
        """`take_head` where it needs no request (`rawrpc.HeadGuard.take_at_once`); None where it does."""
        return self._head.take_at_once(head)

    def _pushed_base_fee(self) -> int | None:
        return self.pushed_base_fee() if self.pushed_base_fee is not None else None

    def rpc_requests(self) -> int:
        """HTTP requests this client's endpoint has had so far (0 where it is not counted: a
        provider other than `connect`'s)."""
        provider = self.w3.provider
        return provider.all_requests() if isinstance(provider, CountingHTTPProvider) else 0

    def block_hash(self, number: int) -> bytes | None:
        """The hash of block `number` as the endpoint serves it; None if it serves no such block."""
        request = partial(self.w3.provider.make_request, RPCEndpoint("eth_getBlockByNumber"), [hex(number), False])
        return header_hash(with_retries(request, what="block_hash"), number)

    def _view(self, fn_name: str, *args: Any, block: int | None = None) -> Any:
        """A view at `block`; else at `block_number()` when reads lie `confirmations` deep, at
        "latest" when they do not (one request fewer)."""
        pushed = self.pushed_head is not None and self.pushed_head() is not None
        if block is None and (self.confirmations or pushed):
            block = self.block_number()  # a pushed head may lag "latest": read where the pinned reads do
        elif block is None:
            self._read_latest = True  # the next pushed head is first held to the endpoint's (`head`)
        if block is None or fn_name not in PINNED_VIEWS:
            return self._call_view(fn_name, args, block)
        key, name = self._state_key(block), (fn_name, *args)
        with self._kept_lock:
            state, views = self._pinned_views
            if key == state and name in views:
                return views[name]
        value = self._call_view(fn_name, args, block)
        with self._kept_lock:
            state, views = self._pinned_views
            if key != state and (key[0] == "state" or state is None or state[0] != "block" or key[1] > state[1]):
                self._pinned_views = state, views = key, {}  # the views of one state are kept: the latest
            if key == state:
                views[name] = value
        return value

    def _call_view(self, fn_name: str, args: tuple[Any, ...], block: int | None) -> Any:
        """One view: a bare eth_call through the raw reader where there is one (`node.chain.codec`:
        a tenth of web3's CPU, one request), else web3's contract call."""
        raw = self._raw_rpc()
        if raw is not None:
            request = {"to": self.address, "data": self._codec.calldata(fn_name, args)}
            params = [request, "latest" if block is None else hex(block)]
            return self._codec.decode(
                fn_name, with_retries(partial(raw_call, raw, self._errors, "eth_call", params), what=fn_name)
            )
        fn = getattr(self.contract.functions, fn_name)(*args)
        return with_retries(fn.call if block is None else partial(fn.call, block_identifier=block), what=fn_name)

    def _state_key(self, block: int) -> tuple[Any, ...]:
        """What the live views at `block` depend on: where the mirror holds the blocks up to it, the
        last one that changed the ledger's state (with the mirror's epoch), so that every block
        since shares its views; else the block itself."""
        changed = self.mirror.last_change(block) if self.mirror is not None else None
        return ("block", block) if changed is None else ("state", *changed)

    def _raw_rpc(self) -> RawRPC | None:
        """The cheap reader for the watcher's probe (`raw_reader`); None where there is none."""
        if self._raw is None:
            self._raw = raw_reader(self.w3) or False
        return self._raw if isinstance(self._raw, RawRPC) else None

    def _logs(self, names: tuple[str, ...], from_block: int, to_block: int, *topics: list[str] | None) -> list[Any]:
        """The logs of the events `names` in from_block..to_block, decoded, in chain order, whose
        indexed arguments match `topics` (by position after the signature: any of those given; None:
        any), in one request per LOG_CHUNK_BLOCKS blocks for all of them."""
        held = self._mirrored(from_block, to_block)
        if held is not None:
            return self._held_logs(held, names, topics)
        self._local.log_reads = self._endpoint_log_reads() + 1
        query_topics: list[Any] = [[self._signatures[name] for name in names], *topics]
        found: list[Any] = []
        for start in range(from_block, to_block + 1, LOG_CHUNK_BLOCKS):
            end = min(to_block, start + LOG_CHUNK_BLOCKS - 1)
            query: FilterParams = {"address": self.address, "fromBlock": start, "toBlock": end, "topics": query_topics}
            found += with_retries(partial(self.w3.eth.get_logs, query), what=f"get_logs {'/'.join(names)}")
        return sorted((self._decode(log) for log in found), key=lambda e: (e["blockNumber"], e["logIndex"]))

    def _endpoint_log_reads(self) -> int:
        """Log reads this thread sent to the endpoint so far (a read the mirror did not answer)."""
        return int(getattr(self._local, "log_reads", 0))

    def _mirrored(self, from_block: int, to_block: int) -> list[MirroredLog] | None:
        """The mirror's logs of from_block..to_block (`node.chain.mirror`), the blocks before the first
        it holds read into it first (from the deployment: once); None where it cannot answer."""
        if self.mirror is None:
            return None
        held = self.mirror.logs(from_block, to_block)
        gap = self.mirror.gap(from_block, to_block) if held is None else None
        if gap is not None:
            epoch, first = gap
            entries = []  # the ledger has no logs before its deployment: read from there, held from block 0
            deployed = self._params.deploy_block if self._params is not None else self.from_block
            for low in range(deployed, first, LOG_CHUNK_BLOCKS):
                query: FilterParams = {
                    "address": self.address,
                    "fromBlock": low,
                    "toBlock": min(first - 1, low + LOG_CHUNK_BLOCKS - 1),
                }
                for log in with_retries(partial(self.w3.eth.get_logs, query), what="get_logs (backfill)"):
                    topics = tuple(bytes(t) for t in log["topics"])
                    if not topics:
                        raise LedgerError(f"a log of {self.address} with no topic")
                    entries.append(MirroredLog(int(log["blockNumber"]), int(log["logIndex"]), topics, log))
            claimed = 0 if self._params is not None else deployed  # (before the deployment: no logs)
            if self._backfill_agrees(entries, first - 1) and self.mirror.backfill(epoch, claimed, first - 1, entries):
                held = self.mirror.logs(from_block, to_block)
        return held

    def _backfill_agrees(self, entries: list[MirroredLog], at: int) -> bool:
        """Whether `entries`, the ledger's logs up to block `at` read from the endpoint, account for
        its state there (the open round, its participant count): an endpoint whose logs lag its
        blocks may answer the last ones without them, which the mirror would hold for good."""
        openings = [e for e in entries if e.topics[0] in self._opening_topics]
        if not openings:
            return False  # the deployment itself opens round 1
        opening = self._decoded(openings[-1])
        current = _opened_round(opening)
        committed = sum(
            1
            for e in entries
            if e.topics[0] == self._committed_topic
            and (e.block, e.index) > (openings[-1].block, openings[-1].index)
            and int(self._decoded(e)["args"]["round"]) == current
        )
        state = int(self._call_view("currentRound", (), at)), int(self._call_view("openRoundCounts", (), at)[0])
        return state == (current, committed)

    def _held_logs(
        self, held: list[MirroredLog], names: tuple[str, ...], topics: tuple[list[str] | None, ...]
    ) -> list[Any]:
        """The mirror's `held` logs that `_logs`' query would return, decoded (once a log)."""
        signatures = {bytes.fromhex(self._signatures[name][2:]) for name in names}
        wanted = [None if t is None else {bytes.fromhex(x[2:]) for x in t} for t in topics]
        found = []
        for entry in held:
            if entry.topics[0] not in signatures:
                continue
            if any(
                w is not None and (i + 1 >= len(entry.topics) or entry.topics[i + 1] not in w)
                for i, w in enumerate(wanted)
            ):
                continue
            found.append(self._decoded(entry))
        return found

    def _decoded(self, entry: MirroredLog) -> Any:
        if entry.decoded is None:
            entry.decoded = self._decode(entry.log)
        return entry.decoded

    def _decode(self, log: Any) -> Any:
        """A log of this contract's decoded by the event its first topic names."""
        topics = log.get("topics") or []
        name = self._events_by_signature.get("0x" + bytes(topics[0]).hex()) if topics else None
        if name is None:
            raise LedgerError(f"a log of {self.address} that names no event of the contract")
        try:
            return self._events.decode(log)
        except (ValueError, TypeError, KeyError, DecodingError, OverflowError):
            pass  # web3 decides: its own answer, or its error
        try:
            return getattr(self.contract.events, name)().process_log(log)
        except Exception as exc:  # the endpoint's bytes (an offset past 2**63 is an OverflowError in eth_abi)
            raise LedgerError(f"a {name} log of {self.address} that does not decode: {exc}") from None

    def _timestamp(self, event: Any) -> int:
        """The timestamp of the block holding `event`, kept by block hash (a reorganised block is another)."""
        block_hash = HexStr("0x" + bytes(event["blockHash"]).hex())
        found = self._timestamps.get(block_hash)
        if found is None and self.mirror is not None:
            found = self.mirror.timestamp(bytes(event["blockHash"]))
        if found is None:
            block = with_retries(lambda: self.w3.eth.get_block(block_hash), what="block timestamp")
            found = self._timestamps[block_hash] = int(block["timestamp"])
        return found

    @staticmethod
    def _final_vote_of(event: Any) -> FinalVote:
        a = event["args"]
        return FinalVote(
            round=int(a["round"]),
            peer=str(a["peer"]),
            aggregate_digest=bytes(a["aggregateDigest"]),
            included=bytes(a["included"]),
            block_number=int(event["blockNumber"]),
            log_index=int(event["logIndex"]),
        )

    @staticmethod
    def _commit_of(event: Any) -> VotedCommit:
        a = event["args"]
        return VotedCommit(
            round=int(a["round"]),
            peer=str(a["peer"]),
            index=int(a["index"]),
            digest=bytes(a["digest"]),
            num_samples=int(a["numSamples"]),
            eps_micro=int(a["epsMicro"]),
            record_eps_micro=int(a["recordEpsMicro"]),
            mechanism=bytes(a["mechanism"]),
            vote_digest=bytes(a["voteDigest"]),
            included=bytes(a["included"]),
            block_number=int(event["blockNumber"]),
            log_index=int(event["logIndex"]),
        )


_UNREAD = RoundInfo(0, RoundState.OPEN, 0, 0, 0, 0, None, 0, 0)  # a reading that lacks events: read again


def _first_block(logs: list[Any], names: tuple[str, ...], round: int) -> int | None:
    """The block of the first of `logs` that is one of `names` of `round`; None if none is."""
    return next((int(e["blockNumber"]) for e in logs if e["event"] in names and e["args"]["round"] == round), None)


def _round_topics(*rounds: int) -> list[str]:
    """Indexed rounds as a log's topic holds them."""
    return ["0x" + r.to_bytes(32, "big").hex() for r in rounds]


def _address_topic(address: str) -> str:
    """An indexed address as a log's topic holds it: 32 bytes, zero-padded on the left."""
    return "0x" + "00" * 12 + address.lower().removeprefix("0x")


def _opened_round(event: Any) -> int:
    """The round a RoundOpened or RoundClosed event opens."""
    round = int(event["args"]["round"])
    return round if event["event"] == "RoundOpened" else round + 1


def _position(event: Any) -> tuple[int, int]:
    """An event's place in the chain: (block, log index)."""
    return int(event["blockNumber"]), int(event["logIndex"])


def _position_of(commit: VotedCommit) -> tuple[int, int]:
    return commit.block_number, commit.log_index


def _named_at(commit: VotedCommit) -> NamedMechanism:
    return NamedMechanism(commit.block_number, commit.log_index, commit.mechanism)


def _finalizing_event(round: int, finalized: Any, logs: list[Any]) -> Any:
    """The vote that finalized `round` among `logs` (chain order), its RoundFinalized event being
    `finalized`: the contract emits RoundFinalized inside the counting of that vote, before the
    vote's own event (Committed of round + 1 in `commit`, Voted of round in `vote`), so it is the
    first such event after RoundFinalized in the same transaction; those after it were not counted.
    None if `logs` lack it."""
    return next(
        (
            e
            for e in logs
            if e["transactionHash"] == finalized["transactionHash"]
            and _position(e) > _position(finalized)
            and (e["event"], int(e["args"]["round"])) in (("Committed", round + 1), ("Voted", round))
        ),
        None,
    )


def _count(closed: Any) -> int:
    """The participant count of a RoundClosed event."""
    return int(closed["args"]["participantCount"])
