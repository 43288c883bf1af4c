"""Real Anvil chains for the ledger tests.

`chain` is parametrized: "automine" (a block per transaction, blocks advanced with anvil_mine)
and "testnet" (Anvil started like a testnet: chain id 11155111, a block every second, so every
receipt is awaited for real). Tests that need many blocks to pass only run on automine; the
testnet run covers the same rule tests (make_swarm is parametrized over both chains).
"""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest
from eth_account import Account
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import PrivateKey
from libp2p.peer.id import ID

from node.chain.anvil import start_anvil
from node.chain.client import LedgerClient, connect
from node.chain.registration import sign_registration

MECHANISM = json.dumps({"name": "pnpm", "epsilon": 1.0}, separators=(",", ":")).encode()
GENESIS = hashlib.sha256(b"genesis model").digest()


def digest(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


def identity(i: int) -> PrivateKey:
    """A fixed Ed25519 libp2p key per index (a test peer's identity)."""
    return create_new_key_pair(hashlib.sha256(b"libp2p key %d" % i).digest()).private_key


def peer_id_of_key(key: PrivateKey) -> bytes:
    return ID.from_pubkey(key.get_public_key()).to_bytes()


def register_signed(client: LedgerClient, key: PrivateKey):
    """Register `client`'s account with `key`'s peer id and a valid signature."""
    assert client.account is not None
    signature = sign_registration(key, client.chain_id(), client.address, client.account.address)
    return client.register(peer_id_of_key(key), signature)


@pytest.fixture(scope="session")
def automine_chain():
    with start_anvil(accounts=8) as anvil:
        yield anvil


@pytest.fixture(scope="session")
def testnet_chain():
    with start_anvil(accounts=8, chain_id=11155111, block_time=1) as anvil:
        yield anvil


@pytest.fixture(scope="session", params=["automine", "testnet"])
def chain(request):
    return request.getfixturevalue(f"{request.param}_chain")


class Swarm:
    """A freshly deployed ledger and one client per dev account."""

    def __init__(self, anvil, n_accounts: int, **params):
        self.anvil = anvil
        self.w3 = connect(anvil.url)
        self.accounts = [Account.from_key(k) for k in anvil.private_keys[:n_accounts]]
        defaults = dict(
            min_peers=2,
            commit_window=20,
            attest_window=20,
            commit_window_seconds=60,  # both must pass: the pass_* helpers move the chain's clock
            attest_window_seconds=60,
            eps_cap_micro=5_000_000,
            delta=1e-5,
            genesis_digest=GENESIS,
        )
        self.params = defaults | params
        self.deployer = LedgerClient.deploy(self.w3, self.accounts[0], tx_timeout=30, **self.params)
        self.address = self.deployer.address
        self.peers = [self.deployer] + [
            LedgerClient(self.w3, self.address, a, tx_timeout=30) for a in self.accounts[1:]
        ]
        self.reader = LedgerClient(self.w3, self.address)

    def register(self, n: int) -> None:
        """Peers 0..n-1 register their own peer ids, signed like a real peer's (identity(i))."""
        for i, peer in enumerate(self.peers[:n]):
            register_signed(peer, identity(i))

    def commit_all(self, round: int, n: int, eps_micro: int = 1_000_000) -> None:
        for i, peer in enumerate(self.peers[:n]):
            peer.commit(round, digest(f"r{round}-p{i}"), 100 + i, eps_micro, MECHANISM)

    def pass_commit_window(self, round: int) -> None:
        """Mine and move the chain's clock until the commit window of `round` has passed."""
        info = self.reader.round_info(round)
        self.pass_window(
            info.opened_block + self.params["commit_window"], info.opened_at + self.params["commit_window_seconds"]
        )

    def pass_attest_window(self, round: int) -> None:
        """Mine and move the chain's clock until the attestation window of `round` (closed) has passed."""
        info = self.reader.round_info(round)
        self.pass_window(
            info.closed_block + self.params["attest_window"], info.closed_at + self.params["attest_window_seconds"]
        )

    def pass_window(self, last_block: int, ends_at: int) -> None:
        """Until the next transaction lands after block `last_block` at a timestamp >= `ends_at`: the
        chain's clock moved on (evm_increaseTime, for every later block) rather than waited for."""
        behind = ends_at - int(self.w3.eth.get_block("latest")["timestamp"])
        if behind > 0:
            self.anvil.rpc("evm_increaseTime", [behind])
        self.mine_to(last_block + 1)

    def mine_to(self, block: int) -> None:
        """Mine until the *next* transaction lands after `block` - 1, i.e. in block >= `block`."""
        self.anvil.mine(max(0, block - 1 - self.anvil.block_number()))


@pytest.fixture(params=["automine", "testnet"])
def make_swarm(request):
    """Every rule test runs twice: on automine Anvil, and on Anvil started like a testnet (a block
    every second), where every receipt is awaited for real."""
    anvil = request.getfixturevalue(f"{request.param}_chain")

    def make(n_accounts: int = 4, **params) -> Swarm:
        return Swarm(anvil, n_accounts, **params)

    return make


@pytest.fixture(scope="session")
def kit():
    """The helpers test modules share (conftest cannot be imported in importlib mode)."""
    return SimpleNamespace(
        Swarm=Swarm,
        MECHANISM=MECHANISM,
        GENESIS=GENESIS,
        digest=digest,
        identity=identity,
        peer_id_of_key=peer_id_of_key,
        register_signed=register_signed,
    )
