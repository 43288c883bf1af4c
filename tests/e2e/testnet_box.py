"""A testnet in a box: a real Anvil behind an HTTP JSON-RPC proxy that behaves like a hosted
endpoint of a public chain, and a thread that does to the chain what public chains do.

`RpcProxy` (in front of any JSON-RPC URL) answers each request after a latency with jitter,
refuses bursts past a token bucket with HTTP 429 and a Retry-After, and serves the logs of a
block only `log_lag_s` after it first saw that block (eth_getLogs answers leave them out until
then, as an indexing node does). `ChainChaos` (on the Anvil itself) reorganises the chain
(`anvil_reorg`, 1 to 3 blocks deep, each removed transaction included again in the new blocks or
dropped) and raises the next block's base fee tenfold, at random moments from a seeded generator.

What it cannot reproduce is in docs/TESTNET.md ("The testnet in a box")."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


@dataclass
class ProxyFaults:
    """What the proxy does to each request. Rates are per second, times in seconds."""

    latency_s: float = 0.15  # mean added before each answer
    jitter_s: float = 0.05  # uniform +- around the mean
    rate: float = 0.0  # requests per second the bucket refills with; 0 = no rate limit
    burst: int = 20  # bucket size: a burst past it is refused
    retry_after: str = "1"  # the Retry-After header sent with a 429
    log_lag_s: float = 0.0  # a block's logs are served this long after the proxy first saw the block
    seed: int = 0


@dataclass
class ProxyStats:
    requests: int = 0
    refused: int = 0  # answered 429
    logs_held_back: int = 0  # log entries left out of an eth_getLogs answer (too new)
    by_method: dict[str, int] = field(default_factory=dict)


class RpcProxy:
    """An HTTP JSON-RPC proxy on a free loopback port in front of `upstream`."""

    def __init__(self, upstream: str, faults: ProxyFaults | None = None) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.faults = faults or ProxyFaults()
        self.stats = ProxyStats()
        self._random = random.Random(self.faults.seed)
        self._lock = threading.Lock()
        self._tokens = float(self.faults.burst)
        self._refilled = time.monotonic()
        self._forced_refusals = 0
        self._hooks: dict[str, Callable[[], None]] = {}  # method -> run once before the next such request
        self._first_seen: dict[int, float] = {}  # block number -> when the proxy first saw it
        self._local = threading.local()  # one upstream connection per serving thread
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers, answer = proxy.handle(body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> RpcProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def before_next(self, method: str, hook: Callable[[], None]) -> None:
        """Run `hook` once, before the next `method` request is forwarded (a spike between a
        transaction's fee quote and its send, say)."""
        with self._lock:
            self._hooks[method] = hook

    def refuse_next(self, n: int) -> None:
        """Answer the next `n` requests with 429, whatever the bucket holds."""
        with self._lock:
            self._forced_refusals += n

    def handle(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        f = self.faults
        with self._lock:
            self.stats.requests += 1
            pause = max(0.0, f.latency_s + self._random.uniform(-f.jitter_s, f.jitter_s))
            refuse = self._take_token()
            if refuse:
                self.stats.refused += 1
        time.sleep(pause)
        if refuse:
            error = {"jsonrpc": "2.0", "id": None, "error": {"code": 429, "message": "Too Many Requests"}}
            return 429, {"Retry-After": f.retry_after}, json.dumps(error).encode()
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        method = request.get("method") if isinstance(request, dict) else None
        with self._lock:
            self.stats.by_method[str(method)] = self.stats.by_method.get(str(method), 0) + 1
            hook = self._hooks.pop(str(method), None)
        if hook is not None:
            hook()
        answer = self._forward(body)
        if method == "eth_getLogs" and f.log_lag_s > 0:
            answer = self._hold_back_new_logs(answer)
        return 200, {}, answer

    def _take_token(self) -> bool:
        """True if this request is refused (called under the lock)."""
        if self._forced_refusals > 0:
            self._forced_refusals -= 1
            return True
        if self.faults.rate <= 0:
            return False
        now = time.monotonic()
        self._tokens = min(float(self.faults.burst), self._tokens + (now - self._refilled) * self.faults.rate)
        self._refilled = now
        if self._tokens < 1:
            return True
        self._tokens -= 1
        return False

    def _forward(self, body: bytes) -> bytes:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        for _ in range(2):  # a kept-alive connection may have gone stale
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(*self._upstream, timeout=30)
            try:
                conn.request("POST", "/", body=body, headers={"Content-Type": "application/json"})
                return conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = self._local.conn = None
        raise ConnectionError("upstream did not answer")

    def _hold_back_new_logs(self, answer: bytes) -> bytes:
        """Leave out of an eth_getLogs answer the logs of blocks seen less than log_lag_s ago."""
        head = int(json.loads(self._forward(_request("eth_blockNumber", [])))["result"], 16)
        now = time.monotonic()
        with self._lock:
            newest = max(self._first_seen, default=head - 1)
            for number in range(newest + 1, head + 1):
                self._first_seen[number] = now
            fresh = {n for n, seen in self._first_seen.items() if now - seen < self.faults.log_lag_s}
        decoded = json.loads(answer)
        logs = decoded.get("result") if isinstance(decoded, dict) else None
        if not isinstance(logs, list) or not fresh:
            return answer
        kept = [e for e in logs if int(e.get("blockNumber", "0x0"), 16) not in fresh]
        with self._lock:
            self.stats.logs_held_back += len(logs) - len(kept)
        decoded["result"] = kept
        return json.dumps(decoded).encode()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that drops its connection (a peer stopping, a timeout) is no news."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _request(method: str, params: list[Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()


def rpc(url: str, method: str, params: list[Any] | None = None) -> Any:
    """One JSON-RPC call straight to `url` (the box's own calls to the Anvil behind the proxy)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=30)
    try:
        conn.request("POST", "/", body=_request(method, params or []), headers={"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    if "error" in answer:
        raise RuntimeError(f"{method}: {answer['error']}")
    return answer["result"]


@dataclass
class ChaosLog:
    reorgs: list[tuple[int, int, int]] = field(default_factory=list)  # (depth, re-included, dropped)
    spikes: int = 0


class ChainChaos:
    """Reorganises the chain behind the proxy and spikes its base fee, every `every_s` seconds
    on average (exponential gaps from `seed`). A reorganisation removes the last 1 to `max_depth`
    blocks; each transaction in them is included again in the new blocks with probability
    `reinclude`, else dropped (its sender must notice and send it again)."""

    def __init__(
        self,
        anvil_url: str,
        *,
        every_s: float = 6.0,
        max_depth: int = 3,
        reinclude: float = 0.5,
        spike_every_s: float = 8.0,
        seed: int = 0,
    ) -> None:
        self.url = anvil_url
        self.every_s, self.max_depth, self.reinclude, self.spike_every_s = every_s, max_depth, reinclude, spike_every_s
        self.log = ChaosLog()
        self._random = random.Random(seed)
        self._lock = threading.Lock()  # one change of the chain at a time (a test's own, and the thread's)
        self._calm_base_fee: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chain-chaos", daemon=True)

    def start(self) -> ChainChaos:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def reorg(self, depth: int, *, reinclude: float | None = None) -> tuple[int, int]:
        """Replace the last `depth` blocks; returns (transactions included again, dropped)."""
        with self._lock:
            return self._reorg(depth, self.reinclude if reinclude is None else reinclude)

    def _reorg(self, depth: int, share: float) -> tuple[int, int]:
        head = int(rpc(self.url, "eth_blockNumber"), 16)
        depth = min(depth, head)
        again: list[list[Any]] = []
        dropped = 0
        for offset, number in enumerate(range(head - depth + 1, head + 1)):
            block = rpc(self.url, "eth_getBlockByNumber", [hex(number), False])
            for tx_hash in block["transactions"]:
                if self._random.random() < share:
                    again.append([rpc(self.url, "eth_getRawTransactionByHash", [tx_hash]), offset])
                else:
                    dropped += 1
        rpc(self.url, "anvil_reorg", [depth, again])
        self.log.reorgs.append((depth, len(again), dropped))
        return len(again), dropped

    def spike(self, factor: int = 10) -> None:
        """The next block's base fee `factor` times the calm one (the latest base fee when no spike
        was made yet: spikes do not compound; the fee then falls back by 12.5% a block)."""
        with self._lock:
            if self._calm_base_fee is None:
                latest = rpc(self.url, "eth_getBlockByNumber", ["latest", False])
                self._calm_base_fee = max(1, int(latest["baseFeePerGas"], 16))
            rpc(self.url, "anvil_setNextBlockBaseFeePerGas", [hex(self._calm_base_fee * factor)])
            self.log.spikes += 1

    def _run(self) -> None:
        next_reorg = time.monotonic() + self._random.expovariate(1 / self.every_s)
        next_spike = time.monotonic() + self._random.expovariate(1 / self.spike_every_s)
        while not self._stop.wait(0.1):
            now = time.monotonic()
            with contextlib.suppress(Exception):  # the chain stopping under us ends nothing
                if now >= next_reorg:
                    next_reorg = now + self._random.expovariate(1 / self.every_s)
                    self.reorg(self._random.randint(1, self.max_depth))
                if now >= next_spike:
                    next_spike = now + self._random.expovariate(1 / self.spike_every_s)
                    self.spike()


@contextlib.contextmanager
def rpc_proxy(upstream: str, faults: ProxyFaults | None = None) -> Iterator[RpcProxy]:
    proxy = RpcProxy(upstream, faults).start()
    try:
        yield proxy
    finally:
        proxy.close()
