"""Transient RPC failures (connection refused or reset, timeouts, HTTP 429/5xx) retried with
exponential backoff; anything else propagates at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import requests

from node.chain.errors import LedgerUnavailable

RETRIES = 5
BACKOFF_S = 0.2

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    # ConnectionError covers node.chain.rawrpc.RawRPCUnavailable
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return exc.response.status_code == 429 or exc.response.status_code >= 500
    return False


def with_retries(call: Callable[[], T], *, what: str, retries: int = RETRIES) -> T:
    """`call()`, retried on transient failures; `LedgerUnavailable` once `retries` are used up."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt == retries:
                raise LedgerUnavailable(f"{what}: no answer after {retries + 1} attempts ({exc})") from exc
            time.sleep(BACKOFF_S * 2**attempt)
    raise AssertionError("unreachable")
