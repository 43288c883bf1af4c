"""After the last round a peer serves `linger` seconds, and on (up to `linger_max`) while a
participant of the last round has not announced the model (node/peer/linger.py): a participant
that saw the round end late (CI's testnet box: 29 s after the others) still finds a holder."""

from __future__ import annotations

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from node.peer.linger import serve_on
from node.peer.round_outcome import Phase
from p2p.host import HostConfig, open_host
from p2p.store import MemoryBlobStore
from tests.node.peer.harness import FakeSwarm, PhaseLog, run_virtual
from tests.node.peer.test_peer_round import run_all

ME, A, B = "me", "peer-a", "peer-b"
DIGEST = "ab" * 32


class Announced:
    """What `serve_on` reads of a host: who announced which digest."""

    def __init__(self) -> None:
        self.by: dict[str, list[str]] = {}

    def providers(self, digest: str) -> list[str]:
        return list(self.by.get(digest, []))


def test_serve_on_waits_for_the_floor_then_for_participants_within_the_cap():
    async def main() -> None:
        host = Announced()
        host.by[DIGEST] = [A]

        async def b_announces_at(t: float) -> None:
            await trio.sleep_until(t)
            host.by[DIGEST].append(B)

        # everyone announced: the floor only (ourselves never awaited)
        host.by[DIGEST].append(B)
        assert await serve_on(host, DIGEST, [ME, A, B], ME, floor=5.0, cap=60.0) == []  # type: ignore[arg-type]
        assert trio.current_time() == 5.0
        # B announces 20 s in: served until then, not to the cap
        host.by[DIGEST] = [A]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b_announces_at, trio.current_time() + 20.0)
            assert await serve_on(host, DIGEST, [ME, A, B], ME, floor=5.0, cap=60.0) == []  # type: ignore[arg-type]
        assert 25.0 <= trio.current_time() <= 25.0 + 0.25 + 1e-9
        # B never announces: the cap, and B named
        host.by[DIGEST] = [A]
        start = trio.current_time()
        assert await serve_on(host, DIGEST, [ME, A, B], ME, floor=5.0, cap=60.0) == [B]  # type: ignore[arg-type]
        assert trio.current_time() - start == pytest.approx(60.0)
        # a cap at or under the floor, or no model held: the floor only
        start = trio.current_time()
        assert await serve_on(host, DIGEST, [A, B], ME, floor=5.0, cap=5.0) == [B]  # type: ignore[arg-type]
        assert await serve_on(host, None, [A, B], ME, floor=5.0, cap=60.0) == []  # type: ignore[arg-type]
        assert trio.current_time() - start == pytest.approx(10.0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("late_by", [20.0, None])
def test_peers_serve_on_until_a_late_participant_announced_the_last_model(late_by):
    """Three real Peers play a round; the third's announcement of the model it aggregated comes
    `late_by` seconds after the others started serving (None: never). They serve until it came,
    or `linger_max`; the third, whose participants did announce, serves `linger` only."""

    async def main() -> None:
        swarm = FakeSwarm(3)
        logs = [PhaseLog() for _ in range(3)]
        peers = [swarm.peer(i, on_status=logs[i], linger=5.0, linger_max=60.0) for i in range(3)]
        late = swarm.members[2].host
        announce, held = late.announce_blob, []

        async def announce_late(digest: str, *, later: bool = False) -> None:
            if peers[2].phase is Phase.AGGREGATING or digest in held:  # the model: the test announces it later
                held.append(digest)
                return
            await announce(digest, later=later)

        late.announce_blob = announce_late  # type: ignore[method-assign]

        async def release() -> None:
            while not all(p.phase in (Phase.SERVING, Phase.DONE) for p in peers):
                await trio.sleep(0.1)
            if late_by is not None:
                await trio.sleep(late_by)
                await announce(held[0])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release)
            outcomes = await run_all(peers)

        assert [o[-1].state for o in outcomes] == ["finalized"] * 3 and len(set(held)) == 1  # announced twice
        assert all(o[-1].global_digest == held[0] for o in outcomes)
        served = [log.duration("serving") for log in logs]
        assert served[2] == pytest.approx(5.0)
        for s in served[:2]:
            if late_by is None:
                assert s == pytest.approx(60.0)
            else:  # from the first peer's SERVING to the release: late_by and at most one check more
                assert late_by <= s <= late_by + 5.0 + 0.25 + 1e-9

    run_virtual(main)


def test_a_real_have_ends_the_wait():
    """Two real libp2p hosts on 127.0.0.1: the holder serves on until the other announces the model."""
    trio.run(_a_real_have)


async def _a_real_have() -> None:

    def config() -> HostConfig:
        return HostConfig(
            key_pair=create_new_key_pair(),
            topic="test-linger",
            listen_addrs=["/ip4/127.0.0.1/tcp/0"],
            gossip_heartbeat=0.3,
            connect_timeout=30.0,
        )

    model = b"the last round's model" * 100
    stores = [MemoryBlobStore(), MemoryBlobStore()]
    digest = stores[0].put(model)
    async with open_host(config(), stores[0]) as holder, open_host(config(), stores[1]) as late:
        await late.connect(holder.addrs[0])
        async with trio.open_nursery() as nursery:
            left: list[list[str]] = []

            async def wait() -> None:
                ids = [holder.peer_id, late.peer_id]
                left.append(await serve_on(holder, digest, ids, holder.peer_id, floor=0.0, cap=120.0))

            nursery.start_soon(wait)
            assert await late.fetch(digest, providers=[holder.peer_id], timeout=60) == model
            await late.announce_blob(digest)  # once: written straight to the connected holder (p2p/have.py)
        assert left == [[]]  # ended by the HAVE, not by the cap (120 s)


def test_a_failed_announcement_at_the_end_does_not_fail_the_run():
    """The model's HAVE again as the peer starts serving is a courtesy: a publish that fails (a
    stalled mesh peer's stream: TooSlowError) must not turn a finished run into an error."""

    async def main() -> None:
        swarm = FakeSwarm(3)
        peers = [swarm.peer(i, linger=5.0, linger_max=60.0) for i in range(3)]
        host = swarm.members[0].host
        announce = host.announce_blob

        async def failing(digest: str, *, later: bool = False) -> None:
            if peers[0].phase is Phase.SERVING:
                raise trio.TooSlowError
            await announce(digest, later=later)

        host.announce_blob = failing  # type: ignore[method-assign]
        outcomes = await run_all(peers)
        assert [o[-1].state for o in outcomes] == ["finalized"] * 3
        assert all(p.phase is Phase.DONE for p in peers)

    run_virtual(main)
