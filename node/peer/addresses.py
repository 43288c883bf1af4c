"""The addresses a peer gives to others: moved to `p2p.addresses` (the host gossips them too);
re-exported here for the node's callers (`<workdir>/peer.json`, what `swarm node` prints). And
`tcp_problem`: why a bootstrap peer's TCP port does not open, for the messages that name it."""

from __future__ import annotations

import socket

from p2p.addresses import WILDCARDS, advertised_addrs, is_loopback, local_ip_addresses

__all__ = ["WILDCARDS", "advertised_addrs", "is_loopback", "local_ip_addresses", "tcp_endpoint", "tcp_problem"]


def tcp_endpoint(multiaddr: str) -> tuple[str, int] | None:
    """(host, port) of /ip4|ip6|dns|dns4|dns6/HOST/tcp/PORT/..., or None for anything else."""
    parts = multiaddr.split("/")
    if len(parts) < 5 or parts[1] not in ("ip4", "ip6", "dns", "dns4", "dns6") or parts[3] != "tcp":
        return None
    try:
        return parts[2], int(parts[4])
    except ValueError:
        return None


def tcp_problem(multiaddr: str, timeout: float = 2.0) -> str | None:
    """Why a TCP connection to the multiaddr's host and port fails, or None when it opens."""
    endpoint = tcp_endpoint(multiaddr)
    if endpoint is None:
        return None  # not a TCP address this check understands: libp2p decides
    try:
        with socket.create_connection(endpoint, timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__
