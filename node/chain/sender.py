"""Signs and sends one account's transactions: estimate first (a revert there raises the
contract's custom error without spending gas), send with a margin on the estimate (Anvil
under-estimates deployments), track nonces locally, await the receipt with a timeout, and check
its status. A node that refuses a transaction for want of funds becomes `InsufficientFunds`, naming
the account, what it holds and what the transaction needed, so the user knows what to fund.

On a public chain a transaction may wait for ever: a node drops it from its pool, or the base fee
rises past its max fee. One that STUCK_AFTER_BLOCKS blocks pass without is signed again with the
same nonce and both EIP-1559 fees raised by at least 12.5% (FEE_BUMP, the least a node takes as a
replacement; the max fee also to twice the latest base fee plus the tip), at most MAX_BUMPS times;
whichever of its versions is mined is the receipt. With `confirmations` > 0 a receipt counts only
once that many blocks are built on its block and it is still there: a reorganisation that took it
out gets the transaction broadcast again (and bumped if it then waits), so a commit is not lost.

Requests per transaction, on an HTTP endpoint a member pays for by the request: the estimate, the
send and, in the common case (mined in the next block), one receipt read. The fees are built here
from the base fee of the head a subscription pushed (`base_fee`; without one, of the latest block,
read) and a priority fee read once per TIP_KEPT_S or TIP_KEPT_SENDS transactions, the chain id read
once; and while heads are pushed the receipt is read once per new head, not polled faster than
blocks come. A chain without EIP-1559 (no base fee in its blocks) gets the node's legacy gas price."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeAlias, cast

from eth_account.datastructures import SignedTransaction
from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3 import Web3
from web3.contract.contract import ContractConstructor, ContractFunction
from web3.exceptions import TimeExhausted, TransactionNotFound
from web3.types import Nonce, TxParams, TxReceipt, Wei

from node.chain.decoder import RevertDecoder
from node.chain.errors import LedgerError, LedgerTimeout, TransactionFailed
from node.chain.rawrpc import HeadRefused
from node.chain.retries import (
    BACKOFF_S,
    RATE_LIMIT_BUDGET_S,
    RETRIES,
    is_transient,
    rate_limit_pause,
    with_retries,
)

GAS_MARGIN = 1.25  # multiply estimates: Anvil's deployment estimate came out 2% short
GAS_PAD = 20_000  # plus a constant, for small transactions whose estimate is tight
# Gas assumed when a node refuses even to estimate for want of funds (and again at gas price 0):
# above what a deployment (about 2.8 M) and the costliest peer call (registration, about 140 k) use.
FALLBACK_GAS = {"deploy": 4_000_000, "call": 300_000}

# What `send` sends: a bound contract function call, or a deployment.
ContractCall: TypeAlias = ContractFunction | ContractConstructor

STUCK_AFTER_BLOCKS = 3  # blocks mined without our transaction before it is sent again with higher fees
FEE_BUMP = (9, 8)  # x 9/8 (+12.5%, rounded up): the least most nodes take to replace a pending transaction
MAX_BUMPS = 10  # x 3.2 in all, past what the max fee's 2 x base fee already covers
RECEIPT_POLL_FIRST_S = 0.02  # a polled head: ask again soon (a local chain mines at once), then every doubling pause
RECEIPT_POLL_MAX_S = 1.0
PUSHED_HEAD_PAUSE_S = 0.02  # between two looks at a pushed head (no request: it is in memory)
HEAD_CHECK_S = 1.0  # seconds between two reads of a polled head while a receipt is awaited
# The priority fee moves slowly and only sets how soon a transaction is mined (a stuck one is bumped):
# read again after this long or this many transactions, whichever comes first.
TIP_KEPT_S = 60.0
TIP_KEPT_SENDS = 32

WEI_PER_ETH = 10**18
TRANSFER_GAS = 21_000  # a plain ETH transfer to an account (not a contract)


class NonceClash(LedgerError):
    """A node refused a transaction's nonce as used or out of range: another process sends from
    the account, or (for a new version of a pending transaction) one version was mined already."""


class InsufficientFunds(LedgerError):
    """The account cannot pay for a transaction. `fields`: address, held_wei, needed_wei (what the
    transaction may cost: its gas limit times its fee per gas; when the node refused already at
    the estimate, the gas comes from an estimate at gas price 0 or FALLBACK_GAS; None only when
    the chain could not say)."""


def _eth(wei: int) -> str:
    return f"{wei / WEI_PER_ETH:.6g} ETH"


def _is_insufficient_funds(exc: BaseException) -> bool:
    # Anvil, Hardhat, Ganache and geth all say "insufficient funds" (in some capitalization).
    return "insufficient funds" in str(exc).lower()


class TransactionSender:
    """Signs and sends one account's transactions: nonce tracking, gas margin, receipt wait."""

    def __init__(
        self,
        w3: Web3,
        account: LocalAccount,
        errors: RevertDecoder,
        tx_timeout: float,
        *,
        confirmations: int = 0,
        head: Callable[[], int] | None = None,
        base_fee: Callable[[], int | None] | None = None,
    ) -> None:
        self.w3 = w3
        # The chain's head, as the caller reads it: LedgerClient passes its guarded head (monotonic,
        # bounded progress), so a lying endpoint cannot fake depth or a stuck transaction here either.
        self.head = head or self._endpoint_head
        # The base fee per gas of the last head a subscription pushed, None while none is pushed (the
        # head is then polled too): the fees are built from it without a request, and while it gives
        # one the head costs nothing to read, so the receipt wait looks at it often.
        self.base_fee = base_fee
        self.account = account
        self.errors = errors
        self.tx_timeout = tx_timeout
        self.confirmations = confirmations  # blocks on top of a receipt's block before it counts
        self.replacements = 0  # transactions signed again with higher fees (stuck or dropped)
        self.rebroadcasts = 0  # transactions sent again after a reorganisation took them out
        self._lock = threading.Lock()
        self._nonce: int | None = None
        self._chain_id: int | None = None  # read once: an endpoint does not change chains under us
        self._london = True  # its blocks carry a base fee (EIP-1559); False once one was read without
        self._tip: int | None = None  # the priority fee last read, when, and how many sends took it since
        self._tip_read_at = 0.0
        self._tip_sends = 0

    def _refusal(self, exc: Exception) -> LedgerError | None:
        return self.errors.from_exception(exc)

    def _estimate(self, fn: ContractCall, label: str) -> int:
        """Estimate on the "pending" block, whose block.number is the one the transaction will
        see (window checks are off by one on "latest"); nodes without it (eth-tester) get "latest"."""
        sender = self.account.address
        try:
            return with_retries(
                lambda: fn.estimate_gas({"from": sender}, block_identifier="pending"), what=f"estimate {label}"
            )
        except Exception as exc:
            if self._refusal(exc) or "not been implemented" not in str(exc):
                raise
        return with_retries(lambda: fn.estimate_gas({"from": sender}), what=f"estimate {label}")

    def send(self, fn: ContractCall, label: str) -> TxReceipt:
        """Estimate (raising the contract's refusal), send with margin, await, check status."""
        sender = self.account.address
        with self._lock:
            try:
                estimate = self._estimate(fn, label)
            except LedgerError:
                raise
            except Exception as exc:
                refusal = self._refusal(exc)
                if refusal:
                    raise refusal from None
                if _is_insufficient_funds(exc):
                    raise self._insufficient_funds(label, self._bound(fn, label)) from exc
                raise LedgerError(f"{label}: the node refused the call: {exc}") from exc
            if self._nonce is None:
                self._nonce = with_retries(lambda: self.w3.eth.get_transaction_count(sender, "pending"), what="nonce")
            nonce = Nonce(self._nonce)
            tx = self._build(fn, label, nonce, int(estimate * GAS_MARGIN) + GAS_PAD)
            sent_at = self._pushed_head()
            for bump in range(MAX_BUMPS + 1):
                # web3's TxParams is the transaction dict eth_account signs; their annotations disagree.
                signed = self.account.sign_transaction(tx)  # type: ignore[arg-type]
                try:
                    tx_hash = self._send_raw(signed, label, tx)
                    break
                except NonceClash:  # another process used this account: read the nonce again next time
                    self._nonce = None
                    raise
                except LedgerError as exc:  # the next block's base fee passed its max fee (a spike)
                    if _replaces_pending(exc):  # our fresh nonce is taken: never replace that transaction
                        self._nonce = None
                        raise LedgerError(
                            f"{label}: nonce {nonce} of {sender} is taken by a pending transaction "
                            "(is another process sending from this account?)"
                        ) from exc
                    if isinstance(exc, InsufficientFunds) or not _underpriced(exc) or bump == MAX_BUMPS:
                        raise
                    tx = self._repriced(tx)
                    self.replacements += 1
            self._nonce = nonce + 1
        try:
            receipt = self._wait(_Pending(tx, signed, [tx_hash]), label, sent_at)
        except LedgerTimeout:
            with self._lock:  # it may never be mined: the next send asks the chain for the nonce
                self._nonce = None
            raise
        if receipt["status"] != 1:
            raise self._explain_failure(fn, receipt, label)
        return receipt

    def _build(self, fn: ContractCall, label: str, nonce: Nonce, gas: int) -> TxParams:
        """The unsigned transaction, its fees built here (`_fees`)."""
        if self._chain_id is None:
            self._chain_id = int(with_retries(lambda: self.w3.eth.chain_id, what="chain id"))
        params: TxParams = {"from": self.account.address, "nonce": nonce, "gas": gas, "chainId": self._chain_id}
        params.update(self._fees())
        return with_retries(lambda: fn.build_transaction(params), what=f"build {label}")

    def _fees(self) -> TxParams:
        """EIP-1559 fees as web3 builds them (max fee: twice the base fee plus the tip), the tip
        kept: the base fee the pushed head's, else the latest block's (one request, as web3 reads
        it). A chain whose blocks have no base fee (before London) gets a legacy gas price, the
        node's: web3 would look for the base fee there and fail."""
        base_fee = self.base_fee() if self.base_fee is not None else None
        if base_fee is None and self._london:
            block = with_retries(partial(self.w3.eth.get_block, "latest"), what="base fee")
            base_fee = block.get("baseFeePerGas")
            self._london = base_fee is not None  # a legacy chain stays one: its blocks are not read again
        if base_fee is None:
            return {"gasPrice": Wei(int(with_retries(lambda: self.w3.eth.gas_price, what="gas price")))}
        tip = self._priority_fee()
        return {"maxPriorityFeePerGas": Wei(tip), "maxFeePerGas": Wei(2 * int(base_fee) + tip)}

    def _priority_fee(self) -> int:
        """The tip, read again once TIP_KEPT_S have passed or TIP_KEPT_SENDS transactions took it
        (web3's `max_priority_fee`: eth_maxPriorityFeePerGas, or the fee history on a chain without it)."""
        now = time.monotonic()
        if self._tip is None or now - self._tip_read_at >= TIP_KEPT_S or self._tip_sends >= TIP_KEPT_SENDS:
            self._tip = int(with_retries(lambda: self.w3.eth.max_priority_fee, what="priority fee"))
            self._tip_read_at, self._tip_sends = now, 0
        self._tip_sends += 1
        return self._tip

    def _pushed_head(self) -> int:
        """The head now if a subscription pushes it (no request), else -1 (unknown: the receipt
        wait then reads the receipt at once, as a local chain mines during the send)."""
        if self.base_fee is None or self.base_fee() is None:
            return -1
        try:
            return self.head()
        except Exception:  # the transaction goes out all the same; its receipt is read at once
            return -1

    def _bound(self, fn: ContractCall, label: str) -> int | None:
        """What the transaction may cost when the node refused its estimate for want of funds: the
        gas the transaction would be sent with (the estimate at gas price 0, which nodes make
        without a balance check, else a fixed bound per kind, FALLBACK_GAS) times the fee per gas
        it would be sent with. None only when the chain answers nothing."""
        sender = self.account.address
        try:
            gas = int(fn.estimate_gas({"from": sender, "gasPrice": Wei(0)}))
        except Exception:
            gas = FALLBACK_GAS["deploy" if label == "deploy" else "call"]
        try:
            tx = fn.build_transaction({"from": sender, "nonce": Nonce(0), "gas": int(gas * GAS_MARGIN) + GAS_PAD})
            return _max_cost(tx)
        except Exception:
            try:
                return (int(gas * GAS_MARGIN) + GAS_PAD) * int(self.w3.eth.gas_price)
            except Exception:
                return None

    def _send_raw(self, signed: SignedTransaction, label: str, tx: TxParams) -> HexBytes:
        attempt, limited = 0, 0.0  # outage retries used; seconds paused for 429s (not an outage)
        while True:
            try:
                return self.w3.eth.send_raw_transaction(signed.raw_transaction)
            except Exception as exc:
                if _is_insufficient_funds(exc):
                    raise self._insufficient_funds(label, _max_cost(tx)) from exc
                text = str(exc).lower()
                if "already known" in text:  # an earlier attempt reached the node
                    return signed.hash
                pause = rate_limit_pause(exc)
                if pause is not None and limited + pause <= RATE_LIMIT_BUDGET_S:  # a 429: nothing was sent
                    limited += pause
                    time.sleep(pause)
                    continue
                if "nonce too low" in text or "nonce too high" in text:
                    # The caller decides what it means (a clash for a new transaction, a version
                    # already mined for a replacement) and resyncs under its lock.
                    raise NonceClash(
                        f"{label}: nonce out of sync for {self.account.address} "
                        f"(is another process sending from this account?)"
                    ) from exc
                if not is_transient(exc) or attempt == RETRIES:
                    raise LedgerError(f"{label}: sending failed: {exc}") from exc
                time.sleep(BACKOFF_S * 2**attempt)
                attempt += 1

    def _insufficient_funds(self, label: str, needed_wei: int | None) -> InsufficientFunds:
        """The error naming the account, its balance and (when known) the transaction's cost."""
        address = self.account.address
        try:
            held: int | None = int(self.w3.eth.get_balance(address))
        except Exception:  # the refusal is the news; a failed balance read must not hide it
            held = None
        holds = "an unknown amount" if held is None else _eth(held)
        needs = f", {label} needs up to {_eth(needed_wei)}" if needed_wei is not None else ""
        error = InsufficientFunds(
            f"insufficient funds: account {address} holds {holds}{needs}: send ETH to {address} and retry",
            address=address,
            held_wei=held,
            needed_wei=needed_wei,
        )
        return error

    def _wait(self, pending: _Pending, label: str, sent_at: int) -> TxReceipt:
        """The receipt of one of `pending`'s versions, `confirmations` deep; re-sent with higher
        fees while STUCK_AFTER_BLOCKS blocks pass without it, broadcast again if a reorganisation
        took it out. LedgerTimeout after tx_timeout s.

        While a subscription pushes the head (`base_fee` gives one) the head costs no request: it is
        looked at every PUSHED_HEAD_PAUSE_S and the receipt read once per new head (at first once the
        head passes `sent_at`, the head at the send), not faster than blocks come: one read when the
        transaction is mined in the next block. A polled head costs a request as the receipt does:
        the receipt is polled then (at once first: a local chain mines during the send, then at
        doubling pauses) and the head read every HEAD_CHECK_S, to see the transaction stuck.

        With confirmations the head is read before the receipt: a receipt read after a head that
        is `confirmations` past its block was in the chain at that depth when read, so one receipt
        read per poll decides (no second read to see that it is still there)."""
        deadline = time.monotonic() + self.tx_timeout
        pause = RECEIPT_POLL_FIRST_S
        head = read_at = stuck_from = sent_at  # the head; the one the receipt was last read at; the one sent at
        head_read = 0.0
        seen = False  # a receipt was found at a depth short of `confirmations`
        while True:
            held = pushed = False  # held: an error, the whole pause is waited, pushed head or not
            try:
                pushed = self.base_fee is not None and self.base_fee() is not None
                stale = time.monotonic() - head_read >= HEAD_CHECK_S
                if pushed or (self.confirmations and (head < 0 or seen or stale)):
                    head, head_read = self.head(), time.monotonic()
                    stuck_from = head if stuck_from < 0 else stuck_from
                if not pushed or head > read_at:
                    receipt = self._receipt(pending.hashes)
                    read_at = head
                    if receipt is not None:
                        if receipt["blockNumber"] + self.confirmations <= head or not self.confirmations:
                            return receipt
                        seen = True
                    elif seen:  # a reorganisation took it out: into the pool again
                        seen = False
                        self._rebroadcast(pending, label)
                        stuck_from = head
                    else:
                        if head < 0 or time.monotonic() - head_read >= HEAD_CHECK_S:
                            head, head_read = self.head(), time.monotonic()
                            stuck_from = head if stuck_from < 0 else stuck_from
                        if 0 <= stuck_from <= head - STUCK_AFTER_BLOCKS and pending.bumps < MAX_BUMPS:
                            self._replace(pending, label)
                            stuck_from = head
            except HeadRefused:  # the endpoint reports a head it does not serve: no depth from it; ask again
                pause, held = RECEIPT_POLL_MAX_S, True
            except LedgerError:
                raise
            except Exception as exc:
                if not is_transient(exc):
                    raise
                pause, held = max(pause, rate_limit_pause(exc) or BACKOFF_S), True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LedgerTimeout(
                    f"{label}: no receipt for 0x{bytes(pending.hashes[-1]).hex()} within {self.tx_timeout:.0f} s"
                )
            time.sleep(min(PUSHED_HEAD_PAUSE_S if pushed and not held else pause, remaining))
            pause = min(pause * 2, RECEIPT_POLL_MAX_S)

    def _endpoint_head(self) -> int:
        return int(with_retries(lambda: self.w3.eth.block_number, what="block number"))

    def _receipt(self, hashes: list[HexBytes]) -> TxReceipt | None:
        """The receipt of whichever of `hashes` (the versions of one nonce) was mined, if any."""
        for tx_hash in reversed(hashes):
            try:
                return self.w3.eth.get_transaction_receipt(tx_hash)
            except TransactionNotFound:
                continue
        return None

    def _rebroadcast(self, pending: _Pending, label: str) -> None:
        """Send the last signed version again (a reorganisation dropped it from the chain)."""
        self.rebroadcasts += 1
        self._resend(pending.signed, label, pending.tx)

    def _replace(self, pending: _Pending, label: str) -> None:
        """Sign `pending` again, same nonce, fees raised by FEE_BUMP at least (the max fee to twice
        the latest base fee plus the tip, if that is more), and send it."""
        replacement = self._repriced(pending.tx)
        signed = self.account.sign_transaction(replacement)  # type: ignore[arg-type]
        pending.tx, pending.signed, pending.bumps = replacement, signed, pending.bumps + 1
        self.replacements += 1
        if self._resend(signed, label, replacement):
            pending.hashes.append(signed.hash)

    def _repriced(self, unsigned: TxParams) -> TxParams:
        """`unsigned` with its fees raised by FEE_BUMP at least, and the max fee to twice the next
        block's base fee plus the tip if that is more (a legacy gas price to the node's price)."""
        tx: dict[str, Any] = dict(unsigned)
        if "maxFeePerGas" in tx:
            tip = _bumped(int(tx["maxPriorityFeePerGas"]))
            tx["maxPriorityFeePerGas"] = tip
            tx["maxFeePerGas"] = max(_bumped(int(tx["maxFeePerGas"])), 2 * self._next_base_fee() + tip)
        else:
            price = int(with_retries(lambda: self.w3.eth.gas_price, what="gas price"))
            tx["gasPrice"] = max(_bumped(int(tx["gasPrice"])), price)
        return cast(TxParams, tx)  # the same keys, other fees

    def _next_base_fee(self) -> int:
        """The base fee of the block being built ("pending"), else of the latest one."""
        for which in ("pending", "latest"):
            try:
                block = with_retries(partial(self.w3.eth.get_block, which), what="base fee")
                return int(block.get("baseFeePerGas", 0))
            except LedgerError:
                raise
            except Exception:  # a node without a pending block
                continue
        return 0

    def _resend(self, signed: SignedTransaction, label: str, tx: TxParams) -> bool:
        """Send a version of a pending transaction; False if the node took none: one version is
        mined already ("nonce too low") or an earlier one stands (a replacement refused)."""
        try:
            self._send_raw(signed, label, tx)
            return True
        except NonceClash:  # a version was mined: the receipt poll finds it
            return False
        except InsufficientFunds:
            raise
        except LedgerError as exc:
            if _underpriced(exc):
                return False
            raise

    def _explain_failure(self, fn: ContractCall, receipt: TxReceipt, label: str) -> LedgerError:
        """Status 0: replay the call on the block's resulting state to name the reason (the usual
        cause is a transaction earlier in the same block, e.g. someone else closed the round)."""
        block = receipt["blockNumber"]
        if isinstance(fn, ContractFunction):  # a deployment cannot be replayed as a call
            try:
                fn.call({"from": self.account.address}, block_identifier=block)
            except Exception as exc:
                refusal = self._refusal(exc)
                if refusal:
                    return refusal
        return TransactionFailed(
            f"{label}: transaction 0x{bytes(receipt['transactionHash']).hex()} reverted in block {block} "
            f"(gas used {receipt['gasUsed']} of the limit sent)"
        )


