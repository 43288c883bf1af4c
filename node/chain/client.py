"""Python client of the SwarmLedger contract (contracts/SwarmLedger.sol) on any EVM JSON-RPC chain.

    w3 = connect("http://127.0.0.1:8545")
    ledger = LedgerClient.deploy(w3, account, min_peers=3, commit_window=5, attest_window=5,
                                 commit_window_seconds=60, attest_window_seconds=60,
                                 eps_cap_micro=10_000_000, delta=1e-5, genesis_digest=digest)
    ledger.register(peer_id, sign_registration(key, chain_id, ledger.address, account.address))
    ledger.commit(ledger.current_round(), blob_digest, 600, 1_000_000, mechanism_json)

Transactions go through `node.chain.sender` (estimate, margin, nonce, receipt, status); reads
are retried on transient RPC failures (`node.chain.retries`); contract refusals arrive as the
`node.chain.errors` subclass named after the custom error. The client is synchronous and
thread-safe: call it from `trio.to_thread.run_sync`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import asdict
from functools import lru_cache, partial
from importlib import resources
from typing import Any, TypeVar, cast

import requests
from eth_abi import encode as abi_encode
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from web3 import HTTPProvider, Web3
from web3.exceptions import BlockNotFound
from web3.types import RPCEndpoint, RPCResponse, TxReceipt

from node.chain.codec import EventCodec, ViewCodec, abi_type
from node.chain.decoder import RevertDecoder
from node.chain.errors import LedgerError, NotParticipant
from node.chain.evm import artifact_evm_version, check_evm_target
from node.chain.rawrpc import (
    MAX_ANSWER_BYTES,
    MAX_LOGS_ANSWER_BYTES,
    HeadGuard,
    RawRPC,
    RawRPCUnavailable,
    RPCErrorAnswer,
    header_hash,
    parse_quantity,
)
from node.chain.records import (
    DELTA_SCALE,
    Attestation,
    Commitment,
    RoundInfo,
    RoundState,
    SwarmParams,
    describe_mechanism,
)
from node.chain.registration import Registration, registration_message, resolve
from node.chain.retries import MISSING_BLOCK_ANSWERS, with_retries
from node.chain.sender import TransactionSender
from node.protocol.wire import eps_from_micro

ARTIFACT_NAME = "SwarmLedger.json"  # package data: node/chain/artifacts/, written by scripts/compile_contracts.py
DEFAULT_TX_TIMEOUT_S = 120.0
LOG_CHUNK_BLOCKS = 10_000
# An RPC may report a block whose logs it has not indexed yet (geth, Anvil under load: eth_getLogs
# briefly misses the newest block's events): a read of logs that storage shows incomplete (a
# round's commitments, a committer's whole history) is read again this many times, pauses
# doubling from LOG_LAG_PAUSE (about 1.5 s in all), before it is an error.
LOG_LAG_RETRIES = 5
LOG_LAG_PAUSE = 0.05

T = TypeVar("T")


@lru_cache(maxsize=1)
def load_artifact() -> dict[str, Any]:
    """The compiled contract (ABI, bytecode, compiler settings, source hash) shipped inside the package."""
    path = resources.files("node.chain") / "artifacts" / ARTIFACT_NAME
    try:
        artifact: dict[str, Any] = json.loads(path.read_text())
        return artifact
    except OSError as exc:
        raise LedgerError(f"contract artifact missing ({path}): run python scripts/compile_contracts.py") from exc


def connect(rpc_url: str, *, timeout: float = 10.0, check_evm: bool = True) -> Web3:
    """A synchronous Web3 on `rpc_url` (http(s) only), checked to answer and, with `check_evm`,
    to run the EVM version the contract artifact targets (`node.chain.evm`: UnsupportedEVM if not)."""
    if not rpc_url.startswith(("http://", "https://")):
        raise ValueError(f"rpc_url must be an http(s) URL, got {rpc_url!r}")
    # The client retries itself (with backoff, and without re-sending a transaction blindly).
    # The chain id is cached: web3 checks it before every call and transaction, which would double
    # the requests of a peer that watches the chain (an endpoint does not change chains under us).
    # Proxy, CA bundle and netrc settings are resolved from the environment once, here: a session
    # that trusts the environment looks them up again on every request (13% of web3's CPU).
    session = requests.Session()
    found = session.merge_environment_settings(rpc_url, {}, None, None, None)
    session.auth = requests.utils.get_netrc_auth(rpc_url)
    session.trust_env = False
    w3 = Web3(
        CountingHTTPProvider(
            rpc_url,
            request_kwargs={"timeout": timeout, "proxies": found["proxies"], "verify": found["verify"]},
            session=session,
            exception_retry_configuration=None,
            cache_allowed_requests=True,
            cacheable_requests={RPCEndpoint("eth_chainId")},
        )
    )
    with_retries(lambda: w3.eth.chain_id, what=f"connect to {rpc_url}")
    if check_evm:
        check_evm_target(w3, rpc_url, artifact_evm_version(load_artifact()))
    return w3


class CountingHTTPProvider(HTTPProvider):
    """web3's HTTP provider, counting the requests it sends (a batch counts once): with the counts
    of the raw readers made on it (`raw_reader`), what a peer asks of its endpoint per round
    (`LedgerClient.rpc_requests`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = 0
        self.raw_readers: list[RawRPC] = []  # `raw_reader`'s on this endpoint, counted with it
        self._count_lock = threading.Lock()

    def all_requests(self) -> int:
        """Requests sent by this provider and by every raw reader made on it."""
        return self.requests + sum(raw.requests for raw in self.raw_readers)

    def _make_request(self, method: RPCEndpoint, request_data: bytes) -> bytes:
        # below web3's request cache: what it answers from there (eth_chainId) is not sent
        with self._count_lock:
            self.requests += 1
        return super()._make_request(method, request_data)

    def make_batch_request(self, batch_requests: list[tuple[RPCEndpoint, Any]]) -> list[RPCResponse] | RPCResponse:
        with self._count_lock:
            self.requests += 1
        return super().make_batch_request(batch_requests)


def raw_call(raw: RawRPC, errors: RevertDecoder, method: str, params: list[Any]) -> Any:
    """One raw request; a revert as the contract's refusal (`errors`), a block the endpoint lacks
    (yet) as transient (`node.chain.retries` reads again, as it does web3's answer)."""
    try:
        return raw.call(
            method, params, max_bytes=MAX_LOGS_ANSWER_BYTES if method == "eth_getLogs" else MAX_ANSWER_BYTES
        )
    except RPCErrorAnswer as exc:
        error = exc.error if isinstance(exc.error, dict) else {}
        decoded = errors.decode(error.get("data"))
        if decoded:
            raise decoded from None
        if any(answer in str(error.get("message", "")).lower() for answer in MISSING_BLOCK_ANSWERS):
            raise RawRPCUnavailable(str(exc)) from None
        raise


def raw_reader(w3: Web3) -> RawRPC | None:
    """A new bare JSON-RPC reader (`RawRPC`, its own connection) on `w3`'s endpoint, its requests
    counted with the provider's; None where it cannot serve: an in-process provider, a URL with
    credentials, or an endpoint reached through a proxy (the raw reader does not speak one)."""
    provider = w3.provider
    uri = getattr(provider, "endpoint_uri", None)
    if not isinstance(provider, HTTPProvider) or not uri or dict(provider.get_request_kwargs()).get("proxies"):
        return None
    try:
        raw = RawRPC(str(uri))
    except ValueError:
        return None
    if isinstance(provider, CountingHTTPProvider):
        provider.raw_readers.append(raw)
    return raw


def read_until_complete(read: Callable[[], tuple[T, str | None]]) -> T:
    """read() -> (value, what is missing or None), again while something is missing: an RPC may
    report a block whose logs it has not indexed yet. LOG_LAG_RETRIES more reads, pauses
    doubling from LOG_LAG_PAUSE, then LedgerError naming what was missing."""
    for attempt in range(LOG_LAG_RETRIES):
        value, missing = read()
        if missing is None:
            return value
        time.sleep(LOG_LAG_PAUSE * 2**attempt)
    value, missing = read()
    if missing is not None:
        raise LedgerError(f"{missing} (the RPC's logs are incomplete; read {LOG_LAG_RETRIES + 1} times)")
    return value


def head_block(w3: Web3) -> int:
    """The latest block number, straight from the provider past web3's middleware (the chain
    watcher's read; a peer's LedgerClient reads it cheaper still, through `RawRPC`)."""
    answer = w3.provider.make_request(RPCEndpoint("eth_blockNumber"), [])
    return parse_quantity(answer.get("result") if isinstance(answer, dict) else None, "eth_blockNumber")


class LedgerClient:
    """One SwarmLedger deployment. `account` None gives a read-only client.

    `confirmations`: how deep the chain state this client reads lies. With 0 every read is of the
    head. With k > 0, `block_number()` is the head less k, every view is pinned to that block and
    every log read ends there, and a transaction's receipt counts once k blocks are built on its
    own (`node.chain.sender`): a reorganisation up to k blocks deep then changes nothing a peer
    has acted on (`chain.confirmations`, docs/TESTNET.md)."""

    def __init__(
        self,
        w3: Web3,
        address: str,
        account: LocalAccount | None = None,
        *,
        tx_timeout: float = DEFAULT_TX_TIMEOUT_S,
        confirmations: int = 0,
    ) -> None:
        if isinstance(confirmations, bool) or not isinstance(confirmations, int) or confirmations < 0:
            raise ValueError(f"confirmations must be an integer >= 0, got {confirmations!r}")
        artifact = load_artifact()
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.account = account
        self.tx_timeout = tx_timeout
        self.confirmations = confirmations
        self.contract = w3.eth.contract(address=self.address, abi=artifact["abi"])
        self._errors = RevertDecoder(artifact["abi"])
        self._views = ViewCodec(artifact["abi"])
        self._events = EventCodec(artifact["abi"])
        self._tx = (
            TransactionSender(
                w3,
                account,
                self._errors,
                tx_timeout,
                confirmations=confirmations,
                head=self.head,
                base_fee=self._pushed_base_fee,
            )
            if account is not None
            else None
        )
        self.gas_used: dict[str, int] = {}  # last receipt's gasUsed per function, for benchmarks
        self._chain_id: int | None = None
        self._peer_ids: dict[str, bytes] = {}  # registered peer ids read so far (they never change)
        self._signatures: dict[str, tuple[bytes, list[str]]] = {}  # function -> (selector, argument types)
        self._raw: RawRPC | None | bool = None  # None: not made yet; False: not available
        # the head as the endpoint reports it, held to monotonic, bounded progress (rawrpc.HeadGuard)
        self._head = HeadGuard(lambda number: self.block_hash(number) is not None)
        # the head a subscription pushes while it runs, else None (node.chain.subscription.ChainFeed.live_head)
        self.pushed_head: Callable[[], int | None] | None = None
        # the base fee of that head while a subscription runs (the sender builds its fees from it)
        self.pushed_base_fee: Callable[[], int | None] | None = None
        self._read_latest = False  # a view read "latest" since the last pushed head was used
        code = self._read(lambda: w3.eth.get_code(self.address), "get_code")
        if len(code) == 0:
            raise LedgerError(
                f"no contract at {self.address} on chain {self._read(lambda: w3.eth.chain_id, 'chain_id')}"
            )

    # ---------------------------------------------------------------- deployment

    @classmethod
    def deploy(
        cls,
        w3: Web3,
        account: LocalAccount,
        *,
        min_peers: int,
        commit_window: int,
        attest_window: int,
        commit_window_seconds: int,
        attest_window_seconds: int,
        eps_cap_micro: int,
        delta: float,
        genesis_digest: bytes,
        eps_step_micro: int = 0,
        record_eps_cap_micro: int = 0,
        record_delta: float = 0.0,
        allowlist: list[str] | None = None,
        max_samples: int = 0,
        secure_aggregation: bool = False,
        tx_timeout: float = DEFAULT_TX_TIMEOUT_S,
        confirmations: int = 0,
    ) -> LedgerClient:
        """Deploy a new swarm ledger from `account` and return a client on it.

        A window ends once both its blocks (`commit_window`, `attest_window`) and its seconds
        (`commit_window_seconds`, `attest_window_seconds`, by block timestamps) have passed.
        `eps_step_micro`: what one release spends under the swarm's privacy policy, which the
        contract then requires of every commit (0: not a constant, checked off chain);
        `record_eps_cap_micro` and `record_delta`: the record-level DP-SGD cap and delta (both 0
        without DP-SGD); `allowlist`: the addresses that may register (None or empty: anyone may);
        `max_samples`: the cap on a commit's numSamples, the FedAvg weight (0: 2^32 - 1);
        `secure_aggregation`: the swarm's rounds are secure-aggregation rounds (postFrame and
        acknowledge taken, commits not deduplicated: docs/SECAGG.md)."""
        settings = constructor_settings(
            min_peers=min_peers,
            commit_window=commit_window,
            attest_window=attest_window,
            commit_window_seconds=commit_window_seconds,
            attest_window_seconds=attest_window_seconds,
            eps_cap_micro=eps_cap_micro,
            delta=delta,
            genesis_digest=genesis_digest,
            eps_step_micro=eps_step_micro,
            record_eps_cap_micro=record_eps_cap_micro,
            record_delta=record_delta,
            max_samples=max_samples,
        ) + (bool(secure_aggregation),)
        artifact = load_artifact()
        factory = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
        constructor = factory.constructor(
            settings,
            bytes(genesis_digest),
            [Web3.to_checksum_address(a) for a in allowlist or []],
        )
        sender = TransactionSender(w3, account, RevertDecoder(artifact["abi"]), tx_timeout, confirmations=confirmations)
        receipt = sender.send(constructor, "deploy")
        address = receipt["contractAddress"]
        if address is None:
            raise LedgerError(f"deploy: receipt 0x{bytes(receipt['transactionHash']).hex()} holds no contract address")
        client = cls(w3, address, account, tx_timeout=tx_timeout, confirmations=confirmations)
        sender.head, sender.base_fee = client.head, client._pushed_base_fee  # from here on the client's
        client._tx = sender  # keeps its nonce count
        client.gas_used["deploy"] = receipt["gasUsed"]
        return client

    # ---------------------------------------------------------------- transactions

    def register(self, peer_id: bytes, signature: bytes) -> TxReceipt:
        """Register this account with its libp2p peer id bytes and the peer id's key's signature
        over `registration_message(account)` (`node.chain.registration.sign_registration`): the
        contract only emits it; peers and verifiers ignore a registration whose signature does not
        verify."""
        return self._transact("register", bytes(peer_id), bytes(signature))

    def commit(
        self,
        round: int,
        digest: bytes,
        num_samples: int,
        eps_micro: int,
        mechanism: bytes,
        record_eps_micro: int = 0,
    ) -> TxReceipt:
        """Commit the digest of this round's published update and the cumulative eps after it."""
        return self._transact(
            "commit", round, bytes(digest), num_samples, eps_micro, record_eps_micro, bytes(mechanism)
        )

    def post_frame(self, round: int, step: int, digest: bytes) -> TxReceipt:
        """Post the digest of this account's secure-aggregation frame for `step` of `round`
        (`node.chain.secure_steps`: the step's window decides whether the chain takes it)."""
        return self._transact("postFrame", round, step, bytes(digest))

    def acknowledge(self, round: int, step: int, fetched: bytes) -> TxReceipt:
        """Acknowledge the frames of `step` (0 KEYS, 1 DEALING, 2 MASKED) this account holds for
        secure `round` (a bitmap over the round's members, on chain itself: `node.chain.secure_steps`)."""
        return self._transact("acknowledge", round, step, bytes(fetched))

    def acknowledgments(self, round: int, from_block: int, to_block: int) -> list[dict[str, Any]]:
        """The Acknowledged events of `round` in from_block..to_block, in chain order (decoded,
        unchecked)."""
        return self._logs("Acknowledged", from_block, to_block, {"round": round})

    def frame_postings(self, round: int, from_block: int, to_block: int) -> list[dict[str, Any]]:
        """The FramePosted events of `round` in from_block..to_block, in chain order (decoded,
        unchecked: `node.chain.secure_steps.chain_steps` reads them)."""
        return self._logs("FramePosted", from_block, to_block, {"round": round})

    def complain(self, round: int, frame: bytes) -> TxReceipt:
        """Post this account's COMPLAINT frame for secure `round`, on chain itself (the complaint
        window decides whether the chain takes it: `node.chain.secure_steps`)."""
        return self._transact("complain", round, bytes(frame))

    def complaints(
        self, round: int, from_block: int, to_block: int, *, senders: Collection[str], max_frame: int
    ) -> list[dict[str, Any]]:
        """The Complained events of `round` in from_block..to_block from `senders`, in chain order
        (decoded, unchecked), less those whose frame is over `max_frame` bytes, which the contract
        never emits. Both are checked on the raw log, before it is decoded: the indexed sender
        against `senders` (anyone registered may complain, its frame up to the contract's bound), the data's size."""
        topics = {_address_topic(sender) for sender in senders}

        def wanted(log: Any) -> bool:
            return _topic(log, 2) in topics and not _over(log, max_frame)

        events = self._logs("Complained", from_block, to_block, {"round": round}, keep=wanted)
        return [
            e for e in events if _address_topic(e["args"]["peer"]) in topics and len(e["args"]["frame"]) <= max_frame
        ]

    def close_round(self, round: int) -> TxReceipt:
        """Close the round (anyone) once its window has passed with quorum. Most tries are refused
        (every member tries again after each commit it sees, node/peer/watch.py): the refusal
        comes from one raw eth_estimateGas (`_refused`), not from web3's estimate, which costs
        ten times its CPU."""
        self._refused("closeRound", round)
        return self._transact("closeRound", round)

    def _refused(self, fn_name: str, *args: Any) -> None:
        """Raise the contract's refusal of a transaction before web3 builds it: one raw
        eth_estimateGas on "pending" from our account, as the sender's estimate asks. Nothing
        raised: the sender estimates again and sends (an error answer that is no refusal of the
        contract's, such as an endpoint that cannot estimate on "pending", is left to it too)."""
        raw = self._raw_rpc()
        if raw is None or self.account is None:
            return
        request = {"from": self.account.address, "to": self.address, "data": self._calldata(fn_name, args)}
        try:
            self._read(partial(self._raw_call, raw, "eth_estimateGas", [request, "pending"]), f"estimate {fn_name}")
        except RPCErrorAnswer:
            return

    def _calldata(self, fn_name: str, args: tuple[Any, ...]) -> str:
        """A function's calldata, its selector and argument types read from the ABI once."""
        if fn_name not in self._signatures:
            abi = cast(list[dict[str, Any]], self.contract.abi)
            (entry,) = [e for e in abi if e.get("type") == "function" and e.get("name") == fn_name]
            types = [abi_type(i) for i in entry["inputs"]]
            self._signatures[fn_name] = (keccak(text=f"{fn_name}({','.join(types)})")[:4], types)
        selector, types = self._signatures[fn_name]
        return "0x" + (selector + abi_encode(types, list(args))).hex()

    def attest(self, round: int, aggregate_digest: bytes, included: bytes) -> TxReceipt:
        """Attest the aggregate computed for a closed round and the bitmap of included blobs."""
        return self._transact("attest", round, bytes(aggregate_digest), bytes(included))

    def abort_round(self, round: int) -> TxReceipt:
        """Abort a closed round whose attestation window passed without a majority (anyone)."""
        return self._transact("abortRound", round)

    def allow(self, accounts: list[str]) -> TxReceipt:
        """Deployer only: add accounts to the allowlist."""
        return self._transact("allow", [Web3.to_checksum_address(a) for a in accounts])

    def disallow(self, account: str) -> TxReceipt:
        """Deployer only: remove an account from the allowlist (it can no longer commit)."""
        return self._transact("disallow", Web3.to_checksum_address(account))

    def _transact(self, fn_name: str, *args: Any) -> TxReceipt:
        if self._tx is None:
            raise LedgerError("this client is read-only (no account): it cannot send transactions")
        receipt = self._tx.send(getattr(self.contract.functions, fn_name)(*args), fn_name)
        self.gas_used[fn_name] = receipt["gasUsed"]
        return receipt

    # ---------------------------------------------------------------- views

    def _read(self, call: Callable[[], T], what: str) -> T:
        return with_retries(call, what=what)

    def _view(self, fn_name: str, *args: Any, block: int | None = None) -> Any:
        """A view call, at the latest block or at `block` (reads that must agree with each other
        and with logs pin one block: the chain moves between two calls). A bare eth_call through
        the raw reader (`node.chain.codec`) where there is one, else web3's contract call."""
        pushed = self.pushed_head is not None and self.pushed_head() is not None
        if block is None and (self.confirmations or pushed):
            # at the block the pinned reads use: a pushed head may lag "latest", and a view at
            # "latest" followed by a read pinned there saw a round the pinned block does not hold
            block = self.block_number()
        elif block is None:
            self._read_latest = True  # the next pushed head is first held to the endpoint's (`head`)
        raw = self._raw_rpc()
        if raw is not None:
            request = {"to": self.address, "data": self._views.calldata(fn_name, args)}
            tag = "latest" if block is None else hex(block)
            return self._views.decode(
                fn_name, self._read(partial(self._raw_call, raw, "eth_call", [request, tag]), fn_name)
            )
        fn = getattr(self.contract.functions, fn_name)(*args)
        call = fn.call if block is None else partial(fn.call, block_identifier=block)
        try:
            return self._read(call, fn_name)
        except LedgerError:
            raise
        except Exception as exc:
            decoded = self._errors.from_exception(exc)
            if decoded:
                raise decoded from None
            raise

    def _raw_call(self, raw: RawRPC, method: str, params: list[Any]) -> Any:
        return raw_call(raw, self._errors, method, params)

    def block_number(self) -> int:
        """The block this client reads the chain at: the head less `confirmations`."""
        return max(0, self.head() - self.confirmations)

    def head(self) -> int:
        """The chain's head: never behind one read before, and a jump past a bound only once the
        endpoint serves that block (`rawrpc.HeadGuard`; `HeadRefused` if it does not)."""
        pushed = self.pushed_head() if self.pushed_head is not None else None
        if pushed is None:
            return self._polled_head()
        # a subscription's last head, taken by the same guard (`take_head`), but never behind a
        # state read before it: views at "latest" (no subscription yet, or down) may have seen
        # blocks the subscription has not pushed yet, so the endpoint's head is read once first
        if self._read_latest:
            self._read_latest = False
            self._polled_head()
        last = self._head.last
        return pushed if last is None or pushed >= last else last

    def _polled_head(self) -> int:
        raw = self._raw_rpc()
        read = raw.block_number if raw else lambda: head_block(self.w3)
        return self._head.check(lambda: self._read(read, "block_number"))

    def take_head(self, head: int) -> int:
        """A head learnt otherwise than by asking (a subscription's newHeads), held to the same
        guard as a polled one: the head taken, which is `head` or the last one (`HeadRefused`)."""
        return self._head.check(lambda: head)

    def take_head_at_once(self, head: int) -> int | None:
        """`take_head` where it needs no request (`rawrpc.HeadGuard.take_at_once`); None where it does."""
        return self._head.take_at_once(head)

    def _pushed_base_fee(self) -> int | None:
        return self.pushed_base_fee() if self.pushed_base_fee is not None else None

    def rpc_requests(self) -> int:
        """HTTP requests this client's endpoint has had from it so far (web3's and the raw
        readers'; everything else on the same Web3, such as the chain watcher, counts too)."""
        provider = self.w3.provider
        if isinstance(provider, CountingHTTPProvider):
            return provider.all_requests()
        raw = self._raw_rpc()
        return raw.requests if raw else 0

    def block_hash(self, number: int) -> bytes | None:
        """The hash of block `number` as the endpoint serves it; None if it serves no such block."""
        if not self._raw_rpc():  # an in-process provider (eth-tester): web3's own call, nothing on a wire
            return self._read(lambda: _in_process_block_hash(self.w3, number), "block_hash")
        request = partial(self.w3.provider.make_request, RPCEndpoint("eth_getBlockByNumber"), [hex(number), False])
        return header_hash(self._read(request, "block_hash"), number)

    def activity(self, from_block: int, to_block: int) -> bool:
        """Whether the ledger emitted any event in blocks from_block..to_block: every change of
        its state does (events for every state change), so a peer that watches a round re-reads
        it only when this says so."""
        if to_block < from_block:
            return False
        raw = self._raw_rpc()
        if raw is not None:
            return self._read(lambda: raw.has_logs(self.address, from_block, to_block), "activity")
        logs = self._read(
            lambda: self.w3.eth.get_logs({"address": self.address, "fromBlock": from_block, "toBlock": to_block}),
            "activity",
        )
        return len(logs) > 0

    def _raw_rpc(self) -> RawRPC | None:
        """The cheap reader for the polled calls and views (`raw_reader`); None where there is
        none: web3 then serves them."""
        if self._raw is None:
            self._raw = raw_reader(self.w3) or False
        return self._raw if isinstance(self._raw, RawRPC) else None

    def params(self) -> SwarmParams:
        fields = list(self._view("params"))  # in SwarmParams' order
        fields[8] = bytes(fields[8])  # genesisDigest
        return SwarmParams(*fields)

    def current_round(self) -> int:
        return self._view("currentRound")

    def last_finalized(self) -> tuple[int, bytes]:
        """(last finalized round, its digest); (0, genesis digest) before any."""
        r, digest = self._view("lastFinalized")
        return r, bytes(digest)

    def round_info(self, round: int, *, block: int | None = None) -> RoundInfo:
        s, opened, closed, ended, count, digest, opened_at, closed_at = self._view("roundInfo", round, block=block)
        state = RoundState(s)
        finalized = bytes(digest) if state is RoundState.FINALIZED else None
        return RoundInfo(round, state, opened, closed, ended, count, finalized, opened_at, closed_at)

    def participants(self, round: int) -> list[str]:
        """The participants of `round` in commit order (the order inclusion bitmaps use)."""
        return [c.peer for c in self.commitments(round)]

    def commitment_of(self, round: int, address: str) -> Commitment:
        """The commitment of `address` in `round`; raises NotParticipant if it made none."""
        address = Web3.to_checksum_address(address)
        for c in self.commitments(round):
            if c.peer == address:
                return c
        raise NotParticipant(round=round, account=address)

    def commitments(self, round: int) -> list[Commitment]:
        """All commitments of `round` in participant order, from the Committed events, checked
        against storage at one pinned block: as many as the stored participant count, indexes
        0..n-1, and (as the contract refuses otherwise) one per peer and no digest twice. Logs
        that lag the state are read again before that is an error (`read_until_complete`); a
        digest may repeat in a swarm deployed for secure aggregation."""

        def read() -> tuple[list[Commitment], str | None]:
            at = self.block_number()  # storage and logs at one block: commits land meanwhile
            info = self.round_info(round, block=at)
            logs = self._logs("Committed", info.opened_block, info.closed_block or at, {"round": round})
            found = sorted((_commitment(e) for e in logs), key=lambda c: c.index)
            complete = [c.index for c in found] == list(range(info.participant_count))
            return found, None if complete else (
                f"round {round}: {len(found)} Committed events for {info.participant_count} stored participants"
            )

        found = read_until_complete(read)
        repeated_digest = len({c.digest for c in found}) != len(found)
        # a secure-aggregation ledger takes a copied digest (its copier is named off chain)
        if len({c.peer for c in found}) != len(found) or (repeated_digest and not self.params().secure_aggregation):
            raise LedgerError(f"round {round}: Committed events repeat a peer or a digest (not the ledger's logs)")
        return found

    def commit_history(self, address: str, from_block: int | None = None) -> list[Commitment]:
        """Every commitment `address` made, oldest first (from the Committed events): the sample
        counts its record-level eps is composed over. `from_block`: only those from that block on
        (a reader that keeps the history reads only what is new). A whole history must end in the
        cumulative eps records the ledger stores for `address` (logs that lag the state end
        earlier, which shows whenever the missing commit raised a record: every private release
        does), and is read again until it does (`read_until_complete`)."""
        peer = Web3.to_checksum_address(address)
        if from_block is not None:
            return [_commitment(e) for e in self._logs("Committed", from_block, self.block_number(), {"peer": peer})]
        start = self.params().deploy_block

        def read() -> tuple[list[Commitment], str | None]:
            history = [_commitment(e) for e in self._logs("Committed", start, self.block_number(), {"peer": peer})]
            last = (history[-1].eps_micro, history[-1].record_eps_micro) if history else (0, 0)
            stored = (self.eps_spent(peer), self.record_eps_spent(peer))
            return history, None if last == stored else (
                f"{peer}: its Committed events end at eps records {last}, the ledger stores {stored}"
            )

        return read_until_complete(read)

    def attestations(self, round: int) -> list[Attestation]:
        info = self.round_info(round)
        if info.state is RoundState.OPEN:
            return []
        to_block = info.ended_block or self.block_number()
        logs = self._logs("Attested", info.closed_block, to_block, {"round": round})
        return [
            Attestation(
                e["args"]["peer"],
                bytes(e["args"]["aggregateDigest"]),
                bytes(e["args"]["included"]),
                e["args"]["votes"],
                e["blockNumber"],
            )
            for e in logs
        ]

    def eps_spent(self, address: str) -> int:
        """Cumulative eps committed by `address`, in micro-eps."""
        return self._view("epsSpent", Web3.to_checksum_address(address))

    def record_eps_spent(self, address: str) -> int:
        """Cumulative record-level (DP-SGD) eps committed by `address`, in micro-eps."""
        return self._view("recordEpsSpent", Web3.to_checksum_address(address))

    def peer_id_of(self, address: str) -> bytes:
        """The peer id `address` registered (empty if none). Kept once read: the contract sets it
        once and never again (a second registration is refused: AlreadyRegistered)."""
        address = Web3.to_checksum_address(address)
        known = self._peer_ids.get(address)
        if known is None:
            known = bytes(self._view("peerIdOf", address))
            if known:
                self._peer_ids[address] = known
        return known

    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(self._read(lambda: self.w3.eth.chain_id, "chain_id"))
        return self._chain_id

    def registration_message(self, address: str) -> bytes:
        """What `address`'s registration signature signs on this chain and ledger."""
        return registration_message(self.chain_id(), self.address, address)

    def address_of_peer_id(self, peer_id: bytes) -> str | None:
        """The address the peer id resolves to: its first registration whose signature verifies
        (None if none does). Peer ids are not unique on chain; this is the off-chain rule."""
        found = resolve(self.registrations(), self.chain_id(), self.address).get(bytes(peer_id))
        return None if found is None else found.address

    def is_registered(self, address: str) -> bool:
        return self._view("isRegistered", Web3.to_checksum_address(address))

    def is_allowed(self, address: str) -> bool:
        """Whether `address` may register (always true on an open ledger)."""
        return self._view("isAllowed", Web3.to_checksum_address(address))

    def finalized_digest(self, round: int) -> bytes | None:
        digest = bytes(self._view("finalizedDigest", round))
        return None if digest == bytes(32) else digest

    def votes_for(self, round: int, aggregate_digest: bytes, included: bytes) -> int:
        """Votes for (aggregate, bitmap) in the round in progress (0 while open; WrongRound for a
        past round, whose votes are in its Attested events: `attestations`)."""
        return self._view("votesFor", round, bytes(aggregate_digest), bytes(included))

    def registered_count(self) -> int:
        return self._view("registeredCount")

    def awaited_count(self) -> int:
        """How many members the early close of the open round still waits for (0 once closed): an
        upper bound, the contract's tallies may count low (docs/LEDGER.md, "Close")."""
        return self._view("awaitedCount")

    def is_awaited(self, address: str) -> bool:
        """Whether the early close of the open round waits for `address`'s commit (registered, not
        removed, not committed yet, not left out of the last finalized aggregate)."""
        return self._view("isAwaited", Web3.to_checksum_address(address))

    def registered_peers(self) -> list[tuple[str, bytes]]:
        """(address, peer id) of every registration, in order, signatures unchecked (from the
        Registered events): `registrations()` and `node.chain.registration.resolve` check them."""
        return [(r.address, r.peer_id) for r in self.registrations()]

    def registrations(self, from_block: int | None = None, to_block: int | None = None) -> list[Registration]:
        """Every Registered event from `from_block` (default: the deployment block) to `to_block`
        (default: the latest block), in chain order, signatures unchecked."""
        start = self.params().deploy_block if from_block is None else from_block
        end = self.block_number() if to_block is None else to_block
        if end < start:
            return []
        return [
            Registration(
                e["args"]["peer"],
                bytes(e["args"]["peerId"]),
                bytes(e["args"]["signature"]),
                e["blockNumber"],
                e["logIndex"],
            )
            for e in self._logs("Registered", start, end, None)
        ]

    def allowlist_changes(self, from_block: int | None = None, to_block: int | None = None) -> list[tuple[str, bool]]:
        """(account, allowed) of every AllowlistChanged event from `from_block` (default: the
        deployment block) to `to_block` (default: the latest block), in chain order: the last
        one of an account is its state."""
        start = self.params().deploy_block if from_block is None else from_block
        end = self.block_number() if to_block is None else to_block
        if end < start:
            return []
        return [
            (str(e["args"]["account"]), bool(e["args"]["allowed"]))
            for e in self._logs("AllowlistChanged", start, end, None)
        ]

    def _logs(
        self,
        event: str,
        from_block: int,
        to_block: int,
        filters: dict[str, Any] | None,
        *,
        keep: Callable[[Any], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """`event`'s logs in from_block..to_block whose indexed arguments equal `filters`, in chain
        order: raw and decoded by `node.chain.codec` where there is a raw reader, else by web3.
        `keep`: a raw log it refuses is dropped before it is decoded (the caller checks what web3
        decoded)."""
        raw = self._raw_rpc()
        found: list[dict[str, Any]] = []
        for start in range(from_block, to_block + 1, LOG_CHUNK_BLOCKS):
            end = min(to_block, start + LOG_CHUNK_BLOCKS - 1)
            if raw is not None:
                query = self._events.query(event, self.address, start, end, filters)
                answer = self._read(partial(self._raw_call, raw, "eth_getLogs", [query]), f"get_logs {event}")
                if keep is not None and isinstance(answer, list):
                    answer = [log for log in answer if keep(log)]
                found += self._events.decode(event, answer)
                continue
            getter = getattr(self.contract.events, event).get_logs
            logs = self._read(
                partial(getter, argument_filters=filters, from_block=start, to_block=end), f"get_logs {event}"
            )
            found += [cast(dict[str, Any], log) for log in logs]
        return sorted(found, key=lambda e: (e["blockNumber"], e["logIndex"]))

    # ---------------------------------------------------------------- snapshot

    def snapshot(self) -> dict[str, Any]:
        """Everything a verifier needs, JSON-able: parameters, every round with its commitments
        (mechanism and what it protects), attestations and outcome, and every peer's eps."""
        p = self.params()
        current = self.current_round()
        rounds = [self._round_snapshot(r) for r in range(1, current + 1)]
        peers = self._peers_snapshot()
        last_round, last_digest = self.last_finalized()
        return {
            "address": self.address,
            "chain_id": self._read(lambda: self.w3.eth.chain_id, "chain_id"),
            "block": self.block_number(),
            "params": _params_json(p),
            "current_round": current,
            "last_finalized": {"round": last_round, "digest": last_digest.hex()},
            "rounds": rounds,
            "peers": peers,
        }

    def _round_snapshot(self, r: int) -> dict[str, Any]:
        """One round of `snapshot`: its state, blocks, commitments and attestations."""
        info = self.round_info(r)
        return {
            "round": r,
            "state": info.state.name,
            "opened_block": info.opened_block,
            "closed_block": info.closed_block,
            "ended_block": info.ended_block,
            "participant_count": info.participant_count,
            "finalized_digest": info.finalized_digest.hex() if info.finalized_digest else None,
            "commitments": [_commitment_json(c) for c in self.commitments(r)],
            "attestations": [_attestation_json(a) for a in self.attestations(r)],
        }

    def _peers_snapshot(self) -> list[dict[str, Any]]:
        """Every registration of `snapshot`, whether it owns its peer id, and its eps spent."""
        registrations = self.registrations()
        owners = resolve(registrations, self.chain_id(), self.address)
        return [
            {
                "address": reg.address,
                "peer_id": reg.peer_id.hex(),
                "signature": reg.signature.hex(),
                "registration_ok": owners.get(reg.peer_id) == reg,
                "eps_spent_micro": (e := self.eps_spent(reg.address)),
                "eps_spent": eps_from_micro(e),
                "record_eps_spent_micro": (re := self.record_eps_spent(reg.address)),
                "record_eps_spent": eps_from_micro(re),
            }
            for reg in registrations
        ]


def _address_topic(address: str) -> str:
    """An indexed address as a log's topic holds it: 32 bytes, zero-padded on the left, lower-case hex."""
    return "0x" + "00" * 12 + address.lower().removeprefix("0x")


def _topic(log: Any, position: int) -> str | None:
    """A raw log's topic at `position`, lower-case, or None if it has none there."""
    topics = log.get("topics") if isinstance(log, dict) else None
    if not isinstance(topics, list) or len(topics) <= position or not isinstance(topics[position], str):
        return None
    return topics[position].lower()


def _over(log: Any, max_bytes: int) -> bool:
    """Whether a raw log's data is longer than one ABI-encoded `bytes` of `max_bytes` (its offset,
    its length, its bytes padded to 32), in hex."""
    data = log.get("data") if isinstance(log, dict) else None
    return isinstance(data, str) and len(data) > 2 + 2 * (64 + -(-max_bytes // 32) * 32)


def _params_json(p: SwarmParams) -> dict[str, Any]:
    return asdict(p) | {
        "genesis_digest": p.genesis_digest.hex(),
        "delta": p.delta,
        "eps_cap": p.eps_cap,
        "eps_step": eps_from_micro(p.eps_step_micro),
        "record_eps_cap": p.record_eps_cap,
        "record_delta": p.record_delta,
    }


def _commitment_json(c: Commitment) -> dict[str, Any]:
    described = describe_mechanism(c.mechanism)
    return {
        "peer": c.peer,
        "index": c.index,
        "digest": c.digest.hex(),
        "num_samples": c.num_samples,
        "eps_micro": c.eps_micro,
        "eps": c.eps,
        "record_eps_micro": c.record_eps_micro,
        "record_eps": c.record_eps,
        "block": c.block_number,
        "mechanism": c.mechanism.decode("utf-8", "replace"),
        "mechanism_name": described["name"],
        "protects": described["protects"],
    }


def _attestation_json(a: Attestation) -> dict[str, Any]:
    return {
        "peer": a.peer,
        "aggregate_digest": a.aggregate_digest.hex(),
        "included": a.included.hex(),
        "votes": a.votes,
        "block": a.block_number,
    }


def _commitment(event: dict[str, Any]) -> Commitment:
    """A Commitment from its `Committed` event."""
    args = event["args"]
    return Commitment(
        args["peer"],
        args["index"],
        bytes(args["digest"]),
        args["numSamples"],
        args["epsMicro"],
        bytes(args["mechanism"]),
        event["blockNumber"],
        args["recordEpsMicro"],
        args["round"],
    )


def constructor_settings(
    *,
    min_peers: int,
    commit_window: int,
    attest_window: int,
    commit_window_seconds: int,
    attest_window_seconds: int,
    eps_cap_micro: int,
    delta: float,
    genesis_digest: bytes,
    eps_step_micro: int,
    record_eps_cap_micro: int,
    record_delta: float,
    max_samples: int,
) -> tuple[int, ...]:
    """The constructor's settings tuple (deltas scaled to integers), after a ValueError naming the
    first setting the contract would refuse or misread."""
    for name, value, low in (
        ("min_peers", min_peers, 1),
        ("commit_window", commit_window, 1),
        ("attest_window", attest_window, 1),
        ("eps_cap_micro", eps_cap_micro, 1),
    ):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    if isinstance(max_samples, bool) or not isinstance(max_samples, int) or not 0 <= max_samples < 2**32:
        raise ValueError(f"max_samples must be an integer in [0, 2^32 - 1] (0 = 2^32 - 1), got {max_samples!r}")
    for name, value in (
        ("commit_window_seconds", commit_window_seconds),
        ("attest_window_seconds", attest_window_seconds),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**32:
            raise ValueError(f"{name} must be an integer in [1, 2^32 - 1] (a uint32 of seconds), got {value!r}")
    for name, value in (("eps_step_micro", eps_step_micro), ("record_eps_cap_micro", record_eps_cap_micro)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if eps_step_micro > eps_cap_micro:
        raise ValueError(f"eps_step_micro {eps_step_micro} is more than the cap {eps_cap_micro}")
    if not 0 <= record_delta < 1 or (record_eps_cap_micro > 0) != (record_delta > 0):
        raise ValueError("record_delta must be in (0, 1) with a record-level cap, and 0 without one")
    if len(genesis_digest) != 32 or int.from_bytes(genesis_digest, "big") <= 1:
        raise ValueError("genesis_digest must be 32 bytes (a sha256 digest), not 0 or 1")
    return (
        min_peers,
        commit_window,
        attest_window,
        eps_cap_micro,
        round(delta * DELTA_SCALE),
        eps_step_micro,
        record_eps_cap_micro,
        round(record_delta * DELTA_SCALE),
        max_samples,
        commit_window_seconds,
        attest_window_seconds,
    )


def _in_process_block_hash(w3: Web3, number: int) -> bytes | None:
    try:
        return bytes(w3.eth.get_block(number)["hash"])
    except BlockNotFound:
        return None
