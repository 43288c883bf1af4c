"""When a peer gives up on its bootstrap peers (node.peer.runner.require_bootstrap), with real
libp2p hosts on 127.0.0.1: alone, with only unreachable bootstrap addresses, it stops after the
timeout naming each address and why; a peer that another one dialed is not alone, so it goes on
although its own bootstrap peer never answered; a bootstrap peer that answers late, within the
timeout, is reached; without bootstrap peers, or with a timeout of 0, it never stops."""

from __future__ import annotations

import socket

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from node.peer.runner import BootstrapUnreachable, require_bootstrap
from p2p.host import HostConfig, open_host
from p2p.store import MemoryBlobStore

TOPIC = "test-require-bootstrap"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(port: int = 0, bootstrap: tuple[str, ...] = ()) -> HostConfig:
    return HostConfig(
        key_pair=create_new_key_pair(),
        topic=TOPIC,
        listen_addrs=[f"/ip4/127.0.0.1/tcp/{port}"],
        bootstrap=bootstrap,
        connect_timeout=2.0,
        bootstrap_retry_initial=0.2,
        bootstrap_retry_max=0.5,
    )


def _nobody() -> str:
    """A bootstrap address with nothing listening (and a peer id nobody has)."""
    peer_id = ID.from_pubkey(create_new_key_pair().public_key).to_base58()
    return f"/ip4/127.0.0.1/tcp/{_closed_port()}/p2p/{peer_id}"


def test_alone_with_unreachable_bootstrap_peers_it_stops_after_the_timeout():
    nobody = _nobody()

    async def main() -> float:
        async with open_host(_config(bootstrap=(nobody,)), MemoryBlobStore()) as host:
            started = trio.current_time()
            with pytest.raises(BootstrapUnreachable) as stopped:
                await require_bootstrap(host, [nobody], 1.0, poll=0.1)
            assert host.connected_peers() == []
            message = str(stopped.value)
            assert message.startswith("no peer reached in 1 s: none of the --bootstrap peers answered (")
            assert f"{nobody}: Connection refused" in message and "--bootstrap-timeout waits longer" in message
            return trio.current_time() - started

    assert 1.0 <= trio.run(main) < 10


def test_a_peer_another_one_dialed_is_not_alone():
    nobody = _nobody()

    async def main() -> None:
        async with open_host(_config(bootstrap=(nobody,)), MemoryBlobStore()) as lonely:
            mine = lonely.addrs[0]  # /ip4/127.0.0.1/tcp/PORT/p2p/ID
            async with open_host(_config(bootstrap=(mine,)), MemoryBlobStore()) as other:
                with trio.fail_after(15):
                    await require_bootstrap(lonely, [nobody], 10.0, poll=0.1)  # returns once `other` dialed in
                assert other.peer_id in lonely.connected_peers()

    trio.run(main)


def test_a_bootstrap_peer_that_starts_within_the_timeout_is_reached():
    port = _closed_port()
    late_config = _config(port=port)
    late_id = ID.from_pubkey(late_config.key_pair.public_key).to_base58()
    late_addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{late_id}"

    async def main() -> None:
        async with open_host(_config(bootstrap=(late_addr,)), MemoryBlobStore()) as early:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(require_bootstrap, early, [late_addr], 20.0, 0.1)
                await trio.sleep(1.0)  # refused meanwhile
                assert early.connected_peers() == []
                async with open_host(late_config, MemoryBlobStore()):
                    with trio.fail_after(15):
                        while late_id not in early.connected_peers():
                            await trio.sleep(0.1)
            # the nursery ended: require_bootstrap returned instead of raising

    trio.run(main)


@pytest.mark.parametrize(("bootstrap", "timeout"), [(False, 0.5), (True, 0.0)], ids=["no-bootstrap", "timeout-0"])
def test_without_bootstrap_peers_or_a_timeout_it_never_stops(bootstrap, timeout):
    nobody = _nobody()

    async def main() -> None:
        async with open_host(_config(bootstrap=(nobody,) if bootstrap else ()), MemoryBlobStore()) as host:
            with trio.move_on_after(2.0) as waited:
                await require_bootstrap(host, [nobody] if bootstrap else [], timeout, poll=0.1)
                await trio.sleep(5)  # it returned at once: nothing to enforce
            assert waited.cancelled_caught  # returned at once, and nothing raised in 2 s

    trio.run(main)
