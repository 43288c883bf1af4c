"""Content-addressed blob stores: blobs named by the hex sha256 of their bytes.

`DiskBlobStore` writes a blob to a temporary file in the same directory, fsyncs it, then renames
it into place (os.replace is atomic on POSIX): a crash leaves at most a stray temporary file, never a
partial blob under its digest. `MemoryBlobStore` keeps blobs in a dict, for tests and simulations.
Both offer `read(digest, offset, length)` so the host serves chunks without loading whole blobs.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Protocol

_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def check_digest(digest: str) -> str:
    """Return `digest` if it is a lowercase hex sha256, else raise ValueError naming it."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ValueError(f"digest must be 64 lowercase hex characters (sha256), got {digest!r}")
    return digest


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BlobStore(Protocol):
    def put(self, data: bytes) -> str: ...
    def get(self, digest: str) -> bytes | None: ...
    def has(self, digest: str) -> bool: ...
    def size(self, digest: str) -> int | None: ...
    def read(self, digest: str, offset: int, length: int) -> bytes | None: ...


class MemoryBlobStore:
    """Blobs in a dict. Thread-safe enough for one trio loop plus worker threads (dict ops are atomic)."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    def put(self, data: bytes) -> str:
        digest = sha256_hex(data)
        self._blobs.setdefault(digest, bytes(data))
        return digest

    def get(self, digest: str) -> bytes | None:
        return self._blobs.get(check_digest(digest))

    def has(self, digest: str) -> bool:
        return check_digest(digest) in self._blobs

    def size(self, digest: str) -> int | None:
        blob = self._blobs.get(check_digest(digest))
        return None if blob is None else len(blob)

    def read(self, digest: str, offset: int, length: int) -> bytes | None:
        blob = self._blobs.get(check_digest(digest))
        return None if blob is None else blob[offset : offset + length]

    def digests(self) -> list[str]:
        return sorted(self._blobs)


class DiskBlobStore:
    """Blobs as files `<directory>/<first 2 hex>/<digest>`, written atomically."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _path(self, digest: str) -> Path:
        check_digest(digest)
        return self.directory / digest[:2] / digest

    def put(self, data: bytes) -> str:
        digest = sha256_hex(data)
        final = self._path(digest)
        if final.exists():
            return digest
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=final.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            with self._lock:
                os.replace(tmp, final)
            # fsync the directory so the rename itself survives a power cut.
            dir_fd = os.open(final.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def get(self, digest: str) -> bytes | None:
        try:
            return self._path(digest).read_bytes()
        except FileNotFoundError:
            return None

    def has(self, digest: str) -> bool:
        return self._path(digest).is_file()

    def size(self, digest: str) -> int | None:
        try:
            return self._path(digest).stat().st_size
        except FileNotFoundError:
            return None

    def read(self, digest: str, offset: int, length: int) -> bytes | None:
        try:
            with open(self._path(digest), "rb") as fh:
                fh.seek(offset)
                return fh.read(length)
        except FileNotFoundError:
            return None

    def digests(self) -> list[str]:
        return sorted(p.name for p in self.directory.glob("??/*") if _DIGEST.match(p.name))
