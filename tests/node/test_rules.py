"""The rulebook (node/rules.py), rule by rule, on plain records: who owns a peer id, the sample-count
bound, the policy's eps record exactly (both directions), and the blob rules (decoding, binding to
round and committer, release). tests/node/test_rulebook_parity.py runs the same rules through a
peer's vetting and `swarm verify` on a real chain."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import PrivateKey
from libp2p.peer.id import ID

import mechanisms as M
from mechanisms.randomness import seeded_generator
from mechanisms.record_level import DPSGDPolicy
from node.chain.records import Commitment
from node.chain.registration import Registration, sign_registration
from node.protocol import policy, wire
from node.protocol.blob import BlobError
from node.protocol.settings import PrivacyPolicy, SharedSettings
from node.rules import BlobRefused, PeerIdOwners, Rulebook, Verdict, policy_verdict, samples_verdict

D = 64
DUCHI = M.get("duchi", epsilon=1.0, clip=True).params()
DP = DPSGDPolicy(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=16, epochs=1)
SHARED = SharedSettings(
    model="mlp",
    dataset="digits",
    input_shape=(64,),
    num_classes=10,
    share="update",
    aggregation="fedavg",
    trim_ratio=0.1,
    krum_f=1,
    seed=0,
    privacy=PrivacyPolicy(DUCHI, DP),
)
ALICE, BOB = "0x" + "a1" * 20, "0x" + "b0" * 20
CHAIN_ID, LEDGER = 31337, "0x" + "11" * 20


def commitment(peer: str = ALICE, r: int = 1, num_samples: int = 100, counts: tuple[int, ...] = (100,)) -> Commitment:
    """What an honest committer records in round r, after commits with `counts` (this one's last)."""
    spent = policy.privacy_spend(SHARED.privacy, D, counts)
    mechanism = wire.canonical(DUCHI).encode()
    return Commitment(peer, 0, b"\x07" * 32, num_samples, spent.eps_micro, mechanism, 1, spent.record_eps_micro, r)


def release(seed: int = 0) -> torch.Tensor:
    update = torch.randn(D, generator=torch.Generator().manual_seed(seed)) * 0.01
    return M.from_params(DUCHI).perturb(update, generator=seeded_generator(seed)).to(torch.float32)


# ---------------------------------------------------------------- rule 1


def key(i: int) -> PrivateKey:
    return create_new_key_pair(hashlib.sha256(b"rules test key %d" % i).digest()).private_key


def registration(address: str, k: PrivateKey, block: int, *, signed: bool = True) -> Registration:
    peer_id = ID.from_pubkey(k.get_public_key()).to_bytes()
    signature = sign_registration(k, CHAIN_ID, LEDGER, address) if signed else b"\x01" * 64
    return Registration(address, peer_id, signature, block, 0)


def test_a_peer_id_belongs_to_its_first_signed_registration_fed_at_once_or_in_batches():
    victim = key(1)
    squat = registration(BOB, victim, 5, signed=False)  # first, without the key
    own = registration(ALICE, victim, 6)
    second = registration(LEDGER, victim, 7)  # the key's holder registers a second account
    for batches in ([[squat, own, second]], [[squat], [own], [second]]):
        owners = PeerIdOwners(CHAIN_ID, LEDGER)
        ignored = [r for batch in batches for r in owners.add(batch)]
        assert ignored == [squat, second]
        assert owners.verdict(ALICE, own.peer_id) is None
        assert owners.verdict(ALICE.upper().replace("0X", "0x"), own.peer_id) is None  # any spelling
        bob = owners.verdict(BOB, own.peer_id)
        assert bob is not None and bob.check == "registration" and "registration does not verify" in bob.reason
        later = owners.verdict(LEDGER, own.peer_id)
        assert later is not None and f"resolves to {ALICE}" in later.reason
    assert "no Registered event" in owners.verdict("0x" + "44" * 20, own.peer_id).reason
    assert "registered peer id" in owners.verdict(ALICE, b"another").reason  # the ledger says otherwise


# ---------------------------------------------------------------- rules 2 and 3


def test_the_sample_count_is_one_to_max_samples():
    assert samples_verdict(1, 1000) is None and samples_verdict(1000, 1000) is None
    assert samples_verdict(1001, 1000).check == "samples"
    assert samples_verdict(0, 1000).check == "samples"
    rules = Rulebook(SHARED, D, max_samples=1000)
    assert rules.commit_verdict(commitment(num_samples=1001, counts=(1001,)), [1001]).check == "samples"
    # the genesis's cap and the ledger's: the smaller holds, whichever it is
    for genesis_cap, ledger_cap in ((500, 1000), (1000, 500)):
        rules = Rulebook(dataclasses.replace(SHARED, max_samples=genesis_cap), D, max_samples=ledger_cap)
        assert rules.max_samples == 500
        assert rules.commit_verdict(commitment(num_samples=501, counts=(501,)), [501]).check == "samples"
        assert rules.commit_verdict(commitment(num_samples=500, counts=(500,)), [500]) is None
    with pytest.raises(ValueError, match="max_samples"):
        dataclasses.replace(SHARED, max_samples=2**32)


def test_the_eps_record_must_be_exactly_what_the_policy_charges_both_ways():
    honest = commitment()
    args = (SHARED.privacy, D, honest.mechanism)
    eps, record = honest.eps_micro, honest.record_eps_micro
    assert policy_verdict(*args, eps, record, [100]) is None
    assert policy_verdict(*args, eps - 1, record, [100]).check == "eps"  # a pure step: exact
    assert policy_verdict(*args, eps + 1, record, [100]).check == "eps"  # more is no record either
    slack = policy.tolerance(record)
    assert policy_verdict(*args, eps, record - slack, [100]) is None  # the accountant's float slack
    assert policy_verdict(*args, eps, record + slack, [100]) is None
    assert policy_verdict(*args, eps, record - slack - 1, [100]).check == "record-eps"
    assert policy_verdict(*args, eps, record + slack + 1, [100]).check == "record-eps"
    assert policy_verdict(*args, eps, record, [200]).check == "record-eps"  # the counts on chain decide
    other = wire.canonical(M.get("duchi", epsilon=1.0, clip=False).params()).encode()
    assert policy_verdict(SHARED.privacy, D, other, eps, record, [100]).check == "mechanism"
    assert policy_verdict(PrivacyPolicy(DUCHI), D, honest.mechanism, eps, 1, [100]).check == "record-eps"  # no DP-SGD


def test_a_check_that_raises_is_a_policy_verdict(monkeypatch):
    from node import rules as rules_module

    def broken(*args, **kwargs):
        raise ArithmeticError("accountant overflow")

    c = commitment()
    monkeypatch.setattr(rules_module.policy, "privacy_spend", broken)
    verdict = Rulebook(SHARED, D, 1000).commit_verdict(c, [100])
    assert verdict == Verdict(
        "policy", "the commit could not be checked against the policy: ArithmeticError: accountant overflow"
    )


# ---------------------------------------------------------------- rules 4 to 6


def test_a_blob_counts_only_for_the_round_and_committer_it_names():
    rules = Rulebook(SHARED, D, 1000)
    vector = release()
    data = wire.update_blob(vector, 2, wire.canonical(DUCHI), ALICE)
    assert torch.equal(rules.read_update(data, commitment(ALICE, r=2)), vector)
    for c in (commitment(ALICE, r=3), commitment(BOB, r=2)):  # replayed in a later round; copied by another
        got, verdict = rules.update_verdict(data, c)
        assert verdict is not None and verdict.check == "binding" and torch.equal(got, vector), verdict
        with pytest.raises(BlobRefused) as refused:
            rules.read_update(data, c)
        assert isinstance(refused.value, BlobError) and refused.value.verdict == verdict
    unbound = wire.blob.encode_blob({wire.VECTOR: vector}, {"kind": "update", "round": "2"})  # names no committer
    assert rules.update_verdict(unbound, commitment(ALICE, r=2))[1].check == "binding"


def test_malformed_and_impossible_blobs_have_their_own_checks():
    rules = Rulebook(SHARED, D, 1000)
    c = commitment()
    malformed = wire.update_blob(torch.zeros(D + 1), 1, wire.canonical(DUCHI), ALICE)
    vector, verdict = rules.update_verdict(malformed, c)
    assert vector is None and verdict.check == "blob" and "shape" in verdict.reason
    scaled = wire.update_blob(release() * 1.01, 1, wire.canonical(DUCHI), ALICE)
    vector, verdict = rules.update_verdict(scaled, c)
    assert vector is not None and verdict.check == "release" and "output set" in verdict.reason
