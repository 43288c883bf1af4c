"""A blob about to be stored, and two fetches of one blob at once (p2p/host.py `blob_coming`, `fetch`),
with real hosts on 127.0.0.1.

A committer stores its update only once its commit is read back, the moment its fetchers see the
commit too: an OPEN that comes meanwhile waits for the store instead of answering NOT_FOUND, and is
answered from the store when the committer is done, stored or not. A fetch of a blob already being
fetched joins that fetch instead of asking the holder again.
"""

from __future__ import annotations

import os
from hashlib import sha256

import pytest
import trio

from p2p.errors import BlobNotHeld, FetchTimeout
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio


class AskedStore(MemoryBlobStore):
    """A real store that says when a holder first looked a digest up (an OPEN for it arrived)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: dict[str, trio.Event] = {}
        self.lookups: dict[str, int] = {}

    def size(self, digest: str) -> int | None:
        self.lookups[digest] = self.lookups.get(digest, 0) + 1
        self.asked.setdefault(digest, trio.Event()).set()
        return super().size(digest)

    async def wait_asked(self, digest: str, times: int = 1) -> None:
        with trio.fail_after(10):
            while self.lookups.get(digest, 0) < times:
                await self.asked.setdefault(digest, trio.Event()).wait()
                self.asked[digest] = trio.Event()


async def joined(fetcher, digest: str) -> None:
    """Until a second fetch of `digest` waits for the running one."""
    with trio.fail_after(10):
        while fetcher._fetching[digest][0].statistics().tasks_waiting < 1:
            await trio.sleep(0.01)


def a_blob() -> tuple[bytes, str]:
    blob = os.urandom(30_000)
    return blob, sha256(blob).hexdigest()


async def test_an_open_for_a_blob_about_to_be_stored_is_answered_once_it_is(config, hosts):
    blob, digest = a_blob()
    holder_store = AskedStore()
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, fetcher):
        await fetcher.connect(holder.addrs[0])
        fetched: list[bytes] = []
        async with trio.open_nursery() as nursery:
            with holder.blob_coming(digest):

                async def fetch() -> None:
                    fetched.append(await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30))

                nursery.start_soon(fetch)
                await holder_store.wait_asked(digest)  # the OPEN is at the holder, before the blob
                assert not fetched
                holder_store.put(blob)
        # Without the wait the only holder would have said NOT_FOUND, and the fetch raised BlobNotHeld.
        assert fetched == [blob]
        assert holder.bytes_served == len(blob) and not fetcher.blames


async def test_a_blob_that_was_not_stored_after_all_is_not_found_and_never_served(config, hosts):
    blob, digest = a_blob()
    holder_store = AskedStore()
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, fetcher):
        await fetcher.connect(holder.addrs[0])
        refused: list[BaseException] = []
        async with trio.open_nursery() as nursery:
            with pytest.raises(RuntimeError, match="commit refused"), holder.blob_coming(digest):

                async def fetch() -> None:
                    with pytest.raises(BlobNotHeld) as caught:
                        await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30)
                    refused.append(caught.value)

                nursery.start_soon(fetch)
                await holder_store.wait_asked(digest)
                raise RuntimeError("commit refused")  # what a refused commit does to the committer's body
        assert len(refused) == 1
        assert holder.bytes_served == 0 and not holder_store.has(digest) and not fetcher.store.has(digest)


async def test_the_wait_for_a_coming_blob_is_bounded_within_the_askers_own(config, hosts):
    """A body that outlasts half of request_timeout: the OPEN is answered NOT_FOUND, so the asker
    hears "not held" (and may ask again) rather than timing out on a silent holder."""
    _, digest = a_blob()
    async with hosts([(config(request_timeout=2.0), AskedStore(), None), (config(), MemoryBlobStore(), None)]) as (
        holder,
        fetcher,
    ):
        await fetcher.connect(holder.addrs[0])
        with holder.blob_coming(digest):
            with pytest.raises(BlobNotHeld, match="not found"):
                await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30)
        assert not fetcher.blames


async def test_blob_coming_refuses_a_malformed_digest_and_nests(config, hosts):
    blob, digest = a_blob()
    async with hosts([(config(), MemoryBlobStore(), None)]) as (holder,):
        with pytest.raises(ValueError):
            with holder.blob_coming("not-a-digest"):
                pass
        with holder.blob_coming(digest):
            with holder.blob_coming(digest):  # the inner use leaves the outer's wait in place
                pass
            assert digest in holder._coming
        assert digest not in holder._coming


async def test_two_fetches_of_one_blob_at_once_ask_the_holder_once(config, hosts):
    blob, digest = a_blob()
    holder_store = AskedStore()
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, fetcher):
        await fetcher.connect(holder.addrs[0])
        fetched: list[bytes] = []

        async def fetch() -> None:
            fetched.append(await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30))

        async with trio.open_nursery() as nursery:
            with holder.blob_coming(digest):  # holds the first fetch's OPEN while the second starts
                nursery.start_soon(fetch)
                await holder_store.wait_asked(digest)
                nursery.start_soon(fetch)
                await joined(fetcher, digest)
                holder_store.put(blob)
        assert fetched == [blob, blob]
        assert holder_store.lookups[digest] == 2  # one OPEN: looked up when it came and when the blob was stored
        assert holder.bytes_served == len(blob)


async def test_a_fetch_that_joined_one_that_failed_fetches_on_its_own(config, hosts):
    blob, digest = a_blob()
    holder_store = AskedStore()
    async with hosts([(config(), holder_store, None), (config(), MemoryBlobStore(), None)]) as (holder, fetcher):
        await fetcher.connect(holder.addrs[0])
        first_failed = trio.Event()
        fetched: list[bytes] = []

        async def first() -> None:
            with pytest.raises(FetchTimeout):
                await fetcher.fetch(digest, providers=[holder.peer_id], timeout=0.5)
            first_failed.set()

        async def second() -> None:
            fetched.append(await fetcher.fetch(digest, providers=[holder.peer_id], timeout=30))

        async with trio.open_nursery() as nursery:
            with holder.blob_coming(digest):
                nursery.start_soon(first)
                await holder_store.wait_asked(digest)
                nursery.start_soon(second)
                await joined(fetcher, digest)  # the second waits for the first, which then runs out of time
                await first_failed.wait()
                await holder_store.wait_asked(digest, times=2)  # the second's own OPEN
                holder_store.put(blob)
        assert fetched == [blob]
        assert not fetcher.blames


async def test_a_fetch_naming_another_holder_asks_it_instead_of_joining(config, hosts):
    blob, digest = a_blob()
    slow_store, honest_store = AskedStore(), AskedStore()
    honest_store.put(blob)
    async with hosts(
        [(config(), slow_store, None), (config(), honest_store, None), (config(), MemoryBlobStore(), None)]
    ) as (slow, honest, fetcher):
        for holder in (slow, honest):
            await fetcher.connect(holder.addrs[0])
        got: list[bytes] = []
        async with trio.open_nursery() as nursery:
            with slow.blob_coming(digest):  # the first fetch waits at the slow holder

                async def held() -> None:
                    got.append(await fetcher.fetch(digest, providers=[slow.peer_id], timeout=30))

                nursery.start_soon(held)
                await slow_store.wait_asked(digest)
                # Asked of the honest holder while the first fetch is held: served at once, not joined.
                assert await fetcher.fetch(digest, providers=[honest.peer_id], timeout=30) == blob
                assert honest_store.lookups[digest] == 1 and not got
        assert got == [blob]  # the held fetch ends once the slow holder's body is over (from the store)
        assert not fetcher.blames
