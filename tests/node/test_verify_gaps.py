"""`swarm verify` checks everything it is given (node/verify.py): the archived finalized models
against their digests, the deployed code against the artifact (immutables masked, then read back
and held to params() and to the deployment's constructor arguments), every exception as a named
failure, and it goes on from an archived model after a round it could not recompute.

Two-round swarms of three peers built by hand on real Anvil: real contract, real LedgerClient,
real blobs."""

from __future__ import annotations

import pytest
import torch
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from node.chain.anvil import start_anvil
from node.chain.client import LedgerClient, connect, load_artifact
from node.chain.registration import sign_registration
from node.protocol import wire
from node.protocol.blob import sha256
from node.protocol.settings import PrivacyPolicy, SharedSettings
from node.verify import verify
from p2p.store import MemoryBlobStore

D = 64
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
    privacy=PrivacyPolicy({"name": "gaussian", "clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1e-5}),
)
EPS_CAP = 210_450


@pytest.fixture(scope="module")
def anvil():
    with start_anvil() as chain:
        yield chain


def run_swarm(anvil, rounds: int = 2):
    """Deploy, register 3 peers, play `rounds` rounds to finalization; returns (anvil, read-only
    client, archive, [(round, model digest, update digests)])."""
    from eth_account import Account

    from mechanisms.accounting import cumulative_spend

    w3 = connect(anvil.url)
    accounts = [Account.from_key(k) for k in anvil.private_keys[:3]]
    archive = MemoryBlobStore()
    genesis_vector = torch.randn(D, generator=torch.Generator().manual_seed(1)) * 0.1
    genesis = wire.genesis_blob(genesis_vector, SHARED.to_dict())
    archive.put(genesis)
    params = dict(SHARED.privacy.mechanism)
    deployer = LedgerClient.deploy(
        w3,
        accounts[0],
        min_peers=2,
        commit_window=50,
        attest_window=50,
        eps_cap_micro=EPS_CAP * 1000,
        delta=1e-5,
        genesis_digest=sha256(genesis),
    )
    clients = [deployer] + [LedgerClient(w3, deployer.address, a) for a in accounts[1:]]
    for i, client in enumerate(clients):  # each with its own libp2p key, signing its registration
        key = create_new_key_pair(bytes([i + 1]) * 32).private_key
        signature = sign_registration(key, client.chain_id(), client.address, client.account.address)
        client.register(ID.from_pubkey(key.get_public_key()).to_bytes(), signature)
    mech_json = wire.canonical(params)
    previous, played = genesis_vector, []
    for r in range(1, rounds + 1):
        eps = wire.eps_to_micro(cumulative_spend(params, D, r).epsilon)
        vectors, digests = [], []
        for i, client in enumerate(clients):
            vector = (torch.randn(D, generator=torch.Generator().manual_seed(100 * r + i)) * 0.01).to(torch.float32)
            vectors.append(vector)
            digests.append(archive.put(wire.update_blob(vector, r, mech_json)))
            client.commit(r, bytes.fromhex(digests[-1]), 10, eps, mech_json.encode())
        deployer.close_round(r)
        previous = wire.next_global(SHARED, previous, vectors, [10, 10, 10])
        model = wire.model_blob(previous, r)
        archive.put(model)
        for client in clients[:2]:
            client.attest(r, sha256(model), wire.encode_bitmap([True, True, True]))
        played.append((r, sha256(model), digests))
    return LedgerClient(w3, deployer.address), archive, played


def failures(report):
    return [(f.round, f.check) for f in report.failures]


def test_an_honest_run_verifies(anvil):
    ledger, archive, _ = run_swarm(anvil)
    report = verify(ledger, archive)
    assert report.ok, report.failures
    assert [r.aggregate_ok for r in report.rounds[:2]] == [True, True]


@pytest.mark.parametrize("how", ["flipped", "deleted"])
def test_an_altered_or_missing_archived_aggregate_fails(anvil, how):
    ledger, archive, played = run_swarm(anvil)
    _, model, _ = played[0]
    data = archive.get(model.hex())
    if how == "flipped":
        archive._blobs[model.hex()] = data[:-1] + bytes([data[-1] ^ 1])  # type: ignore[attr-defined]
    else:
        del archive._blobs[model.hex()]  # type: ignore[attr-defined]
    report = verify(ledger, archive)
    assert failures(report) == [(1, "aggregate-blob")], report.failures


def test_after_a_round_it_cannot_recompute_it_goes_on_from_the_archived_model(anvil):
    ledger, archive, played = run_swarm(anvil)
    del archive._blobs[played[0][2][1]]  # type: ignore[attr-defined]  # an included update of round 1
    report = verify(ledger, archive)
    assert failures(report) == [(1, "blob")], report.failures
    assert [r.aggregate_ok for r in report.rounds[:2]] == [False, True]  # round 2 recomputed from the archive


def test_an_exception_inside_a_check_is_a_named_failure(anvil):
    ledger, archive, played = run_swarm(anvil)
    broken = played[1][2][0]

    class Flaky(MemoryBlobStore):
        def get(self, digest: str) -> bytes | None:
            if digest == broken:
                raise OSError("disk on fire")
            return archive.get(digest)

    report = verify(ledger, Flaky())
    assert failures(report) == [(2, "blob"), (2, "blob")], report.failures  # unreadable; so round 2 not recomputed
    assert "OSError: disk on fire" in report.failures[0].detail
    assert report.rounds[1].aggregate_ok is False


def _patch(anvil, ledger: LedgerClient, old: int, new: int, *, everywhere: bool) -> None:
    code = bytes(ledger.w3.eth.get_code(ledger.address))
    word_old, word_new = old.to_bytes(32, "big"), new.to_bytes(32, "big")
    assert word_old in code
    patched = code.replace(word_old, word_new, -1 if everywhere else 1)
    anvil.rpc("anvil_setCode", [ledger.address, "0x" + patched.hex()])


@pytest.mark.parametrize("everywhere", [True, False], ids=["every-use", "one-use"])
def test_a_patched_eps_cap_immutable_fails_the_code_check(anvil, everywhere):
    assert load_artifact()["immutableReferences"]["_epsCapMicro"]  # recorded by scripts/compile_contracts.py
    ledger, archive, _ = run_swarm(anvil, rounds=1)
    _patch(anvil, ledger, EPS_CAP * 1000, 1, everywhere=everywhere)
    report = verify(ledger, archive)
    assert any(f.round == 0 and f.check == "code" for f in report.failures)


def test_patched_code_fails_the_code_check(anvil):
    ledger, archive, _ = run_swarm(anvil, rounds=1)
    code = bytearray(ledger.w3.eth.get_code(ledger.address))
    code[40] ^= 0xFF  # an opcode or push byte of the dispatcher, outside every immutable
    anvil.rpc("anvil_setCode", [ledger.address, "0x" + bytes(code).hex()])
    report = verify(ledger, archive)
    assert (0, "code") in failures(report)
    assert "differs from the artifact" in next(f.detail for f in report.failures if f.check == "code")
