"""Faults a test swarm can inject for real (`swarm node --fault ...`, hidden from --help):
a byzantine peer is the only way to show that honest peers refuse it. Never used otherwise."""

from __future__ import annotations

from typing import Any

from p2p.store import DiskBlobStore

# the secure member's (node/peer/secure.py), named here so that checking a --fault imports nothing heavy:
# a share of the lowest dealer's secret moved by one in this member's REVEAL, a MASKED frame one
# coordinate short, each signed by the member itself, a MASKED frame committed and then never
# served (nor anything after it), garbage sealed to floor(n/3) holders and the REVEAL withheld
# (the dealer masks anyway, against the U2 it dealt to), or a complaint against an honest dealer
SECURE_FAULTS = (
    "secagg-wrong-share",
    "secagg-bad-masked",
    "secagg-withhold-masked",
    "secagg-bad-seal",
    "secagg-false-complaint",
)
FAULTS = ("wrong-bytes", "withhold", "scale:K", *SECURE_FAULTS)
STORE_FAULTS = ("wrong-bytes", "withhold")  # served through a `FaultyStore`


def check_fault(fault: str | None) -> str | None:
    """`fault` if it is one of FAULTS (the secure ones: the secure member's, node/peer/secure.py)."""
    if fault is None or fault in STORE_FAULTS or fault in SECURE_FAULTS:
        return fault
    if fault.startswith("scale:"):
        try:
            float(fault.split(":", 1)[1])
            return fault
        except ValueError:
            pass
    raise ValueError(f"--fault must be one of {', '.join(FAULTS)}, got {fault!r}")


class FaultyStore:
    """Wraps a blob store; the digests it was told to poison are served faultily, as by a peer
    that commits one digest and then serves other bytes (`wrong-bytes`) or nothing: it answers
    "not found" though it holds the blob, announces it and uses it itself (`withhold`)."""

    def __init__(self, inner: DiskBlobStore, fault: str = "wrong-bytes") -> None:
        if fault not in STORE_FAULTS:
            raise ValueError(f"not a store fault: {fault!r}")
        self.inner = inner
        self.fault = fault
        self.poisoned: set[str] = set()

    def poison(self, digest: str) -> None:
        self.poisoned.add(digest)

    def _alter(self, digest: str, data: bytes | None) -> bytes | None:
        if data is None or digest not in self.poisoned:
            return data
        return bytes(b ^ 0x5A for b in data)

    def get(self, digest: str) -> bytes | None:
        if self.fault == "withhold":  # the peer's own reads: it aggregates its blob like any other
            return self.inner.get(digest)
        return self._alter(digest, self.inner.get(digest))

    def size(self, digest: str) -> int | None:  # what the host serves from: nothing, when withheld
        if self.fault == "withhold" and digest in self.poisoned:
            return None
        return self.inner.size(digest)

    def read(self, digest: str, offset: int, length: int) -> bytes | None:
        if self.fault == "withhold":
            return None if digest in self.poisoned else self.inner.read(digest, offset, length)
        return self._alter(digest, self.inner.read(digest, offset, length))

    def __getattr__(self, name: str) -> Any:  # put, has, digests...: the inner store's
        return getattr(self.inner, name)
