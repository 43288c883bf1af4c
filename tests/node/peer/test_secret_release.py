"""What a peer releases and when (docs/NODE.md, "The peer"): its noise is secret, so the same swarm
seed never gives the same blob twice, while the aggregate stays identical on every peer because
it is computed from the published blobs; and a blob is stored and served only after its commit."""

from __future__ import annotations

import pytest

from node.chain import errors
from node.chain.records import RoundState
from tests.node.peer.harness import FakeSwarm, genesis_digest, run_virtual
from tests.node.peer.test_peer_round import run_all


def _one_round() -> tuple[list[str], set[str]]:
    """Three peers, one round, from the same settings and seed: (committed update digests, the
    global digests the peers hold afterwards)."""

    async def main() -> tuple[list[str], set[str]]:
        swarm = FakeSwarm(3)
        outcomes = await run_all([swarm.peer(i) for i in range(3)])
        assert swarm.members[0].ledger.round_info(1).state is RoundState.FINALIZED
        commits = [c.digest.hex() for c in swarm.members[0].ledger.commitments(1)]
        return commits, {o.global_digest for outcome in outcomes for o in outcome}

    return run_virtual(main)


def test_same_seed_twice_commits_other_blobs_and_every_peer_still_agrees():
    first_commits, first_globals = _one_round()
    second_commits, second_globals = _one_round()
    # Same data, same model, same swarm seed, same public round seed: only the secret noise
    # differs, and it differs in every blob (a seeded draw would repeat them all).
    assert not set(first_commits) & set(second_commits)
    assert len(first_globals) == 1 and len(second_globals) == 1  # bit-identical on every peer, each run
    assert first_globals != second_globals


def test_a_refused_commit_leaves_nothing_stored_or_served(monkeypatch):
    async def main() -> None:
        swarm = FakeSwarm(3, min_peers=2)
        member = swarm.members[2]

        def refuse(round: int, digest: bytes, *_: object) -> dict[str, int]:
            refuse.digests.append(digest.hex())
            raise errors.CommitWindowClosed(round=round)

        refuse.digests = []  # type: ignore[attr-defined]
        monkeypatch.setattr(member.ledger, "commit", refuse)
        outcomes = await run_all([swarm.peer(i) for i in range(3)])
        (refused,) = refuse.digests  # type: ignore[attr-defined]
        assert not outcomes[2][0].committed and outcomes[0][0].state == "finalized"
        assert member.store.get(refused) is None  # never stored, so never served
        assert refused not in swarm.network.announced  # never announced
        # what the peer did store and announce: the genesis and the finalized model it fetched
        assert set(swarm.network.announced) >= {genesis_digest().hex()}

    run_virtual(main)


def test_a_commit_comes_before_the_blob_is_announced():
    async def main() -> None:
        swarm = FakeSwarm(3)
        order: list[str] = []
        member = swarm.members[0]
        commit, announce = member.ledger.commit, member.host.announce_blob

        def logged_commit(round: int, digest: bytes, *rest: object) -> object:
            order.append(f"commit {digest.hex()}")
            return commit(round, digest, *rest)

        async def logged_announce(digest: str, *, later: bool = False) -> None:
            order.append(f"announce {digest}")
            await announce(digest, later=later)

        member.ledger.commit = logged_commit  # type: ignore[method-assign]
        member.host.announce_blob = logged_announce  # type: ignore[method-assign]
        await run_all([swarm.peer(i) for i in range(3)])
        (mine,) = [c.digest.hex() for c in member.ledger.commitments(1) if c.peer == member.address]
        assert order.index(f"commit {mine}") < order.index(f"announce {mine}")

    run_virtual(main)


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
