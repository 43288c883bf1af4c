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
head less `confirmations` (views pinned there, logs read up to there in chunks of LOG_CHUNK_BLOCKS from
the deployment's block), the head held by `rawrpc.HeadGuard`, logs that lag their block read again
until the state accounts for them, the endpoint's requests counted."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from importlib import resources
from typing import Any

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
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
    raw_reader,
    read_until_complete,
)
from node.chain.decoder import RevertDecoder
from node.chain.errors import LedgerError
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
class FinalVote:
    """A Voted event: a participant's vote on `round` outside a commit (it does not commit in the next)."""

    round: int
    peer: str
    aggregate_digest: bytes
    included: bytes
    block_number: int
    log_index: int


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
        self.confirmations = confirmations
        self.from_block = from_block
        self.gas_used: dict[str, int] = {}  # last receipt's gasUsed per function, for benchmarks
        self._head = HeadGuard(lambda number: self.block_hash(number) is not None)
        self._raw: RawRPC | None | bool = None  # None: not made yet; False: not available
        self._params: SwarmParams | None = None  # immutable: read once
        self._chain_id: int | None = None
        self._peer_ids: dict[str, bytes] = {}  # registered peer ids read so far (they never change)
        self._named: dict[str, list[VotedCommit]] = {}  # each member's commits naming a mechanism, read so far
        self._named_to: dict[str, int] = {}  # the block up to which `_named` holds a member's
        self._timestamps: dict[str, int] = {}  # block hash -> timestamp
        # the head a subscription pushes while it runs, else None (node.chain.subscription.ChainFeed.live_head)
        self.pushed_head: Callable[[], int | None] | None = None
        self._read_latest = False  # a view read "latest" since the last pushed head was used
        self._tx = (
            TransactionSender(w3, account, RevertDecoder(abi), tx_timeout, confirmations=confirmations, head=self.head)
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
        """The open round."""
        return int(self._view("currentRound", block=block))

    def voting_round(self, *, block: int | None = None) -> VotingRound:
        round, pending, participants = self._view("votingRound", block=block)
        return VotingRound(int(round), bool(pending), int(participants))

    def last_finalized_round(self, *, block: int | None = None) -> int:
        """The last finalized round (0: none; the model is the genesis)."""
        return int(self._view("lastFinalized", block=block))

    def open_round_participants(self, *, block: int | None = None) -> int:
        """How many members committed in the open round so far."""
        return int(self._view("openRoundCounts", block=block)[0])

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
        contract keeps none, and refuses a second registration), kept once read."""
        address = Web3.to_checksum_address(address)
        known = self._peer_ids.get(address)
        if known is None:
            found = self._logs(("Registered",), self.from_block, self.block_number(), [_address_topic(address)])
            known = bytes(found[0]["args"]["peerId"]) if found else b""
            if known:
                self._peer_ids[address] = known
        return known

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
        return read_until_complete(lambda: self._round_info_at(round, self.block_number() if block is None else block))

    def _round_info_at(self, round: int, at: int) -> tuple[RoundInfo, str | None]:
        current = self.current_round(block=at)
        if round > current:
            return RoundInfo(round, RoundState.OPEN, 0, 0, 0, 0, None, 0, 0), None
        events = self._logs(ROUND_EVENTS, self.from_block, at, _round_topics(round - 1, round))

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
        if self.voting_round(block=at) != VotingRound(round, True, _count(closed)):
            return _UNREAD, lagging  # the state has it ended: its RoundFinalized or RoundAborted lags
        return RoundInfo(
            round, RoundState.CLOSED, opened_block, closed_block, 0, _count(closed), None, opened_at, closed_at
        ), None

    def voted_commits(self, round: int) -> list[VotedCommit]:
        """Round `round`'s commits in participant order, with the votes they carry, read at one
        pinned block (`block_number`). Checked to be numbered 0, 1, ... (a duplicated log is an
        error, not a longer list) and to be as many as the state says at that block (the open
        round's count, or a closed round's `RoundClosed`; a round past that neither closed nor was
        aborted has lost its events): logs that lag are read again first (`read_until_complete`)."""

        def read() -> tuple[list[VotedCommit], str | None]:
            at = self.block_number()
            logs = self._logs(COMMIT_EVENTS, self.from_block, at, _round_topics(round))
            return self._complete_commits(round, logs, at, self.current_round(block=at))

        return read_until_complete(read)

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
        mechanism resolved: an empty one is that member's mechanism of its last commit that named one."""
        return self._resolved(self.voted_commits(round))

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

        history, at = read_until_complete(read)
        # the whole history up to `at`: its named mechanisms are all there are
        self._named[peer] = [c for c in history if c.mechanism]
        self._named_to[peer] = at
        return self._resolved(history)

    def _resolved(self, commits: list[VotedCommit]) -> list[Commitment]:
        """`commits` as Commitments, an empty mechanism replaced by its member's last named one
        before it (one log read filtered by those members, from where an earlier read stopped)."""
        unnamed = [c for c in commits if not c.mechanism]
        if unnamed:
            self._read_named({c.peer for c in unnamed}, max(c.block_number for c in unnamed))
        return [
            Commitment(
                peer=c.peer,
                index=c.index,
                digest=c.digest,
                num_samples=c.num_samples,
                eps_micro=c.eps_micro,
                mechanism=c.mechanism or self._named_before(c),
                block_number=c.block_number,
                record_eps_micro=c.record_eps_micro,
                round=c.round,
            )
            for c in commits
        ]

    def _read_named(self, peers: set[str], to_block: int) -> None:
        """Read the commits naming a mechanism of `peers` up to `to_block` that no read has seen."""
        before = self.from_block - 1
        start = min(self._named_to.get(p, before) for p in peers) + 1
        if start <= to_block:
            for e in self._logs(("Committed",), start, to_block, None, [_address_topic(p) for p in sorted(peers)]):
                c = self._commit_of(e)
                if c.mechanism and c.block_number > self._named_to.get(c.peer, before):
                    self._named.setdefault(c.peer, []).append(c)
        for p in peers:
            self._named_to[p] = max(self._named_to.get(p, before), to_block)

    def _named_before(self, commit: VotedCommit) -> bytes:
        earlier = [
            c
            for c in self._named.get(commit.peer, [])
            if (c.block_number, c.log_index) < (commit.block_number, commit.log_index)
        ]
        if not earlier:  # the contract refuses a first commit without one: the logs lack it
            raise LedgerError(f"{commit.peer}: its round {commit.round} commit names no mechanism, nor does one before")
        return earlier[-1].mechanism

    def attestations(self, round: int) -> list[Attestation]:
        """The counted votes on `round`, as `LedgerClient.attestations` gives SwarmLedger's (each with
        its key's tally): `node.chain.votes.votes_on` over its commits, the next round's and its
        final votes, all from one log read at one block, less the votes sent after the transaction
        that finalized or aborted it (the contract counts none of those)."""

        def read() -> tuple[list[Attestation], str | None]:
            at = self.block_number()
            current = self.current_round(block=at)
            names = COMMIT_EVENTS + ("Voted", "RoundFinalized")
            logs = self._logs(names, self.from_block, at, _round_topics(round, round + 1))
            voters, missing = self._complete_commits(round, logs, at, current)
            after, missing_after = self._complete_commits(round + 1, logs, at, current)
            end = next((e for e in logs if e["event"] in ROUND_ENDS and e["args"]["round"] == round), None)
            counted = {
                (e["blockNumber"], e["logIndex"])
                for e in logs
                if end is None
                or (e["blockNumber"], e["logIndex"]) < (end["blockNumber"], end["logIndex"])
                or e["transactionHash"] == end["transactionHash"]  # the finalizing vote: logged before its event
            }
            votes = [c for c in after if (c.block_number, c.log_index) in counted]
            finals = [
                self._final_vote_of(e)
                for e in logs
                if e["event"] == "Voted"
                and e["args"]["round"] == round
                and (e["blockNumber"], e["logIndex"]) in counted
            ]
            return votes_on(voters, votes, finals), missing or missing_after

        return read_until_complete(read)

    def final_votes(self, round: int) -> list[FinalVote]:
        """The final votes on `round` (Voted events) up to `block_number`, in chain order."""
        logs = self._logs(("Voted",), self.from_block, self.block_number(), _round_topics(round))
        return [self._final_vote_of(e) for e in logs]

    def finalized(self, round: int) -> tuple[bytes, bytes] | None:
        """(digest, bitmap) round `round` was finalized with, None if it was not (at `block_number`):
        the vote of the transaction that holds its RoundFinalized event (a commit of round + 1 or a
        final vote), read again while that vote's log lags."""

        def read() -> tuple[tuple[bytes, bytes] | None, str | None]:
            events = self._logs(("RoundFinalized",), self.from_block, self.block_number(), _round_topics(round))
            return self._finalizing_vote(round, events[0]) if events else (None, None)

        return read_until_complete(read)

    def finalized_digest(self, round: int) -> bytes | None:
        found = self.finalized(round)
        return found[0] if found else None

    def last_finalized(self) -> tuple[int, bytes]:
        """(last finalized round, its digest); (0, genesis digest) before any."""

        def read() -> tuple[tuple[int, bytes], str | None]:
            at = self.block_number()
            last = self.last_finalized_round(block=at)
            if last == 0:
                return (0, self.params().genesis_digest), None
            events = self._logs(("RoundFinalized",), self.from_block, at, _round_topics(last))
            vote, missing = self._finalizing_vote(last, events[0]) if events else (None, None)
            if vote is None:
                return (last, b""), missing or f"round {last}: finalized in the state, no RoundFinalized by block {at}"
            return (last, vote[0]), None

        return read_until_complete(read)

    def _finalizing_vote(self, round: int, event: Any) -> tuple[tuple[bytes, bytes] | None, str | None]:
        """The vote of the transaction holding `round`'s RoundFinalized `event` (a Committed event of
        round + 1 or a Voted event of round, read in that block only), or what is missing."""
        block = int(event["blockNumber"])
        votes = [
            (
                bytes(e["args"]["voteDigest" if e["event"] == "Committed" else "aggregateDigest"]),
                bytes(e["args"]["included"]),
            )
            for e in self._logs(("Committed", "Voted"), block, block, _round_topics(round, round + 1))
            if e["transactionHash"] == event["transactionHash"]
            and e["args"]["round"] == (round + 1 if e["event"] == "Committed" else round)
        ]
        if len(votes) > 1:
            raise LedgerError(f"round {round}: {len(votes)} votes in the finalizing transaction, not one")
        return (votes[0], None) if votes else (None, f"round {round}: no vote in its finalizing transaction")

    # ---------------------------------------------------------------- the head and the endpoint

    def block_number(self) -> int:
        """The block this client reads the chain at: the head less `confirmations`."""
        return max(0, self.head() - self.confirmations)

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
        fn = getattr(self.contract.functions, fn_name)(*args)
        return with_retries(fn.call if block is None else partial(fn.call, block_identifier=block), what=fn_name)

    def _raw_rpc(self) -> RawRPC | None:
        """The cheap reader for the watcher's probe (`raw_reader`); None where there is none."""
        if self._raw is None:
            self._raw = raw_reader(self.w3) or False
        return self._raw if isinstance(self._raw, RawRPC) else None

    def _logs(self, names: tuple[str, ...], from_block: int, to_block: int, *topics: list[str] | None) -> list[Any]:
        """The logs of the events `names` in from_block..to_block, decoded, in chain order, whose
        indexed arguments match `topics` (by position after the signature: any of those given; None:
        any), in one request per LOG_CHUNK_BLOCKS blocks for all of them."""
        query_topics: list[Any] = [[self._signatures[name] for name in names], *topics]
        found: list[Any] = []
        for start in range(from_block, to_block + 1, LOG_CHUNK_BLOCKS):
            end = min(to_block, start + LOG_CHUNK_BLOCKS - 1)
            query: FilterParams = {"address": self.address, "fromBlock": start, "toBlock": end, "topics": query_topics}
            found += with_retries(partial(self.w3.eth.get_logs, query), what=f"get_logs {'/'.join(names)}")
        return sorted((self._decode(log) for log in found), key=lambda e: (e["blockNumber"], e["logIndex"]))

    def _decode(self, log: Any) -> Any:
        """A log of this contract's decoded by the event its first topic names."""
        topics = log.get("topics") or []
        name = self._events_by_signature.get("0x" + bytes(topics[0]).hex()) if topics else None
        if name is None:
            raise LedgerError(f"a log of {self.address} that names no event of the contract")
        return getattr(self.contract.events, name)().process_log(log)

    def _timestamp(self, event: Any) -> int:
        """The timestamp of the block holding `event`, kept by block hash (a reorganised block is another)."""
        block_hash = HexStr("0x" + bytes(event["blockHash"]).hex())
        found = self._timestamps.get(block_hash)
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


def _round_topics(*rounds: int) -> list[str]:
    """Indexed rounds as a log's topic holds them."""
    return ["0x" + r.to_bytes(32, "big").hex() for r in rounds]


def _address_topic(address: str) -> str:
    """An indexed address as a log's topic holds it: 32 bytes, zero-padded on the left."""
    return "0x" + "00" * 12 + address.lower().removeprefix("0x")


def _count(closed: Any) -> int:
    """The participant count of a RoundClosed event."""
    return int(closed["args"]["participantCount"])
