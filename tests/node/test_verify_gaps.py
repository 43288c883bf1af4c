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

import mechanisms
from mechanisms.randomness import seeded_generator
from node.chain.anvil import start_anvil
from node.chain.client import LedgerClient, connect, load_artifact
from node.chain.registration import sign_registration
from node.protocol import aggregate, release, wire
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


def genuine(seed: int) -> torch.Tensor:
    """A genuine release of the swarm's mechanism (seeded: a test's noise, reproducible)."""
    update = torch.randn(D, generator=torch.Generator().manual_seed(seed)) * 0.01
    return mechanisms.from_params(dict(SHARED.privacy.mechanism)).perturb(update, generator=seeded_generator(seed))


def malformed_blob(r: int, mech_json: str, committer: str) -> bytes:
    """An update blob with the right digest on chain but unusable content: one value too many."""
    return wire.update_blob(torch.zeros(D + 1), r, mech_json, committer)


def run_swarm(anvil, rounds: int = 2, *, malformed: tuple[int, int] | None = None, include_malformed: bool = False):
    """Deploy, register 3 peers, play `rounds` rounds to finalization; returns (read-only client,
    archive, [(round, model digest, update digests)]). `malformed` = (round, peer index): that peer
    commits (and the archive holds) `malformed_blob` instead of its update; the majority leaves it
    out as honest peers do, unless `include_malformed` (then it attests the others' aggregate
    with the malformed blob's bit set, which nobody could have computed)."""
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
        commit_window_seconds=60,
        attest_window_seconds=60,
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
        vectors, digests, flags = [], [], [True, True, True]
        for i, client in enumerate(clients):
            vector = genuine(100 * r + i).to(torch.float32)
            data = wire.update_blob(vector, r, mech_json, client.account.address)
            if malformed == (r, i):
                data, flags[i] = malformed_blob(r, mech_json, client.account.address), include_malformed
            else:
                vectors.append(vector)
            digests.append(archive.put(data))
            client.commit(r, bytes.fromhex(digests[-1]), 10, eps, mech_json.encode())
        deployer.close_round(r)
        previous = aggregate.next_global(SHARED, previous, vectors, [10] * len(vectors))
        model = wire.model_blob(previous, r)
        archive.put(model)
        for client in clients[:2]:
            client.attest(r, sha256(model), wire.encode_bitmap(flags))
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


# ------------------------------------------------------------------ malformed blobs (named)


def test_a_committed_malformed_blob_is_named_and_the_rounds_verify(anvil):
    """A peer committed a blob that does not decode; the honest majority left it out (as every
    peer does, node/peer/agree.py): verify names its round, its committer and "malformed", and
    both aggregates are right."""
    ledger, archive, _ = run_swarm(anvil, malformed=(1, 1))
    culprit = ledger.commitments(1)[1].peer
    report = verify(ledger, archive)
    assert [(f.round, f.peer, f.check) for f in report.failures] == [(1, culprit, "blob")], report.failures
    detail = report.failures[0].detail
    assert "round 1:" in detail and culprit in detail and "malformed" in detail and "shape" in detail, detail
    assert [r.aggregate_ok for r in report.rounds[:2]] == [True, True]
    assert (report.rounds[0].blobs_ok, report.rounds[0].included) == (2, 2)


def test_an_aggregate_that_includes_a_malformed_blob_fails(anvil):
    ledger, archive, _ = run_swarm(anvil, malformed=(1, 2), include_malformed=True)
    culprit = ledger.commitments(1)[2].peer
    report = verify(ledger, archive)
    assert [(f.round, f.peer, f.check) for f in report.failures] == [(1, culprit, "blob"), (1, culprit, "blob")]
    assert "malformed" in report.failures[0].detail
    assert "included in the finalized aggregate" in report.failures[1].detail
    assert [r.aggregate_ok for r in report.rounds[:2]] == [False, True]  # round 2 from the archived model


# ------------------------------------------------------------------ exceptions outside a round's checks


def test_an_archive_that_raises_on_a_finalized_model_is_a_named_failure_and_verify_goes_on(anvil):
    ledger, archive, played = run_swarm(anvil)
    model = played[0][1].hex()

    class Flaky(MemoryBlobStore):
        def get(self, digest: str) -> bytes | None:
            if digest == model:
                raise OSError("disk on fire")
            return archive.get(digest)

    report = verify(ledger, Flaky())
    assert failures(report) == [(1, "aggregate-blob")], report.failures
    assert "OSError: disk on fire" in report.failures[0].detail
    assert [r.aggregate_ok for r in report.rounds[:2]] == [True, True]  # round 2 from the recomputed model
    assert all("eps_spent" in entry for entry in report.peers.values())  # the final totals were still checked


def test_an_eps_total_that_cannot_be_read_names_its_peer_and_the_others_are_checked(anvil):
    ledger, archive, _ = run_swarm(anvil, rounds=1)
    peers = [c.peer for c in ledger.commitments(1)]
    original = ledger.eps_spent

    def eps_spent(peer: str) -> int:
        if peer == peers[1]:
            raise ConnectionError("RPC went away")
        return original(peer)

    ledger.eps_spent = eps_spent  # type: ignore[method-assign]
    report = verify(ledger, archive)
    assert [(f.round, f.peer, f.check) for f in report.failures] == [(0, peers[1], "eps")], report.failures
    assert "ConnectionError: RPC went away" in report.failures[0].detail
    assert "eps_spent" in report.peers[peers[0]] and "eps_spent" in report.peers[peers[2]]
    assert report.rounds[0].aggregate_ok


def test_a_policy_check_that_raises_names_the_committer(anvil, monkeypatch):
    """Peers leave out a commit whose policy check raises (`rules.Rulebook.commit_verdict`: a pure
    function of chain data, so it raises alike everywhere); verify names the committer, checks the
    round's other commits, and fails the aggregate that includes it."""
    from node import rules

    ledger, archive, _ = run_swarm(anvil)
    peers = [c.peer for c in ledger.commitments(2)]
    calls = []
    original = rules.policy_verdict

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) == 5:  # round 2, the second commit
            raise ArithmeticError("accountant overflow")
        return original(*args, **kwargs)

    monkeypatch.setattr(rules, "policy_verdict", flaky)
    report = verify(ledger, archive)
    assert [(f.round, f.peer, f.check) for f in report.failures] == [
        (2, peers[1], "policy"),
        (2, peers[1], "aggregate"),
    ], report.failures
    assert "ArithmeticError: accountant overflow" in report.failures[0].detail
    assert (report.rounds[1].eps_ok, report.rounds[1].releases_ok, report.rounds[1].blobs_ok) == (2, 3, 3)
    assert [r.aggregate_ok for r in report.rounds[:2]] == [True, False]


def test_a_release_check_that_raises_names_the_committer(anvil, monkeypatch):
    ledger, archive, _ = run_swarm(anvil, rounds=1)
    peers = [c.peer for c in ledger.commitments(1)]
    target = genuine(100 + 2).to(torch.float32)
    original = release.check_release

    def flaky(vector, mechanism):
        if torch.equal(vector, target):  # peer 2's update
            raise RuntimeError("out of memory")
        return original(vector, mechanism)

    monkeypatch.setattr(release, "check_release", flaky)
    report = verify(ledger, archive)
    assert [(f.round, f.peer, f.check) for f in report.failures] == [
        (1, peers[2], "release"),
        (1, peers[2], "aggregate"),
    ], report.failures
    assert "could not be checked: RuntimeError: out of memory" in report.failures[0].detail
    assert (report.rounds[0].eps_ok, report.rounds[0].releases_ok) == (3, 2)
