"""The host's lifecycle: the caller's own errors always propagate out of `open_host` (only
py-libp2p's shutdown races after a finished body are logged instead, and never hide a failed body's
error, see p2p/host.py), and the byte counters the node reports per round count chunk payloads both ways."""

from __future__ import annotations

import pytest
import trio

from p2p.host import open_host
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio


class BodyError(Exception):
    pass


async def test_an_error_in_the_body_propagates(config):
    with pytest.raises(ExceptionGroup) as info:  # trio nurseries group what they propagate
        async with open_host(config(), MemoryBlobStore()):
            raise BodyError("the caller's own failure")
    assert info.group_contains(BodyError)


async def test_byte_counters_count_both_directions(config):
    holder_store = MemoryBlobStore()
    blob = bytes(range(256)) * 4096  # 1 MiB: one full chunk
    digest = holder_store.put(blob)
    async with open_host(config(), holder_store) as holder, open_host(config(), MemoryBlobStore()) as fetcher:
        await fetcher.connect(holder.addrs[0])
        assert await fetcher.fetch(digest, providers=[holder.peer_id], timeout=20) == blob
        assert fetcher.bytes_fetched == len(blob)
        assert holder.bytes_served == len(blob)
        assert holder.bytes_fetched == 0 and fetcher.bytes_served == 0


async def test_the_body_error_wins_over_a_shutdown_race(config, monkeypatch):
    """py-libp2p's shutdown race (a stream arriving while its services stop spawns a task into a
    closed nursery) cannot be caused on demand: it is raised here where the host hangs up. An
    unfunded node once printed the race instead of its own error; the body's error must come out."""
    import p2p.host

    hang_up = p2p.host._hang_up

    async def racing_hang_up(libp2p_host, timeout):
        await hang_up(libp2p_host, timeout)
        raise ExceptionGroup("libp2p", [RuntimeError("Nursery is closed to new arrivals")])

    monkeypatch.setattr(p2p.host, "_hang_up", racing_hang_up)
    funds = ValueError("insufficient funds")  # what the node's one-line error must still find
    with pytest.raises(BaseException) as info:
        async with open_host(config(), MemoryBlobStore()):
            raise BodyError("the caller's own failure") from funds
    assert isinstance(info.value, BodyError), repr(info.value)  # the race is logged, not raised
    assert info.value.__cause__ is funds
    # after a finished body the same race is logged, not raised
    async with open_host(config(), MemoryBlobStore()):
        pass


async def test_a_background_task_crash_comes_out_as_itself_not_as_the_bodys_cancel(config, monkeypatch):
    """A host task that fails cancels the body; the body's Cancelled must not stand in for the failure."""
    from p2p.host import SwarmHost

    async def crash(self):
        raise KeyError("a bug in a background task")

    monkeypatch.setattr(SwarmHost, "_say_hello_periodically", crash)
    with pytest.raises(BaseException) as info:
        with trio.fail_after(60):
            async with open_host(config(), MemoryBlobStore()):
                await trio.sleep_forever()
    assert isinstance(info.value, BaseExceptionGroup) and info.group_contains(KeyError), repr(info.value)


async def test_only_the_shutdown_race_is_taken_out_of_a_failed_bodys_error():
    from p2p.host import _without_shutdown_race

    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            cancelled = exc
    body, bug = BodyError("the caller's own failure"), KeyError("a bug")
    race = RuntimeError("Nursery is closed to new arrivals")
    assert _without_shutdown_race(race, body) is body
    assert _without_shutdown_race(BaseExceptionGroup("g", [race, cancelled]), body) is body
    assert _without_shutdown_race(ExceptionGroup("g", [race]), body) is body
    kept = _without_shutdown_race(ExceptionGroup("g", [ExceptionGroup("ours", [body]), race]), body)
    assert isinstance(kept, ExceptionGroup) and kept.subgroup(BodyError) and not kept.subgroup(RuntimeError)
    other = _without_shutdown_race(ExceptionGroup("g", [race, bug]), body)
    assert isinstance(other, ExceptionGroup) and other.exceptions == (bug,)
    assert _without_shutdown_race(ExceptionGroup("g", [bug]), body) is None  # no race: as it is
    assert _without_shutdown_race(RuntimeError("something else"), body) is None
    assert _without_shutdown_race(ExceptionGroup("g", [race]), cancelled) is None  # a cancelled body: as it is
    assert _without_shutdown_race(ExceptionGroup("g", [race]), None) is None
