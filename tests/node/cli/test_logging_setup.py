"""The CLI's log handler follows sys.stderr: a run inside another program that swaps stderr and
closes the old one leaves no handler writing to a closed stream."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from node.cli.common import setup_logging


def test_records_go_to_the_stderr_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging(verbose=False)
    logging.getLogger("swarm.test").warning("to the first stream")
    first.close()

    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    errors: list[str] = []
    monkeypatch.setattr(logging.Handler, "handleError", lambda self, record: errors.append(record.getMessage()))
    logging.getLogger("swarm.test").warning("to the second stream")

    assert errors == []
    assert "to the second stream" in second.getvalue()
    assert [type(h).__name__ for h in logging.getLogger().handlers] == ["_CurrentStderrHandler"]


def test_verbose_lets_info_through(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    setup_logging(verbose=True)
    logging.getLogger("swarm.test").info("an info record")
    setup_logging(verbose=False)
    logging.getLogger("swarm.test").info("a hidden record")
    assert "an info record" in out.getvalue()
    assert "a hidden record" not in out.getvalue()
