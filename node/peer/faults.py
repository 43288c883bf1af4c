"""Faults a test swarm can inject for real (`swarm node --fault ...`, hidden from --help):
a byzantine peer is the only way to show that honest peers refuse it. Never used otherwise."""

from __future__ import annotations

from typing import Any

from p2p.store import DiskBlobStore

FAULTS = ("wrong-bytes", "scale:K")


def check_fault(fault: str | None) -> str | None:
    if fault is None or fault == "wrong-bytes":
        return fault
    if fault.startswith("scale:"):
        try:
            float(fault.split(":", 1)[1])
            return fault
        except ValueError:
            pass
    raise ValueError(f"--fault must be one of {', '.join(FAULTS)}, got {fault!r}")


class WrongBytesStore:
    """Wraps a blob store; serves altered bytes for the digests it was told to poison, as a
    peer would that commits one digest and serves other bytes."""

    def __init__(self, inner: DiskBlobStore) -> None:
        self.inner = inner
        self.poisoned: set[str] = set()

    def poison(self, digest: str) -> None:
        self.poisoned.add(digest)

    def _alter(self, digest: str, data: bytes | None) -> bytes | None:
        if data is None or digest not in self.poisoned:
            return data
        return bytes(b ^ 0x5A for b in data)

    def get(self, digest: str) -> bytes | None:
        return self._alter(digest, self.inner.get(digest))

    def read(self, digest: str, offset: int, length: int) -> bytes | None:
        return self._alter(digest, self.inner.read(digest, offset, length))

    def __getattr__(self, name: str) -> Any:  # put, has, size, digests...: the inner store's
        return getattr(self.inner, name)
