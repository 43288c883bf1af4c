"""A finalized model is fetched around a holder that lies or says nothing (node/peer/fetching.py),
with real libp2p hosts on 127.0.0.1: the first holder asked serves corrupted bytes, or accepts the
request and never answers; the follower blames it, skips it and takes the model from the honest
holder, well inside the fetch's deadline (before, it asked the same first holder again until the
deadline and gave up). The chain is the in-memory FakeChain of the round tests, on the real clock.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol

from node.peer.catchup import CatchUp
from node.peer.faults import FaultyStore
from node.peer.fetching import obtain
from node.protocol import wire
from node.protocol.wire import encode_bitmap
from p2p import wire as p2p_wire
from p2p.host import HostConfig, SwarmHost, open_host
from p2p.store import DiskBlobStore, MemoryBlobStore
from tests.node.peer.fakes import FakeChain, FakeLedger
from tests.node.peer.harness import settings

FETCH_TIMEOUT = 5.0  # the deadline is 15 s, room for a loaded machine; a silent holder costs 2.5 s
D = 1000  # model parameters: a blob of one piece (p2p's), so the blame is exact
LIAR, HONEST, FOLLOWER = (f"0x{0xB0B0 + i:040x}" for i in range(3))


def _config() -> HostConfig:
    # The host's own wait for an answer (request_timeout) is longer than the whole fetch: only the
    # peer's per-try timeout can route around a silent holder.
    return HostConfig(
        key_pair=create_new_key_pair(),
        topic="test-fetch-around-liars",
        listen_addrs=["/ip4/127.0.0.1/tcp/0"],
        request_timeout=30.0,
        connect_timeout=30.0,  # a bound for failure only: a loaded machine handshakes slowly
    )


def _finalize(chain: FakeChain, model_digest: bytes, holders: list[SwarmHost]) -> None:
    """Round 1 finalized with `model_digest`, its participants the holders (liar first)."""
    for i, (address, host) in enumerate(zip((LIAR, HONEST), holders)):
        ledger = FakeLedger(chain, address)
        ledger.register(host.peer_id_bytes)
        ledger.commit(1, bytes([i + 2]) * 32, 100, 0, b"{}")
    FakeLedger(chain, LIAR).close_round(1)
    for address in (LIAR, HONEST):
        FakeLedger(chain, address).attest(1, model_digest, encode_bitmap([True, True]))


async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


async def _no_reader(commitments: Any) -> Any:
    raise AssertionError("a follower rebuilds nothing")


async def _silent(stream: Any) -> None:
    await trio.sleep_forever()  # takes the request, never answers


def fetch_with_a_lying_first_holder(how: str, tmp_path: Path) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """(model fetched, model finalized, seconds the fetch took, bytes the honest holder served)."""
    vector = torch.randn(D, generator=torch.Generator().manual_seed(3))
    blob = wire.model_blob(vector, 1)
    liar_store = FaultyStore(DiskBlobStore(tmp_path / "liar"))
    digest = liar_store.put(blob)
    if how == "corrupting":
        liar_store.poison(digest)
    honest_store = MemoryBlobStore()
    honest_store.put(blob)

    async def main() -> tuple[torch.Tensor, float, int]:
        chain = FakeChain(genesis_digest=b"\x01" * 32, min_peers=2)
        async with (
            open_host(_config(), liar_store) as liar,
            open_host(_config(), honest_store) as honest,
            open_host(_config(), MemoryBlobStore()) as follower,
        ):
            if how == "silent":
                liar.libp2p_host.set_stream_handler(TProtocol(p2p_wire.BLOB_PROTOCOL), _silent)
            for holder in (liar, honest):
                await follower.connect(holder.addrs[0])
            _finalize(chain, bytes.fromhex(digest), [liar, honest])
            catchup = CatchUp(
                ledger=FakeLedger(chain, FOLLOWER),
                host=follower,
                store=follower.store,
                address=FOLLOWER,
                call=_call,
                obtain=lambda d, providers, timeout: obtain(
                    follower.store, follower, d, providers, max_size=len(blob), timeout=timeout
                ),
                update_reader=_no_reader,
                settings=settings(fetch_timeout=FETCH_TIMEOUT),
                genesis_vector=torch.zeros(D),
                order=list,  # the participants in commit order: the liar is asked first
            )
            started = trio.current_time()
            fetched = await catchup.fetch_model(1)
            return fetched, trio.current_time() - started, honest.bytes_served

    fetched, seconds, served = trio.run(main)
    return fetched, vector, seconds, served


@pytest.mark.parametrize("how", ["corrupting", "silent"])
def test_a_follower_fetches_the_model_around_a_lying_first_holder(how, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="swarm.peer"):
        fetched, vector, seconds, served = fetch_with_a_lying_first_holder(how, tmp_path)

    assert torch.equal(fetched, vector)
    assert served > 0  # from the honest holder
    if how == "corrupting":
        # The host refuses the liar's piece hash (for one piece, the digest) before any byte, names it
        # and takes the model from the other connected holder within the same try.
        (blame,) = [r for r in caplog.records if r.name == "p2p.host" and "dropped from this fetch" in r.getMessage()]
        assert blame.levelno == logging.WARNING and "whose hash is not the digest" in blame.getMessage()
    else:
        (blame,) = [r for r in caplog.records if "asking the others first" in r.getMessage()]
        assert blame.levelno == logging.WARNING and "holder" in blame.getMessage()
        assert "served nothing" in blame.getMessage()
        assert blame.getMessage().startswith("round 1: the finalized model ")
    assert seconds < 3 * FETCH_TIMEOUT  # the deadline: the fetch did not run into it
