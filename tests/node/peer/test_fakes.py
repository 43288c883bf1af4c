"""The fakes keep the rules the round tests rely on (the contract's, contracts/SwarmLedger.sol;
the real chain's are tested in tests/node/chain), so a round test cannot pass on a fake that
lets anything through."""

from __future__ import annotations

import pytest
import trio

from node.chain import errors
from node.chain.records import RoundState
from node.protocol.blob import sha256
from p2p import BlobNotFound, FetchTimeout
from tests.node.peer.harness import FakeSwarm, run_virtual, update_blob

T, F = True, False


def test_fake_chain_round_rules():
    async def main():
        swarm = FakeSwarm(3, min_peers=2)
        swarm.register(0, 1, 2)
        a, b, c = (m.ledger for m in swarm.members)
        with pytest.raises(errors.RoundNotClosed):  # still open
            a.attest(1, sha256(b"x"), b"\x00")
        swarm.commit(0, update_blob(0))
        with pytest.raises(errors.AlreadyCommitted):
            swarm.commit(0, update_blob(0))
        with pytest.raises(errors.CommitWindowOpen):  # one of three committed, window still open
            a.close_round(1)
        swarm.commit(1, update_blob(1))
        await trio.sleep(swarm.chain.params.commit_window + 1)  # blocks follow the clock
        a.close_round(1)  # quorum 2 met, window over: member 2 is too late
        with pytest.raises(errors.CommitWindowClosed):
            swarm.commit(2, update_blob(2))
        assert a.participants(1) == [swarm.members[0].address, swarm.members[1].address]
        with pytest.raises(errors.NotParticipant):
            c.attest_flags(1, sha256(b"m"), [T, T])
        with pytest.raises(errors.MalformedBitmap):
            a.attest_flags(1, sha256(b"m"), [T, T, T])  # a bit past the last participant
        a.attest_flags(1, sha256(b"m"), [T, T])
        with pytest.raises(errors.AlreadyAttested):
            a.attest_flags(1, sha256(b"m"), [T, T])
        with pytest.raises(errors.AbortTooEarly):
            c.abort_round(1)
        assert a.round_info(1).state is RoundState.CLOSED  # 1 vote of 2 is no strict majority
        b.attest_flags(1, sha256(b"m"), [T, T])
        info = a.round_info(1)
        assert info.state is RoundState.FINALIZED and info.finalized_digest == sha256(b"m")
        assert a.last_finalized() == (1, sha256(b"m")) and a.current_round() == 2
        with pytest.raises(errors.RoundNotClosed):
            b.attest_flags(1, sha256(b"m"), [T, T])
        with pytest.raises(errors.RoundAlreadyFinalized):
            c.abort_round(1)

    run_virtual(main)


def test_fake_chain_aborts_only_after_the_attestation_window():
    async def main():
        swarm = FakeSwarm(2)
        swarm.register(0, 1)
        swarm.commit(0, update_blob(0))
        swarm.commit(1, update_blob(1))
        a, b = (m.ledger for m in swarm.members)
        a.close_round(1)  # everyone registered committed: no need to wait for the window
        a.attest_flags(1, sha256(b"one"), [T, T])
        b.attest_flags(1, sha256(b"two"), [T, T])  # 1 + 1 votes of 2: no majority
        await trio.sleep(swarm.chain.params.attest_window)
        with pytest.raises(errors.AbortTooEarly):
            a.abort_round(1)
        await trio.sleep(1)
        a.abort_round(1)
        assert a.round_info(1).state is RoundState.ABORTED and a.finalized_digest(1) is None
        assert a.last_finalized() == (0, swarm.chain.params.genesis_digest) and a.current_round() == 2

    run_virtual(main)


def test_fake_host_fetches_from_named_or_announcing_providers_only():
    async def main():
        swarm = FakeSwarm(3)
        me, other, third = swarm.members
        digest = other.store.put(b"blob")
        with pytest.raises(BlobNotFound):  # nobody named, nobody announced: the fake dials nobody
            await me.host.fetch(digest)
        assert await me.host.fetch(digest, providers=[other.peer_id]) == b"blob"
        assert me.host.bytes_fetched == 4 and other.host.bytes_served == 4
        assert me.host.providers(digest) == [me.peer_id]  # it announced what it fetched
        assert await third.host.fetch(digest) == b"blob"  # found through the announcement
        swarm.network.stall(digest)
        late = swarm.members[0].store.put(b"late")
        swarm.network.stall(late)
        with pytest.raises(FetchTimeout):
            await third.host.fetch(late, providers=[me.peer_id], timeout=3.0)
        swarm.network.unreachable.add(me.peer_id)
        with pytest.raises(BlobNotFound):
            await third.host.fetch(late, providers=[me.peer_id])

    run_virtual(main)
