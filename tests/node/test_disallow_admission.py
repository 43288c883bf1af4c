"""`disallow` refuses a peer at the p2p layer too, and `allow` admits it again:
on a real Anvil with an allowlist, two real libp2p hosts on 127.0.0.1, the holder admitting
streams through `RegistryCache`. Also the rule that leaves a squatter's commit out
(`RegistryCache.ownership`, rule 1 of node/rules.py): only the account that holds a peer id's
first verifying registration owns it."""

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
from node.peer.registry import RegistryCache
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
            commit_window_seconds=60,
            attest_window_seconds=60,
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
        assert registry.ownership(banned_account.address, banned_id) is None
        assert registry.ownership(squatter_account.address, banned_id).check == "registration"
        assert registry.ownership(member_account.address, holder_id) is None
        assert registry.ownership(member_account.address, banned_id).check == "registration"

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
        assert registry.ownership(banned_account.address, banned_id) is None


def test_a_disallowed_peers_gossip_is_refused_and_allow_readmits_it():
    """The gossip path: after `disallow` (and the registry's refresh), the
    holder delivers none of the removed peer's announcements and records none of its HAVEs as a
    provider, on the mesh link it already has; after `allow` both go through again. Real Anvil
    with an allowlist, two real libp2p hosts, the holder admitting through `RegistryCache`."""
    with start_anvil(accounts=3) as anvil:
        w3 = connect(anvil.url)
        deployer_account, member_account, banned_account = (Account.from_key(k) for k in anvil.private_keys[:3])
        deployer = LedgerClient.deploy(
            w3,
            deployer_account,
            min_peers=2,
            commit_window=50,
            attest_window=50,
            commit_window_seconds=60,
            attest_window_seconds=60,
            eps_cap_micro=10**9,
            delta=1e-5,
            genesis_digest=GENESIS,
            allowlist=[member_account.address, banned_account.address],
        )
        member, banned = (LedgerClient(w3, deployer.address, a) for a in (member_account, banned_account))
        holder_pair, banned_pair = key_pair(1), key_pair(2)
        register(member, holder_pair)
        register(banned, banned_pair)
        registry = RegistryCache(LedgerClient(w3, deployer.address))
        registry.refresh()

        async def main() -> None:
            theirs = MemoryBlobStore()
            before, during, after = (theirs.put(os.urandom(512)) for _ in range(3))  # one HAVE per stage

            async def heard(host, what: str) -> bytes:
                with trio.fail_after(10):
                    got = await host.announcements.receive()
                assert got.peer_id == other.peer_id, what
                return got.payload

            async def until(predicate, what: str) -> None:
                with trio.fail_after(10):
                    while not predicate():
                        await trio.sleep(0.05)

            async with (
                open_host(host_config(holder_pair), MemoryBlobStore(), registry) as holder,
                open_host(host_config(banned_pair), theirs, None) as other,
            ):
                await other.connect(holder.addrs[0])
                await until(lambda: other.peer_id in holder.mesh_peers(), "the holder's mesh holds the peer")
                await other.publish(b"before")
                assert await heard(holder, "admitted") == b"before"
                await other.announce_blob(before)
                await until(lambda: other.peer_id in holder.providers(before), "a provider of its blob")

                await trio.to_thread.run_sync(lambda: deployer.disallow(banned_account.address))
                await trio.to_thread.run_sync(registry.refresh)
                assert not registry(other.peer_id)
                await other.publish(b"during")
                await other.announce_blob(during)
                await trio.sleep(2.0)  # several gossip heartbeats: a delivered message would be here
                with pytest.raises(trio.WouldBlock):
                    holder.announcements.receive_nowait()
                assert other.peer_id not in holder.providers(during)
                assert other.peer_id in holder.mesh_peers()  # refused on a link that is still up

                await trio.to_thread.run_sync(lambda: deployer.allow([banned_account.address]))
                await trio.to_thread.run_sync(registry.refresh)
                await other.publish(b"after")
                assert await heard(holder, "readmitted") == b"after"  # not a late "during"
                await other.announce_blob(after)
                await until(lambda: other.peer_id in holder.providers(after), "a provider again")
                assert other.peer_id not in holder.providers(during)

        trio.run(main)
