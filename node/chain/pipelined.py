"""Client of the one-transaction-per-round prototype (contracts/PipelinedLedger.sol, docs/LEDGER.md "One
transaction per round"): a member's commit carries its vote on the round before, rounds close by
themselves, a final `vote` serves a member that does not commit in the next round. The chain layer the
pipelined round loop is to call; `swarm node` still runs SwarmLedger through `node.chain.client`.

Synchronous like `LedgerClient` (call it from `trio.to_thread.run_sync`); transactions go through the
same `TransactionSender` (estimate on the pending block, nonces, fee bumps, confirmations), and a
refusal raises a `LedgerError` naming the contract's custom error. Reads as `LedgerClient`'s: at the
head less `confirmations` (views pinned there, logs read up to there in chunks of LOG_CHUNK_BLOCKS from
the deployment's block), the head held by `rawrpc.HeadGuard`, logs that lag their block read again
until the state accounts for them, the endpoint's requests counted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache, partial
from importlib import resources
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.types import RPCEndpoint, TxReceipt

from node.chain.client import (
    DEFAULT_TX_TIMEOUT_S,
    LOG_CHUNK_BLOCKS,
    CountingHTTPProvider,
    constructor_settings,
    head_block,
    read_until_complete,
)
from node.chain.decoder import RevertDecoder
from node.chain.errors import LedgerError
from node.chain.rawrpc import HeadGuard, header_hash
from node.chain.retries import with_retries
from node.chain.sender import TransactionSender

ARTIFACT_NAME = (
    "PipelinedLedger.json"  # package data, written by scripts/compile_contracts.py --contract PipelinedLedger
)


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
        self.contract = w3.eth.contract(address=self.address, abi=abi)
        self.confirmations = confirmations
        self.from_block = from_block
        self.gas_used: dict[str, int] = {}  # last receipt's gasUsed per function, for benchmarks
        self._head = HeadGuard(lambda number: self._block_hash(number) is not None)
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

    # ---------------------------------------------------------------- views and events

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

    def commitments(self, round: int) -> list[VotedCommit]:
        """Round `round`'s commits in participant order, with the votes they carry, read at one
        pinned block (`block_number`). Checked to be numbered 0, 1, ... (a duplicated log is an
        error, not a longer list) and to be as many as the state says at that block (the open
        round's count, or a closed round's `RoundClosed`; a round past that neither closed nor was
        aborted has lost its events): logs that lag are read again first (`read_until_complete`)."""

        def read() -> tuple[list[VotedCommit], str | None]:
            at = self.block_number()
            found = [self._commit_of(e) for e in self._events("Committed", {"round": round}, at)]
            if [c.index for c in found] != list(range(len(found))):
                raise LedgerError(f"round {round}: the Committed events are not numbered 0..{len(found) - 1}")
            expected, lagging = self._expected_commits(round, at)
            if lagging or expected is None or expected == len(found):
                return found, lagging
            return found, f"round {round}: {len(found)} Committed events at block {at}, {expected} in the state"

        return read_until_complete(read)

    def _expected_commits(self, round: int, at: int) -> tuple[int | None, str | None]:
        """How many members committed in `round` by block `at`, from the state (None for an open round
        aborted with its voting round: its count is in no event), or what the logs lack to tell."""
        current = self.current_round(block=at)
        if round >= current:
            return (self.open_round_participants(block=at) if round == current else 0), None
        closed = self._events("RoundClosed", {"round": round}, at)
        if closed:
            return int(closed[0]["args"]["participantCount"]), None
        if self._events("RoundAborted", {"round": round}, at):
            return None, None
        return None, f"round {round}: neither RoundClosed nor RoundAborted by block {at}, round {current} open"

    def final_votes(self, round: int) -> list[FinalVote]:
        """The final votes on `round` (Voted events) up to `block_number`, in chain order."""
        return [
            FinalVote(
                round=int(e["args"]["round"]),
                peer=str(e["args"]["peer"]),
                aggregate_digest=bytes(e["args"]["aggregateDigest"]),
                included=bytes(e["args"]["included"]),
                block_number=int(e["blockNumber"]),
                log_index=int(e["logIndex"]),
            )
            for e in self._events("Voted", {"round": round}, self.block_number())
        ]

    def finalized(self, round: int) -> tuple[bytes, bytes] | None:
        """(digest, bitmap) round `round` was finalized with, None if it was not (at `block_number`):
        the vote of the transaction that holds its RoundFinalized event (a commit of round + 1 or a
        final vote), read again while that vote's log lags."""

        def read() -> tuple[tuple[bytes, bytes] | None, str | None]:
            at = self.block_number()
            events = self._events("RoundFinalized", {"round": round}, at)
            if not events:
                return None, None
            tx = events[0]["transactionHash"]
            votes = [
                (bytes(e["args"]["voteDigest"]), bytes(e["args"]["included"]))
                for e in self._events("Committed", {"round": round + 1}, at)
                if e["transactionHash"] == tx
            ] + [
                (bytes(e["args"]["aggregateDigest"]), bytes(e["args"]["included"]))
                for e in self._events("Voted", {"round": round}, at)
                if e["transactionHash"] == tx
            ]
            if len(votes) > 1:
                raise LedgerError(f"round {round}: {len(votes)} votes in the finalizing transaction, not one")
            return (votes[0], None) if votes else (None, f"round {round}: no vote in its finalizing transaction")

        return read_until_complete(read)

    # ---------------------------------------------------------------- the head and the endpoint

    def block_number(self) -> int:
        """The block this client reads the chain at: the head less `confirmations`."""
        return max(0, self.head() - self.confirmations)

    def head(self) -> int:
        """The chain's head, never behind one read before (`rawrpc.HeadGuard`)."""
        return self._head.check(lambda: with_retries(lambda: head_block(self.w3), what="block_number"))

    def rpc_requests(self) -> int:
        """HTTP requests this client's endpoint has had so far (0 where it is not counted: a
        provider other than `connect`'s)."""
        provider = self.w3.provider
        return provider.all_requests() if isinstance(provider, CountingHTTPProvider) else 0

    def _block_hash(self, number: int) -> bytes | None:
        request = partial(self.w3.provider.make_request, RPCEndpoint("eth_getBlockByNumber"), [hex(number), False])
        return header_hash(with_retries(request, what="block_hash"), number)

    def _view(self, fn_name: str, *args: Any, block: int | None = None) -> Any:
        """A view at `block`; else at `block_number()` when reads lie `confirmations` deep, at
        "latest" when they do not (one request fewer)."""
        if block is None and self.confirmations:
            block = self.block_number()
        fn = getattr(self.contract.functions, fn_name)(*args)
        return with_retries(fn.call if block is None else partial(fn.call, block_identifier=block), what=fn_name)

    def _events(self, event: str, filters: dict[str, Any], to_block: int) -> list[Any]:
        """`event`'s logs from the deployment's block to `to_block` whose indexed arguments equal
        `filters`, in chain order, in requests of LOG_CHUNK_BLOCKS blocks at most."""
        getter = getattr(self.contract.events, event).get_logs
        found: list[Any] = []
        for start in range(self.from_block, to_block + 1, LOG_CHUNK_BLOCKS):
            end = min(to_block, start + LOG_CHUNK_BLOCKS - 1)
            found += with_retries(
                partial(getter, argument_filters=filters, from_block=start, to_block=end), what=f"get_logs {event}"
            )
        return sorted(found, key=lambda e: (e["blockNumber"], e["logIndex"]))

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
