"""`disallow` refuses a peer at the p2p layer too (issue 13, item 6), and `allow` admits it again:
on a real Anvil with an allowlist, two real libp2p hosts on 127.0.0.1, the holder admitting
streams through `RegistryCache`. Also the predicate that leaves a squatter's commit out
(`RegistryCache.owns`): only the account that holds a peer id's first verifying registration
owns it."""

from __future__ import annotations

import hashlib
import os

import pytest
import trio
from eth_account import Account
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from node.chain.anvil import start_anvil
from node.chain.client import LedgerClient, connect
from node.chain.registration import sign_registration
from node.peer.runner import RegistryCache
from p2p import BlobNotFound
from p2p.host import HostConfig, open_host
from p2p.store import MemoryBlobStore

GENESIS = hashlib.sha256(b"disallow test genesis").digest()


def key_pair(i: int):
    return create_new_key_pair(hashlib.sha256(b"disallow test key %d" % i).digest())


def register(client: LedgerClient, pair, *, signature: bytes | None = None) -> bytes:
    assert client.account is not None
    peer_id = ID.from_pubkey(pair.public_key).to_bytes()
    if signature is None:
        signature = sign_registration(pair.private_key, client.chain_id(), client.address, client.account.address)
    client.register(peer_id, signature)
    return peer_id


def host_config(pair) -> HostConfig:
    return HostConfig(
        key_pair=pair,
        topic="disallow-test",
        request_timeout=3.0,
        connect_timeout=3.0,
        reconnect_interval=0.3,
        hello_interval=1.0,
        gossip_heartbeat=0.3,
    )


def test_a_disallowed_peer_is_refused_on_the_stream_path_and_allow_readmits_it():
    with start_anvil(accounts=4) as anvil:
        w3 = connect(anvil.url)
        deployer_account, member_account, banned_account, squatter_account = (
            Account.from_key(k) for k in anvil.private_keys[:4]
        )
        allowlist = [member_account.address, banned_account.address, squatter_account.address]
        deployer = LedgerClient.deploy(
            w3,
            deployer_account,
            min_peers=2,
            commit_window=50,
            attest_window=50,
            eps_cap_micro=10**9,
            delta=1e-5,
            genesis_digest=GENESIS,
            allowlist=allowlist,
        )
        member, banned, squatter = (
            LedgerClient(w3, deployer.address, a) for a in (member_account, banned_account, squatter_account)
        )
        holder_pair, banned_pair = key_pair(1), key_pair(2)
        holder_id = register(member, holder_pair)
        banned_id = register(banned, banned_pair)
        register(squatter, banned_pair, signature=b"\x01" * 64)  # the banned peer's id, without its key
        registry = RegistryCache(LedgerClient(w3, deployer.address))
        registry.refresh()

        # the squatter's commits would be left out: it does not own the peer id it registered
        assert registry.owns(banned_account.address, banned_id)
        assert not registry.owns(squatter_account.address, banned_id)
        assert registry.owns(member_account.address, holder_id)
        assert not registry.owns(member_account.address, banned_id)

        async def main() -> None:
            store = MemoryBlobStore()
            before, banned_blob, after = (store.put(os.urandom(4096)) for _ in range(3))  # one per stage
            async with (
                open_host(host_config(holder_pair), store, registry) as holder,
                open_host(host_config(banned_pair), MemoryBlobStore(), None) as other,
            ):
                await other.connect(holder.addrs[0])
                assert await other.fetch(before, providers=[holder.peer_id], timeout=20) == store.get(before)

                await trio.to_thread.run_sync(lambda: deployer.disallow(banned_account.address))
                await trio.to_thread.run_sync(registry.refresh)
                assert not registry(other.peer_id) and registry(holder.peer_id)
                with pytest.raises(BlobNotFound, match="refused"):  # on the connection it already has
                    await other.fetch(banned_blob, providers=[holder.peer_id], timeout=20)

                await trio.to_thread.run_sync(lambda: deployer.allow([banned_account.address]))
                await trio.to_thread.run_sync(registry.refresh)
                assert registry(other.peer_id)
                assert await other.fetch(after, providers=[holder.peer_id], timeout=20) == store.get(after)

        trio.run(main)
        # a disallowed owner still owns its peer id: its past commits stay valid (docs/THREATS.md)
        assert registry.owns(banned_account.address, banned_id)
