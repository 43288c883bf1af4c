"""Bootstrap dial retry: peers started together dial their bootstrap node before it
listens; py-libp2p then refuses to dial that peer again for 60 s (its negative cache), and the swarm
used to split. The host retries its bootstrap peers with backoff and lifts that cache entry first."""

from __future__ import annotations

import socket

import pytest
import trio
from libp2p.peer.id import ID

from p2p.host import open_host
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio


def _free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound once by the kernel's choice, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_bootstrap_node_that_starts_late_is_reached(config, wait_until):
    port = _free_port()
    late_config = config(listen_addrs=[f"/ip4/127.0.0.1/tcp/{port}"])
    late_id = ID.from_pubkey(late_config.key_pair.public_key).to_base58()
    # The production backoff (0.5 s doubling to 10 s), not the shared test config's.
    early_config = config(
        bootstrap=[f"/ip4/127.0.0.1/tcp/{port}/p2p/{late_id}"], bootstrap_retry_initial=0.5, bootstrap_retry_max=10.0
    )
    async with open_host(early_config, MemoryBlobStore()) as early:
        # B dials A before A listens: refused, at least twice (so py-libp2p's negative cache holds A).
        await wait_until(lambda: early.failed_bootstrap_dials >= 2, timeout=10, what="dials refused before A listens")
        assert late_id not in early.connected_peers()
        async with open_host(late_config, MemoryBlobStore()) as late:
            assert late.peer_id == late_id
            started = trio.current_time()
            await wait_until(lambda: late_id in early.connected_peers(), timeout=6, what="B reaching A once it listens")
            waited = trio.current_time() - started
            # ... and the swarm works across that connection: A hears B's announcement.
            await wait_until(lambda: early.peer_id in late.mesh_peers(), timeout=10, what="mesh")
            await early.publish(b"made it")
            with trio.fail_after(10):
                ann = await late.announcements.receive()
            assert (ann.peer_id, ann.payload) == (early.peer_id, b"made it")
    assert waited < 6


async def test_bootstrap_config_rejects_a_backoff_that_cannot_work(config):
    with pytest.raises(ValueError, match="bootstrap_retry"):
        config(bootstrap_retry_initial=0.0)
    with pytest.raises(ValueError, match="bootstrap_retry"):
        config(bootstrap_retry_initial=20.0, bootstrap_retry_max=10.0)
