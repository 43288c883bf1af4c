"""The page's HTTP server: the standard library's ThreadingHTTPServer on 127.0.0.1, in a thread of
its own. Why not Starlette/uvicorn or aiohttp: the page needs four GET routes and one server-sent
events stream; the stdlib serves them without a dependency, and a thread keeps it clear of the
peer's trio loop (an asyncio server would need a loop of its own anyway).

Routes: `/` (the page), `/static/<name>` (a fixed set of packaged files: the page's script and
style, and the vendored uPlot), `/api/state` (one snapshot as JSON), `/events` (server-sent
events: a `state` event whenever the snapshot changes, a comment every 15 s to keep the
connection open). Loopback only: the page shows peer addresses and the run's figures."""

from __future__ import annotations

import json
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import ClassVar

from node.dashboard.snapshot import snapshot

STATIC = {  # name -> content type; nothing else is served
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uplot.min.js": "text/javascript; charset=utf-8",
    "uplot.min.css": "text/css; charset=utf-8",
}
PUSH_SECONDS = 0.5  # how often a stream re-reads the folder
KEEPALIVE_SECONDS = 15.0
MAX_STREAMS = 8  # open event streams at once (each holds a thread)
# Scripts and styles from this server only (no CDN, no inline script); uPlot sets element styles.
CSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"


def static_file(name: str) -> bytes:
    return resources.files("node.dashboard").joinpath("static", name).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    error_content_type = "text/plain; charset=utf-8"
    error_message_format = "%(code)d %(message)s\n"
    routes: ClassVar[dict[str, str]] = {"/": "index.html", "/index.html": "index.html"}

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's name)
        pass  # a page polls constantly: no access log on the run's terminal

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        port = self.server.dashboard.port
        if self.headers.get("Host") not in (f"127.0.0.1:{port}", f"localhost:{port}"):
            # DNS rebinding: a page from elsewhere whose name now resolves to 127.0.0.1 sends its own
            # host name; only a page of ours names this address and port
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST)
        elif path in self.routes:
            self._send(HTTPStatus.OK, STATIC["index.html"], static_file("index.html"))
        elif path.startswith("/static/") and path.removeprefix("/static/") in STATIC:
            name = path.removeprefix("/static/")
            self._send(HTTPStatus.OK, STATIC[name], static_file(name))
        elif path == "/api/state":
            body = json.dumps(self.server.dashboard.state()).encode()
            self._send(HTTPStatus.OK, "application/json", body)
        elif path == "/events":
            if not self.server.streams.acquire(blocking=False):
                self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, "too many open event streams")
                return
            try:
                self._stream()
            finally:
                self.server.streams.release()
        else:
            self.send_error(HTTPStatus.NOT_FOUND)

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _stream(self) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        dashboard = self.server.dashboard
        last, quiet_since = "", time.monotonic()
        try:
            while not dashboard.stopping.is_set():
                text = json.dumps(dashboard.state())
                if text != last:
                    self.wfile.write(f"event: state\ndata: {text}\n\n".encode())
                    self.wfile.flush()
                    last, quiet_since = text, time.monotonic()
                elif time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
                    self.wfile.write(b": keepalive\n\n")
                    self.wfile.flush()
                    quiet_since = time.monotonic()
                dashboard.stopping.wait(PUSH_SECONDS)
            text = json.dumps(dashboard.state())  # the last state (the run's end) before the server goes
            if text != last:
                self.wfile.write(f"event: state\ndata: {text}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page was closed


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # open event streams must not keep the process alive
    dashboard: Dashboard
    streams: threading.BoundedSemaphore  # each stream holds a thread: a few tabs, not a flood


class Dashboard:
    """Serve the page for `folder` on 127.0.0.1:`port` (0 = any free port) from a thread.
    `live` says whether the run is still going (the page says so)."""

    def __init__(self, folder: Path, *, port: int = 0, live: bool = True) -> None:
        self.folder, self.live = Path(folder), live
        self.stopping = threading.Event()
        self._state_lock = threading.Lock()
        self._state: dict | None = None
        self._state_at = 0.0
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._server.dashboard = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="dashboard-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def state(self) -> dict:
        """The snapshot, read at most once per PUSH_SECONDS however many pages poll or stream."""
        with self._state_lock:
            now = time.monotonic()
            if self._state is None or now - self._state_at >= PUSH_SECONDS or self.stopping.is_set():
                self._state = snapshot(self.folder, live=self.live and not self.stopping.is_set())
                self._state_at = now
            return self._state

    def start(self) -> Dashboard:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
