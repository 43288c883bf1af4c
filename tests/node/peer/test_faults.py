"""`swarm node --fault`: the faults a test swarm can inject, the secure member's included."""

from __future__ import annotations

import pytest

from node.peer.faults import SECURE_FAULTS, check_fault


@pytest.mark.parametrize("fault", [None, "wrong-bytes", "withhold", "scale:-1", *SECURE_FAULTS])
def test_known_faults_are_taken(fault):
    assert check_fault(fault) == fault


@pytest.mark.parametrize("fault", ["secagg-nothing", "scale:big", "wrong"])
def test_unknown_faults_are_refused_with_the_list(fault):
    with pytest.raises(ValueError, match="secagg-withhold-masked"):
        check_fault(fault)
