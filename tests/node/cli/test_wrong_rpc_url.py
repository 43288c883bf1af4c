"""Every command that takes --rpc-url, pointed at what is not a chain: a web server (HTTP answers, no
JSON-RPC), a dead port (it takes the connection and never answers) and a closed port (nothing
listens). Each answers in one line naming the URL and what to do, exit status 2, no traceback;
with -v the trace comes first and the same line last."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from node.chain.anvil import free_port

LEDGER = "0x" + "11" * 20


@pytest.fixture(scope="module")
def wrong_urls() -> Iterator[dict[str, str]]:
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotAChain)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead.listen(64)  # the kernel takes connections; nobody ever reads or answers
    try:
        yield {
            "web server": f"http://127.0.0.1:{web.server_address[1]}",
            "dead port": f"http://127.0.0.1:{dead.getsockname()[1]}",
            "closed port": f"http://127.0.0.1:{free_port()}",
        }
    finally:
        web.shutdown()
        web.server_close()
        dead.close()


class _NotAChain(http.server.BaseHTTPRequestHandler):
    """A web server: a page for GET, 405 for the POST a JSON-RPC client sends."""

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self.send_error(405, "Method Not Allowed")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def commands(url: str, tmp: str) -> dict[str, list[str]]:
    return {
        "deploy": ["deploy", "--rpc-url", url],
        "fund": ["fund", "--rpc-url", url, "--to", LEDGER],
        "node": ["node", "--rpc-url", url, "--ledger", LEDGER, "--workdir", f"{tmp}/node"],
        "verify": ["verify", "--rpc-url", url, "--ledger", LEDGER, "--archive", tmp],
        "ledger": ["ledger", "--rpc-url", url, "--ledger", LEDGER],
    }


WHAT_TO_DO = {  # the end of each kind's line: what the user can do about it
    "web server": "is not an Ethereum JSON-RPC endpoint (it answers HTTP 405 Method Not Allowed): fix --rpc-url",
    "dead port": "did not answer within 5 s: check that a chain runs there (swarm chain starts one) or fix --rpc-url",
    "closed port": "(Connection refused): start it or fix --rpc-url",
}


def test_every_rpc_command_answers_a_wrong_url_in_one_line(wrong_urls, tmp_path):
    """All fifteen at once (the dead port makes each wait its 5 s): each a fresh `swarm` process."""
    env = {"SWARM_PRIVATE_KEY": "0x" + "11" * 32, "SWARM_P2P_PASSWORD": "pw", "PATH": "/usr/bin:/bin"}
    runs = {
        (kind, name): subprocess.Popen(
            [sys.executable, "-m", "node.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        for kind, url in wrong_urls.items()
        for name, argv in commands(url, str(tmp_path)).items()
    }
    for (kind, name), proc in runs.items():
        out, err = proc.communicate(timeout=120)
        lines = err.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and out == "", (kind, name, err)
        assert lines[0].startswith(f"swarm {name}: error: ") and wrong_urls[kind] in lines[0], (kind, lines)
        assert lines[0].endswith(WHAT_TO_DO[kind]), (kind, lines)


@pytest.mark.parametrize("name", ["verify", "ledger"])
def test_v_shows_the_trace_then_the_same_line(wrong_urls, tmp_path, capsys, name):
    from node.cli import main

    argv = commands(wrong_urls["web server"], str(tmp_path))[name]
    assert main(argv) == 2
    line = capsys.readouterr().err
    assert main([*argv, "-v"]) == 2
    verbose = capsys.readouterr().err
    assert "Traceback (most recent call last)" in verbose and "HTTPError" in verbose, verbose
    assert verbose.strip().splitlines()[-1] == line.strip()
