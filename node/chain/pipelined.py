"""Client of the one-transaction-per-round prototype (contracts/PipelinedLedger.sol, docs/LEDGER.md "One
transaction per round"): a member's commit carries its vote on the round before, rounds close by
themselves, a final `vote` serves a member that does not commit in the next round. The chain layer the
pipelined round loop is to call; `swarm node` still runs SwarmLedger through `node.chain.client`.

Synchronous like `LedgerClient` (call it from `trio.to_thread.run_sync`); transactions go through the
same `TransactionSender` (estimate on the pending block, nonces, fee bumps, confirmations), and a
refusal raises a `LedgerError` naming the contract's custom error."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.types import TxReceipt

from node.chain.client import DEFAULT_TX_TIMEOUT_S, constructor_settings
from node.chain.decoder import RevertDecoder
from node.chain.errors import LedgerError
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


class PipelinedClient:
    """One PipelinedLedger deployment; `account` None gives a read-only client."""

    def __init__(
        self,
        w3: Web3,
        address: str,
        account: LocalAccount | None = None,
        *,
        tx_timeout: float = DEFAULT_TX_TIMEOUT_S,
        confirmations: int = 0,
    ) -> None:
        abi = load_pipelined_artifact()["abi"]
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.contract = w3.eth.contract(address=self.address, abi=abi)
        self.gas_used: dict[str, int] = {}  # last receipt's gasUsed per function, for benchmarks
        self._tx = (
            TransactionSender(w3, account, RevertDecoder(abi), tx_timeout, confirmations=confirmations)
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
        client = cls(w3, receipt["contractAddress"], account, tx_timeout=tx_timeout)
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

    def current_round(self) -> int:
        """The open round."""
        return int(self._view("currentRound"))

    def voting_round(self) -> VotingRound:
        round, pending, participants = self._view("votingRound")
        return VotingRound(int(round), bool(pending), int(participants))

    def last_finalized_round(self) -> int:
        """The last finalized round (0: none; the model is the genesis)."""
        return int(self._view("lastFinalized"))

    def commitments(self, round: int) -> list[VotedCommit]:
        """Round `round`'s commits in participant order, with the votes they carry; checked to be
        numbered 0, 1, ... (a dropped or duplicated log is an error, not a shorter list)."""
        found = [self._commit_of(e) for e in self._events("Committed", {"round": round})]
        if [c.index for c in found] != list(range(len(found))):
            raise LedgerError(f"round {round}: the Committed events are not numbered 0..{len(found) - 1}")
        return found

    def finalized(self, round: int) -> tuple[bytes, bytes] | None:
        """(digest, bitmap) round `round` was finalized with, None if it was not: the vote of the
        transaction that holds its RoundFinalized event (a commit of round + 1 or a final vote)."""
        events = self._events("RoundFinalized", {"round": round})
        if not events:
            return None
        tx = events[0]["transactionHash"]
        votes = [
            (bytes(e["args"]["voteDigest"]), bytes(e["args"]["included"]))
            for e in self._events("Committed", {"round": round + 1})
            if e["transactionHash"] == tx
        ] + [
            (bytes(e["args"]["aggregateDigest"]), bytes(e["args"]["included"]))
            for e in self._events("Voted", {"round": round})
            if e["transactionHash"] == tx
        ]
        if len(votes) != 1:
            raise LedgerError(f"round {round}: {len(votes)} votes in the finalizing transaction, not one")
        return votes[0]

    def _view(self, fn_name: str, *args: Any) -> Any:
        return with_retries(lambda: getattr(self.contract.functions, fn_name)(*args).call(), what=fn_name)

    def _events(self, event: str, filters: dict[str, Any]) -> list[Any]:
        getter = getattr(self.contract.events, event).get_logs
        logs = with_retries(lambda: getter(argument_filters=filters, from_block=0), what=f"get_logs {event}")
        return sorted(logs, key=lambda e: (e["blockNumber"], e["logIndex"]))

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
        )
