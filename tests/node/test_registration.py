"""Registrations are bound to libp2p keys (node/chain/registration.py, docs/LEDGER.md "Registration").

The message format, sign/verify for Ed25519 and secp256k1 peer ids, and on a real Anvil: a
squatter who registers a victim's peer id first (with a signature it cannot make) does not block
the victim, the registry admits the victim and ignores the squatter, the registry reads only new
blocks, and `swarm verify` names a committer whose registration does not verify."""

from __future__ import annotations

import hashlib

import pytest
import torch
from eth_account import Account
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import PrivateKey
from libp2p.crypto.rsa import create_new_key_pair as create_rsa_key_pair
from libp2p.crypto.secp256k1 import create_new_key_pair as create_secp_key_pair
from libp2p.peer.id import ID

import mechanisms
from mechanisms.accounting import cumulative_spend
from mechanisms.randomness import seeded_generator
from node.chain.anvil import start_anvil
from node.chain.client import LedgerClient, connect
from node.chain.registration import (
    REGISTRATION_DOMAIN,
    Registration,
    registration_message,
    resolve,
    sign_registration,
    signature_verifies,
)
from node.peer.registry import RegistryCache
from node.protocol import aggregate, wire
from node.protocol.blob import sha256
from node.protocol.settings import PrivacyPolicy, SharedSettings
from node.verify import verify
from p2p import peer_id_from_bytes
from p2p.store import MemoryBlobStore

CHAIN_ID = 31337
LEDGER = "0x" + "11" * 20
ALICE = "0x" + "22" * 20
MALLORY = "0x" + "33" * 20


def key(i: int) -> PrivateKey:
    return create_new_key_pair(hashlib.sha256(b"registration test key %d" % i).digest()).private_key


def pid(k: PrivateKey) -> bytes:
    return ID.from_pubkey(k.get_public_key()).to_bytes()


def test_the_message_format_is_fixed():
    message = registration_message(CHAIN_ID, LEDGER, ALICE)
    assert message == b"swarm-ledger/register/v1" + CHAIN_ID.to_bytes(32, "big") + b"\x11" * 20 + b"\x22" * 20
    assert message.startswith(REGISTRATION_DOMAIN) and len(message) == len(REGISTRATION_DOMAIN) + 72
    # addresses in any case spell the same message
    assert registration_message(CHAIN_ID, LEDGER.upper().replace("0X", "0x"), ALICE) == message


@pytest.mark.parametrize("make", [lambda: key(0), lambda: create_secp_key_pair().private_key])
def test_a_signature_verifies_only_for_its_own_key_chain_ledger_and_address(make):
    k = make()
    sig = sign_registration(k, CHAIN_ID, LEDGER, ALICE)
    assert signature_verifies(pid(k), sig, CHAIN_ID, LEDGER, ALICE)
    assert not signature_verifies(pid(k), sig, CHAIN_ID, LEDGER, MALLORY)  # another address
    assert not signature_verifies(pid(k), sig, 1, LEDGER, ALICE)  # another chain
    assert not signature_verifies(pid(k), sig, CHAIN_ID, MALLORY, ALICE)  # another ledger
    assert not signature_verifies(pid(key(9)), sig, CHAIN_ID, LEDGER, ALICE)  # another key's peer id
    assert not signature_verifies(pid(k), b"\x00" * len(sig), CHAIN_ID, LEDGER, ALICE)
    assert not signature_verifies(pid(k), b"", CHAIN_ID, LEDGER, ALICE)
    assert not signature_verifies(b"peer-0", sig, CHAIN_ID, LEDGER, ALICE)  # not a peer id at all


def test_a_peer_id_that_hashes_its_key_never_verifies():
    rsa = create_rsa_key_pair(bits=1024).private_key  # the peer id is sha256 of the key: no key inside
    sig = sign_registration(rsa, CHAIN_ID, LEDGER, ALICE)
    assert not signature_verifies(pid(rsa), sig, CHAIN_ID, LEDGER, ALICE)


def test_a_peer_id_resolves_to_its_first_verifying_registration():
    victim = key(1)
    squat = Registration(MALLORY, pid(victim), b"\x01" * 64, 5, 0)
    own = Registration(ALICE, pid(victim), sign_registration(victim, CHAIN_ID, LEDGER, ALICE), 6, 0)
    second = Registration(LEDGER, pid(victim), sign_registration(victim, CHAIN_ID, LEDGER, LEDGER), 7, 0)
    regs = [squat, own, second]
    assert resolve(regs, CHAIN_ID, LEDGER) == {pid(victim): own}  # the rulebook's verdicts: tests/node/test_rules.py


# ---------------------------------------------------------------------------- on a real chain

D = 32
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


@pytest.fixture(scope="module")
def anvil():
    with start_anvil(accounts=6) as chain:
        yield chain


def deploy(anvil, archive: MemoryBlobStore | None = None) -> tuple[list[LedgerClient], torch.Tensor]:
    w3 = connect(anvil.url)
    accounts = [Account.from_key(k) for k in anvil.private_keys[:4]]
    genesis_vector = torch.randn(D, generator=torch.Generator().manual_seed(1)) * 0.1
    genesis = wire.genesis_blob(genesis_vector, SHARED.to_dict())
    if archive is not None:
        archive.put(genesis)
    deployer = LedgerClient.deploy(
        w3,
        accounts[0],
        min_peers=2,
        commit_window=50,
        attest_window=50,
        commit_window_seconds=60,
        attest_window_seconds=60,
        eps_cap_micro=10**9,
        delta=1e-5,
        genesis_digest=sha256(genesis),
    )
    return [deployer] + [LedgerClient(w3, deployer.address, a) for a in accounts[1:]], genesis_vector


