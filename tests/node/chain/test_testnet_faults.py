"""What a public chain does that a local one does not, on a real Anvil: transactions dropped from
the pool or priced out by a base fee spike (re-sent with higher fees, same nonce), reorganisations
(a receipt counts only `confirmations` deep, and one taken out is sent again), reads that lag the
head by `confirmations`, and an endpoint that refuses bursts with HTTP 429 (the proxy of
tests/e2e/testnet_box.py: waited out after its Retry-After, never an outage)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from eth_account import Account

from node.chain import retries
from node.chain.anvil import start_anvil
from node.chain.client import LedgerClient, connect
from node.chain.errors import LedgerError
from node.chain.retries import parse_retry_after
from node.chain.sender import FEE_BUMP
from tests.e2e.testnet_box import ChainChaos, ProxyFaults, rpc_proxy


@pytest.fixture()
def manual_chain():
    """Anvil mining only when told (evm_mine), once the ledger is deployed: what sits in the
    pool and what gets mined is the test's choice."""
    with start_anvil(accounts=4) as anvil:
        yield anvil


def deploy(anvil, kit, *, confirmations: int = 0) -> tuple[LedgerClient, LedgerClient]:
    """A ledger, and a client of the second account on it (registered), before mining goes manual."""
    w3 = connect(anvil.url)
    accounts = [Account.from_key(k) for k in anvil.private_keys[:2]]
    address = LedgerClient.deploy(
        w3,
        accounts[0],
        min_peers=1,
        commit_window=50,
        attest_window=50,
        commit_window_seconds=600,
        attest_window_seconds=600,
        eps_cap_micro=5_000_000,
        delta=1e-5,
        genesis_digest=kit.GENESIS,
    ).address
    kit.register_signed(LedgerClient(w3, address, accounts[1]), kit.identity(1))  # mined at once, no block on top
    anvil.rpc("evm_setAutomine", [False])
    peer = LedgerClient(w3, address, accounts[1], tx_timeout=60, confirmations=confirmations)
    return peer, LedgerClient(w3, address)


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # the test asserts on it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def pending_count(anvil, address: str) -> int:
    return int(anvil.rpc("eth_getTransactionCount", [address, "pending"]), 16)


def commit_pending(anvil, peer: LedgerClient, kit, label: str) -> tuple[threading.Thread, dict[str, Any], int, dict]:
    """The peer's commit sent from a thread: (thread, its outcome, the nonce, the pending transaction)."""
    me = peer.account.address
    nonce = int(anvil.rpc("eth_getTransactionCount", [me, "latest"]), 16)
    thread, out = in_background(lambda: peer.commit(1, kit.digest(label), 100, 1_000_000, kit.MECHANISM))
    until(lambda: pending_count(anvil, me) == nonce + 1, 20, "commit in the pool")
    return thread, out, nonce, anvil.rpc("eth_getBlockByNumber", ["pending", True])["transactions"][0]


def mine_until_done(anvil, thread: threading.Thread, timeout: float = 30.0) -> None:
    """One block every 0.3 s until the sender's thread is done (it waits on blocks)."""
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        assert time.monotonic() < deadline, "the transaction was never mined"
        anvil.rpc("evm_mine", [])
        thread.join(0.3)


def test_a_dropped_transaction_is_sent_again_with_higher_fees_and_its_nonce(manual_chain, kit):
    peer, reader = deploy(manual_chain, kit)
    me = peer.account.address
    thread, out, nonce, first = commit_pending(manual_chain, peer, kit, "dropped")
    manual_chain.rpc("anvil_dropTransaction", [first["hash"]])  # a node forgot it
    mine_until_done(manual_chain, thread)
    assert "error" not in out, out
    receipt = out["value"]
    mined = manual_chain.rpc("eth_getTransactionByHash", [receipt["transactionHash"].to_0x_hex()])
    assert receipt["transactionHash"].to_0x_hex() != first["hash"]  # a new version was mined
    assert int(mined["nonce"], 16) == nonce  # with the same nonce
    for fee in ("maxFeePerGas", "maxPriorityFeePerGas"):  # and both fees raised by 12.5% at least
        assert int(mined[fee], 16) * FEE_BUMP[1] >= int(first[fee], 16) * FEE_BUMP[0], fee
    assert peer._tx is not None and peer._tx.replacements >= 1
    assert [c.peer for c in reader.commitments(1)] == [me]
    # the nonce is still right: the next transaction goes through at once
    thread, out = in_background(lambda: peer.close_round(1))
    mine_until_done(manual_chain, thread)
    assert "error" not in out, out


