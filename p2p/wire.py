"""Wire formats: the `/swarm/blob/4.0.0` frames and the gossip envelope.

Blob protocol (every message is a frame `u32 big-endian length || body`, because in py-libp2p a reader
waiting for EOF after the writer's close() hangs; see docs/P2P.md):

    client -> server  OPEN  b"O" || digest(32)          server -> client  SIZE  b"S" || u64 size || piece hashes
                      FIRST b"F" || digest(32)                           DATA  b"D" || bytes
                      READ  b"R" || u64 offset || u32 length             NOT_FOUND / REFUSED / ERROR:
                                                                         b"N" / b"X" / b"E" || utf-8 reason

FIRST is an OPEN that also reads the blob's first piece: a holder that has the blob answers SIZE and,
unless the blob is empty, the DATA of its first piece in the same write, as if a READ of that piece
had followed (it counts against the open blob's READs and bytes). A fetcher sends it to the holder it
asks first, whose first piece it wants anyway: a blob of one piece (a round's update) then costs one
request and one answer instead of two of each (docs/P2P.md, "One request for a small blob").

A stream carries any number of blobs, one after the other: an OPEN starts the next (the READs that
follow are for it). A client keeps a stream whose requests were all answered for its next fetch from
the same holder; the server closes a stream silent for its idle timeout (docs/P2P.md, "Blob streams are
kept"). The stream also survives NOT_FOUND; it ends after REFUSED and ERROR.

A blob is cut into pieces of PIECE_SIZE bytes (the last one shorter); SIZE carries the sha256 of each
piece, in order (32 bytes each, none for an empty blob), so a fetcher checks every piece as it arrives
(docs/P2P.md, "Piece hashes"). A client reads whole pieces, so a READ asks for at most PIECE_SIZE bytes.

The client may keep several READs in flight; the server answers them in order. Requests are tiny and
of fixed size (OPEN and FIRST 33 bytes, READ 13 bytes), so the server reads a request frame only if its declared
length is at most MAX_REQUEST = 33 bytes; a larger one is refused with ERROR before any of its body is
read, and the stream is closed. A request frame of the wrong length for its type is refused the same way.

Gossip envelope: kind(1) || u16 length of addresses || addresses (utf-8, newline-separated) || body.
Kinds: b"A" application payload, b"H" "I hold these blobs" (1 to MAX_HAVE_DIGESTS digests of 32 bytes,
concatenated: a fetcher announces the blobs it fetched in batches, see docs/P2P.md), b"P" hello
(addresses only).
"""

from __future__ import annotations

import struct
from typing import NoReturn, Protocol

BLOB_PROTOCOL = "/swarm/blob/4.0.0"  # 4.0.0: FIRST; 3.0.0 servers refuse it, so the versions do not interoperate
PIECE_SIZE = 1 << 20  # 1 MiB: pieces stay well below the 8 MB single-message failures seen in py-libp2p
_FRAME_HEADER = struct.Struct(">I")
MAX_FRAME = PIECE_SIZE + 64

OPEN, OPEN_FIRST, READ = b"O", b"F", b"R"
DIGEST_SIZE = 32  # sha256
_SIZE_HEADER = struct.Struct(">Q")
MAX_PIECES = (MAX_FRAME - 1 - _SIZE_HEADER.size) // DIGEST_SIZE  # piece hashes one SIZE frame can carry
MAX_BLOB = MAX_PIECES * PIECE_SIZE  # about 32 GiB: the largest blob the protocol can describe
_READ_ARGS = struct.Struct(">QI")  # offset, length
OPEN_SIZE = len(OPEN) + DIGEST_SIZE  # 33: the body of a well-formed OPEN (or FIRST) frame
READ_SIZE = len(READ) + _READ_ARGS.size  # 13: the body of a well-formed READ frame
MAX_REQUEST = max(OPEN_SIZE, READ_SIZE)  # 33: no well-formed client -> server frame body is larger
SIZE, DATA, NOT_FOUND, REFUSED, ERROR = b"S", b"D", b"N", b"X", b"E"

KIND_APP, KIND_HAVE, KIND_HELLO = b"A", b"H", b"P"
MAX_HAVE_DIGESTS = 1024  # 32 KiB of digests: half the default max_announcement_size


class WireError(Exception):
    """A peer sent bytes that do not follow the protocol."""


class FrameTooLarge(WireError):
    """A frame declared a length above the reader's limit; its body was not read."""


class StreamEnded(Exception):
    """The peer closed or reset the stream, or the connection went away."""


class ByteReader(Protocol):
    """What the frame reader needs of a stream (a py-libp2p `INetStream` is one)."""

    async def read(self, n: int, /) -> bytes: ...


class ByteWriter(Protocol):
    """What the frame writer needs of a stream (a py-libp2p `INetStream` is one)."""

    async def write(self, data: bytes, /) -> None: ...