def register(client: LedgerClient, k: PrivateKey, *, signature: bytes | None = None) -> None:
    assert client.account is not None
    if signature is None:
        signature = sign_registration(k, client.chain_id(), client.address, client.account.address)
    client.register(pid(k), signature)


def test_a_squatter_cannot_block_the_victim_and_the_registry_admits_only_signed_peers(anvil):
    (honest, mallory, victim, forger), _ = deploy(anvil)
    victim_key, honest_key, forger_key = key(1), key(2), key(3)
    registry = RegistryCache(LedgerClient(honest.w3, honest.address))
    register(honest, honest_key)
    registry.refresh()
    assert registry(peer_id_from_bytes(pid(honest_key)))
    first_scan = registry.scanned_to
    assert first_scan == anvil.block_number()

    register(mallory, victim_key, signature=b"\x01" * 64)  # the squatter goes first, garbage signature
    register(victim, victim_key)  # not blocked: peer ids are not unique on chain
    assert victim.peer_id_of(victim.account.address) == pid(victim_key)
    # the forger registers its OWN peer id with a signature over another address: not admitted
    register(forger, forger_key, signature=sign_registration(forger_key, victim.chain_id(), victim.address, ALICE))

    registry.refresh()
    assert registry.scanned_to == anvil.block_number() > first_scan
    assert registry(peer_id_from_bytes(pid(victim_key)))
    assert registry.owners[pid(victim_key)].address == victim.account.address  # the victim, not the squatter
    assert not registry(peer_id_from_bytes(pid(forger_key)))
    assert registry.ignored == 2  # the squatter's and the forger's registrations
    assert victim.address_of_peer_id(pid(victim_key)) == victim.account.address

    # the registry reads only blocks after the last one it scanned, and their logs only if the
    # ledger emitted anything in them
    calls: list[tuple[int | None, int | None]] = []
    checked: list[tuple[int, int]] = []
    original, original_activity = registry.ledger.registrations, registry.ledger.activity

    def spy(from_block=None, to_block=None):
        calls.append((from_block, to_block))
        return original(from_block, to_block)

    def activity_spy(from_block, to_block):
        checked.append((from_block, to_block))
        return original_activity(from_block, to_block)

    registry.ledger.registrations = spy  # type: ignore[method-assign]
    registry.ledger.activity = activity_spy  # type: ignore[method-assign]
    registry.refresh()  # no new block: nothing read
    anvil.mine(2)
    registry.refresh()  # two empty blocks: checked, no logs read
    assert checked == [(registry.scanned_to - 1, registry.scanned_to)] and calls == []
    assert registry.scanned_to == anvil.block_number()


@pytest.mark.parametrize("squatter_included", [False, True], ids=["left-out", "included"])
def test_verify_names_a_committer_whose_registration_does_not_verify(anvil, squatter_included):
    """The squatter's commit is named either way. Honest peers leave it out unfetched (rule 1 of
    node/rules.py, through their vetting), so a finalized aggregate that includes it was not made by honest
    peers: verify fails it too (check "aggregate", aggregate_ok false), although its digest is
    what the attested blobs give."""
    archive = MemoryBlobStore()
    (honest, mallory, victim, _), genesis_vector = deploy(anvil, archive)
    register(mallory, key(1), signature=b"\x02" * 64)  # squats the victim's peer id before it
    register(victim, key(1))
    register(honest, key(2))
    params = dict(SHARED.privacy.mechanism)
    mech_json = wire.canonical(params)
    eps = wire.eps_to_micro(cumulative_spend(params, D, 1).epsilon)
    clients = [honest, victim, mallory]
    vectors = []
    for i, client in enumerate(clients):
        update = torch.randn(D, generator=torch.Generator().manual_seed(100 + i)) * 0.01
        vector = mechanisms.from_params(params).perturb(update, generator=seeded_generator(100 + i)).to(torch.float32)
        vectors.append(vector)
        digest = archive.put(wire.update_blob(vector, 1, mech_json, client.account.address))
        client.commit(1, bytes.fromhex(digest), 10, eps, mech_json.encode())
    honest.close_round(1)  # every registered peer committed
    flags = [True, True, squatter_included]
    kept = [v for v, f in zip(vectors, flags) if f]
    model = wire.model_blob(aggregate.next_global(SHARED, genesis_vector, kept, [10] * len(kept)), 1)
    archive.put(model)
    for client in clients[:2]:
        client.attest(1, sha256(model), wire.encode_bitmap(flags))
    report = verify(LedgerClient(honest.w3, honest.address), archive)
    squatter = mallory.account.address
    expected = [(1, squatter, "registration")] + [(1, squatter, "aggregate")] * squatter_included
    assert [(f.round, f.peer, f.check) for f in report.failures] == expected
    assert "does not verify" in report.failures[0].detail
    assert report.rounds[0].included == sum(flags)
    assert report.rounds[0].aggregate_ok is not squatter_included
    if squatter_included:
        detail = report.failures[1].detail
        assert "registration does not verify" in detail and "honest peers leave it out" in detail


def test_a_peer_signs_its_registration_with_its_libp2p_key():
    from tests.node.peer.harness import FakeSwarm, run_virtual

    async def main() -> None:
        swarm = FakeSwarm(1)
        member = swarm.members[0]
        peer = swarm.peer(0)
        peer.identity = key(5)
        await peer.start()
        assert member.ledger.peer_id_of(member.address) == member.host.peer_id_bytes
        message = member.ledger.registration_message(member.address)
        assert key(5).get_public_key().verify(message, swarm.chain.signatures[member.address])

    run_virtual(main)
