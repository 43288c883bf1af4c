"""A run that learnt nothing must not look like a success: `swarm up` exits 1 and says why, in
report.md and on stderr, when no round finalized, most rounds were aborted, or rounds are missing."""

from __future__ import annotations

import pytest

from node.cli.up import exit_status
from node.runs.report import run_failure


def rows(*states: str) -> list[dict]:
    return [{"round": i + 1, "state": s} for i, s in enumerate(states)]


@pytest.mark.parametrize(
    "states, wanted, interrupted, expected",
    [
        (("finalized", "finalized"), 2, False, None),
        (("finalized", "aborted", "finalized"), 3, False, None),  # one of three aborted: a bad round, not a failure
        (("aborted", "aborted"), 2, False, "no round finalized"),
        (("open",), 1, False, "no round finalized"),
        (("finalized", "aborted", "aborted"), 3, False, "2 of 3 rounds were aborted"),
        (("finalized",), 3, False, "stopped after 1 of 3 rounds"),
        (("finalized",), 3, True, None),  # Ctrl-C: fewer rounds is what the user asked for
    ],
)
def test_run_failure(states, wanted, interrupted, expected):
    found = run_failure(rows(*states), wanted, interrupted)
    assert (found is None) if expected is None else (expected in found), found


def test_exit_status(capsys):
    ok = {"interrupted": False, "failure": None, "peer_exit_codes": [0, 0]}
    assert exit_status(ok) == 0
    assert exit_status(ok | {"peer_exit_codes": [0, 1]}) == 1
    assert exit_status(ok | {"interrupted": True, "failure": "no round finalized"}) == 130
    assert exit_status(ok | {"failure": "no round finalized (2 aborted)"}) == 1
    assert "FAILED: no round finalized" in capsys.readouterr().err