async def read_exactly(stream: ByteReader, n: int) -> bytes:
    """Read exactly n bytes; callers bound the wait with trio.fail_after / move_on_after."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        try:
            part = await stream.read(n - got)
        except Exception as exc:  # libp2p raises StreamEOF/StreamReset/MuxedConn errors here
            raise StreamEnded(f"{type(exc).__name__}: {exc}") from None
        if not part:
            raise StreamEnded("end of stream")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


async def read_frame(stream: ByteReader, max_frame: int = MAX_FRAME) -> bytes:
    """Read one frame's body; WireError if its declared length exceeds `max_frame`."""
    (length,) = _FRAME_HEADER.unpack(await read_exactly(stream, _FRAME_HEADER.size))
    if length > max_frame:
        raise FrameTooLarge(f"frame of {length} bytes exceeds the limit of {max_frame}")
    return await read_exactly(stream, length)


async def write_frame(stream: ByteWriter, body: bytes, *more: bytes) -> None:
    """Write `body` (and `more` bodies after it) as frames in one write; StreamEnded if the stream is gone.
    One write: one muxer frame and one encrypted message where the bodies fit, not one per body."""
    try:
        await stream.write(b"".join(_FRAME_HEADER.pack(len(b)) + b for b in (body, *more)))
    except Exception as exc:
        raise StreamEnded(f"{type(exc).__name__}: {exc}") from None


def open_request(digest: str, *, first: bool = False) -> bytes:
    """OPEN `digest`, or FIRST (`first`): OPEN and read its first piece (see the module docstring)."""
    return (OPEN_FIRST if first else OPEN) + bytes.fromhex(digest)


def read_request(offset: int, length: int) -> bytes:
    return READ + _READ_ARGS.pack(offset, length)


def parse_open(body: bytes) -> tuple[str, bool]:
    """(digest, whether the first piece goes with the answer) of an OPEN or FIRST request."""
    if len(body) != OPEN_SIZE or body[:1] not in (OPEN, OPEN_FIRST):
        raise WireError("expected OPEN(digest)")
    return body[1:].hex(), body[:1] == OPEN_FIRST


def parse_read(body: bytes) -> tuple[int, int]:
    if len(body) != READ_SIZE or body[:1] != READ:
        raise WireError("expected READ(offset, length)")
    offset, length = _READ_ARGS.unpack(body[1:])
    return offset, length


def piece_count(size: int) -> int:
    """How many pieces a blob of `size` bytes has (0 for an empty blob)."""
    return -(-size // PIECE_SIZE)


def size_response(size: int, piece_hashes: bytes) -> bytes:
    if len(piece_hashes) != piece_count(size) * DIGEST_SIZE:
        raise ValueError(f"{len(piece_hashes)} bytes of piece hashes for a blob of {size} bytes")
    return SIZE + _SIZE_HEADER.pack(size) + piece_hashes


def parse_size(body: bytes) -> tuple[int, bytes]:
    """(size, piece hashes) of a SIZE answer; WireError unless it carries one hash per piece. The size
    is read first: a caller checks it against its limit before anything else."""
    header = 1 + _SIZE_HEADER.size
    if len(body) < header or body[:1] != SIZE:
        raise_status(body, "SIZE")
    (size,) = _SIZE_HEADER.unpack(body[1:header])
    hashes = body[header:]
    if size > MAX_BLOB or len(hashes) != piece_count(size) * DIGEST_SIZE:
        raise WireError(f"SIZE of {size} bytes carries {len(hashes)} bytes of piece hashes")
    return size, hashes


def raise_status(body: bytes, expected: str) -> NoReturn:
    """Turn a NOT_FOUND / REFUSED / ERROR answer (or garbage) into WireError with the peer's reason."""
    reason = body[1:200].decode("utf-8", "replace")
    kind = {NOT_FOUND: "not found", REFUSED: "refused", ERROR: "error"}.get(body[:1])
    if kind is None:
        raise WireError(f"expected {expected}, got message type {body[:1]!r}")
    raise WireError(f"{kind}: {reason}")


def envelope(kind: bytes, addrs: list[str], body: bytes = b"") -> bytes:
    packed = "\n".join(addrs).encode()
    return kind + struct.pack(">H", len(packed)) + packed + body


def parse_envelope(data: bytes) -> tuple[bytes, list[str], bytes]:
    if len(data) < 3:
        raise WireError("gossip envelope too short")
    (n,) = struct.unpack(">H", data[1:3])
    if len(data) < 3 + n:
        raise WireError("gossip envelope truncated")
    addrs = [a for a in data[3 : 3 + n].decode("utf-8", "replace").split("\n") if a]
    return data[:1], addrs, data[3 + n :]


def have_body(digests: list[str]) -> bytes:
    """The body of a HAVE announcement for 1 to MAX_HAVE_DIGESTS hex sha256 digests."""
    if not 0 < len(digests) <= MAX_HAVE_DIGESTS:
        raise ValueError(f"a HAVE names 1 to {MAX_HAVE_DIGESTS} digests, got {len(digests)}")
    return b"".join(bytes.fromhex(d) for d in digests)


def parse_have(body: bytes) -> list[str]:
    """The hex digests of a HAVE body; WireError unless it is 1 to MAX_HAVE_DIGESTS whole digests."""
    if not body or len(body) % DIGEST_SIZE or len(body) > MAX_HAVE_DIGESTS * DIGEST_SIZE:
        raise WireError(f"HAVE body of {len(body)} bytes is not 1 to {MAX_HAVE_DIGESTS} digests of {DIGEST_SIZE} bytes")
    return [body[i : i + DIGEST_SIZE].hex() for i in range(0, len(body), DIGEST_SIZE)]
