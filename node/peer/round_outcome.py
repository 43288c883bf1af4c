"""A round's phases (what a peer's status says it is doing) and what the round came to (a line
of its metrics.jsonl): shared by the peer's ordinary round and its secure round."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import cast

from node.peer.ports import Receipt


class Phase(enum.StrEnum):
    STARTING = "starting"
    TRAINING = "training"
    COMMITTING = "committing"
    WAITING_CLOSE = "waiting-close"
    FETCHING = "fetching"
    AGGREGATING = "aggregating"
    ATTESTING = "attesting"
    WAITING_FINAL = "waiting-final"
    FOLLOWING = "following"  # not a participant this round: waits for the result
    EVALUATING = "evaluating"
    BUDGET_SPENT = "budget-spent"
    SERVING = "serving"  # the last round is over; still serving blobs to peers that lag behind
    DONE = "done"


@dataclass
class RoundOutcome:
    round: int
    state: str
    committed: bool = False
    included: list[bool] = field(default_factory=list)
    accuracy: float | None = None
    loss: float | None = None
    eps_cumulative: float | None = None  # the local mechanism's, whole shared update
    delta_cumulative: float | None = None  # the delta that eps_cumulative holds at
    eps_protects: str | None = None  # what eps_cumulative protects ("sign" for PNPM), from the guarantee
    record_eps_cumulative: float | None = None  # DP-SGD's, each training record (None without DP-SGD)
    record_delta: float | None = None
    record_protects: str | None = None
    train_seconds: float = 0.0
    train_started: float | None = None  # wall clock (Unix time) of this round's local training:
    train_ended: float | None = None  # a speculative training (node/peer/training.py) starts before the round opens
    round_seconds: float = 0.0
    bytes_received: int = 0  # blob bytes this peer fetched from others during the round
    bytes_sent: int = 0  # blob bytes this peer served to others during the round
    gas_used: int = 0
    phase_seconds: dict[str, float] = field(default_factory=dict)  # wall time per Phase value
    # CPU seconds of the process over the round (node/peer/cpu.py): training and evaluation, and the rest
    compute_cpu_s: float = 0.0
    protocol_cpu_s: float = 0.0
    global_digest: str | None = None  # the model this peer holds after the round
    left_out: list[str] = field(default_factory=list)  # each blob this peer's vote left out, and why


def gas_used(receipt: object) -> int:
    """The gas a transaction's receipt says it used (0 when it says nothing)."""
    try:
        return int(cast(Receipt, receipt)["gasUsed"])
    except (TypeError, KeyError):
        return int(getattr(receipt, "gas_used", 0) or 0)


def mined_in(receipt: object) -> int | None:
    """The block a transaction's receipt says it was mined in (None when it says nothing: the
    in-memory tests' fake chain)."""
    try:
        return int(cast(Receipt, receipt)["blockNumber"])
    except (TypeError, KeyError, ValueError):
        return None
