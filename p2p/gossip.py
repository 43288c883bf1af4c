"""The swarm's GossipSub router: py-libp2p 0.8.1's GossipSub with explicit mesh settings for swarms of
4 to 64 peers, and the one rule of go-libp2p it lacks (whoever prunes a peer backs off from it).

Why each setting (measured on 14-16 hosts in one process; docs/P2P.md, "Gossip mesh"):
- degree 6, low 4, high 12: the libp2p defaults. With every peer connected to every other peer
  (`dial_discovered`), 6 mesh links reach 64 peers in 3 hops; every message costs each peer about
  `degree` receptions (mesh duplicates), so a larger degree buys nothing but CPU here.
- heartbeat: `HostConfig.gossip_heartbeat` (1 s), fixed. py-libp2p's "adaptive gossip" (on by
  default) rescores the network every 30 s and, when it finds the mesh below `degree` (always true
  in a swarm of fewer than 7 peers), sets the heartbeat to max(60, 0.75 * base) s, or 30 s: mesh
  repair then takes a minute. It is turned off.
- prune backoff 60 s (the spec's default), unsubscribe backoff 10 s.
- no flood publishing: py-libp2p 0.8.1 publishes to the mesh only (there is no flood_publish).
- IP-diversity (eclipse) guard off: every local test peer shares 127.0.0.1 and the guard would keep
  the mesh empty.

GRAFT flood between honest peers: py-libp2p records when a peer PRUNEd us and penalises a GRAFT from
that peer within 10 s ("GRAFT flood detected ... applying penalty"). But its heartbeat prunes an
oversized mesh (and answers refused GRAFTs) without recording a backoff on its own side, so the
pruner could GRAFT the same peer again on the next heartbeat, and the pruned peer penalised an honest
peer. `SwarmGossipSub` records the backoff whenever it sends a PRUNE, as go-libp2p does, so a peer
never re-GRAFTs within `prune_back_off` a peer it pruned.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub

MESH_DEGREE = 6
MESH_DEGREE_LOW = 4
MESH_DEGREE_HIGH = 12
PRUNE_BACKOFF = 60  # seconds; py-libp2p takes whole seconds
UNSUBSCRIBE_BACKOFF = 10


class SwarmGossipSub(GossipSub):
    """GossipSub that backs off locally from every peer it prunes (see the module docstring)."""

    def mesh_heartbeat(self) -> tuple[defaultdict[ID, list[str]], defaultdict[ID, list[str]]]:
        to_graft, to_prune = super().mesh_heartbeat()
        for peer, topics in to_prune.items():
            for topic in topics:
                self._add_back_off(peer, topic, False)
        return to_graft, to_prune

    def _perform_opportunistic_grafting(self, topic: str, peers_to_graft: defaultdict[ID, list[str]]) -> int:
        return 0  # off: see "mesh churn" in the module docstring

    async def _maintain_mesh_quality(self, topic: str) -> None:
        return None  # off: see "mesh churn" in the module docstring

    async def emit_prune(self, topic: str, to_peer: ID, do_px: bool, is_unsubscribe: bool) -> None:
        self._add_back_off(to_peer, topic, is_unsubscribe)
        await super().emit_prune(topic, to_peer, do_px, is_unsubscribe)


def swarm_gossipsub(heartbeat: float, max_messages_per_second: float) -> SwarmGossipSub:
    """The router every swarm host runs; `heartbeat` in seconds."""
    protocols: Sequence[TProtocol] = [PROTOCOL_ID_V11, PROTOCOL_ID]
    return SwarmGossipSub(
        protocols=protocols,
        degree=MESH_DEGREE,
        degree_low=MESH_DEGREE_LOW,
        degree_high=MESH_DEGREE_HIGH,
        # py-libp2p 0.8.1 annotates int, but only sleeps on it (trio.sleep takes float seconds).
        heartbeat_interval=heartbeat,  # type: ignore[arg-type]
        prune_back_off=PRUNE_BACKOFF,
        unsubscribe_back_off=UNSUBSCRIBE_BACKOFF,
        adaptive_gossip_enabled=False,
        eclipse_protection_enabled=False,
        max_messages_per_topic_per_second=max_messages_per_second,
    )
