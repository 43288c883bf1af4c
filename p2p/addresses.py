"""The addresses a peer gives to others. A host listening on the wildcard (`/ip4/0.0.0.0`,
`/ip6/::`) reports the wildcard itself, which no other host can dial; these are replaced by the
machine's own interface addresses, routable ones first and loopback last (for peers on the same
machine). Used for the addresses a host gossips (p2p/host.py), and by the node for
`<workdir>/peer.json` and the addresses `swarm node` prints. Standard library only (psutil if present)."""

from __future__ import annotations

import ipaddress
import socket

WILDCARDS = {"ip4": "0.0.0.0", "ip6": "::"}


def local_ip_addresses() -> dict[str, list[str]]:
    """This machine's interface addresses by family ("ip4", "ip6"), without link-local ones (they
    need an interface scope to dial). psutil when installed; else the address the default route
    leaves from (a UDP connect sends nothing) plus the host name's addresses; loopback always."""
    found: dict[str, list[str]] = {"ip4": [], "ip6": []}

    def add(text: str) -> None:
        try:
            ip = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return
        if ip.is_link_local or ip.is_unspecified or ip.is_multicast:
            return
        family = "ip4" if ip.version == 4 else "ip6"
        if str(ip) not in found[family]:
            found[family].append(str(ip))

    try:
        import psutil  # type: ignore[import-untyped]  # optional: not a declared dependency

        for interface in psutil.net_if_addrs().values():
            for snic in interface:
                if snic.family in (socket.AF_INET, socket.AF_INET6):
                    add(snic.address)
    except Exception:  # no psutil, or it cannot read the interfaces: the portable fallbacks below
        pass
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:  # the route trick: the source address the kernel picks for a documentation address
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                add(s.getsockname()[0])
        except OSError:
            pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None):
            add(str(info[4][0]))
    except OSError:
        pass
    add("127.0.0.1")
    add("::1")
    for listed in found.values():  # routable first, loopback last
        listed.sort(key=lambda a: ipaddress.ip_address(a).is_loopback)
    return found


def advertised_addrs(addrs: list[str], local: dict[str, list[str]] | None = None) -> list[str]:
    """`addrs` (multiaddrs a host listens on) with each wildcard address replaced by one address
    per local interface of its family; other addresses unchanged, duplicates dropped."""
    out: list[str] = []
    for addr in addrs:
        parts = addr.split("/")  # "/ip4/0.0.0.0/tcp/4001/p2p/..." -> ["", "ip4", "0.0.0.0", ...]
        if len(parts) > 2 and WILDCARDS.get(parts[1]) == parts[2]:
            if local is None:
                local = local_ip_addresses()
            expanded = ["/".join([*parts[:2], ip, *parts[3:]]) for ip in local[parts[1]]]
        else:
            expanded = [addr]
        out.extend(a for a in expanded if a not in out)
    return out


def is_loopback(addr: str) -> bool:
    """Whether a multiaddr's IP is a loopback address (only dialable from this machine)."""
    parts = addr.split("/")
    try:
        return len(parts) > 2 and ipaddress.ip_address(parts[2]).is_loopback
    except ValueError:
        return False
