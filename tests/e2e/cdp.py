"""A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe): no
driver package and no debugging port. Chromium reads commands from fd 3 and writes replies and
events to fd 4, each message one JSON object ended by a NUL byte."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [  # the machine's note: quiet, offline-safe headless flags
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1600",
]


def chromium_available() -> bool:
    return os.access(CHROMIUM, os.X_OK)


class Browser:
    """One Chromium with one page; `evaluate` runs JavaScript in it, `screenshot` saves a PNG."""

    def __init__(self, url: str, profile: Path) -> None:
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()

        def child_fds() -> None:  # in the child: the command pipe on fd 3, the reply pipe on fd 4
            a = fcntl.fcntl(commands_read, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(replies_write, fcntl.F_DUPFD, 10)
            os.dup2(a, 3, inheritable=True)
            os.dup2(b, 4, inheritable=True)

        self.process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", url],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child_fds,  # runs before the fds outside pass_fds are closed
            pass_fds=(3, 4),
        )
        os.close(commands_read)
        os.close(replies_write)
        self._buffer = b""
        self._next_id = 0
        self.session = self._attach(url)

    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    def _receive(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(message))

    def _attach(self, url: str, timeout: float = 30.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pages = [t for t in self._send("Target.getTargets")["targetInfos"] if t["type"] == "page"]
            if pages:
                return str(
                    self._send("Target.attachToTarget", {"targetId": pages[0]["targetId"], "flatten": True})[
                        "sessionId"
                    ]
                )
            time.sleep(0.2)
        raise TimeoutError(f"chromium opened no page for {url}")

    def evaluate(self, expression: str) -> Any:
        result = self._send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, self.session)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float, interval: float = 0.25) -> Any:
        """The first truthy value of `expression`, polled (while the page is still loading, an
        evaluation can fail: that counts as not yet)."""
        end = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError as exc:
                if "execution context" not in str(exc):
                    raise
                value = None
            if value:
                return value
            if time.monotonic() > end:
                raise TimeoutError(f"{expression} stayed falsy for {timeout:g} s")
            time.sleep(interval)

    def resize(self, width: int, height: int) -> None:
        """Lay the page out as in a window of `width` x `height` CSS pixels."""
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self._send("Emulation.setDeviceMetricsOverride", metrics, self.session)

    def reload(self) -> None:
        """Reload the page (its open connections are dropped, as when a tab is closed)."""
        self._send("Page.reload", {"ignoreCache": True}, self.session)

    def screenshot(self, path: Path) -> None:
        data = self._send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, self.session)
        path.write_bytes(base64.b64decode(data["data"]))

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self._send("Browser.close")
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._replies)
