"""Everything the ledger client raises. Contract refusals are `ContractRefusal` subclasses named
after the Solidity custom error, so callers catch exactly the refusal they expect."""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    """A ledger operation failed. Contract refusals are subclasses named after the custom error."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.fields = fields


class LedgerUnavailable(LedgerError):
    """The RPC endpoint did not answer (after retries)."""


class LedgerTimeout(LedgerError):
    """A transaction was sent but no receipt came within the timeout."""


class TransactionFailed(LedgerError):
    """A transaction was mined with status 0 and the reason could not be decoded."""


class ContractRefusal(LedgerError):
    """The contract refused with one of its custom errors; `fields` holds the error's arguments."""

    template = "{name}"

    def __init__(self, **fields: Any) -> None:
        super().__init__(self.template.format(**fields), **fields)


def _refusal(name: str, template: str) -> type[ContractRefusal]:
    cls = type(name, (ContractRefusal,), {"template": template, "__doc__": template})
    cls.__module__ = __name__
    return cls


InvalidParams = _refusal("InvalidParams", "invalid deployment parameter {name}")
NotDeployer = _refusal("NotDeployer", "{sender} is not the deployer: only the deployer manages the allowlist")
NotAllowed = _refusal("NotAllowed", "{account} is not on the swarm's allowlist")
NotRegistered = _refusal("NotRegistered", "{account} is not registered: call register(peer_id, signature) first")
AlreadyRegistered = _refusal("AlreadyRegistered", "{account} is already registered")
InvalidSignature = _refusal("InvalidSignature", "a registration signature is at most 128 bytes, got {length}")
InvalidPeerId = _refusal("InvalidPeerId", "peer id must be 1 to 128 bytes, got {length}")
WrongRound = _refusal("WrongRound", "round {given} is not the current round {current}")
AlreadyCommitted = _refusal("AlreadyCommitted", "{peer} already committed in round {round}")
CommitWindowClosed = _refusal("CommitWindowClosed", "round {round} no longer takes commitments")
CommitWindowOpen = _refusal(
    "CommitWindowOpen",
    "round {round}: the commit window lasts through block {lastBlock} and until block time {endsAt} (both must pass)",
)
QuorumNotMet = _refusal(
    "QuorumNotMet", "round {round}: {committed} of {minPeers} needed peers committed; the window extends"
)
EpsDecreasing = _refusal("EpsDecreasing", "cumulative eps may not decrease: {previousMicro} -> {givenMicro} micro-eps")
EpsNotPolicy = _refusal(
    "EpsNotPolicy",
    "the swarm's privacy policy spends exactly {expectedMicro} micro-eps by this commit, not {givenMicro}",
)
RecordEpsDecreasing = _refusal(
    "RecordEpsDecreasing", "record-level eps may not decrease: {previousMicro} -> {givenMicro} micro-eps"
)
RecordEpsOverCap = _refusal(
    "RecordEpsOverCap", "record-level eps {givenMicro} micro-eps passes the swarm's cap {capMicro} (0: no DP-SGD)"
)
EpsOverCap = _refusal("EpsOverCap", "cumulative eps {givenMicro} micro-eps passes the swarm's cap {capMicro}")
InvalidDigest = _refusal("InvalidDigest", "digest 0x{digest} is not allowed (0 and 1 are reserved)")
InvalidNumSamples = _refusal("InvalidNumSamples", "numSamples must be at least 1, got {numSamples}")
NumSamplesOverCap = _refusal(
    "NumSamplesOverCap", "numSamples {numSamples} passes the swarm's cap {maxSamples} (the FedAvg weight is capped)"
)
DuplicateDigest = _refusal(
    "DuplicateDigest", "round {round}: another participant already committed digest 0x{digest} (a copied update)"
)
RoundNotOpen = _refusal("RoundNotOpen", "round {round} is not open (it is {state})")
RoundNotClosed = _refusal("RoundNotClosed", "round {round} is not closed (it is {state})")
NotParticipant = _refusal("NotParticipant", "{account} did not commit in round {round}")
AlreadyAttested = _refusal("AlreadyAttested", "{peer} already attested in round {round}")
MalformedBitmap = _refusal(
    "MalformedBitmap",
    "round {round}: bitmap of {length} bytes, expected {expectedLength} (an attestation's: exactly that, with no "
    "bit past the last participant; an acknowledgment's: at most that)",
)
AbortTooEarly = _refusal(
    "AbortTooEarly",
    "round {round}: the attestation window lasts through block {lastBlock} and until block time {endsAt} "
    "(both must pass)",
)
RoundAlreadyFinalized = _refusal("RoundAlreadyFinalized", "round {round} is finalized and cannot be aborted")
InvalidStep = _refusal(
    "InvalidStep", "step {step} is neither posted (postFrame: 0 KEYS, 1 DEALING, 3 REVEAL) nor acknowledged (0 to 2)"
)


class StepWindowClosed(ContractRefusal):
    """round {round}: step {step}'s window has not begun (lastBlock and endsAt 0), or is over"""

    def __init__(self, **fields: Any) -> None:
        if fields.get("lastBlock") == 0 and fields.get("endsAt") == 0:
            message = "round {round}: step {step}'s window has not begun"
        else:
            message = (
                "round {round}: step {step}'s window is over "
                "(it lasted through block {lastBlock} and until block time {endsAt})"
            )
        LedgerError.__init__(self, message.format(**fields), **fields)


AlreadyPosted = _refusal("AlreadyPosted", "{peer} already posted for step {step} of round {round}")
NotSecureAggregation = _refusal("NotSecureAggregation", "this swarm was not deployed for secure aggregation")
InvalidComplaint = _refusal(
    "InvalidComplaint", "round {round}: a COMPLAINT frame of {length} bytes (it must be 1 to {maxLength})"
)
# The one-transaction-per-round prototype's own (contracts/PipelinedLedger.sol, node/chain/pipelined.py)
PreviousPending = _refusal("PreviousPending", "round {round} cannot close: the round before it is not finalized yet")
NotVoting = _refusal("NotVoting", "round {round} is not the closed round awaiting its votes")
AlreadyVoted = _refusal("AlreadyVoted", "{peer} already voted on round {round}")
MissingMechanism = _refusal("MissingMechanism", "{peer}'s first commit must name its mechanism")

REFUSALS: dict[str, type[ContractRefusal]] = {cls.__name__: cls for cls in ContractRefusal.__subclasses__()}
