"""Gossip RPCs read from a buffer instead of a few bytes at a time, in py-libp2p 0.8.1's pubsub.

Pubsub reads each RPC from a peer's stream with `read_varint_prefixed_bytes_limited`: the length
prefix one byte per `stream.read(1)`, then the body. Each read goes down through the NetStream's
state lock, yamux's buffer and a trio checkpoint, so an RPC of a few hundred bytes costs two to
four such reads. In a 16-peer swarm's round profile (py-spy, GIL holder) those reads were more than
half of pubsub's reading, the largest part of a peer's protocol CPU after the fixes of docs/P2P.md
("Protocol CPU per round").

`install()` points the pubsub module at `read_rpc`, which reads whatever the stream has (up to
READ_CHUNK bytes) into a buffer kept per stream, and cuts the RPCs out of it. What it accepts and
refuses is the original's: the same length limit checked before the body is awaited, the same
errors (ParseError for a prefix past 64 bits, MessageTooLarge, IncompleteReadError when the stream
ends mid-RPC; a stream's own errors pass through). The buffer holds at most one RPC's bytes plus
one chunk. Only pubsub's reader of each stream reads it, so bytes taken ahead are never missed by
another reader. The library is not edited: one module attribute is replaced."""

from __future__ import annotations

import weakref
from typing import Any

from libp2p.exceptions import ParseError
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.pubsub import pubsub as _pubsub

READ_CHUNK = 64 * 1024  # bytes asked of the stream at once (it answers with what it holds, up to that)
MAX_VARINT_BYTES = 10  # a 64-bit unsigned varint

_BUFFERS: weakref.WeakKeyDictionary[Any, bytearray] = weakref.WeakKeyDictionary()


def _prefix(buffer: bytearray) -> tuple[int, int] | None:
    """(length, bytes of the prefix) of the varint at the head of `buffer`; None if incomplete."""
    value = 0
    for i, byte in enumerate(buffer[:MAX_VARINT_BYTES]):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value >> 64:
                raise ParseError("Varint decoding error: integer exceeds maximum size of 64 bits")
            return value, i + 1
    if len(buffer) >= MAX_VARINT_BYTES:
        raise ParseError("Varint decoding error: integer exceeds maximum size of 64 bits")
    return None


async def _fill(reader: Any, buffer: bytearray, expected: int, what: str) -> None:
    chunk = await reader.read(READ_CHUNK)
    if not chunk:
        raise IncompleteReadError(what, expected_bytes=expected, received_bytes=len(buffer))
    buffer += chunk


async def read_rpc(reader: Any, max_length: int) -> bytes:
    """`read_varint_prefixed_bytes_limited(reader, max_length)`, through `reader`'s buffer."""
    if max_length <= 0:
        raise ValueError("max_length must be greater than 0")
    buffer = _BUFFERS.get(reader)
    if buffer is None:
        buffer = _BUFFERS[reader] = bytearray()
    while (prefix := _prefix(buffer)) is None:
        await _fill(reader, buffer, 1, "Stream ended while reading varint length prefix")
    length, size = prefix
    if length > max_length:
        raise MessageTooLarge(f"Message length {length} exceeds maximum allowed {max_length}")
    del buffer[:size]
    while len(buffer) < length:
        await _fill(reader, buffer, length, f"Incomplete message: expected {length}, got {len(buffer)}")
    message = bytes(buffer[:length])
    del buffer[:length]
    return message


def install() -> None:
    """Point py-libp2p's pubsub at `read_rpc` (idempotent)."""
    _pubsub.read_varint_prefixed_bytes_limited = read_rpc
