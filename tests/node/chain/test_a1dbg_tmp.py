"""The reads the round loop, the agreement step, the catch-up and `swarm verify` make of a ledger
(node/peer/ports.py `LedgerPort`), served by `PipelinedClient` from the events of a real Anvil
(docs/LEDGER.md "Porting the peers", step 2): a scripted history read through every one of them
and checked against what was sent, and `ChainWatcher` waiting on a pipelined round's close and end
(and nudging the close and the abort) as it does on SwarmLedger's, polling or fed by a subscription."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import trio
from eth_account import Account

from node.chain.client import LedgerClient, connect
from node.chain.pipelined import PipelinedClient
from node.chain.records import RoundState
from node.chain.registration import registration_message, resolve
from node.chain.subscription import ChainFeed, ws_url_for
from node.chain.votes import majority, votes_on
from node.peer.watch import ChainWatcher
from node.protocol.wire import encode_bitmap
from tests.e2e.testnet_box import ProxyFaults, rpc_proxy
from tests.node.chain.test_pipelined_ledger import WINDOW_BLOCKS, WINDOW_SECONDS, Ledger


import time as _t
T0=_t.time()
def P(*a): print(f"{_t.time()-T0:7.3f}", *a, flush=True)
EVERYONE=None
def test_a_subscription_pushes_the_pipelined_clients_head_and_wakes_the_watcher(automine_chain, kit):
    """With a ChainFeed on Anvil's WebSocket, the client takes the pushed head (`pushed_head`,
    `take_head`) instead of asking for it, and `ChainWatcher.closed` returns on the pushed logs of
    the commit that closes the round."""
    led = Ledger(automine_chain, kit, 2)
    reader = PipelinedClient(connect(automine_chain.url), led.reader.address, from_block=led.members[0].from_block)
    feed = ChainFeed(ws_url_for(automine_chain.url, "auto"), reader.address, lambda h: reader.take_head(h))
    reader.pushed_head = feed.live_head
    watcher = ChainWatcher(reader, _off_loop, poll_interval=0.05, chain_timeout=30)
    watcher.follow(feed, confirmations=0)
    for name in ("_pushed_head", "_pushed_log", "_moved", "_feed_live", "_read_chain"):
        orig = getattr(watcher, name)
        def wrap(*a, _o=orig, _n=name, **k):
            P("watcher", _n, a, "block", watcher.block, "moves", watcher.moves, "moved_at", watcher._moved_at, "pending", watcher._pending)
            return _o(*a, **k)
        setattr(watcher, name, wrap)
    orig_ri = reader._round_info_at
    def ri(r, at):
        v = orig_ri(r, at); P("round_info", r, "at", at, v[0].state, v[0].participant_count, v[1]); return v
    reader._round_info_at = ri
    orig_th = reader.take_head
    def th(h):
        v = orig_th(h); P("take_head", h, "->", v); return v
    reader.take_head = th

    async def play() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed.run)
            nursery.start_soon(watcher.run)
            with trio.fail_after(30):
                while not feed.live:
                    await trio.sleep(0.02)
            await trio.to_thread.run_sync(led.commit, 0, 1)
            nursery.start_soon(trio.to_thread.run_sync, led.commit, 1, 1)
            info = await watcher.closed(1)
            assert (info.state, info.participant_count) == (RoundState.CLOSED, 2)
            with trio.fail_after(30):  # the last block's head is pushed to the feed in its own time
                while feed.head != automine_chain.block_number():
                    await trio.sleep(0.02)
            asked = reader.rpc_requests()
            assert reader.head() == feed.head
            assert reader.rpc_requests() == asked, "the head came pushed"
            nursery.cancel_scope.cancel()

    trio.run(play)


async def _off_loop(fn, *args, **kwargs):
    """The peer's `chain` (node/peer/peer.py): a blocking ledger call off the trio loop."""
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs))