class _Pending:
    """One nonce's transaction while it awaits its receipt: its latest version (unsigned and
    signed), the hash of every version sent, and how many times its fees were raised."""

    def __init__(self, tx: TxParams, signed: SignedTransaction, hashes: list[HexBytes]) -> None:
        self.tx, self.signed, self.hashes = tx, signed, hashes
        self.bumps = 0


def _underpriced(exc: BaseException) -> bool:
    """A node refused a transaction for its fees: below the next block's base fee (Anvil, geth),
    or below what it takes to replace one pending with the same nonce."""
    text = str(exc).lower()
    return "less than block base fee" in text or "underpriced" in text


def _replaces_pending(exc: BaseException) -> bool:
    """A node refused a transaction as an underpriced replacement of one pending with its nonce."""
    return "replacement transaction underpriced" in str(exc).lower()


def _bumped(fee: int) -> int:
    """`fee` raised by FEE_BUMP, rounded up, and by 1 wei at least."""
    num, den = FEE_BUMP
    return max(-(-fee * num // den), fee + 1)


def _max_cost(tx: TxParams) -> int | None:
    """The most a transaction may cost: gas limit x (max fee per gas, or gas price) + value."""
    try:
        price = tx.get("maxFeePerGas", tx.get("gasPrice"))
        return int(tx["gas"]) * int(price) + int(tx.get("value", 0)) if price is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def send_eth(w3: Web3, account: LocalAccount, to: str, value_wei: int, *, tx_timeout: float) -> TxReceipt:
    """Send `value_wei` from `account` to `to` (a plain transfer: 21,000 gas at the chain's gas
    price) and await the receipt. InsufficientFunds names the sender, what it holds and what the
    transfer needs; LedgerTimeout when no receipt comes within `tx_timeout` s."""
    sender = account.address
    price = with_retries(lambda: int(w3.eth.gas_price), what="gas price")
    tx: TxParams = {
        "to": Web3.to_checksum_address(to),
        "value": Wei(value_wei),
        "gas": TRANSFER_GAS,
        "gasPrice": Wei(price),
        "nonce": with_retries(lambda: w3.eth.get_transaction_count(sender, "pending"), what="nonce"),
        "chainId": with_retries(lambda: int(w3.eth.chain_id), what="chain id"),
    }
    signed = account.sign_transaction(tx)  # type: ignore[arg-type]  # web3's and eth_account's dicts disagree
    needed = value_wei + TRANSFER_GAS * price
    try:
        tx_hash = with_retries(lambda: w3.eth.send_raw_transaction(signed.raw_transaction), what="send")
    except Exception as exc:
        if not _is_insufficient_funds(exc):
            raise
        try:
            held: int | None = int(w3.eth.get_balance(sender))
        except Exception:
            held = None
        holds = "an unknown amount" if held is None else _eth(held)
        raise InsufficientFunds(
            f"insufficient funds: account {sender} holds {holds}, sending {_eth(value_wei)} needs up to "
            f"{_eth(needed)} with the gas: send ETH to {sender} or send less",
            address=sender,
            held_wei=held,
            needed_wei=needed,
        ) from exc
    try:
        return w3.eth.wait_for_transaction_receipt(tx_hash, timeout=tx_timeout, poll_latency=0.1)
    except TimeExhausted:
        raise LedgerTimeout(f"no receipt for 0x{bytes(tx_hash).hex()} within {tx_timeout:.0f} s") from None
