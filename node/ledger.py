"""Python client of the SwarmLedger contract (contracts/SwarmLedger.sol) on any EVM JSON-RPC chain.

    w3 = connect("http://127.0.0.1:8545")
    ledger = LedgerClient.deploy(w3, account, min_peers=3, commit_window=5, attest_window=5,
                                 eps_cap_micro=10_000_000, delta=1e-5, genesis_digest=digest)
    ledger.register(peer_id)
    ledger.commit(ledger.current_round(), blob_digest, 600, 1_000_000, mechanism_json)

Every transaction is estimated first (a revert there raises the contract's custom error as a
`LedgerError` subclass without spending gas), sent with a margin on the gas estimate (Anvil
under-estimates deployments, PLATFORM.md), awaited with a timeout and checked for status 1.
Nonces are tracked locally so back-to-back transactions from one account never collide; transient
RPC failures (connection refused or reset, timeouts, HTTP 429/5xx) are retried with exponential
backoff. The client is synchronous and thread-safe: call it from `trio.to_thread.run_sync`.
"""
from __future__ import annotations

import enum
import json
import threading
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, TypeVar

ARTIFACT = Path(__file__).resolve().parent.parent / "contracts" / "build" / "SwarmLedger.json"
GAS_MARGIN = 1.25  # multiply estimates: Anvil's deployment estimate came out 2% short
GAS_PAD = 20_000  # plus a constant, for small transactions whose estimate is tight
DEFAULT_TX_TIMEOUT_S = 120.0
RETRIES = 5
BACKOFF_S = 0.2
LOG_CHUNK_BLOCKS = 10_000
DELTA_SCALE = 10**18
EPS_SCALE = 10**6

T = TypeVar("T")


# --------------------------------------------------------------------------- errors


class LedgerError(Exception):
    """A ledger operation failed. Contract refusals are subclasses named after the custom error."""

    def __init__(self, message: str, **fields: Any):
        super().__init__(message)
        self.fields = fields


class LedgerUnavailable(LedgerError):
    """The RPC endpoint did not answer (after retries)."""


class LedgerTimeout(LedgerError):
    """A transaction was sent but no receipt came within the timeout."""


class TransactionFailed(LedgerError):
    """A transaction was mined with status 0 and the reason could not be decoded."""


class ContractRefusal(LedgerError):
    """The contract refused with one of its custom errors; `fields` holds the error's arguments."""

    template = "{name}"

    def __init__(self, **fields: Any):
        super().__init__(self.template.format(**fields), **fields)


def _refusal(name: str, template: str) -> type[ContractRefusal]:
    cls = type(name, (ContractRefusal,), {"template": template, "__doc__": template})
    cls.__module__ = __name__
    return cls


