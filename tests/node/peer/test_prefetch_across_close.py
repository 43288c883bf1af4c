"""A blob whose prefetch is still running when the round closes is fetched once, on one stream,
with real libp2p hosts on 127.0.0.1 and two real `Peer`s on a FakeChain (real clock).

Member A reads its commit back slowly (until its fetcher B has seen the round close and begun the
agreement step's fetches: a lagging endpoint), so B asks for A's blob before A stored it: B's OPEN
waits at A (`SwarmHost.blob_coming`) across the close. B's prefetch is not cancelled at the close
(node/peer/peer.py `_prefetch`) and the agreement step's fetch of the same blob joins it
(`SwarmHost.fetch`). Before, the prefetch was cancelled at the close, its stream reset, and the
agreement step opened a second stream and asked again; and before `blob_coming` the early OPEN
was answered NOT_FOUND.
"""

from __future__ import annotations

from typing import Any

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol

from node.peer.peer import Peer, RoundOutcome
from node.peer.round_outcome import Phase
from p2p import wire as p2p_wire
from p2p.host import HostConfig, SwarmHost, open_host
from p2p.store import MemoryBlobStore
from tests.node.peer.fakes import FakeChain, FakeLedger
from tests.node.peer.harness import genesis_digest, inline, member_address, settings, tiny_data

RUN_TIMEOUT_S = 120  # a bound for failure only


class SlowReadBack(Peer):
    """Reads its own commit back only once `go` is set."""

    go: trio.Event

    async def _read_back_commit(self, r: int, digest: bytes, mined_in: int | None = None) -> Any:
        await self.go.wait()
        return await super()._read_back_commit(r, digest, mined_in)


class Fetching:
    """B's on_status: sets `seen` once B's agreement step fetches (the round closed for B)."""

    def __init__(self) -> None:
        self.seen = trio.Event()

    def __call__(self, status: dict[str, Any]) -> None:
        if status["phase"] == Phase.FETCHING:
            self.seen.set()


def count_blob_streams(holder: SwarmHost) -> list[int]:
    """A one-item list counting the blob streams `holder` accepts (it serves them as before)."""
    opened = [0]

    async def handler(stream: Any) -> None:
        opened[0] += 1
        await holder._serve_blob_stream(stream)

    holder.libp2p_host.set_stream_handler(TProtocol(p2p_wire.BLOB_PROTOCOL), handler)
    return opened


async def play() -> tuple[list[list[RoundOutcome]], int, SwarmHost]:
    chain = FakeChain(genesis_digest=genesis_digest(), min_peers=2)
    config = dict(topic="test-prefetch-across-close", listen_addrs=["/ip4/127.0.0.1/tcp/0"], connect_timeout=30.0)
    async with (
        open_host(HostConfig(key_pair=create_new_key_pair(), **config), MemoryBlobStore()) as host_a,
        open_host(HostConfig(key_pair=create_new_key_pair(), **config), MemoryBlobStore()) as host_b,
    ):
        await host_b.connect(host_a.addrs[0])
        streams_at_a = count_blob_streams(host_a)
        b_fetching = Fetching()
        peers = [
            kind(
                settings(),
                ledger=FakeLedger(chain, member_address(i)),
                host=host,
                store=host.store,
                train_xy=tiny_data(i),
                test_xy=tiny_data(100),
                run_sync=inline,
                on_status=on_status,
            )
            for i, (kind, host, on_status) in enumerate([(SlowReadBack, host_a, None), (Peer, host_b, b_fetching)])
        ]
        peers[0].go = b_fetching.seen  # type: ignore[attr-defined]
        outcomes: list[list[RoundOutcome]] = [[], []]

        async def run(i: int) -> None:
            outcomes[i] = await peers[i].run()

        with trio.fail_after(RUN_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                for i in range(2):
                    nursery.start_soon(run, i)
        return outcomes, streams_at_a[0], host_a


def test_a_blob_still_being_fetched_at_the_close_is_fetched_once_on_one_stream():
    outcomes, streams_at_a, host_a = trio.run(play)
    for mine in outcomes:
        assert [(o.state, o.committed, o.included) for o in mine] == [("finalized", True, [True, True])]
    # B asked A for its blob once, on one stream, and A sent it once, when it had stored it.
    assert streams_at_a == 1
    assert host_a.not_found_answers == 0
    assert host_a.bytes_served == outcomes[1][0].bytes_received
