"""The peer's secure round (node/peer/secure_round.py) without the transport: its arithmetic is
`swarm simulate`'s bit for bit, a sum outside what honest members make is refused, and a real
`Peer` on the fake chain attests the model stepped from the sum its protocol member returns, or,
when the member gets no sum (the unmasking failed), votes nothing and goes on to the next round.
The protocol itself over libp2p and a real chain is tests/node/chain/test_secure_transport.py;
the whole swarm, tests/e2e/test_e2e_secure.py."""

from __future__ import annotations

import dataclasses
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import trio

from mechanisms.randomness import seeded_generator
from mechanisms.secagg.member import sum_residues
from mechanisms.secagg.policy import SecAggPolicy
from mechanisms.secagg.unmask import RoundResult
from node.chain.records import Commitment, RoundState
from node.learning.clipped_sum import MemberRecords
from node.learning.models import init_model
from node.peer.peer import Peer
from node.peer.secure import SecureOutcome
from node.peer.secure_round import Membership, SecureRounds, member_residues, model_from_sum
from node.protocol import wire
from node.protocol.blob import flatten, sha256, unflatten
from node.protocol.secure_step import GlobalStep, next_global
from node.protocol.settings import PrivacyPolicy
from node.runs.secure_round import SecureRounds as SimulatedRounds
from p2p.store import MemoryBlobStore
from tests.node.peer.fakes import FakeChain, FakeLedger, FakeNetwork
from tests.node.peer.harness import SHARED, genesis_vector, inline, member_address, run_virtual, settings, tiny_data

RECORDS = 48  # tiny_data's records per member
STEP = GlobalStep(lr=2.0, lr_decay=0.9, momentum=0.5)


def policy(members: int) -> SecAggPolicy:
    return SecAggPolicy(
        members=members,
        max_records=members * RECORDS,
        dim=genesis_vector().numel(),
        clip=1.0,
        noise_multiplier=1.0,
    )


def commitment(i: int, samples: int = RECORDS) -> Commitment:
    return Commitment(member_address(i), i, bytes([i + 2]) * 32, samples, 0, b"", 0)


def test_the_peer_steps_as_swarm_simulate_does_bit_for_bit():
    """Two rounds of three members: each member's residues (same seeded streams), their sum and
    the model step with momentum give exactly the model `swarm simulate` computes."""
    n, sec = 3, policy(3)
    shared = dataclasses.replace(SHARED, privacy=PrivacyPolicy(sec.to_dict()), global_step=STEP)
    simulated = SimulatedRounds(sec, settings(shared=shared))
    model = init_model(SHARED.model, input_shape=SHARED.input_shape, num_classes=SHARED.num_classes, seed=0)
    spec = flatten(model)[1]
    members = [SimpleNamespace(name=f"m{i}", x=tiny_data(i)[0], y=tiny_data(i)[1]) for i in range(n)]
    records = [MemberRecords(model, m.x, m.y) for m in members]
    commitments = [commitment(i) for i in range(n)]
    ours, theirs, velocity = genesis_vector(), genesis_vector(), None
    for r in (1, 2):
        theirs, _ = simulated.step(
            model, spec, theirs, members, r, lambda name, r=r: seeded_generator(100 * r + int(name[1:]))
        )
        model.load_state_dict(unflatten(ours, spec))
        residues = [member_residues(sec, records[i], model, seeded_generator(100 * r + i)) for i in range(n)]
        total = sum_residues(residues, sec.bits)
        ours, velocity = model_from_sum(STEP, sec, ours, velocity, total, n, commitments, [True] * n, r)
        assert torch.equal(ours, theirs), r
    assert not torch.equal(ours, genesis_vector())


def test_a_sum_outside_what_honest_members_make_is_refused():
    sec = policy(2)
    wild = np.full(sec.dim, 2 ** (sec.bits - 2), dtype=np.int64)  # every coordinate a quarter of the modulus
    with pytest.raises(ValueError, match="within_norm_bound"):
        model_from_sum(STEP, sec, genesis_vector(), None, wild, 2, [commitment(0), commitment(1)], [True, True], 1)
    small = np.zeros(sec.dim, dtype=np.int64)
    with pytest.raises(ValueError, match="survivors"):  # two survivors, one of them not among the committers
        model_from_sum(STEP, sec, genesis_vector(), None, small, 2, [commitment(0), commitment(1)], [True, False], 1)


