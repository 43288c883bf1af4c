"""The page's HTTP server: the standard library's ThreadingHTTPServer on 127.0.0.1, in a thread of
its own. Why not Starlette/uvicorn or aiohttp: the page needs four GET routes and one server-sent
events stream; the stdlib serves them without a dependency, and a thread keeps it clear of the
peer's trio loop (an asyncio server would need a loop of its own anyway).

Routes: `/` (the page), `/static/<name>` (a fixed set of packaged files: the page's script and
style, and the vendored uPlot), `/api/state` (one snapshot as JSON), `/events` (server-sent
events: the current state at once, then a `state` event whenever the snapshot changes, a comment
every 15 s to keep the connection open). Loopback only: the page shows peer addresses and the
run's figures.

The snapshot is read from the folder by a thread of its own every PUSH_SECONDS and requests are
answered from the last one, so a page gets its first data at once however loaded the machine is
(reading a big run's files takes seconds then). A page that goes away mid-answer is expected:
it ends that answer quietly, never with a traceback on the run's terminal."""

from __future__ import annotations

import json
import socket
import sys
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
PUSH_SECONDS = 0.5  # how often the folder is read again
KEEPALIVE_SECONDS = 5.0  # also how soon a stream whose page went away frees its thread
RETRY_MS = 1000  # how soon a page's EventSource reconnects after the stream dropped
GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout)  # the page went away
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
        try:
            self._write_response(status, content_type, body)
        except GONE:
            self.close_connection = True

    def _write_response(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
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
        retry = f"retry: {RETRY_MS}\n"  # sent with the first event
        try:
            while not dashboard.stopping.is_set():
                text = json.dumps(dashboard.state())
                if text != last:
                    self.wfile.write(f"event: state\ndata: {text}\n{retry}\n".encode())
                    retry = ""
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
        except GONE:
            pass  # the page was closed


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # open event streams must not keep the process alive
    dashboard: Dashboard
    streams: threading.BoundedSemaphore  # each stream holds a thread: a few tabs, not a flood

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:
        """One line instead of socketserver's traceback; nothing for a page that went away."""
        error = sys.exc_info()[1]
        if not isinstance(error, GONE):
            print(f"dashboard: a request failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


class Dashboard:
    """Serve the page for `folder` on 127.0.0.1:`port` (0 = any free port) from a thread.
    `live` says whether the run is still going (the page says so)."""

    def __init__(self, folder: Path, *, port: int = 0, live: bool = True) -> None:
        self.folder, self.live = Path(folder), live
        self.stopping = threading.Event()
        self._state_lock = threading.Lock()
        self._fresh = threading.Event()  # set once a snapshot has been read
        self._state: dict = {}
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._server.dashboard = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="dashboard-http", daemon=True)
        self._reader = threading.Thread(target=self._read_forever, name="dashboard-read", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def state(self) -> dict:
        """The last snapshot read (the first one is waited for)."""
        self._fresh.wait()
        with self._state_lock:
            return self._state

    def refresh(self) -> None:
        """Read the folder now (at the run's end: its last files are on the page at once)."""
        state = snapshot(self.folder, live=self.live)
        with self._state_lock:
            self._state = state
        self._fresh.set()

    def run_ended(self) -> None:
        """The run is over: the page says so, and is served on from the folder as it is."""
        self.live = False
        self.refresh()

    def _read_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                self.refresh()
            except Exception as exc:  # snapshot reads defensively; keep the last state, say why once
                print(f"dashboard: cannot read {self.folder}: {exc}", file=sys.stderr, flush=True)
                self._fresh.set()
                self.stopping.wait(10 * PUSH_SECONDS)
            self.stopping.wait(PUSH_SECONDS)

    def start(self) -> Dashboard:
        self._reader.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.stopping.is_set():
            return
        self.run_ended()  # the open pages get the last state before their streams end
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
