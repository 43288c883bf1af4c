"""Block stuffing cannot shorten a round's windows (contracts/SwarmLedger.sol, on a real Anvil).

On automine Anvil every transaction mines a block, a failed one too, and block timestamps follow
the wall clock (the blocks of one second share it): an outsider's 300 reverted `register` calls
pass any window counted in blocks alone within a few seconds. A window ends only once its
seconds (block timestamps) have passed as well, so the round keeps waiting for its honest peers.
"""

from __future__ import annotations

import pytest

from node.chain import errors
from node.chain.client import LedgerClient
from node.chain.records import RoundState
from node.protocol.wire import encode_bitmap

STUFFING = 300  # reverted transactions, each mined in a block of its own
WINDOW_BLOCKS = 20  # far fewer than STUFFING
WINDOW_SECONDS = 600  # far more than STUFFING transactions take on any machine: the honest peers act within it
OUTSIDER = 5  # a dev account that never registers


def _swarm(kit, chain, **params):
    windows = dict(
        commit_window=WINDOW_BLOCKS,
        attest_window=WINDOW_BLOCKS,
        commit_window_seconds=WINDOW_SECONDS,
        attest_window_seconds=WINDOW_SECONDS,
    )
    return kit.Swarm(chain, OUTSIDER + 1, **(windows | params))


def _stuff(swarm) -> None:
    """The outsider's attack: STUFFING `register` calls with an empty peer id (InvalidPeerId), signed
    and sent raw with a fixed gas limit, so no estimate refuses them before they are mined."""
    w3, outsider = swarm.w3, swarm.accounts[OUTSIDER]
    data = swarm.reader.contract.encode_abi("register", [b"", b""])
    nonce = w3.eth.get_transaction_count(outsider.address, "pending")
    gas_price, chain_id = 2 * w3.eth.gas_price, w3.eth.chain_id
    first = swarm.anvil.block_number() + 1
    sent = []
    for i in range(STUFFING):
        tx = {"to": swarm.address, "data": data, "gas": 100_000, "gasPrice": gas_price, "nonce": nonce + i}
        sent.append(w3.eth.send_raw_transaction(outsider.sign_transaction(tx | {"chainId": chain_id}).raw_transaction))
    receipts = [w3.eth.wait_for_transaction_receipt(h, timeout=60) for h in sent]
    assert [r["status"] for r in receipts] == [0] * STUFFING  # every one reverted
    blocks = sorted({r["blockNumber"] for r in receipts})
    # Anvil mines each as it arrives; a loaded machine may find two waiting and mine them together
    assert len(blocks) > 2 * WINDOW_BLOCKS and blocks[0] >= first, (len(blocks), blocks[:3], blocks[-3:], first)


def _head_time(swarm) -> int:
    return int(swarm.w3.eth.get_block("latest")["timestamp"])


def test_stuffed_blocks_do_not_close_the_commit_window_on_an_honest_peer(automine_chain, kit):
    swarm = _swarm(kit, automine_chain, min_peers=2)
    swarm.register(4)  # peers 0..2 commit; peer 3 is registered and stays silent (no early close)
    a, b, late, _silent = swarm.peers[:4]
    outsider = LedgerClient(swarm.w3, swarm.address, swarm.accounts[OUTSIDER], tx_timeout=30)
    a.commit(1, kit.digest("a"), 10, 1, kit.MECHANISM)
    b.commit(1, kit.digest("b"), 10, 1, kit.MECHANISM)  # the quorum: a window over would now let anyone close
    opened = swarm.reader.round_info(1)

    _stuff(swarm)

    assert swarm.anvil.block_number() > opened.opened_block + WINDOW_BLOCKS  # the window's blocks are over
    assert _head_time(swarm) < opened.opened_at + WINDOW_SECONDS  # its seconds are not
    with pytest.raises(errors.CommitWindowOpen) as refused:
        outsider.close_round(1)
    assert refused.value.fields == {
        "round": 1,
        "lastBlock": opened.opened_block + WINDOW_BLOCKS,
        "endsAt": opened.opened_at + WINDOW_SECONDS,
    }
    late.commit(1, kit.digest("late"), 10, 1, kit.MECHANISM)  # inside the window's seconds: accepted

    swarm.pass_commit_window(1)  # both its blocks and its seconds: now it closes
    outsider.close_round(1)
    closed = swarm.reader.round_info(1)
    assert closed.state is RoundState.CLOSED
    assert closed.closed_at >= opened.opened_at + WINDOW_SECONDS
    assert swarm.reader.participants(1) == [p.account.address for p in (a, b, late)]  # every honest committer


def test_stuffed_blocks_do_not_cut_the_attestation_window_short(automine_chain, kit):
    swarm = _swarm(kit, automine_chain, min_peers=3)
    swarm.register(3)
    swarm.commit_all(1, 3)
    a, b, c = swarm.peers[:3]
    a.close_round(1)  # every registered peer committed: no window to wait for
    everyone = encode_bitmap([True] * 3)
    aggregate = kit.digest("aggregate")
    a.attest(1, aggregate, everyone)  # one of three: no majority yet, the others still aggregate
    closed = swarm.reader.round_info(1)
    outsider = LedgerClient(swarm.w3, swarm.address, swarm.accounts[OUTSIDER], tx_timeout=30)

    _stuff(swarm)

    assert swarm.anvil.block_number() > closed.closed_block + WINDOW_BLOCKS
    assert _head_time(swarm) < closed.closed_at + WINDOW_SECONDS
    with pytest.raises(errors.AbortTooEarly) as refused:
        outsider.abort_round(1)
    assert refused.value.fields == {
        "round": 1,
        "lastBlock": closed.closed_block + WINDOW_BLOCKS,
        "endsAt": closed.closed_at + WINDOW_SECONDS,
    }
    b.attest(1, aggregate, everyone)  # the honest majority, late by blocks, inside the window's seconds
    final = swarm.reader.round_info(1)
    assert (final.state, final.finalized_digest) == (RoundState.FINALIZED, aggregate)
    assert [x.peer for x in swarm.reader.attestations(1)] == [a.account.address, b.account.address]
    with pytest.raises(errors.RoundAlreadyFinalized):
        c.abort_round(1)