class ScriptedMember:
    """The protocol member, scripted: commits a digest, waits for the round to close (as the real
    one does before its reveal) and returns the sum of its own residues, or no sum."""

    def __init__(self, ledger: FakeLedger, *, fails: bool) -> None:
        self.ledger, self.fails = ledger, fails
        self.residues: dict[int, np.ndarray] = {}
        self.order: list[str] = []  # "play" when the protocol begins, "masks" when it has the residues

    async def play(self, r, residues, commit) -> SecureOutcome:
        self.order.append("play")
        self.residues[r] = await residues()
        self.order.append("masks")
        await commit(hashlib.sha256(b"masked frame of round %d" % r).digest())
        while self.ledger.round_info(r).state is RoundState.OPEN:
            await trio.sleep(0.25)
        if self.fails:
            return SecureOutcome(sat_out="unmask: RoundFailed: a secret has fewer than t good shares")
        return SecureOutcome(result=RoundResult(self.residues[r], (0,), (), {}))


def one_member_swarm(fails: bool) -> tuple[Peer, ScriptedMember, SecAggPolicy]:
    sec = policy(1)
    shared = dataclasses.replace(SHARED, privacy=PrivacyPolicy(sec.to_dict()), global_step=STEP)
    genesis = sha256(wire.genesis_blob(genesis_vector(), shared.to_dict()))
    chain = FakeChain(genesis_digest=genesis, min_peers=1, record_eps_cap_micro=10**12, secure_aggregation=True)
    ledger = FakeLedger(chain, member_address(0))
    store = MemoryBlobStore()
    member = ScriptedMember(ledger, fails=fails)
    peer = Peer(
        settings(shared=shared, rounds=2),
        ledger=ledger,
        host=FakeNetwork().join(b"peer-0", store),
        store=store,
        train_xy=tiny_data(0),
        test_xy=tiny_data(100),
        run_sync=inline,
        secure_member=Membership(member, lambda r: (member_address(0),)),
    )
    return peer, member, sec


def test_the_peer_attests_the_model_stepped_from_the_sum():
    async def main():
        peer, member, sec = one_member_swarm(fails=False)
        outcomes = await peer.run()
        model, velocity = genesis_vector(), None
        for out in outcomes:
            model, velocity = next_global(STEP, sec, model, velocity, member.residues[out.round], RECORDS, out.round)
            assert out.state == "finalized" and out.committed and out.included == [True]
            assert out.global_digest == sha256(wire.model_blob(model, out.round, velocity)).hex()
            assert out.record_eps_cumulative == pytest.approx(sec.epsilon(out.round))
        assert [o.round for o in outcomes] == [1, 2]

    run_virtual(main)


def test_the_protocol_begins_while_the_member_trains(monkeypatch):
    """The KEYS and DEALING steps need no residues: the protocol begins first and awaits them only
    when it masks, so the windows of those steps need not cover the training."""
    trained = SecureRounds._residues

    def residues(self, global_vector):
        order.append("trained")
        return trained(self, global_vector)

    monkeypatch.setattr(SecureRounds, "_residues", residues)

    order: list[str] = []

    async def main():
        peer, member, _ = one_member_swarm(fails=False)
        member.order = order
        await peer.run()

    run_virtual(main)
    assert order == ["play", "trained", "masks"] * 2


def test_a_round_without_a_sum_gets_no_vote_and_the_peer_goes_on():
    async def main():
        peer, member, _ = one_member_swarm(fails=True)
        outcomes = await peer.run()
        assert [(o.round, o.state, o.committed, o.included) for o in outcomes] == [
            (1, "aborted", True, []),
            (2, "aborted", True, []),
        ]
        assert peer.ledger.attestations(1) == [] and sorted(member.residues) == [1, 2]

    run_virtual(main)


