"""The buffered gossip RPC reader (p2p/pubsub_reader.py) reads what py-libp2p's own reader reads,
and refuses what it refuses, whatever sizes the stream hands its bytes out in."""

from __future__ import annotations

import random

import pytest
import trio
from libp2p.exceptions import ParseError
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.utils.varint import encode_uvarint, read_varint_prefixed_bytes_limited

import p2p.host  # noqa: F401  (installs the reader)
from p2p import pubsub_reader

MAX = 4096


class Chunked:
    """A stream that hands out `data` in pieces of the sizes `rng` draws (at most what is asked)."""

    def __init__(self, data: bytes, rng: random.Random) -> None:
        self.data, self.rng = data, rng

    async def read(self, n: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        take = min(n or len(self.data), self.rng.randint(1, 700))
        out, self.data = self.data[:take], self.data[take:]
        return out


async def read_all(read, stream: Chunked) -> tuple[list[bytes], type[Exception] | None]:
    messages: list[bytes] = []
    try:
        while True:
            messages.append(await read(stream, MAX))
    except (ParseError, MessageTooLarge, IncompleteReadError) as exc:
        return messages, type(exc)


def framed(*bodies: bytes) -> bytes:
    return b"".join(encode_uvarint(len(b)) + b for b in bodies)


@pytest.mark.parametrize(
    "data",
    [
        framed(b"x" * 5, b"", b"y" * 300, b"z" * MAX),  # then the stream ends between RPCs
        framed(b"a" * 200) + encode_uvarint(100) + b"b" * 40,  # ends inside a body
        framed(b"a" * 10) + b"\x80\x80",  # ends inside a length prefix
        framed(b"a" * 10) + encode_uvarint(MAX + 1) + b"c" * (MAX + 1),  # one past the limit
        framed(b"a" * 10) + b"\xff" * 10 + b"\x01",  # a prefix longer than 64 bits
    ],
    ids=["whole", "cut-body", "cut-prefix", "too-large", "overlong-prefix"],
)
def test_reads_and_refuses_what_py_libp2p_reads_and_refuses(data):
    async def main():
        for seed in range(5):
            ours = await read_all(pubsub_reader.read_rpc, Chunked(data, random.Random(seed)))
            theirs = await read_all(read_varint_prefixed_bytes_limited, Chunked(data, random.Random(seed)))
            assert ours == theirs
            assert ours[1] is not None  # every case ends in a refusal or the stream's end

    trio.run(main)


def test_pubsub_reads_through_it():
    from libp2p.pubsub import pubsub

    assert pubsub.read_varint_prefixed_bytes_limited is pubsub_reader.read_rpc
