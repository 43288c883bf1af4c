"""What the ledger holds, as plain frozen records: the swarm's parameters, rounds, commitments,
attestations, and the words for what a committed mechanism's eps protects."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from node.protocol.wire import eps_from_micro

DELTA_SCALE = 10**18  # the contract stores delta as an integer times 1e-18


class RoundState(enum.IntEnum):
    OPEN = 0
    CLOSED = 1
    FINALIZED = 2
    ABORTED = 3


@dataclass(frozen=True)
class SwarmParams:
    min_peers: int
    commit_window: int
    attest_window: int
    eps_cap_micro: int
    delta_e18: int
    genesis_digest: bytes
    allowlist_enabled: bool
    deployer: str
    deploy_block: int

    @property
    def delta(self) -> float:
        return self.delta_e18 / DELTA_SCALE

    @property
    def eps_cap(self) -> float:
        return eps_from_micro(self.eps_cap_micro)


@dataclass(frozen=True)
class RoundInfo:
    round: int
    state: RoundState
    opened_block: int
    closed_block: int  # 0 while open
    ended_block: int  # block it was finalized or aborted in; 0 while open or closed
    participant_count: int
    finalized_digest: bytes | None  # None unless finalized


@dataclass(frozen=True)
class Commitment:
    peer: str
    index: int
    digest: bytes
    num_samples: int
    eps_micro: int
    mechanism: bytes  # the canonical JSON as committed (from the Committed event)
    block_number: int

    @property
    def eps(self) -> float:
        return eps_from_micro(self.eps_micro)


@dataclass(frozen=True)
class Attestation:
    peer: str
    aggregate_digest: bytes
    included: bytes
    votes: int  # votes for (aggregate_digest, included) after this attestation
    block_number: int


# Which part of the shared update a mechanism's eps bounds, when its JSON does not say.
# PNPM's density ratio holds between the two signs only; |w| is released exactly (docs/MECHANISMS.md).
PROTECTS_BY_NAME = {"pnpm": "sign only (no eps for the values)"}
# The mechanisms package's own vocabulary (Guarantee.protects), spelled out.
PROTECTS_WORDS = {"sign": PROTECTS_BY_NAME["pnpm"], "value": "the values"}
UNKNOWN_PROTECTS = "not stated by the mechanism"


def describe_mechanism(raw: bytes) -> dict[str, Any]:
    """Parse committed mechanism bytes: {"name", "protects", "params"}, tolerant of anything.

    "protects" comes from the JSON's own "protects" field if present, else from the known names
    table, else says it is not stated. Bytes that are not a JSON object give name "unparsed".
    """
    try:
        params = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"name": "unparsed", "protects": UNKNOWN_PROTECTS, "params": None}
    if not isinstance(params, dict):
        return {"name": "unparsed", "protects": UNKNOWN_PROTECTS, "params": params}
    name = str(params.get("name") or params.get("mechanism") or "unnamed")
    protects = params.get("protects")
    if isinstance(protects, str) and protects:
        protects = PROTECTS_WORDS.get(protects.lower(), protects)
    else:
        protects = PROTECTS_BY_NAME.get(name.lower(), UNKNOWN_PROTECTS)
    return {"name": name, "protects": protects, "params": params}
