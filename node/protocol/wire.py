"""What peers put on the wire and on chain, defined once so that peers, the ledger client and
`swarm verify` agree byte for byte: the genesis, update and model blobs, the eps fixed point,
the inclusion bitmap (the contract's layout) and the gossip topic."""

from __future__ import annotations

import math

import torch

from mechanisms import canonical_json
from node.protocol import blob
from node.protocol.aggregate import MAX_PARTICIPANTS, VALUE_BOUND, VALUE_BOUND_BITS

VECTOR = "vector"  # the one tensor every blob holds: the flat float32 parameter vector
VELOCITY = "velocity"  # a secure swarm's model blob also holds the global step's momentum (float64)
EPS_SCALE = 1_000_000  # the ledger stores eps in micro-epsilon: the only place this scale is written


def canonical(obj: object) -> str:
    """Canonical JSON text (mechanisms.canonical_json): what every peer hashes the same way."""
    return canonical_json(obj).decode("utf-8")


def eps_to_micro(epsilon: float) -> int:
    """Eps as the ledger stores it, rounded up, so the recorded spend (or cap) is never below the
    true bound. (The 1e-9 absorbs the float error of a product that is an integer in decimal.)"""
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    return math.ceil(epsilon * EPS_SCALE - 1e-9)


def eps_from_micro(eps_micro: int) -> float:
    """The ledger's micro-eps integer as an eps."""
    return eps_micro / EPS_SCALE


def encode_bitmap(flags: list[bool]) -> bytes:
    """The inclusion bitmap for flags[i] = participant i included: ceil(n / 8) bytes, bit i is
    the (i % 8)-th lowest bit of byte i // 8 (the contract's layout)."""
    out = bytearray((len(flags) + 7) // 8)
    for i, flag in enumerate(flags):
        if flag:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def decode_bitmap(included: bytes, count: int) -> list[bool]:
    """The flags of `count` participants from an inclusion bitmap (the inverse of encode_bitmap)."""
    if len(included) * 8 < count:
        raise ValueError(f"bitmap of {len(included)} bytes cannot hold {count} participants")
    return [bool(included[i // 8] >> (i % 8) & 1) for i in range(count)]


def topic_for(chain_id: int, ledger_address: str) -> str:
    return f"swarm-ledger/{chain_id}/{ledger_address.lower()}"


def genesis_blob(vector: torch.Tensor, swarm: dict[str, object]) -> bytes:
    """The genesis model with the swarm's shared settings (model, data, aggregation, privacy
    policy) in its metadata: the ledger stores its digest, so those settings are anchored on chain."""
    return blob.encode_blob({VECTOR: vector}, {"kind": "genesis", "swarm": canonical(swarm)})


def update_blob(vector: torch.Tensor, round_number: int, mechanism_json: str, committer: str) -> bytes:
    """A peer's release for one round. The round and the committer's address (lower case) are in
    the blob, so in its digest: the blob counts only in a commit of that round by that account
    (node/rules.py, rule "binding"), so replaying or copying it gains nothing."""
    meta = {"kind": "update", "round": str(round_number), "mechanism": mechanism_json, "committer": committer.lower()}
    return blob.encode_blob({VECTOR: vector}, meta)


def model_blob(vector: torch.Tensor, round_number: int, velocity: torch.Tensor | None = None) -> bytes:
    """The global model after a round; its sha256 is what participants attest. Under secure
    aggregation the swarm's state after a round is the model and the global step's velocity
    (node.protocol.secure_step): both are in the blob, so the finalized digest anchors both and a
    peer that missed a round's sum takes the velocity from the finalized blob."""
    tensors = {VECTOR: vector} if velocity is None else {VECTOR: vector, VELOCITY: velocity.to(torch.float64)}
    return blob.encode_blob(tensors, {"kind": "model", "round": str(round_number)})


def read_model_state(data: bytes, num_params: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, str]]:
    """A secure swarm's model blob: (model, velocity, metadata), each checked as `read_vector`
    checks a vector (size cap, canonical encoding, shapes, dtypes, finite values); a `BlobError`
    otherwise."""
    tensors, meta = blob.decode_blob(
        data,
        max_size=max_blob_size(3 * num_params),
        expected={VECTOR: ((num_params,), torch.float32), VELOCITY: ((num_params,), torch.float64)},
    )
    if meta.get("kind") != "model":
        raise blob.BlobError(f"expected a 'model' blob, got kind {meta.get('kind')!r}")
    return tensors[VECTOR], tensors[VELOCITY], meta


def read_vector(data: bytes, num_params: int, *, kind: str | None = None) -> tuple[torch.Tensor, dict[str, str]]:
    """Decode and validate a blob holding exactly one float32 vector of `num_params`. An update
    blob's values must also be what the exact aggregation can hold (`check_update_values`).
    Every failure is a `blob.BlobError`: the peers and `swarm verify` all decode through here,
    so they leave out the same blobs."""
    tensors, meta = blob.decode_blob(
        data, max_size=max_blob_size(num_params), expected={VECTOR: ((num_params,), torch.float32)}
    )
    if kind is not None and meta.get("kind") != kind:
        raise blob.BlobError(f"expected a {kind!r} blob, got kind {meta.get('kind')!r}")
    vector = tensors[VECTOR]
    if meta.get("kind") == "update":  # whatever kind the caller asked for: these values get aggregated
        check_update_values(vector)
    return vector, meta


def check_update_values(vector: torch.Tensor) -> None:
    """BlobError unless every value is finite with |v| < aggregate.VALUE_BOUND (2^20): what the
    fixed-point sums of fedavg and trimmed-mean hold without overflow for any round of up to
    aggregate.MAX_PARTICIPANTS participants, whatever sample counts the ledger accepted. One
    rule for every rule and every peer: a blob outside it is malformed, not aggregated."""
    magnitude = vector.abs()
    outside = ~(magnitude < VALUE_BOUND)  # NaN compares False: outside too
    if bool(outside.any()):
        i = int(torch.nonzero(outside)[0])
        raise blob.BlobError(
            f"update value {vector[i].numpy()!s} at coordinate {i} is not strictly inside "
            f"+-{VALUE_BOUND:.0f} (2^{VALUE_BOUND_BITS}), what the exact aggregation of up to "
            f"{MAX_PARTICIPANTS} participants holds"
        )


def max_blob_size(num_params: int) -> int:
    return 4 * num_params + 64 * 1024  # the vector plus generous room for header and metadata