InvalidParams = _refusal("InvalidParams", "invalid deployment parameter {name}")
NotDeployer = _refusal("NotDeployer", "{sender} is not the deployer: only the deployer manages the allowlist")
NotAllowed = _refusal("NotAllowed", "{account} is not on the swarm's allowlist")
NotRegistered = _refusal("NotRegistered", "{account} is not registered: call register(peer_id) first")
AlreadyRegistered = _refusal("AlreadyRegistered", "{account} is already registered")
PeerIdTaken = _refusal("PeerIdTaken", "peer id 0x{peerId} is already registered by {owner}")
InvalidPeerId = _refusal("InvalidPeerId", "peer id must be 1 to 128 bytes, got {length}")
WrongRound = _refusal("WrongRound", "round {given} is not the current round {current}")
AlreadyCommitted = _refusal("AlreadyCommitted", "{peer} already committed in round {round}")
CommitWindowClosed = _refusal("CommitWindowClosed", "round {round} no longer takes commitments")
CommitWindowOpen = _refusal("CommitWindowOpen", "round {round}: the commit window lasts until block {lastBlock}")
QuorumNotMet = _refusal("QuorumNotMet", "round {round}: {committed} of {minPeers} needed peers committed; the window extends")
EpsDecreasing = _refusal("EpsDecreasing", "cumulative eps may not decrease: {previousMicro} -> {givenMicro} micro-eps")
EpsOverCap = _refusal("EpsOverCap", "cumulative eps {givenMicro} micro-eps passes the swarm's cap {capMicro}")
InvalidDigest = _refusal("InvalidDigest", "digest 0x{digest} is not allowed (0 and 1 are reserved)")
InvalidNumSamples = _refusal("InvalidNumSamples", "numSamples must be 1 to 2^32 - 1, got {numSamples}")
RoundNotOpen = _refusal("RoundNotOpen", "round {round} is not open (it is {state})")
RoundNotClosed = _refusal("RoundNotClosed", "round {round} is not closed (it is {state})")
NotParticipant = _refusal("NotParticipant", "{account} did not commit in round {round}")
AlreadyAttested = _refusal("AlreadyAttested", "{peer} already attested in round {round}")
MalformedBitmap = _refusal("MalformedBitmap", "round {round}: bitmap of {length} bytes, expected {expectedLength} with no bit past the last participant")
AbortTooEarly = _refusal("AbortTooEarly", "round {round}: the attestation window lasts until block {lastBlock}")
RoundAlreadyFinalized = _refusal("RoundAlreadyFinalized", "round {round} is finalized and cannot be aborted")

REFUSALS: dict[str, type[ContractRefusal]] = {
    cls.__name__: cls for cls in ContractRefusal.__subclasses__()
}


# --------------------------------------------------------------------------- records


class RoundState(enum.IntEnum):
    OPEN = 0
    CLOSED = 1
    FINALIZED = 2
    ABORTED = 3


@dataclass(frozen=True)
class SwarmParams:
    min_peers: int
    commit_window: int
    attest_window: int
    eps_cap_micro: int
    delta_e18: int
    genesis_digest: bytes
    allowlist_enabled: bool
    deployer: str
    deploy_block: int

    @property
    def delta(self) -> float:
        return self.delta_e18 / DELTA_SCALE

    @property
    def eps_cap(self) -> float:
        return self.eps_cap_micro / EPS_SCALE


@dataclass(frozen=True)
class RoundInfo:
    round: int
    state: RoundState
    opened_block: int
    closed_block: int  # 0 while open
    ended_block: int  # block it was finalized or aborted in; 0 while open or closed
    participant_count: int
    finalized_digest: bytes | None  # None unless finalized


@dataclass(frozen=True)
class Commitment:
    peer: str
    index: int
    digest: bytes
    num_samples: int
    eps_micro: int
    mechanism: bytes  # the canonical JSON as committed (from the Committed event)
    block_number: int

    @property
    def eps(self) -> float:
        return self.eps_micro / EPS_SCALE


@dataclass(frozen=True)
class Attestation:
    peer: str
    aggregate_digest: bytes
    included: bytes
    votes: int  # votes for (aggregate_digest, included) after this attestation
    block_number: int


# Which part of the shared update a mechanism's eps bounds, when its JSON does not say.
# PRIVACY.md: PNPM's density ratio holds between the two signs only; |w| is released exactly.
PROTECTS_BY_NAME = {"pnpm": "sign only (no eps for the values)"}
# The mechanisms package's own vocabulary (Guarantee.protects), spelled out.
PROTECTS_WORDS = {"sign": PROTECTS_BY_NAME["pnpm"], "value": "the values"}
UNKNOWN_PROTECTS = "not stated by the mechanism"


