"""What the ledger holds, as plain frozen records: the swarm's parameters, rounds, commitments,
attestations, and the words for what a committed mechanism's eps protects."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

import mechanisms
from node.protocol.wire import eps_from_micro

DELTA_SCALE = 10**18  # the contract stores delta as an integer times 1e-18


class RoundState(enum.IntEnum):
    OPEN = 0
    CLOSED = 1
    FINALIZED = 2
    ABORTED = 3


@dataclass(frozen=True)
class SwarmParams:
    """The contract's `params()`, in its order. A window ends once both its blocks and its seconds
    (block timestamps) have passed."""

    min_peers: int
    commit_window: int  # blocks
    attest_window: int  # blocks
    eps_cap_micro: int
    delta_e18: int
    eps_step_micro: int  # what one release spends under the policy; 0 = not constant (checked off chain)
    record_eps_cap_micro: int  # record-level (DP-SGD) cap; 0 = the policy has no DP-SGD
    record_delta_e18: int
    genesis_digest: bytes
    allowlist_enabled: bool
    deployer: str
    deploy_block: int
    max_samples: int  # cap on a commit's numSamples (the FedAvg weight)
    commit_window_seconds: int
    attest_window_seconds: int
    secure_aggregation: bool = False  # deployed for secure aggregation (docs/SECAGG.md)

    @property
    def delta(self) -> float:
        return self.delta_e18 / DELTA_SCALE

    @property
    def eps_cap(self) -> float:
        return eps_from_micro(self.eps_cap_micro)

    @property
    def record_delta(self) -> float:
        return self.record_delta_e18 / DELTA_SCALE

    @property
    def record_eps_cap(self) -> float:
        return eps_from_micro(self.record_eps_cap_micro)


@dataclass(frozen=True)
class RoundInfo:
    round: int
    state: RoundState
    opened_block: int
    closed_block: int  # 0 while open
    ended_block: int  # block it was finalized or aborted in; 0 while open or closed
    participant_count: int
    finalized_digest: bytes | None  # None unless finalized
    opened_at: int  # the opening block's timestamp
    closed_at: int  # the closing block's timestamp; 0 while open


@dataclass(frozen=True)
class Commitment:
    peer: str
    index: int
    digest: bytes
    num_samples: int
    eps_micro: int
    mechanism: bytes  # the canonical JSON as committed (from the Committed event)
    block_number: int
    record_eps_micro: int = 0  # record-level (DP-SGD) eps; 0 without DP-SGD
    round: int = 0

    @property
    def eps(self) -> float:
        return eps_from_micro(self.eps_micro)

    @property
    def record_eps(self) -> float:
        return eps_from_micro(self.record_eps_micro)


@dataclass(frozen=True)
class Attestation:
    peer: str
    aggregate_digest: bytes
    included: bytes
    votes: int  # votes for (aggregate_digest, included) after this attestation
    block_number: int


# The mechanisms package's own vocabulary (Guarantee.protects), spelled out (PNPM's "sign":
# docs/PRIVACY-MODEL.md, "PNPM protects signs only").
PROTECTS_WORDS = {"sign": "sign only (no eps for the values)", "value": "the values"}
NO_GUARANTEE = "nothing: not a valid mechanism, so no guarantee"


def describe_mechanism(raw: bytes) -> dict[str, Any]:
    """Parse committed mechanism bytes: {"name", "protects", "params"}, tolerant of anything.

    "protects" comes from the guarantee of the mechanism the parameters build, never from a field
    the peer wrote itself: parameters that build no mechanism protect nothing. Bytes that are not
    a JSON object give name "unparsed".
    """
    try:
        params = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"name": "unparsed", "protects": NO_GUARANTEE, "params": None}
    if not isinstance(params, dict):
        return {"name": "unparsed", "protects": NO_GUARANTEE, "params": params}
    name = str(params.get("name") or "unnamed")
    try:
        kind = mechanisms.from_params(params).guarantee.protects
    except (ValueError, TypeError, KeyError):
        return {"name": name, "protects": NO_GUARANTEE, "params": params}
    return {"name": name, "protects": PROTECTS_WORDS.get(kind, kind), "params": params}
