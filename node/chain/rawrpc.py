"""The two reads a waiting peer makes several times a second (the block number, and whether the
ledger emitted anything), as bare JSON-RPC over one kept-alive HTTP connection.

Why not web3: through web3 and requests one eth_blockNumber costs about 1 ms of CPU (middleware,
session, adapters); here about a seventh of that. A peer that polls the chain ten times a second
then stays idle (at most 2% of a core while it waits: docs/BENCHMARKS.md, "Round overhead").
Anything else goes through web3.
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any
from urllib.parse import urlsplit

from node.chain.errors import LedgerError

MAX_ANSWER_BYTES = 1 << 20  # an answer to these two calls is tiny; a larger one is not an RPC's


class RawRPCUnavailable(ConnectionError):
    """The endpoint did not answer (a transient failure: `node.chain.retries` retries it)."""


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

    def call(self, method: str, params: list[Any]) -> Any:
        """The call's `result`; LedgerError for an error answer, RawRPCUnavailable if none came."""
        with self._lock:
            self._id += 1
            body = json.dumps({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params}).encode()
            try:
                raw = self._post(body)
            except (OSError, http.client.HTTPException) as exc:  # one reconnect: a kept-alive socket may be stale
                self._close()
                try:
                    raw = self._post(body)
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
            raise LedgerError(f"{method}: {str(answer['error'])[:300]}")
        return answer["result"]

    def block_number(self) -> int:
        return parse_quantity(self.call("eth_blockNumber", []), "eth_blockNumber")

    def has_logs(self, address: str, from_block: int, to_block: int) -> bool:
        query = {"address": address, "fromBlock": hex(from_block), "toBlock": hex(to_block)}
        result = self.call("eth_getLogs", [query])
        if not isinstance(result, list):
            raise LedgerError(f"eth_getLogs: unexpected answer {str(result)[:200]}")
        return len(result) > 0

    def _post(self, body: bytes) -> bytes:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            self._conn = kind(self._host, self._port, timeout=self._timeout)
        self._conn.request("POST", self._path, body=body, headers={"Content-Type": "application/json"})
        response = self._conn.getresponse()
        raw = response.read(MAX_ANSWER_BYTES + 1)
        if response.status == 429 or response.status >= 500:
            raise http.client.HTTPException(f"HTTP {response.status}")
        if len(raw) > MAX_ANSWER_BYTES:
            self._close()
            raise LedgerError(f"the RPC's answer is larger than {MAX_ANSWER_BYTES} bytes")
        return raw

    def close(self) -> None:
        """Drop the kept-alive connection (a later call opens a new one)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def parse_quantity(result: Any, what: str) -> int:
    """A JSON-RPC quantity ("0x1f"; in-process providers give the int itself), bounded to 64 bits."""
    if isinstance(result, int) and not isinstance(result, bool) and 0 <= result < 2**64:
        return result
    if not isinstance(result, str) or not result.startswith("0x") or not 2 < len(result) <= 18:
        raise LedgerError(f"{what}: unexpected answer {str(result)[:200]}")
    return int(result, 16)