def describe_mechanism(raw: bytes) -> dict:
    """Parse committed mechanism bytes: {"name", "protects", "params"}, tolerant of anything.

    "protects" comes from the JSON's own "protects" field if present, else from the known names
    table, else says it is not stated. Bytes that are not a JSON object give name "unparsed".
    """
    try:
        params = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"name": "unparsed", "protects": UNKNOWN_PROTECTS, "params": None}
    if not isinstance(params, dict):
        return {"name": "unparsed", "protects": UNKNOWN_PROTECTS, "params": params}
    name = str(params.get("name") or params.get("mechanism") or "unnamed")
    protects = params.get("protects")
    if isinstance(protects, str) and protects:
        protects = PROTECTS_WORDS.get(protects.lower(), protects)
    else:
        protects = PROTECTS_BY_NAME.get(name.lower(), UNKNOWN_PROTECTS)
    return {"name": name, "protects": protects, "params": params}


def decode_bitmap(included: bytes, count: int) -> list[bool]:
    """Bit i (lowest bit of byte 0 first) is participant i."""
    return [bool(included[i // 8] >> (i % 8) & 1) for i in range(count)]


def encode_bitmap(flags: list[bool]) -> bytes:
    """The inclusion bitmap for flags[i] = participant i included (bytes of ceil(n / 8))."""
    out = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


# --------------------------------------------------------------------------- plumbing


@lru_cache(maxsize=1)
def load_artifact() -> dict:
    try:
        return json.loads(ARTIFACT.read_text())
    except OSError as exc:
        raise LedgerError(f"contract artifact missing ({ARTIFACT}): run python scripts/compile_contracts.py") from exc


def connect(rpc_url: str, *, timeout: float = 10.0):
    """A synchronous Web3 on `rpc_url` (http(s) only), checked to answer."""
    from web3 import HTTPProvider, Web3

    if not rpc_url.startswith(("http://", "https://")):
        raise ValueError(f"rpc_url must be an http(s) URL, got {rpc_url!r}")
    # The client retries itself (with backoff, and without re-sending a transaction blindly).
    w3 = Web3(HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}, exception_retry_configuration=None))
    _with_retries(lambda: w3.eth.chain_id, what=f"connect to {rpc_url}")
    return w3


def _is_transient(exc: BaseException) -> bool:
    import requests

    if isinstance(exc, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return exc.response.status_code == 429 or exc.response.status_code >= 500
    return False


def _with_retries(call: Callable[[], T], *, what: str, retries: int = RETRIES) -> T:
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as exc:
            if not _is_transient(exc):
                raise
            if attempt == retries:
                raise LedgerUnavailable(f"{what}: no answer after {retries + 1} attempts ({exc})") from exc
            time.sleep(BACKOFF_S * 2**attempt)
    raise AssertionError("unreachable")


def _hex_field(value: Any) -> Any:
    return value.hex() if isinstance(value, (bytes, bytearray)) else value


class _ErrorDecoder:
    """Maps 4-byte selectors of the ABI's custom errors to LedgerError subclasses."""

    def __init__(self, abi: list[dict]):
        from eth_utils import keccak

        self._by_selector = {}
        for item in abi:
            if item["type"] != "error":
                continue
            types = [i["type"] for i in item["inputs"]]
            selector = keccak(text=f"{item['name']}({','.join(types)})")[:4]
            self._by_selector[selector] = (item["name"], types, [i["name"] for i in item["inputs"]])

    def decode(self, data: Any) -> LedgerError | None:
        from eth_abi import decode as abi_decode

        if isinstance(data, str):
            try:
                data = bytes.fromhex(data.removeprefix("0x"))
            except ValueError:
                return None
        if not isinstance(data, (bytes, bytearray)) or len(data) < 4 or bytes(data[:4]) not in self._by_selector:
            return None
        name, types, names = self._by_selector[bytes(data[:4])]
        values = abi_decode(types, bytes(data[4:]))
        from eth_utils import to_checksum_address

        fields = {n: to_checksum_address(v) if t == "address" else _hex_field(v)
                  for n, t, v in zip(names, types, values)}
        if "state" in fields:
            fields["state"] = RoundState(fields["state"]).name
        cls = REFUSALS.get(name)
        return cls(**fields) if cls else LedgerError(f"contract refused: {name}{fields}", **fields)

    def from_exception(self, exc: BaseException | None) -> LedgerError | None:
        """Find revert data in the exception or its causes (eth-tester nests it)."""
        seen = 0
        while exc is not None and seen < 8:
            for data in (getattr(exc, "data", None), *getattr(exc, "args", ())):
                found = self.decode(data)
                if found:
                    return found
            exc, seen = exc.__cause__ or exc.__context__, seen + 1
        return None


# --------------------------------------------------------------------------- client


class LedgerClient:
    """One SwarmLedger deployment. `account` None gives a read-only client."""

    def __init__(self, w3, address: str, account=None, *, tx_timeout: float = DEFAULT_TX_TIMEOUT_S):
        from web3 import Web3

        artifact = load_artifact()
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.account = account
        self.tx_timeout = tx_timeout
        self.contract = w3.eth.contract(address=self.address, abi=artifact["abi"])
        self._errors = _ErrorDecoder(artifact["abi"])
        self._tx = _Sender(w3, account, self._errors, tx_timeout) if account is not None else None
        self.gas_used: dict[str, int] = {}  # last receipt's gasUsed per function, for benchmarks
        code = self._read(lambda: w3.eth.get_code(self.address), "get_code")
        if len(code) == 0:
            raise LedgerError(f"no contract at {self.address} on chain {self._read(lambda: w3.eth.chain_id, 'chain_id')}")

    # ---------------------------------------------------------------- deployment

    @classmethod
    def deploy(
        cls,
        w3,
        account,
        *,
        min_peers: int,
        commit_window: int,
        attest_window: int,
        eps_cap_micro: int,
        delta: float,
        genesis_digest: bytes,
        allowlist: list[str] | None = None,
        tx_timeout: float = DEFAULT_TX_TIMEOUT_S,
    ) -> "LedgerClient":
        """Deploy a new swarm ledger from `account` and return a client on it."""
        from web3 import Web3

        for name, value, low in (("min_peers", min_peers, 1), ("commit_window", commit_window, 1),
                                 ("attest_window", attest_window, 1), ("eps_cap_micro", eps_cap_micro, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not 0 <= delta < 1:
            raise ValueError(f"delta must be in [0, 1), got {delta!r}")
        if len(genesis_digest) != 32 or int.from_bytes(genesis_digest, "big") <= 1:
            raise ValueError("genesis_digest must be 32 bytes (a sha256 digest), not 0 or 1")
        artifact = load_artifact()
        factory = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
        constructor = factory.constructor(
            min_peers, commit_window, attest_window, eps_cap_micro, round(delta * DELTA_SCALE),
            bytes(genesis_digest), [Web3.to_checksum_address(a) for a in allowlist or []],
        )
        sender = _Sender(w3, account, _ErrorDecoder(artifact["abi"]), tx_timeout)
        receipt = sender.send(constructor, "deploy")
        client = cls(w3, receipt["contractAddress"], account, tx_timeout=tx_timeout)
        client._tx = sender  # keeps its nonce count
        client.gas_used["deploy"] = receipt["gasUsed"]
        return client

    # ---------------------------------------------------------------- transactions

    def register(self, peer_id: bytes):
        """Register this account with its libp2p peer id bytes."""
        return self._transact("register", bytes(peer_id))

    def commit(self, round: int, digest: bytes, num_samples: int, eps_micro: int, mechanism: bytes):
        """Commit the digest of this round's published update and the cumulative eps after it."""
        return self._transact("commit", round, bytes(digest), num_samples, eps_micro, bytes(mechanism))

    def close_round(self, round: int):
        """Close the round (anyone) once its window has passed with quorum."""
        return self._transact("closeRound", round)

    def attest(self, round: int, aggregate_digest: bytes, included: bytes):
        """Attest the aggregate computed for a closed round and the bitmap of included blobs."""
        return self._transact("attest", round, bytes(aggregate_digest), bytes(included))

    def abort_round(self, round: int):
        """Abort a closed round whose attestation window passed without a majority (anyone)."""
        return self._transact("abortRound", round)

    def allow(self, accounts: list[str]):
        """Deployer only: add accounts to the allowlist."""
        from web3 import Web3

        return self._transact("allow", [Web3.to_checksum_address(a) for a in accounts])

    def disallow(self, account: str):
        """Deployer only: remove an account from the allowlist (it can no longer commit)."""
        from web3 import Web3

        return self._transact("disallow", Web3.to_checksum_address(account))

    def _transact(self, fn_name: str, *args):
        if self._tx is None:
            raise LedgerError("this client is read-only (no account): it cannot send transactions")
        receipt = self._tx.send(getattr(self.contract.functions, fn_name)(*args), fn_name)
        self.gas_used[fn_name] = receipt["gasUsed"]
        return receipt

    # ---------------------------------------------------------------- views

    def _read(self, call: Callable[[], T], what: str) -> T:
        return _with_retries(call, what=what)

    def _view(self, fn_name: str, *args):
        fn = getattr(self.contract.functions, fn_name)(*args)
        try:
            return self._read(fn.call, fn_name)
        except LedgerError:
            raise
        except Exception as exc:
            decoded = self._errors.from_exception(exc)
            if decoded:
                raise decoded from None
            raise

    def block_number(self) -> int:
        return self._read(lambda: self.w3.eth.block_number, "block_number")

    def params(self) -> SwarmParams:
        p = self._view("params")
        return SwarmParams(p[0], p[1], p[2], p[3], p[4], bytes(p[5]), p[6], p[7], p[8])

    def current_round(self) -> int:
        return self._view("currentRound")

    def last_finalized(self) -> tuple[int, bytes]:
        """(last finalized round, its digest); (0, genesis digest) before any."""
        r, digest = self._view("lastFinalized")
        return r, bytes(digest)

    def round_info(self, round: int) -> RoundInfo:
        s, opened, closed, ended, count, digest = self._view("roundInfo", round)
        state = RoundState(s)
        return RoundInfo(round, state, opened, closed, ended, count,
                         bytes(digest) if state is RoundState.FINALIZED else None)

    def participants(self, round: int) -> list[str]:
        return list(self._view("participants", round))

    def commitment_of(self, round: int, address: str) -> Commitment:
        """The stored commitment of `address` in `round` (mechanism bytes from the event)."""
        from web3 import Web3

        address = Web3.to_checksum_address(address)
        peer, index, digest, num_samples, eps_micro = self._view("commitmentOf", round, address)
        for c in self.commitments(round):
            if c.index == index:
                return c
        raise LedgerError(f"round {round}: no Committed event for {address} (the RPC's logs are incomplete)")

    def commitments(self, round: int) -> list[Commitment]:
        """All commitments of `round` in participant order, from the Committed events, checked
        against the participant list in storage."""
        info = self.round_info(round)
        to_block = info.closed_block or self.block_number()
        logs = self._logs("Committed", info.opened_block, to_block, {"round": round})
        found = sorted(
            (Commitment(e.args.peer, e.args.index, bytes(e.args.digest), e.args.numSamples,
                        e.args.epsMicro, bytes(e.args.mechanism), e.blockNumber) for e in logs),
            key=lambda c: c.index,
        )
        stored = self.participants(round)
        if [c.peer for c in found] != stored:
            raise LedgerError(f"round {round}: Committed events do not match the stored participant list")
        return found

    def attestations(self, round: int) -> list[Attestation]:
        info = self.round_info(round)
        if info.state is RoundState.OPEN:
            return []
        to_block = info.ended_block or self.block_number()
        logs = self._logs("Attested", info.closed_block, to_block, {"round": round})
        return [Attestation(e.args.peer, bytes(e.args.aggregateDigest), bytes(e.args.included), e.args.votes,
                            e.blockNumber) for e in logs]

    def commitment_digest(self, round: int, address: str) -> bytes:
        """Just the stored digest (one call, no event scan)."""
        from web3 import Web3

        return bytes(self._view("commitmentOf", round, Web3.to_checksum_address(address))[2])

    def eps_spent(self, address: str) -> int:
        """Cumulative eps committed by `address`, in micro-eps."""
        from web3 import Web3

        return self._view("epsSpent", Web3.to_checksum_address(address))

    def peer_id_of(self, address: str) -> bytes:
        from web3 import Web3

        return bytes(self._view("peerIdOf", Web3.to_checksum_address(address)))

    def address_of_peer_id(self, peer_id: bytes) -> str | None:
        found = self._view("addressOfPeerId", bytes(peer_id))
        return None if int(found, 16) == 0 else found

    def is_registered(self, address: str) -> bool:
        from web3 import Web3

        return self._view("isRegistered", Web3.to_checksum_address(address))

    def finalized_digest(self, round: int) -> bytes | None:
        digest = bytes(self._view("finalizedDigest", round))
        return None if digest == bytes(32) else digest

    def votes_for(self, round: int, aggregate_digest: bytes, included: bytes) -> int:
        return self._view("votesFor", round, bytes(aggregate_digest), bytes(included))

    def registered_count(self) -> int:
        return self._view("registeredCount")

    def registered_peers(self) -> list[tuple[str, bytes]]:
        """(address, peer id) of every registration, in order (from the Registered events)."""
        logs = self._logs("Registered", self.params().deploy_block, self.block_number(), None)
        return [(e.args.peer, bytes(e.args.peerId)) for e in logs]

    def _logs(self, event: str, from_block: int, to_block: int, filters: dict | None) -> list:
        found = []
        for start in range(from_block, to_block + 1, LOG_CHUNK_BLOCKS):
            end = min(to_block, start + LOG_CHUNK_BLOCKS - 1)
            getter = getattr(self.contract.events, event).get_logs
            found += self._read(lambda: getter(argument_filters=filters, from_block=start, to_block=end),
                                f"get_logs {event}")
        return sorted(found, key=lambda e: (e.blockNumber, e.logIndex))

    # ---------------------------------------------------------------- snapshot

    def snapshot(self) -> dict:
        """Everything a verifier needs, JSON-able: parameters, every round with its commitments
        (mechanism and what it protects), attestations and outcome, and every peer's eps."""
        p = self.params()
        current = self.current_round()
        rounds = []
        for r in range(1, current + 1):
            info = self.round_info(r)
            rounds.append({
                "round": r,
                "state": info.state.name,
                "opened_block": info.opened_block,
                "closed_block": info.closed_block,
                "ended_block": info.ended_block,
                "participant_count": info.participant_count,
                "finalized_digest": info.finalized_digest.hex() if info.finalized_digest else None,
                "commitments": [
                    {"peer": c.peer, "index": c.index, "digest": c.digest.hex(), "num_samples": c.num_samples,
                     "eps_micro": c.eps_micro, "eps": c.eps, "block": c.block_number,
                     "mechanism": c.mechanism.decode("utf-8", "replace"),
                     "mechanism_name": (d := describe_mechanism(c.mechanism))["name"],
                     "protects": d["protects"]}
                    for c in self.commitments(r)
                ],
                "attestations": [
                    {"peer": a.peer, "aggregate_digest": a.aggregate_digest.hex(), "included": a.included.hex(),
                     "votes": a.votes, "block": a.block_number}
                    for a in self.attestations(r)
                ],
            })
        peers = [
            {"address": addr, "peer_id": pid.hex(), "eps_spent_micro": (e := self.eps_spent(addr)),
             "eps_spent": e / EPS_SCALE}
            for addr, pid in self.registered_peers()
        ]
        last_round, last_digest = self.last_finalized()
        params = asdict(p) | {"genesis_digest": p.genesis_digest.hex(), "delta": p.delta, "eps_cap": p.eps_cap}
        return {
            "address": self.address,
            "chain_id": self._read(lambda: self.w3.eth.chain_id, "chain_id"),
            "block": self.block_number(),
            "params": params,
            "current_round": current,
            "last_finalized": {"round": last_round, "digest": last_digest.hex()},
            "rounds": rounds,
            "peers": peers,
        }


class _Sender:
    """Signs and sends one account's transactions: nonce tracking, gas margin, receipt wait."""

    def __init__(self, w3, account, errors: _ErrorDecoder, tx_timeout: float):
        self.w3 = w3
        self.account = account
        self.errors = errors
        self.tx_timeout = tx_timeout
        self._lock = threading.Lock()
        self._nonce: int | None = None

    def _refusal(self, exc: Exception) -> LedgerError | None:
        return self.errors.from_exception(exc)

    def _estimate(self, fn, label: str) -> int:
        """Estimate on the "pending" block, whose block.number is the one the transaction will
        see (window checks are off by one on "latest"); nodes without it (eth-tester) get "latest"."""
        sender = self.account.address
        try:
            return _with_retries(lambda: fn.estimate_gas({"from": sender}, block_identifier="pending"),
                                 what=f"estimate {label}")
        except Exception as exc:
            if self._refusal(exc) or "not been implemented" not in str(exc):
                raise
        return _with_retries(lambda: fn.estimate_gas({"from": sender}), what=f"estimate {label}")

    def send(self, fn, label: str) -> dict:
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
                raise LedgerError(f"{label}: the node refused the call: {exc}") from exc
            if self._nonce is None:
                self._nonce = _with_retries(
                    lambda: self.w3.eth.get_transaction_count(sender, "pending"), what="nonce")
            tx = _with_retries(
                lambda: fn.build_transaction({"from": sender, "nonce": self._nonce,
                                              "gas": int(estimate * GAS_MARGIN) + GAS_PAD}),
                what=f"build {label}")
            signed = self.account.sign_transaction(tx)
            tx_hash = self._send_raw(signed, label)
            self._nonce += 1
        receipt = self._wait(tx_hash, label)
        if receipt["status"] != 1:
            raise self._explain_failure(fn, receipt, label)
        return receipt

    def _send_raw(self, signed, label: str):
        for attempt in range(RETRIES + 1):
            try:
                return self.w3.eth.send_raw_transaction(signed.raw_transaction)
            except Exception as exc:
                text = str(exc).lower()
                if "already known" in text:  # an earlier attempt reached the node
                    return signed.hash
                if "nonce too low" in text or "nonce too high" in text:
                    # Another process used this account: resync once and fail clearly.
                    self._nonce = None
                    raise LedgerError(f"{label}: nonce out of sync for {self.account.address} "
                                      f"(is another process sending from this account?)") from exc
                if not _is_transient(exc) or attempt == RETRIES:
                    raise LedgerError(f"{label}: sending failed: {exc}") from exc
                time.sleep(BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")

    def _wait(self, tx_hash, label: str) -> dict:
        from web3.exceptions import TimeExhausted

        deadline = time.monotonic() + self.tx_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LedgerTimeout(f"{label}: no receipt for 0x{bytes(tx_hash).hex()} within {self.tx_timeout:.0f} s")
            try:
                return self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=remaining, poll_latency=0.02)
            except TimeExhausted:
                continue
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                time.sleep(BACKOFF_S)

    def _explain_failure(self, fn, receipt, label: str) -> LedgerError:
        """Status 0: replay the call on the block's resulting state to name the reason (the usual
        cause is a transaction earlier in the same block, e.g. someone else closed the round)."""
        block = receipt["blockNumber"]
        try:
            fn.call({"from": self.account.address}, block_identifier=block)
        except Exception as exc:
            refusal = self._refusal(exc)
            if refusal:
                return refusal
        return TransactionFailed(
            f"{label}: transaction 0x{bytes(receipt['transactionHash']).hex()} reverted in block {block} "
            f"(gas used {receipt['gasUsed']} of the limit sent)")
