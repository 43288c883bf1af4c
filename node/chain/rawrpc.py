"""The reads a peer makes most (the block number, whether the ledger emitted anything, the
ledger's views: `node.chain.codec`), as bare JSON-RPC over one kept-alive HTTP connection.

Why not web3: through web3 and requests one eth_blockNumber costs about 1 ms of CPU (middleware,
session, adapters); here about a seventh of that. A peer that polls the chain ten times a second
then stays idle (at most 2% of a core while it waits: docs/BENCHMARKS.md, "Round overhead").
Everything else (transactions, decoded event logs) goes through web3.

The head an endpoint reports is held to monotonic, bounded progress (`HeadGuard`), whichever way
it was read: one fabricated answer of block 50,002 on a chain at block 30 used to become the
admission registry's last scanned block, so every later registration and removal went unseen.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from node.chain.errors import LedgerError, LedgerUnavailable
from node.chain.retries import RateLimited, parse_retry_after

log = logging.getLogger("swarm.chain")

MAX_ANSWER_BYTES = 1 << 20  # a head or a view's answer is small; a larger one is not an RPC's
# logs of up to LOG_CHUNK_BLOCKS blocks (node.chain.client): a Committed log is about 1 kB of JSON
MAX_LOGS_ANSWER_BYTES = 64 << 20
# A head is taken without asking whether the endpoint serves it only within a credit of blocks: at
# most HEAD_SLACK, refilled at MAX_BLOCKS_PER_SECOND and spent by every head taken so (a token
# bucket), else only once the endpoint serves that block too (which refills the credit). A chain
# faster than that (a local chain stuffed with failing transactions made 163 blocks/s) pays one more
# read per head past the credit; a liar pushing heads each HEAD_SLACK ahead gains HEAD_SLACK once,
# then MAX_BLOCKS_PER_SECOND, however many it pushes (measured from the last head taken, the slack
# was granted again with every head: 10,000 pushes walked the head 640,000 blocks ahead).
MAX_BLOCKS_PER_SECOND = 50.0
HEAD_SLACK = 64
HEAD_REREADS = 2  # reads again of a head that is refused, before the endpoint is held unusable


class RawRPCUnavailable(ConnectionError):
    """The endpoint did not answer (a transient failure: `node.chain.retries` retries it). An
    HTTP 429 is `retries.RateLimited` instead: waited out after its Retry-After, not an outage."""


class RPCErrorAnswer(LedgerError):
    """The endpoint answered with a JSON-RPC error; `error` is that error object, unchecked (a
    revert's data, for `decoder.RevertDecoder`)."""

    def __init__(self, message: str, error: Any) -> None:
        super().__init__(message)
        self.error = error


class RawRPC:
    """One JSON-RPC endpoint over a persistent http(s) connection, safe to call from threads."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) RPC URL: {url!r}")
        if parts.username or parts.password:
            raise ValueError("RPC URLs with credentials are not supported by the raw reader")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._id = 0
        self.requests = 0  # HTTP requests sent (the per-round request count: docs/TESTNET.md)

    def call(self, method: str, params: list[Any], *, max_bytes: int = MAX_ANSWER_BYTES) -> Any:
        """The call's `result`; RPCErrorAnswer for an error answer, LedgerError for an answer
        longer than `max_bytes` or not JSON-RPC, RawRPCUnavailable if none came."""
        with self._lock:
            self._id += 1
            body = json.dumps({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params}).encode()
            try:
                raw = self._post(body, max_bytes)
            except RateLimited:
                raise  # the endpoint answered: asking again at once is the burst it refused
            except (OSError, http.client.HTTPException) as exc:  # one reconnect: a kept-alive socket may be stale
                self._close()
                try:
                    raw = self._post(body, max_bytes)
                except RateLimited:
                    raise
                except (OSError, http.client.HTTPException) as again:
                    self._close()
                    raise RawRPCUnavailable(f"{method}: {again}") from exc
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise LedgerError(f"{method}: the RPC answered something that is not JSON") from exc
        if not isinstance(answer, dict) or ("result" not in answer and "error" not in answer):
            raise LedgerError(f"{method}: unexpected answer {raw[:200]!r}")
        if "error" in answer:
            raise RPCErrorAnswer(f"{method}: {str(answer['error'])[:300]}", answer["error"])
        return answer["result"]

    def block_number(self) -> int:
        return parse_quantity(self.call("eth_blockNumber", []), "eth_blockNumber")

    def has_logs(self, address: str, from_block: int, to_block: int) -> bool:
        query = {"address": address, "fromBlock": hex(from_block), "toBlock": hex(to_block)}
        result = self.call("eth_getLogs", [query], max_bytes=MAX_LOGS_ANSWER_BYTES)
        if not isinstance(result, list):
            raise LedgerError(f"eth_getLogs: unexpected answer {str(result)[:200]}")
        return len(result) > 0

    def _post(self, body: bytes, max_bytes: int) -> bytes:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            self._conn = kind(self._host, self._port, timeout=self._timeout)
        self.requests += 1
        self._conn.request("POST", self._path, body=body, headers={"Content-Type": "application/json"})
        response = self._conn.getresponse()
        raw = response.read(max_bytes + 1)
        if response.status == 429:
            raise RateLimited("HTTP 429", parse_retry_after(response.getheader("Retry-After")))
        if response.status >= 500:
            raise http.client.HTTPException(f"HTTP {response.status}")
        if len(raw) > max_bytes:
            self._close()
            raise LedgerError(f"the RPC's answer is larger than {max_bytes} bytes")
        return raw

    def close(self) -> None:
        """Drop the kept-alive connection (a later call opens a new one)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class HeadRefused(LedgerUnavailable):
    """The endpoint keeps reporting a head it does not serve: it is treated as an endpoint that
    does not answer (callers wait and read again, for their own deadline)."""


class HeadGuard:
    """The chain head an endpoint reports, held to monotonic, bounded progress. A head behind the
    last one taken is refused and the last one stands (the nodes behind one load-balanced endpoint
    lag each other; a chain's head never goes back); one further ahead than the credit allows
    (HEAD_SLACK blocks at most, refilled at MAX_BLOCKS_PER_SECOND, spent by the heads taken
    without asking), or the first one, is taken only if the endpoint serves that block
    (`block_exists`), else read again (HEAD_REREADS times) and then refused with `HeadRefused`.
    Safe to call from threads."""

    def __init__(self, block_exists: Callable[[int], bool], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._exists = block_exists
        self._clock = clock
        self._lock = threading.Lock()
        self.last: int | None = None  # the last head taken
        self._credit = 0.0  # blocks a head may go past `last` without asking, as of `_credit_at`
        self._credit_at = 0.0  # clock() then

    def check(self, read: Callable[[], int]) -> int:
        """The head `read()` reports, once it passes; else the last one taken (a head that went
        back), or HeadRefused."""
        with self._lock:
            seen: list[int] = []
            for _ in range(HEAD_REREADS + 1):
                head = read()
                taken = self._within_credit(head)
                if taken is not None:
                    return taken
                now = self._clock()  # (before asking: a slow answer must not refill the credit)
                if self._exists(head):
                    self.last, self._credit, self._credit_at = head, float(HEAD_SLACK), now
                    return head
                seen.append(head)
            raise HeadRefused(
                f"the RPC reported head block {', '.join(map(str, seen))} but serves no such block "
                f"(last head taken: {self.last}): refused"
            )

    def take_at_once(self, head: int) -> int | None:
        """`check(lambda: head)` where it needs no read of the endpoint (a head at or behind the last
        one, or within the credit: a subscription's every head but the first and a far jump): the head
        taken; None where it would need one, or while a check holds the guard (the caller then
        calls `check` off its event loop). A subscription's head costs no thread hop this way
        (docs/SCALING.md: ~30 a round for a 16-peer swarm's peer, a quarter of its hops)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._within_credit(head)
        finally:
            self._lock.release()

    def _within_credit(self, head: int) -> int | None:
        """The head taken without asking whether the endpoint serves it (the lock held): the last one
        for a head at or behind it, `head` within the credit (spending it); None where the endpoint
        must be asked."""
        if self.last is None:
            return None
        if head <= self.last:
            if head < self.last:
                log.debug("the RPC reported head %d, behind %d already seen: refused", head, self.last)
            return self.last
        now = self._clock()
        credit = min(float(HEAD_SLACK), self._credit + MAX_BLOCKS_PER_SECOND * max(0.0, now - self._credit_at))
        if head - self.last > credit:
            return None
        self.last, self._credit, self._credit_at = head, credit - (head - self.last), now
        return head


def header_hash(answer: Any, number: int) -> bytes | None:
    """The hash in an eth_getBlockByNumber(number) answer; None if the endpoint has no such block."""
    if not isinstance(answer, dict) or ("result" not in answer and "error" not in answer):
        raise LedgerError(f"eth_getBlockByNumber: unexpected answer {str(answer)[:200]}")
    if "error" in answer:
        raise LedgerError(f"eth_getBlockByNumber: {str(answer['error'])[:300]}")
    header = answer["result"]
    if header is None:
        return None
    if not isinstance(header, dict) or parse_quantity(header.get("number"), "eth_getBlockByNumber") != number:
        raise LedgerError(f"eth_getBlockByNumber({number}): the RPC answered another block: {str(header)[:200]}")
    return parse_hash32(header.get("hash"), f"eth_getBlockByNumber({number}) hash")


def parse_hash32(value: Any, what: str) -> bytes:
    """A JSON-RPC 32-byte hash ("0x" and 64 hex digits)."""
    if not isinstance(value, str) or not value.startswith("0x") or len(value) != 66:
        raise LedgerError(f"{what}: not a 32-byte hash: {str(value)[:80]}")
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        raise LedgerError(f"{what}: not hex: {value[:80]}") from None


def parse_quantity(result: Any, what: str) -> int:
    """A JSON-RPC quantity ("0x1f"; in-process providers give the int itself), bounded to 64 bits."""
    if isinstance(result, int) and not isinstance(result, bool) and 0 <= result < 2**64:
        return result
    if not isinstance(result, str) or not result.startswith("0x") or not 2 < len(result) <= 18:
        raise LedgerError(f"{what}: unexpected answer {str(result)[:200]}")
    return int(result, 16)
