"""A secure-aggregation round that never reaches its quorum ends (contracts/SwarmLedger.sol,
`abortRound`): members that sat out of a step of the protocol (too few keys posted, a dealing they
could not fetch) never commit, so without this the round could neither close nor take a late
commit and the swarm would stop for good. On a real Anvil: the abort is refused before the commit
window and an attestation window after it have both passed (blocks and seconds), refused while the
round has its quorum (it closes instead), and refused on a ledger deployed without secure
aggregation, whose open rounds wait for late commits as before."""

from __future__ import annotations

import pytest

from node.chain.errors import AbortTooEarly, RoundNotClosed
from node.chain.records import RoundState
from tests.node.chain.conftest import Swarm


def pass_open_round_windows(swarm: Swarm, r: int, *, blocks_short: int = 0) -> None:
    """The chain past round r's commit window and an attestation window after it (from its opening)."""
    info = swarm.reader.round_info(r)
    p = swarm.params
    swarm.pass_window(
        info.opened_block + p["commit_window"] + p["attest_window"] - blocks_short,
        info.opened_at + p["commit_window_seconds"] + p["attest_window_seconds"],
    )


def test_an_open_secure_round_without_quorum_is_aborted_once_both_windows_passed(automine_chain):
    swarm = Swarm(automine_chain, 4, min_peers=3, secure_aggregation=True)
    swarm.register(4)
    swarm.commit_all(1, 2)  # two commits: below the quorum of three
    swarm.pass_commit_window(1)
    with pytest.raises(AbortTooEarly):  # the commit window alone is not enough
        swarm.peers[3].abort_round(1)
    pass_open_round_windows(swarm, 1, blocks_short=2)
    with pytest.raises(AbortTooEarly):  # the seconds have passed, not yet the blocks
        swarm.peers[3].abort_round(1)
    pass_open_round_windows(swarm, 1)
    swarm.peers[3].abort_round(1)  # anyone, once both have passed
    assert swarm.reader.round_info(1).state is RoundState.ABORTED
    assert swarm.reader.current_round() == 2 and swarm.reader.round_info(2).state is RoundState.OPEN
    assert swarm.reader.eps_spent(swarm.peers[0].account.address) == 1_000_000  # committed eps stays spent


def test_an_open_secure_round_with_its_quorum_is_closed_not_aborted(automine_chain):
    swarm = Swarm(automine_chain, 4, min_peers=3, secure_aggregation=True)
    swarm.register(4)
    swarm.commit_all(1, 3)
    pass_open_round_windows(swarm, 1)
    with pytest.raises(RoundNotClosed):
        swarm.peers[3].abort_round(1)
    swarm.peers[3].close_round(1)
    assert swarm.reader.round_info(1).state is RoundState.CLOSED


def test_an_open_round_of_an_ordinary_ledger_waits_for_its_quorum(automine_chain):
    swarm = Swarm(automine_chain, 4, min_peers=3)
    swarm.register(4)
    swarm.commit_all(1, 2)
    pass_open_round_windows(swarm, 1)
    with pytest.raises(RoundNotClosed):
        swarm.peers[3].abort_round(1)
    swarm.peers[2].commit(1, bytes([7]) * 32, 100, 1_000_000, b'{"name":"pnpm"}')  # a late commit is taken
    swarm.peers[3].close_round(1)
    assert swarm.reader.round_info(1).state is RoundState.CLOSED
