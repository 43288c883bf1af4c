"""The addresses a peer gives to others: moved to `p2p.addresses` (the host gossips them too);
re-exported here for the node's callers (`<workdir>/peer.json`, what `swarm node` prints)."""

from __future__ import annotations

from p2p.addresses import WILDCARDS, advertised_addrs, is_loopback, local_ip_addresses

__all__ = ["WILDCARDS", "advertised_addrs", "is_loopback", "local_ip_addresses"]
