"""A lying JSON-RPC endpoint for the tests: an HTTP proxy in front of a real one (Anvil) that
forwards every call, except the methods a test tells it to answer otherwise. A lying RPC provider
is the fault; it cannot be caused on a real chain, so this proxy is it."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

# A lie: (the call's params, a function that forwards the call and returns the real result) -> the
# result to answer.
Lie = Callable[[list[Any], Callable[[], Any]], Any]


class LyingRPC:
    """Forwards JSON-RPC calls to `target`; `lies[method]` answers that method instead. `calls`
    counts the calls of each method it saw."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self.lies: dict[str, Lie] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the clients use it

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = json.loads(body)
                answer = [proxy._answer(r) for r in request] if isinstance(request, list) else proxy._answer(request)
                raw = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def forward(self, request: dict[str, Any]) -> dict[str, Any]:
        """The real endpoint's answer to one request."""
        conn = http.client.HTTPConnection(self._host, self._port, timeout=30)
        try:
            conn.request("POST", "/", json.dumps(request).encode(), {"Content-Type": "application/json"})
            answer: dict[str, Any] = json.loads(conn.getresponse().read())
            return answer
        finally:
            conn.close()

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        method = request.get("method", "")
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            lie = self.lies.get(method)
        if lie is None:
            return self.forward(request)

        def real() -> Any:
            return self.forward(request).get("result")

        return {"jsonrpc": "2.0", "id": request.get("id"), "result": lie(list(request.get("params") or []), real)}


@contextmanager
def lying_rpc(target: str) -> Iterator[LyingRPC]:
    proxy = LyingRPC(target)
    thread = threading.Thread(target=proxy._server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy._server.shutdown()
        proxy._server.server_close()
