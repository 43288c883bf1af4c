"""What one transaction asks of an HTTP endpoint (issue 27: at most 10 requests per member per
round), counted by method through the proxy of tests/e2e/testnet_box.py on a real Anvil: with a
subscription pushing the head and its base fee, a steady-state send costs the estimate, the send
and one receipt read per head that passes (one, when it is mined in the next block); its fees are
built from the pushed base fee (max fee: twice the base fee plus the tip), the tip read once per
TIP_KEPT_SENDS transactions, the chain id once (as `connect` has web3 do). Without a pushed base
fee the latest block's is read; a chain without base fees gets legacy transactions."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3
from web3.types import TxReceipt

from node.chain import sender as sender_module
from node.chain.anvil import Anvil, start_anvil
from node.chain.client import connect, constructor_settings
from node.chain.decoder import RevertDecoder
from node.chain.pipelined import load_pipelined_artifact
from node.chain.registration import sign_registration
from node.chain.sender import FEE_BUMP, ContractCall, TransactionSender
from tests.e2e.testnet_box import ChainChaos, ProxyFaults, RpcProxy, rpc_proxy
from tests.node.chain.test_testnet_faults import in_background

ACCOUNT = 6  # a dev account of the shared chains (its nonce is read from the chain: others may use it too)
STEADY = {"eth_estimateGas", "eth_sendRawTransaction", "eth_getTransactionReceipt"}


class PushedHead:
    """What a subscription hands the sender: the head and the base fee of the last head pushed,
    read here straight from Anvil (a subscription's pushes are no HTTP requests of the endpoint)."""

    def __init__(self, anvil: Anvil) -> None:
        self.anvil = anvil
        self.last_base_fee: int | None = None  # None: no head pushed (no subscription running)

    def head(self) -> int:
        return self.anvil.block_number()

    def base_fee(self) -> int | None:
        return self.last_base_fee

    def push(self) -> int:
        """A new head is pushed: its base fee is the latest block's."""
        block = self.anvil.rpc("eth_getBlockByNumber", ["latest", False])
        self.last_base_fee = int(block["baseFeePerGas"], 16)
        return self.last_base_fee


class Member:
    """One account's sender on a web3 as a peer connects it (`connect`: the chain id cached, as
    web3 would ask it before every estimate) through a counting proxy, the head and base fee
    pushed, and the contract calls it makes."""

    def __init__(self, anvil: Anvil, proxy: RpcProxy, kit: Any) -> None:
        self.anvil, self.proxy, self.kit = anvil, proxy, kit
        self.w3 = connect(proxy.url)
        self.account = Account.from_key(anvil.private_keys[ACCOUNT])
        self.artifact = load_pipelined_artifact()
        self.pushed = PushedHead(anvil)
        self.tx = TransactionSender(
            self.w3,
            self.account,
            RevertDecoder(self.artifact["abi"]),
            30,
            head=self.pushed.head,
            base_fee=self.pushed.base_fee,
        )

    def deployment(self) -> ContractCall:
        settings = constructor_settings(
            min_peers=1,
            commit_window=30,
            attest_window=30,
            commit_window_seconds=60,
            attest_window_seconds=60,
            eps_cap_micro=10_000_000,
            delta=1e-5,
            genesis_digest=self.kit.GENESIS,
            eps_step_micro=0,
            record_eps_cap_micro=0,
            record_delta=0.0,
            max_samples=0,
        )
        factory = self.w3.eth.contract(abi=self.artifact["abi"], bytecode=self.artifact["bytecode"])
        return factory.constructor(settings, self.kit.GENESIS, [])

    def round_calls(self, address: str | None) -> list[tuple[str, ContractCall]]:
        """A member's transactions on a fresh ledger: its registration, then its round-1 commit."""
        assert address is not None  # the deployment's receipt names its contract
        ledger = self.w3.eth.contract(address=Web3.to_checksum_address(address), abi=self.artifact["abi"])
        key = self.kit.identity(ACCOUNT)
        chain_id = int(self.anvil.rpc("eth_chainId"), 16)
        signature = sign_registration(key, chain_id, address, self.account.address)
        commit = (1, self.kit.digest("steady"), 100, 1, 0, self.kit.MECHANISM, bytes(32), b"")
        return [
            ("register", ledger.functions.register(self.kit.peer_id_of_key(key), signature)),
            ("commit", ledger.functions.commit(*commit)),
        ]

    def counted_send(self, fn: ContractCall, label: str) -> tuple[TxReceipt, dict[str, int], int]:
        """Send `fn`: its receipt, the requests it made by method, and the heads that passed meanwhile."""
        before, head_before = dict(self.proxy.stats.by_method), self.anvil.block_number()
        receipt = self.tx.send(fn, label)
        heads_passed = self.anvil.block_number() - head_before
        after = self.proxy.stats.by_method
        asked = {method: n - before.get(method, 0) for method, n in after.items() if n != before.get(method, 0)}
        return receipt, asked, heads_passed

    def fees_of(self, receipt: TxReceipt) -> tuple[int, int]:
        mined = self.anvil.rpc("eth_getTransactionByHash", [receipt["transactionHash"].to_0x_hex()])
        return int(mined["maxFeePerGas"], 16), int(mined["maxPriorityFeePerGas"], 16)


@pytest.fixture()
def member_on(kit: Any) -> Iterator[Callable[[Anvil], Member]]:
    """member_on(anvil): a Member on `anvil`, its proxy closed after the test."""
    with contextlib.ExitStack() as stack:

        def make(anvil: Anvil) -> Member:
            return Member(anvil, stack.enter_context(rpc_proxy(anvil.url, ProxyFaults(latency_s=0, jitter_s=0))), kit)

        yield make


def test_a_steady_state_send_costs_the_estimate_the_send_and_one_receipt_read_per_head(
    member_on: Callable[[Anvil], Member], chain: Anvil, request: pytest.FixtureRequest
) -> None:
    """On both chains: automine (mined in the next block at once: at most 3 requests) and a block
    a second (the receipt read once per head that passed, which is one in the common case)."""
    member = member_on(chain)
    member.pushed.push()
    first, asked, _ = member.counted_send(member.deployment(), "deploy")
    assert asked["eth_maxPriorityFeePerGas"] == 1  # read once, kept
    tip = int(chain.rpc("eth_maxPriorityFeePerGas"), 16)
    for label, fn in [("deploy", member.deployment()), *member.round_calls(first["contractAddress"])]:
        base_fee = member.pushed.push()
        receipt, asked, heads_passed = member.counted_send(fn, label)
        assert receipt["status"] == 1
        assert set(asked) <= STEADY, asked  # no block, tip, chain id or nonce read
        assert asked["eth_estimateGas"] == 1 and asked["eth_sendRawTransaction"] == 1, asked
        assert 1 <= asked["eth_getTransactionReceipt"] <= heads_passed, (asked, heads_passed)
        if request.node.callspec.params["chain"] == "automine":  # mined in the next block, at once: the target
            assert heads_passed == 1 and sum(asked.values()) <= 3, asked
        assert member.fees_of(receipt) == (2 * base_fee + tip, tip)


def test_the_tip_is_read_again_after_tip_kept_sends(
    member_on: Callable[[Anvil], Member], automine_chain: Anvil, monkeypatch: pytest.MonkeyPatch
) -> None:
    member = member_on(automine_chain)
    monkeypatch.setattr(sender_module, "TIP_KEPT_SENDS", 2)
    member.pushed.push()
    tips = []
    for _ in range(5):
        _, asked, _ = member.counted_send(member.deployment(), "deploy")
        tips.append(asked.get("eth_maxPriorityFeePerGas", 0))
    assert tips == [1, 0, 1, 0, 1]


def test_without_a_pushed_base_fee_the_latest_block_gives_it(
    member_on: Callable[[Anvil], Member], automine_chain: Anvil
) -> None:
    """No subscription running (the base fee None): the latest block is read for its base fee (as
    web3 would), the tip still kept, the receipt read at once (a polled head: a local chain mines
    during the send) and again, without a head read, until it is there (Anvil's automine mines in
    a task of its own: on a loaded machine the first read can come before the block)."""
    member = member_on(automine_chain)
    _, asked, _ = member.counted_send(member.deployment(), "deploy")
    assert asked["eth_getBlockByNumber"] == 1 and asked["eth_maxPriorityFeePerGas"] == 1, asked
    base_fee = int(automine_chain.rpc("eth_getBlockByNumber", ["latest", False])["baseFeePerGas"], 16)
    receipt, asked, _ = member.counted_send(member.deployment(), "deploy")
    assert set(asked) == STEADY | {"eth_getBlockByNumber"}, asked
    assert asked["eth_getBlockByNumber"] == 1 and asked["eth_getTransactionReceipt"] >= 1, asked
    tip = int(automine_chain.rpc("eth_maxPriorityFeePerGas"), 16)
    assert member.fees_of(receipt) == (2 * base_fee + tip, tip)


def test_a_chain_without_a_base_fee_gets_a_legacy_gas_price() -> None:
    """Before London (Anvil --hardfork berlin) blocks carry no base fee: web3 would fail looking for
    one; the sender sends legacy transactions at the node's gas price (this ledger's contract needs
    a later EVM, so the contract sent is an empty one)."""
    with start_anvil(accounts=1, hardfork="berlin") as berlin:
        w3 = connect(berlin.url, check_evm=False)
        account = Account.from_key(berlin.private_keys[0])
        tx = TransactionSender(w3, account, RevertDecoder([]), 30, base_fee=lambda: None)
        empty = w3.eth.contract(abi=[], bytecode="0x60006000f3")  # returns no code
        for _ in range(2):  # the second with the chain known to be legacy
            receipt = tx.send(empty.constructor(), "deploy")
            mined = berlin.rpc("eth_getTransactionByHash", [receipt["transactionHash"].to_0x_hex()])
            assert receipt["status"] == 1 and int(mined["type"], 16) == 0 and "maxFeePerGas" not in mined
            assert int(mined["gasPrice"], 16) == int(berlin.rpc("eth_gasPrice"), 16)


def _sent_in_background(anvil: Anvil, send: Callable[[], TxReceipt]) -> tuple[threading.Thread, dict[str, Any], dict]:
    """`send` run in a thread once automine is off: (thread, its outcome, its transaction in the pool)."""
    thread, out = in_background(send)
    deadline = time.monotonic() + 20
    while not (pool := anvil.rpc("eth_getBlockByNumber", ["pending", True])["transactions"]):
        assert time.monotonic() < deadline and thread.is_alive(), f"nothing in the pool: {out}"
        time.sleep(0.05)
    return thread, out, pool[0]


def _mine_until_done(anvil: Anvil, thread: threading.Thread) -> None:
    """A block every 0.3 s until the sender is done: it waits on pushed heads."""
    deadline = time.monotonic() + 30
    while thread.is_alive():
        assert time.monotonic() < deadline, "the transaction was never mined"
        anvil.rpc("evm_mine", [])
        thread.join(0.3)


@pytest.fixture()
def manual_chain() -> Iterator[Anvil]:
    """Anvil mining only when told (evm_mine): what gets mined, and when, is the test's choice."""
    with start_anvil(accounts=1) as anvil:
        anvil.rpc("evm_setAutomine", [False])
        yield anvil


def _pushed_sender(anvil: Anvil, confirmations: int = 0) -> tuple[TransactionSender, ContractCall]:
    w3 = connect(anvil.url)
    pushed = PushedHead(anvil)
    pushed.push()
    account = Account.from_key(anvil.private_keys[0])
    tx = TransactionSender(
        w3, account, RevertDecoder([]), 60, confirmations=confirmations, head=pushed.head, base_fee=pushed.base_fee
    )
    return tx, w3.eth.contract(abi=[], bytecode="0x60006000f3").constructor()  # a contract with no code


def test_with_pushed_heads_a_dropped_transaction_is_sent_again_with_higher_fees(manual_chain: Anvil) -> None:
    tx, empty = _pushed_sender(manual_chain)
    thread, out, first = _sent_in_background(manual_chain, lambda: tx.send(empty, "deploy"))
    manual_chain.rpc("anvil_dropTransaction", [first["hash"]])  # a node forgot it
    _mine_until_done(manual_chain, thread)
    assert "error" not in out, out
    mined = manual_chain.rpc("eth_getTransactionByHash", [out["value"]["transactionHash"].to_0x_hex()])
    assert mined["hash"] != first["hash"] and mined["nonce"] == first["nonce"] and tx.replacements >= 1
    assert int(mined["maxFeePerGas"], 16) * FEE_BUMP[1] >= int(first["maxFeePerGas"], 16) * FEE_BUMP[0]


def test_with_pushed_heads_a_transaction_a_reorganisation_took_out_is_sent_again(manual_chain: Anvil) -> None:
    tx, empty = _pushed_sender(manual_chain, confirmations=2)
    thread, out, _ = _sent_in_background(manual_chain, lambda: tx.send(empty, "deploy"))
    for _ in range(2):  # mined, one block on top: seen short of its depth
        manual_chain.rpc("evm_mine", [])
        thread.join(0.3)
    assert thread.is_alive()
    assert ChainChaos(manual_chain.url).reorg(2, reinclude=0.0) == (0, 1)  # both blocks replaced, it dropped
    _mine_until_done(manual_chain, thread)
    assert "error" not in out, out
    assert tx.rebroadcasts + tx.replacements >= 1
    assert out["value"]["blockNumber"] + 2 <= manual_chain.block_number()
