"""Shared helpers for the p2p tests: real py-libp2p hosts on 127.0.0.1, driven by trio through
anyio's pytest plugin. Timeouts are short so a broken test fails fast instead of hanging."""

from __future__ import annotations

import contextlib

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from p2p.host import HostConfig, open_host
from p2p.store import MemoryBlobStore


@pytest.fixture
def anyio_backend():
    return "trio"


class CountingStore(MemoryBlobStore):
    """A real in-memory store that records how many bytes it served and can signal a threshold."""

    def __init__(self, signal_after: int | None = None) -> None:
        super().__init__()
        self.bytes_served = 0
        self.signal_after = signal_after
        self.threshold_reached = trio.Event()

    def read(self, digest, offset, length):
        chunk = super().read(digest, offset, length)
        self.bytes_served += len(chunk or b"")
        if self.signal_after is not None and self.bytes_served >= self.signal_after:
            self.threshold_reached.set()
        return chunk


class CorruptingStore(MemoryBlobStore):
    """Serves wrong bytes for real: flips one byte of every chunk it reads (a faulty or lying peer)."""

    def read(self, digest, offset, length):
        chunk = super().read(digest, offset, length)
        if not chunk:
            return chunk
        return bytes([chunk[0] ^ 0xFF]) + chunk[1:]


@pytest.fixture
def stores():
    return {"counting": CountingStore, "corrupting": CorruptingStore, "memory": MemoryBlobStore}


@pytest.fixture
def config():
    """Factory of fast test configurations (short timeouts, quick heartbeats)."""

    def make(topic: str = "test-swarm", **overrides) -> HostConfig:
        fields = dict(
            key_pair=create_new_key_pair(),
            topic=topic,
            request_timeout=3.0,
            connect_timeout=3.0,
            reconnect_interval=0.3,
            hello_interval=1.0,
            gossip_heartbeat=0.3,
        )
        fields.update(overrides)
        return HostConfig(**fields)

    return make


@pytest.fixture
def wait_until():
    async def wait(predicate, timeout: float = 10.0, what: str = "condition") -> None:
        try:
            with trio.fail_after(timeout):
                while not predicate():
                    await trio.sleep(0.05)
        except trio.TooSlowError:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None

    return wait


@pytest.fixture
def hosts():
    """`async with hosts([(config, store, allowed), ...]) as [h1, h2, ...]` opens several hosts."""

    @contextlib.asynccontextmanager
    async def open_many(specs):
        async with contextlib.AsyncExitStack() as stack:
            opened = []
            for cfg, store, allowed in specs:
                opened.append(await stack.enter_async_context(open_host(cfg, store, allowed)))
            yield opened

    return open_many