def test_a_transaction_priced_out_by_a_base_fee_spike_is_bumped_past_it(manual_chain, kit):
    peer, reader = deploy(manual_chain, kit)
    me = peer.account.address
    thread, out, nonce, first = commit_pending(manual_chain, peer, kit, "priced out")
    ChainChaos(manual_chain.url).spike()  # tenfold: past its max fee (twice the base fee plus the tip)
    manual_chain.rpc("evm_mine", [])
    spiked = int(manual_chain.rpc("eth_getBlockByNumber", ["latest", False])["baseFeePerGas"], 16)
    assert spiked > int(first["maxFeePerGas"], 16)
    assert not manual_chain.rpc("eth_getTransactionReceipt", [first["hash"]])
    mine_until_done(manual_chain, thread)
    assert "error" not in out, out
    receipt = out["value"]
    mined = manual_chain.rpc("eth_getTransactionByHash", [receipt["transactionHash"].to_0x_hex()])
    assert int(mined["nonce"], 16) == nonce and int(mined["maxFeePerGas"], 16) > int(first["maxFeePerGas"], 16)
    assert [c.peer for c in reader.commitments(1)] == [me]


def test_a_transaction_sent_into_a_base_fee_spike_is_priced_past_it(manual_chain, kit):
    """The base fee jumps between the fee quote and the send: the node refuses the transaction
    ("max fee per gas less than block base fee"), and the sender reprices it at once."""
    peer, reader = deploy(manual_chain, kit)
    with rpc_proxy(manual_chain.url, ProxyFaults(latency_s=0.0, jitter_s=0.0)) as proxy:
        client = LedgerClient(connect(proxy.url), peer.address, peer.account, tx_timeout=60)
        proxy.before_next("eth_sendRawTransaction", lambda: ChainChaos(manual_chain.url).spike(factor=50))
        thread, out = in_background(lambda: client.commit(1, kit.digest("spike"), 100, 1_000_000, kit.MECHANISM))
        mine_until_done(manual_chain, thread)
        assert "error" not in out, out
        assert client._tx is not None and client._tx.replacements >= 1  # refused once, repriced
        assert proxy.stats.by_method["eth_sendRawTransaction"] >= 2
    block = manual_chain.rpc("eth_getBlockByNumber", [hex(out["value"]["blockNumber"]), False])
    assert out["value"]["effectiveGasPrice"] >= int(block["baseFeePerGas"], 16)
    assert [c.peer for c in reader.commitments(1)] == [peer.account.address]


def test_logs_that_lag_their_block_are_read_again_until_complete(automine_chain, kit):
    """An endpoint that serves a block's logs 0.5 s after the block: the commitments read at
    once after a commit still come out complete (read again while storage shows more)."""
    swarm = kit.Swarm(automine_chain, 2, min_peers=1)
    swarm.register(2)
    with rpc_proxy(automine_chain.url, ProxyFaults(latency_s=0.0, jitter_s=0.0, log_lag_s=0.5)) as proxy:
        reader = LedgerClient(connect(proxy.url), swarm.address)
        reader.commitments(1)  # the proxy has seen the chain up to here
        swarm.commit_all(1, 2)
        assert [c.peer for c in reader.commitments(1)] == [a.address for a in swarm.accounts[:2]]
        assert proxy.stats.logs_held_back > 0  # the lag was real


def test_reads_lag_the_head_by_the_confirmations(manual_chain, kit):
    peer, reader = deploy(manual_chain, kit, confirmations=2)
    head_client = reader  # confirmations 0: the head
    thread, out = in_background(lambda: peer.commit(1, kit.digest("deep"), 100, 1_000_000, kit.MECHANISM))
    until(lambda: pending_count(manual_chain, peer.account.address) == 2, 20, "commit in the pool")  # after register
    manual_chain.rpc("evm_mine", [])
    until(lambda: head_client.round_info(1).participant_count == 1, 10, "the commit at the head")
    assert peer.round_info(1).participant_count == 0  # 0 blocks on top: not yet for this client
    assert thread.is_alive()  # nor is its receipt counted yet
    manual_chain.rpc("evm_mine", [])
    assert peer.round_info(1).participant_count == 0  # 1 block on top
    manual_chain.rpc("evm_mine", [])
    assert peer.round_info(1).participant_count == 1  # 2 blocks on top
    assert peer.block_number() == peer.head() - 2
    thread.join(10)
    assert "error" not in out and out["value"]["blockNumber"] + 2 <= peer.head()


