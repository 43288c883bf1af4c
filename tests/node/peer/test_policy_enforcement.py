"""The swarm's privacy policy (in the genesis) binds every peer: a peer with another policy is
refused at join, and a commit that names another mechanism or records another eps than the
policy spends is left out by every honest peer, without fetching its blob (it was released under
terms nobody agreed to, and counting it would reward the lie)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import trio

from mechanisms.record_level import DPSGDPolicy, record_level_spend
from node.protocol import wire
from node.protocol.blob import sha256
from node.protocol.policy import expected_micro
from node.protocol.settings import PrivacyPolicy
from tests.node.peer.harness import SHARED, FakeSwarm, genesis_vector, run_virtual, samples_of, update_blob

T, F = True, False
D = genesis_vector().numel()
POLICY_EPS = expected_micro(SHARED.privacy, D, [samples_of(2)])[0]  # what one PNPM release spends


@pytest.mark.parametrize(
    "mechanism, eps_micro",
    [
        ({"name": "pnpm", "epsilon": 0.5}, POLICY_EPS // 2),  # a cheaper mechanism, honestly accounted
        (dict(SHARED.privacy.mechanism), POLICY_EPS // 2),  # the policy's mechanism, half its spend recorded
        (dict(SHARED.privacy.mechanism), POLICY_EPS * 2),  # more than it spends: not the policy either
        ({"name": "duchi", "epsilon": 1.0, "clip": True}, POLICY_EPS),  # another mechanism, the same figure
    ],
    ids=["other-eps", "under-recorded", "over-recorded", "other-mechanism"],
)
def test_a_commit_that_breaks_the_policy_is_left_out_unfetched(mechanism, eps_micro):
    async def main():
        swarm = FakeSwarm(3)
        swarm.register(0, 1, 2)
        blobs = [update_blob(i) for i in range(3)]
        swarm.commit(0, blobs[0])
        swarm.commit(1, blobs[1])
        liar = swarm.members[2]
        digest = liar.store.put(blobs[2])
        liar.ledger.commit(1, bytes.fromhex(digest), samples_of(2), eps_micro, wire.canonical(mechanism).encode())
        swarm.members[0].ledger.close_round(1)

        peer = swarm.peer(0)
        agreement = await peer._agreement(1)
        included = await agreement.run()

        assert included == [T, T, F]
        assert agreement.blobs.malformed == [F, F, T] and agreement.blobs.vectors[2] is None
        assert all(t.digest != digest for t in swarm.network.transfers)  # never fetched

    run_virtual(main)


def test_the_honest_commit_is_included():
    async def main():
        swarm = FakeSwarm(3)
        swarm.register(0, 1, 2)
        for i in range(3):
            swarm.commit(i, update_blob(i))  # the harness commits exactly what the policy spends
        swarm.members[0].ledger.close_round(1)
        agreement = await swarm.peer(0)._agreement(1)
        assert await agreement.run() == [T, T, T]

    run_virtual(main)


@pytest.mark.parametrize(
    "privacy",
    [
        PrivacyPolicy({"name": "pnpm", "epsilon": 2.0}),
        PrivacyPolicy({"name": "duchi", "epsilon": 1.0, "clip": True}),
    ],
    ids=["other-eps", "other-mechanism"],
)
def test_a_peer_with_another_privacy_policy_is_refused_at_join(privacy):
    async def main():
        swarm = FakeSwarm(2)
        shared = dataclasses.replace(SHARED, privacy=privacy)
        peer = swarm.peer(0, shared=shared)
        with pytest.raises(RuntimeError, match="privacy policy"):
            await peer.start()
        assert not swarm.chain.accounts  # refused before registering
        await trio.sleep(0)

    run_virtual(main)


def test_a_restarted_peer_continues_its_record_level_accountant(tmp_path, caplog):
    """The record-level accountant lives in the workdir and continues over restarts; the chain's
    commits are what was released, so a file that says otherwise is reported and rewritten."""
    dp = DPSGDPolicy(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=16, epochs=1)
    shared = dataclasses.replace(SHARED, privacy=PrivacyPolicy(dict(SHARED.privacy.mechanism), dp))
    path = tmp_path / "privacy-accountant.json"

    async def main():
        swarm = FakeSwarm(2)
        genesis = sha256(wire.genesis_blob(genesis_vector(), shared.to_dict()))
        swarm.chain.params = dataclasses.replace(swarm.chain.params, genesis_digest=genesis)
        swarm.register(0, 1)
        swarm.commit(0, update_blob(0), num_samples=48)  # released before a crash
        for stale in (None, {"accountant": "pld-replace-one", "history": [[1.0, 0.5, 2]] * 3}):
            if stale is not None:
                path.write_text(json.dumps(stale))
            peer = swarm.peer(0, shared=shared)
            peer.spending.accountant_path = path
            await peer.start()
            saved = json.loads(path.read_text())
            assert saved["history"] == [[1.0, 16 / 48, 3]]  # one round of 48 records: q = 16/48, 3 steps
            assert saved["epsilon"] == record_level_spend(dp, [48]).epsilon and saved["delta"] == dp.delta
        assert "the chain's commits are what was released" in caplog.text

    run_virtual(main)


def test_a_commit_whose_policy_check_raises_is_left_out_not_a_crash(monkeypatch):
    """The policy check is a pure function of chain data (the committer's history), so whatever
    a hostile history makes it raise, it raises alike on every peer: each leaves the commit out
    (named) instead of ending its round."""
    from node import rules

    original = rules.policy_verdict

    def fragile(privacy, num_params, mechanism, eps_micro, record_eps_micro, counts):
        if counts[-1] == samples_of(2):
            raise ArithmeticError("accountant overflow")
        return original(privacy, num_params, mechanism, eps_micro, record_eps_micro, counts)

    monkeypatch.setattr(rules, "policy_verdict", fragile)

    async def main():
        swarm = FakeSwarm(3)
        swarm.register(0, 1, 2)
        for i in range(3):
            swarm.commit(i, update_blob(i))
        swarm.members[0].ledger.close_round(1)
        agreement = await swarm.peer(0)._agreement(1)
        assert await agreement.run() == [T, T, F]
        why = agreement.blobs.left_out[2]
        assert "round 1:" in why and swarm.members[2].address in why and "refused unfetched" in why, why
        assert "could not be checked against the policy: ArithmeticError: accountant overflow" in why, why

    run_virtual(main)
