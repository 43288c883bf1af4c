"""Transient RPC failures (connection refused or reset, timeouts, HTTP 5xx, a node that does not
have the block asked for) retried with exponential backoff; anything else propagates at once.

An HTTP 429 (a hosted endpoint refusing a burst) is not an outage: the endpoint answered, and
said when to come back. It is retried after its Retry-After (RATE_LIMIT_WAIT_MAX_S at most per
wait; 1 s when the header is missing or unreadable), without using up the retries an outage
gets, for RATE_LIMIT_BUDGET_S in all per call; only past that budget is it `LedgerUnavailable`."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from datetime import UTC
from typing import TypeVar

import requests
from web3.exceptions import Web3RPCError

from node.chain.errors import LedgerUnavailable

RETRIES = 5
BACKOFF_S = 0.2
RATE_LIMIT_DEFAULT_S = 1.0  # the pause after a 429 that names no Retry-After
RATE_LIMIT_WAIT_MIN_S = BACKOFF_S  # a shorter Retry-After (0, a past date) is raised to this: the budget ends
RATE_LIMIT_WAIT_MAX_S = 30.0  # a longer Retry-After is cut to this
RATE_LIMIT_BUDGET_S = 120.0  # seconds of 429 pauses one call may take before it is an outage

T = TypeVar("T")


class RateLimited(ConnectionError):
    """The endpoint answered HTTP 429; `retry_after` is the pause it asked for, in seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def parse_retry_after(value: str | None, *, now: float | None = None) -> float:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), bounded to
    [RATE_LIMIT_WAIT_MIN_S, RATE_LIMIT_WAIT_MAX_S]; RATE_LIMIT_DEFAULT_S when missing or unreadable."""
    if not value:
        return RATE_LIMIT_DEFAULT_S
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return RATE_LIMIT_DEFAULT_S
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return RATE_LIMIT_DEFAULT_S
    return min(max(seconds, RATE_LIMIT_WAIT_MIN_S), RATE_LIMIT_WAIT_MAX_S)


def rate_limit_pause(exc: BaseException) -> float | None:
    """The pause a 429 asked for (RateLimited from the raw reader, requests' HTTPError from web3);
    None for anything else."""
    if isinstance(exc, RateLimited):
        return exc.retry_after
    if isinstance(exc, requests.HTTPError) and exc.response is not None and exc.response.status_code == 429:
        return parse_retry_after(exc.response.headers.get("Retry-After"))
    return None


# What nodes answer for a block they do not have (yet, or any more: a reorganisation in progress,
# or one node behind a load balancer lagging the one that gave the head): read again shortly.
MISSING_BLOCK_ANSWERS = ("header not found", "unknown block", "blockoutofrangeerror")


def is_transient(exc: BaseException) -> bool:
    # ConnectionError covers node.chain.rawrpc.RawRPCUnavailable and RateLimited
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return exc.response.status_code == 429 or exc.response.status_code >= 500
    if isinstance(exc, Web3RPCError):
        return any(answer in str(exc).lower() for answer in MISSING_BLOCK_ANSWERS)
    return False


def with_retries(call: Callable[[], T], *, what: str, retries: int = RETRIES) -> T:
    """`call()`, retried on transient failures; `LedgerUnavailable` once `retries` are used up
    (429s wait out their Retry-After apart from those, up to RATE_LIMIT_BUDGET_S)."""
    attempt = 0
    limited = 0.0  # seconds paused for 429s so far
    while True:
        try:
            return call()
        except Exception as exc:
            pause = rate_limit_pause(exc)
            if pause is not None and limited + pause <= RATE_LIMIT_BUDGET_S:
                limited += pause
                time.sleep(pause)
                continue
            if not is_transient(exc):
                raise
            if attempt == retries or pause is not None:
                raise LedgerUnavailable(f"{what}: no answer after {attempt + 1} attempts ({exc})") from exc
            time.sleep(BACKOFF_S * 2**attempt)
            attempt += 1