def test_a_commit_a_reorganisation_took_out_is_sent_again(manual_chain, kit):
    peer, reader = deploy(manual_chain, kit, confirmations=2)
    me = peer.account.address
    thread, out = in_background(lambda: peer.commit(1, kit.digest("reorged"), 100, 1_000_000, kit.MECHANISM))
    until(lambda: pending_count(manual_chain, me) == 2, 20, "commit in the pool")  # after its registration
    manual_chain.rpc("evm_mine", [])
    manual_chain.rpc("evm_mine", [])
    assert reader.round_info(1).participant_count == 1  # at the head, one block on top
    kept, dropped = ChainChaos(manual_chain.url).reorg(2, reinclude=0.0)  # both blocks replaced, the commit dropped
    assert (kept, dropped) == (0, 1)
    assert reader.round_info(1).participant_count == 0
    mine_until_done(manual_chain, thread)
    assert "error" not in out, out
    assert peer._tx is not None and peer._tx.rebroadcasts + peer._tx.replacements >= 1
    assert [c.peer for c in reader.commitments(1)] == [me]  # nothing lost
    assert out["value"]["blockNumber"] + 2 <= reader.head()


def test_http_429_is_waited_out_after_its_retry_after_and_is_no_outage(automine_chain, kit, monkeypatch):
    faults = ProxyFaults(latency_s=0.0, jitter_s=0.0, retry_after="0.2")
    with rpc_proxy(automine_chain.url, faults) as proxy:
        w3 = connect(proxy.url)
        swarm = kit.Swarm(automine_chain, 2)
        reader = LedgerClient(w3, swarm.address)
        refusals = retries.RETRIES + 3  # more than an outage gets: 429s are not counted as one
        for read in (reader.block_number, reader.current_round):  # the raw reader, and web3
            proxy.refuse_next(refusals)
            before, started = proxy.stats.refused, time.monotonic()
            read()
            assert proxy.stats.refused - before == refusals
            assert time.monotonic() - started >= refusals * 0.2  # each Retry-After was waited out
        assert reader.rpc_requests() >= 2 * (refusals + 1)
        # a budget bounds it: an endpoint that refuses for ever is an outage in the end
        monkeypatch.setattr(retries, "RATE_LIMIT_BUDGET_S", 0.5)
        proxy.refuse_next(100)
        with pytest.raises(retries.LedgerUnavailable):
            reader.current_round()


def test_retry_after_is_read_as_seconds_or_a_date_and_bounded():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(None) == retries.RATE_LIMIT_DEFAULT_S
    assert parse_retry_after("soon") == retries.RATE_LIMIT_DEFAULT_S
    assert parse_retry_after("100000") == retries.RATE_LIMIT_WAIT_MAX_S
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    # an answer of 0, or a date already past, still pauses: the budget, not the endpoint, ends the retries
    assert parse_retry_after("0") == retries.RATE_LIMIT_WAIT_MIN_S > 0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412500.0) == retries.RATE_LIMIT_WAIT_MIN_S


def test_a_nonce_taken_by_another_pending_transaction_is_never_replaced(manual_chain, kit):
    """Another process sent a transaction with the nonce this client counts next: the node refuses
    ours as an underpriced replacement. That is a clash to report, not a fee to bump: bumping would
    replace the other transaction with ours."""
    peer, _ = deploy(manual_chain, kit)
    me = peer.account
    thread, out, nonce, _ = commit_pending(manual_chain, peer, kit, "first")
    mine_until_done(manual_chain, thread)
    assert "error" not in out, out
    w3 = peer.w3
    head = w3.eth.get_block("latest")
    other = me.sign_transaction(
        {
            "to": me.address,
            "value": 0,
            "gas": 21_000,
            "nonce": nonce + 1,  # the one the client counts next
            "maxFeePerGas": 20 * int(head["baseFeePerGas"]) + 10**11,
            "maxPriorityFeePerGas": 10**11,
            "chainId": w3.eth.chain_id,
        }
    )
    other_hash = manual_chain.rpc("eth_sendRawTransaction", ["0x" + bytes(other.raw_transaction).hex()])
    with pytest.raises(LedgerError, match="taken by a pending transaction"):
        peer.close_round(1)
    pending = manual_chain.rpc("eth_getBlockByNumber", ["pending", True])["transactions"]
    assert [t["hash"] for t in pending] == [other_hash]  # the other transaction stands, not replaced


def test_a_block_the_node_does_not_have_yet_is_read_again(automine_chain, kit, monkeypatch):
    """A read pinned to a block past the node's head (a reorganisation in progress, or a node
    behind a load balancer lagging the one that gave the head) is retried like an outage."""
    monkeypatch.setattr(retries, "BACKOFF_S", 0.01)
    swarm = kit.Swarm(automine_chain, 2)
    with pytest.raises(retries.LedgerUnavailable, match="attempts"):
        swarm.reader.round_info(1, block=swarm.reader.head() + 1000)
