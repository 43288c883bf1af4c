"""`swarm verify` checks each committed release against the committed mechanism's output set.

A one-round swarm of three peers is built by hand on the in-process chain (eth-tester): real
contract, real LedgerClient, real blobs. The dishonest peer's blob IS the one whose digest it
committed (the digest check passes), so only the release check can catch it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

import mechanisms as M
from mechanisms.accounting import cumulative_spend
from mechanisms.randomness import seeded_generator
from node.chain.client import LedgerClient
from node.chain.registration import sign_registration
from node.protocol import aggregate, wire
from node.protocol.blob import sha256
from node.protocol.settings import PrivacyPolicy, SharedSettings
from node.verify import verify
from p2p.store import MemoryBlobStore

D = 256
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
    privacy=PrivacyPolicy(),
)


def _one_round(params: dict[str, object], forge=None, *, commit_as=None, eps_shift=0, include=(True, True, True)):
    """Deploy, register 3 peers, commit their releases (peer 2's replaced by `forge(update,
    genuine)` when given), close, attest the true aggregate of the blobs flagged in `include`;
    verify with a read-only client."""
    from eth_account import Account
    from eth_tester import EthereumTester
    from web3 import EthereumTesterProvider, Web3

    w3 = Web3(EthereumTesterProvider(EthereumTester()))
    accounts = [Account.from_key("0x" + f"{i + 0x31:02x}" * 32) for i in range(3)]
    for account in accounts:
        w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": account.address, "value": 10**20})
    archive = MemoryBlobStore()
    genesis_vector = torch.randn(D, generator=torch.Generator().manual_seed(1)) * 0.1
    shared = dataclasses.replace(SHARED, privacy=PrivacyPolicy(params))  # the swarm's policy is `params`
    genesis = wire.genesis_blob(genesis_vector, shared.to_dict())
    archive.put(genesis)
    eps_micro = wire.eps_to_micro(cumulative_spend(params, D, 1).epsilon)
    deployer = LedgerClient.deploy(
        w3,
        accounts[0],
        min_peers=2,
        commit_window=50,
        attest_window=50,
        commit_window_seconds=60,
        attest_window_seconds=60,
        eps_cap_micro=10 * eps_micro,
        delta=1e-5,
        genesis_digest=sha256(genesis),
    )
    clients = [deployer] + [LedgerClient(w3, deployer.address, a) for a in accounts[1:]]
    for i, client in enumerate(clients):  # each with its own libp2p key, signing its registration
        key = create_new_key_pair(bytes([i + 1]) * 32).private_key
        signature = sign_registration(key, client.chain_id(), client.address, client.account.address)
        client.register(ID.from_pubkey(key.get_public_key()).to_bytes(), signature)
    mech = M.from_params(params)
    mech_json = wire.canonical(params)
    vectors = []
    for i, client in enumerate(clients):
        g = torch.Generator().manual_seed(100 + i)
        update = (torch.randn(D, generator=g) * 0.01).to(torch.float32)
        vector = mech.perturb(update, generator=seeded_generator(100 + i)).to(torch.float32)
        if forge is not None and i == 2:
            vector = forge(update, vector).to(torch.float32)
        vectors.append(vector)
        committed_json, committed_eps = mech_json, eps_micro
        if i == 2 and commit_as is not None:  # peer 2 names other parameters, honestly accounted for them
            committed_json = wire.canonical(commit_as)
            committed_eps = wire.eps_to_micro(cumulative_spend(commit_as, D, 1).epsilon)
        if i == 2:
            committed_eps += eps_shift
        digest = archive.put(wire.update_blob(vector, 1, committed_json, client.account.address))
        client.commit(1, bytes.fromhex(digest), 10, committed_eps, committed_json.encode())
    deployer.close_round(1)  # every registered peer committed
    kept = [v for v, inc in zip(vectors, include) if inc]
    model_vector = aggregate.next_global(shared, genesis_vector, kept, [10] * len(kept))
    model = wire.model_blob(model_vector, 1)
    archive.put(model)
    for client in clients[:2]:  # a strict majority of 3
        client.attest(1, sha256(model), wire.encode_bitmap(list(include)))
    report = verify(LedgerClient(w3, deployer.address), archive)
    return report, [a.address for a in accounts]


DUCHI = M.get("duchi", epsilon=1.0, clip=True).params()


def test_honest_duchi_round_verifies():
    report, _ = _one_round(DUCHI)
    assert report.ok, report.failures
    assert report.rounds[0].state == "finalized" and report.rounds[0].aggregate_ok
    assert report.rounds[0].blobs_ok == 3 and report.rounds[0].eps_ok == 3 and report.rounds[0].releases_ok == 3
    assert all(entry["delta"] == 0.0 for entry in report.peers.values())  # Duchi is pure eps-LDP


@pytest.mark.parametrize(
    "forge, count",
    [
        (lambda update, genuine: update, D),  # the raw update released under a duchi commit
        (lambda update, genuine: genuine * 1.01, D),  # the genuine output, scaled
        (lambda update, genuine: torch.cat([genuine[:-1], torch.tensor([0.0])]), 1),  # one coordinate moved
    ],
    ids=["raw", "scaled", "one-moved"],
)
def test_release_outside_the_committed_output_set_fails_verify(forge, count):
    """The honest majority left the forged release out, as every peer does (release.check_release):
    the release is named, the aggregate is right."""
    report, addresses = _one_round(DUCHI, forge, include=(True, True, False))
    assert not report.ok
    assert [(f.round, f.peer, f.check) for f in report.failures] == [(1, addresses[2], "release")]
    detail = report.failures[0].detail
    assert f"{count} of {D} coordinates are not in duchi(eps 1)'s output set" in detail, detail
    assert "Duchi(epsilon=1.0, clip=True)" in detail
    # everything else still holds: the digests match, the aggregate and the eps are right
    assert report.rounds[0].blobs_ok == 3 and report.rounds[0].aggregate_ok and report.rounds[0].eps_ok == 3
    assert report.rounds[0].releases_ok == 2  # the forged one is the only release that fails
    assert report.rounds[0].included == 2


def test_an_aggregate_that_includes_an_impossible_release_fails_verify():
    """Every honest peer leaves a release its mechanism cannot output out (release.check_release), so a
    finalized aggregate that includes one was not made by honest peers: named, and not ok, although
    it is the digest the attesters' blobs give."""
    report, addresses = _one_round(DUCHI, lambda update, genuine: genuine * 1.01)
    assert sorted((f.round, f.peer, f.check) for f in report.failures) == [
        (1, addresses[2], "aggregate"),
        (1, addresses[2], "release"),
    ]
    detail = next(f.detail for f in report.failures if f.check == "aggregate")
    assert "not a possible output of the swarm's mechanism" in detail and "honest peers leave it out" in detail
    assert report.rounds[0].aggregate_ok is False and report.rounds[0].included == 3


def test_sampled_release_with_too_many_non_zeros_fails_verify():
    params = M.get("sampled", base="pm", epsilon=10.0, clip=True).params()
    honest, _ = _one_round(params)
    assert honest.ok, honest.failures
    report, addresses = _one_round(params, lambda update, genuine: update, include=(True, True, False))
    assert [(f.peer, f.check) for f in report.failures] == [(addresses[2], "release")]
    assert f"{D} of {D} coordinates are non-zero" in report.failures[0].detail


def test_a_raw_update_is_not_a_gaussian_release():
    """The exact Gaussian releases values on its input-independent grid only, so a raw update (no
    noise added) is told apart: verify names it under "release" (and the aggregate that included it)."""
    params = M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0).params()
    report, addresses = _one_round(params, lambda update, genuine: update)
    assert not report.ok
    assert {f.check for f in report.failures if f.peer != "-"} >= {"release"}


PNPM = M.get("pnpm", epsilon=2.0).params()
GAUSSIAN = M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0, delta=1e-5).params()


@pytest.mark.parametrize(
    "policy, commit_as",
    [
        (PNPM, M.get("pnpm", epsilon=1.5).params()),  # a cheaper eps than the swarm's, accounted as such
        (GAUSSIAN, M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0, delta=0.5).params()),  # its own delta
        (DUCHI, M.get("duchi", epsilon=1.0, clip=False).params()),  # other parameters of the same mechanism
    ],
    ids=["pnpm-cheaper-eps", "gaussian-own-delta", "duchi-other-params"],
)
def test_a_commit_under_other_parameters_than_the_policy_fails_verify(policy, commit_as):
    """The attacks found earlier: each peer's eps used to be checked against parameters it chose
    itself. Now the policy in the genesis decides; the finalized aggregate that includes the
    commit is flagged too."""
    report, addresses = _one_round(policy, commit_as=commit_as)
    checks = sorted((f.peer, f.check) for f in report.failures)
    assert checks == [(addresses[2], "aggregate"), (addresses[2], "mechanism")], report.failures
    assert "is not the swarm's policy" in next(f.detail for f in report.failures if f.check == "mechanism")


@pytest.mark.parametrize("eps_shift", [-2, +1000], ids=["under", "over"])
def test_verify_holds_the_eps_record_exactly_both_ways(eps_shift):
    """A record is not a bid: less than the policy charges, or more, is not what the policy spent,
    and every honest peer leaves such a commit out; so verify fails it, and the aggregate that
    includes it (an over-record used to pass verify while every peer left it out)."""
    report, addresses = _one_round(PNPM, eps_shift=eps_shift)
    assert sorted((f.peer, f.check) for f in report.failures) == [(addresses[2], "aggregate"), (addresses[2], "eps")]
    assert "where the policy spends" in next(f.detail for f in report.failures if f.check == "eps")


@pytest.mark.parametrize("mechanism", ["duchi", "hm", "pm", "ldp-fl", "sampled"])
def test_honest_simulated_runs_on_anvil_pass_the_release_check(tmp_path, capsys, mechanism):
    """The real peer path (node.learning.contribute, the derived parameters, the float32 blob)
    through a recorded run and `swarm verify --run`: no false alarm."""
    import json

    from node.cli import main
    from node.config import load_config
    from node.runs.simulate import Simulation

    overrides = [
        "data.dataset=digits",
        "swarm.peers=3",
        "swarm.rounds=2",
        "train.epochs=1",
        "train.batch_size=16",
        "train.lr=0.1",
        f"privacy.mechanism={mechanism}",
        "privacy.epsilon=1.0",
        "swarm.seed=7",
    ]
    Simulation(load_config(None, overrides), out=tmp_path / "run", ledger=True).run()
    capsys.readouterr()
    assert main(["verify", "--run", str(tmp_path / "run"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and not report["failures"], report["failures"]
    assert [r["aggregate_ok"] for r in report["rounds"][:2]] == [True, True]
    assert [r["blobs_ok"] for r in report["rounds"][:2]] == [3, 3]