class SharedScript:
    """Three scripted protocol members that agree: each returns the sum of every member's residues
    of the round once all three committed, except the members told to sit a round out."""

    def __init__(self, ledger: FakeLedger, sits_out: dict[int, set[int]]) -> None:
        self.ledger, self.sits_out = ledger, sits_out
        self.residues: dict[int, dict[int, np.ndarray]] = {}

    def member(self, i: int) -> ScriptedMember:
        script = self

        class One:
            async def play(self, r, residues, commit) -> SecureOutcome:
                script.residues.setdefault(r, {})[i] = await residues()
                await commit(hashlib.sha256(b"masked frame of member %d round %d" % (i, r)).digest())
                while script.ledger.round_info(r).state is RoundState.OPEN or len(script.residues[r]) < 3:
                    await trio.sleep(0.25)
                if r in script.sits_out.get(i, set()):
                    return SecureOutcome(sat_out="DEALING: no dealing fetched")
                total = sum_residues([script.residues[r][j] for j in range(3)], policy(3).bits)
                return SecureOutcome(result=RoundResult(total, (0, 1, 2), (), {}))

        return One()  # type: ignore[return-value]


def test_a_peer_that_missed_a_sum_takes_the_velocity_from_the_finalized_blob_and_votes_again():
    """Member 0 gets no sum in round 1 (it sat out); the others finalize it. The finalized blob
    holds the model and the velocity, so member 0 steps round 2 exactly as they do and votes."""

    async def main():
        sec = policy(3)
        shared = dataclasses.replace(SHARED, privacy=PrivacyPolicy(sec.to_dict()), global_step=STEP)
        genesis = sha256(wire.genesis_blob(genesis_vector(), shared.to_dict()))
        chain = FakeChain(genesis_digest=genesis, min_peers=3, record_eps_cap_micro=10**12, secure_aggregation=True)
        network = FakeNetwork()
        script = SharedScript(FakeLedger(chain, member_address(0)), sits_out={0: {1}})
        peers = []
        for i in range(3):
            store = MemoryBlobStore()
            peers.append(
                Peer(
                    settings(shared=shared, rounds=2),
                    ledger=FakeLedger(chain, member_address(i)),
                    host=network.join(b"peer-%d" % i, store),
                    store=store,
                    train_xy=tiny_data(0),
                    test_xy=tiny_data(100),
                    run_sync=inline,
                    secure_member=Membership(script.member(i), lambda r: tuple(member_address(j) for j in range(3))),
                )
            )
        outcomes: list[list] = [[], [], []]

        async def one(i: int) -> None:
            outcomes[i] = await peers[i].run()

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)
        assert [[o.state for o in out] for out in outcomes] == [["finalized", "finalized"]] * 3
        assert member_address(0) not in {a.peer for a in chain.rounds[0].attestations}  # no sum: no vote
        # round 2: member 0 attests (its vote may come after the other two finalized the round)
        assert [o.included for o in outcomes[0]] == [[], [True, True, True]]
        model, velocity = genesis_vector(), None
        for r in (1, 2):
            total = sum_residues([script.residues[r][j] for j in range(3)], sec.bits)
            model, velocity = next_global(STEP, sec, model, velocity, total, 3 * RECORDS, r)
            digest = sha256(wire.model_blob(model, r, velocity)).hex()
            assert {out[r - 1].global_digest for out in outcomes} == {digest}
        assert peers[0].store.get(digest) is not None  # the round-2 model member 0 computed and attested
        # whom each serves on for after the last round (node/peer/linger.py): its participants
        assert [(r, sorted(ids)) for r, ids in (p._participant_ids for p in peers)] == [
            (2, sorted(q.host.peer_id for q in peers))
        ] * 3

    run_virtual(main)


def test_a_secure_peer_refuses_a_ledger_not_deployed_for_secure_aggregation():
    """The genesis digest does not cover the ledger's `secureAggregation` setting: the peer checks it."""

    async def main():
        peer, _, _ = one_member_swarm(fails=False)
        chain = peer.ledger.chain
        chain.params = dataclasses.replace(chain.params, secure_aggregation=False)
        with pytest.raises(
            RuntimeError, match="was not deployed for secure aggregation but the genesis' privacy policy is secagg"
        ):
            await peer.start()

    trio.run(main)
