"""GossipSub mesh settings on real hosts: mesh churn between honest peers never trips
py-libp2p's GRAFT-flood penalty, and every host still receives every message.

14 hosts on 127.0.0.1 in one process. The churn that made honest peers GRAFT-flood each other is
produced on purpose, in two steps every swarm goes through:
1. oversubscription: 13 peers that know only the first host (a bootstrap node) all GRAFT it, its mesh
   passes D_high (12) and its heartbeat PRUNEs 7 of them down to D (6);
2. departures: 3 of its 6 remaining mesh peers leave, its mesh falls below D_low (4), and its next
   heartbeat looks for peers to GRAFT. The only candidates are the 7 it has just pruned: without a local
   backoff on PRUNE (p2p/gossip.py) it GRAFTs them within py-libp2p's 10 s flood threshold and each of
   them logs "GRAFT flood detected ... applying penalty".
Then the survivors are linked in a ring and every one publishes; each must receive all the others.

Configuration: `hello_interval` is the production default (60 s). With the 1 s hellos of the shared test
config, 12+ hosts in one process spend about a core on hellos alone (each is received about D times by
every peer), and on a loaded 2-core machine delivery then took longer than the test's deadline.
"""

from __future__ import annotations

import logging

import pytest
import trio

from p2p.gossip import MESH_DEGREE, MESH_DEGREE_HIGH, MESH_DEGREE_LOW
from p2p.host import HostConfig, SwarmHost, open_host
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio

N_HOSTS = 14  # the hub's mesh must be able to pass D_high: 13 spokes > 12
N_LEAVING = MESH_DEGREE - MESH_DEGREE_LOW + 1  # 3: the hub's mesh falls from 6 to 3 < D_low
HEARTBEAT = 0.5  # seconds: many mesh-maintenance rounds in a short test


class _Records(logging.Handler):
    """Keeps every record at WARNING or above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


async def _run_host(cfg: HostConfig, stop: trio.Event, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """One host in its own task, so that any host can leave the swarm at any time (set `stop`)."""
    async with open_host(cfg, MemoryBlobStore()) as host:
        task_status.started(host)
        await stop.wait()


def _pruned_by(spoke: SwarmHost, hub: SwarmHost) -> bool:
    """Whether `hub` PRUNEd `spoke` (py-libp2p records the backoff a PRUNE asks for)."""
    backoffs = spoke._gossipsub.back_off.get(spoke.config.topic, {})
    return hub.libp2p_host.get_id() in backoffs


async def test_mesh_churn_has_no_graft_flood_and_delivers_everything(config, wait_until):
    assert N_HOSTS - 1 > MESH_DEGREE_HIGH
    records = _Records()
    # The penalty is logged by this logger; a handler on it sees the record whatever libp2p's logging setup.
    gossip_logger = logging.getLogger("libp2p.pubsub.gossipsub")
    gossip_logger.addHandler(records)
    try:
        async with trio.open_nursery() as nursery:
            stops = [trio.Event() for _ in range(N_HOSTS)]
            peers: list[SwarmHost] = []
            for stop in stops:
                cfg = config(
                    gossip_heartbeat=HEARTBEAT, hello_interval=60.0, dial_discovered=False, connect_timeout=10.0
                )
                peers.append(await nursery.start(_run_host, cfg, stop))
            hub, spokes = peers[0], peers[1:]

            # 1. Oversubscription: every spoke knows only the hub, so all of them GRAFT it.
            for spoke in spokes:
                await spoke.connect(hub.addrs[0])
            await wait_until(
                lambda: (
                    sum(_pruned_by(s, hub) for s in spokes) == len(spokes) - MESH_DEGREE
                    and len(hub.mesh_peers()) == MESH_DEGREE
                ),
                timeout=20,
                what="the hub pruning its oversized mesh",
            )
            pruned = [s for s in spokes if _pruned_by(s, hub)]

            # 2. Departures: half of the hub's remaining mesh leaves; its mesh is now below D_low.
            leaving = [p for p in spokes if p.peer_id in hub.mesh_peers()][:N_LEAVING]
            for p in leaving:
                stops[peers.index(p)].set()
            await wait_until(
                lambda: len(hub.mesh_peers()) < MESH_DEGREE_LOW, timeout=10, what="departures seen by the hub"
            )
            await trio.sleep(6 * HEARTBEAT)  # heartbeats in which the hub looks for peers to GRAFT
            floods = [m for m in records.messages if "GRAFT flood" in m]
            assert floods == [], f"{len(floods)} GRAFT-flood penalties between honest peers, e.g. {floods[0]}"
            regrafted = [p.peer_id[-8:] for p in pruned if p.peer_id in hub.mesh_peers()]
            assert regrafted == [], f"the hub re-GRAFTed peers it pruned within the backoff: {regrafted}"

            # 3. Survivors linked in a ring besides their links to the hub (the pruned ones have no mesh
            # peer left until then); everyone publishes.
            alive = [p for p in peers if p not in leaving]
            for i, p in enumerate(alive):
                other = alive[(i + 1) % len(alive)]
                if other.peer_id not in p.connected_peers():
                    await p.connect(other.addrs[0])
            await wait_until(lambda: all(p.mesh_peers() for p in alive), timeout=10, what="meshes")
            received: list[set[bytes]] = [set() for _ in alive]
            expected = [{f"hello from {j}".encode() for j in range(len(alive)) if j != i} for i in range(len(alive))]

            async def collect(i: int) -> None:
                while received[i] != expected[i]:
                    ann = await alive[i].announcements.receive()
                    received[i].add(ann.payload)

            with trio.move_on_after(20):
                async with trio.open_nursery() as collectors:
                    for i in range(len(alive)):
                        collectors.start_soon(collect, i)
                    for i, p in enumerate(alive):
                        await p.publish(f"hello from {i}".encode())
            missing = {i: sorted(m.decode() for m in expected[i] - received[i]) for i in range(len(alive))}
            assert all(not m for m in missing.values()), f"messages not delivered within 20 s: {missing}"
            intervals = {p._gossipsub.heartbeat_interval for p in alive}
            for stop in stops:
                stop.set()
    finally:
        gossip_logger.removeHandler(records)
    floods = [m for m in records.messages if "GRAFT flood" in m]
    assert floods == [], f"{len(floods)} GRAFT-flood penalties between honest peers, e.g. {floods[0]}"
    assert intervals == {HEARTBEAT}, f"heartbeat drifted to {intervals}"
