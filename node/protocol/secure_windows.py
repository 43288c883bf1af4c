"""The steps of a secure-aggregation round and where each one's window lies (docs/SECAGG.md "Over
libp2p and the chain"), as the ledger lays them out (`SwarmLedger._stepWindow`): what a member
waits on, what the configuration check measures, in one place. A new step is a new line here and
there.

Windows are in eighths of their phase's window: the commit window while the round is open (from
its opening), the attestation window once it is closed (from its closing), in blocks and in
seconds, each cut as the contract divides (`length * eighth // 8`)."""

from __future__ import annotations

import enum
from typing import NamedTuple


class Step(enum.IntEnum):
    """The contract's step numbers: frames (`postFrame`; MASKED is the commit, never posted),
    acknowledgments (`acknowledge(round, s, bitmap)` for frame step s, recorded as s + 4) and the
    complaints (`complain(round, frame)`: the frame itself on chain)."""

    KEYS = 0
    DEALING = 1
    MASKED = 2
    REVEAL = 3
    KEYS_ACK = 4
    DEALING_ACK = 5
    MASKED_ACK = 6
    COMPLAINT = 7


ACKNOWLEDGED = {Step.KEYS: Step.KEYS_ACK, Step.DEALING: Step.DEALING_ACK, Step.MASKED: Step.MASKED_ACK}

EIGHTHS = 8


class Window(NamedTuple):
    """A step's window: in the open round's commit window (`closed` False) or the closed round's
    attestation window, from the end of eighth `start` through the end of eighth `through`."""

    closed: bool
    start: int
    through: int

    def bounds(self, blocks: int, seconds: int) -> tuple[int, int, int, int]:
        """(first, last) block offsets and (start, end) second offsets from the phase's start."""
        return (
            blocks * self.start // EIGHTHS,
            blocks * self.through // EIGHTHS,
            seconds * self.start // EIGHTHS,
            seconds * self.through // EIGHTHS,
        )


# the MASKED commit takes the rest of the commit window (from eighth 5 on, for members that follow
# the protocol: they mask against U2 as the complaints left it), and the attestations the rest of
# the attestation window
WINDOWS: dict[Step, Window] = {
    Step.KEYS: Window(False, 0, 1),
    Step.KEYS_ACK: Window(False, 1, 2),
    Step.DEALING: Window(False, 2, 3),
    Step.DEALING_ACK: Window(False, 3, 4),
    Step.COMPLAINT: Window(False, 4, 5),
    Step.MASKED_ACK: Window(True, 0, 2),
    Step.REVEAL: Window(True, 2, 4),
}


def step_blocks(step: Step, commit_window: int, attest_window: int) -> int:
    """How many blocks `step`'s window lasts."""
    window = WINDOWS[step]
    first, last, _, _ = window.bounds(attest_window if window.closed else commit_window, 0)
    return last - first


def window_end(step: Step, since: tuple[int, int], blocks: int, seconds: int) -> tuple[int, int]:
    """The last block and the end (block time) of `step`'s window, its phase begun at block and
    time `since` lasting `blocks` and `seconds`."""
    _, last, _, end = WINDOWS[step].bounds(blocks, seconds)
    return since[0] + last, since[1] + end
