"""Tensors on the wire: canonical safetensors bytes, strict decoding, digests. Never pickle.

`encode_blob` writes the safetensors format itself (8-byte little-endian header length, JSON
header, raw little-endian tensor bytes) so the bytes are canonical: keys sorted, data laid out
in key order, header JSON without spaces, padded with spaces to a multiple of 8 as the format
requires. The same tensors and metadata therefore always give the same bytes and the same
sha256 on every peer and every version of the safetensors library. `decode_blob` parses with
the safetensors library (no code execution), then insists that re-encoding gives back the
exact input bytes, so a blob has exactly one valid encoding.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load
from torch import nn

# safetensors dtype names for the dtypes a blob may carry.
_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8"}
_MAX_HEADER = 1 << 20  # 1 MiB of JSON header is far more than any model here needs

# A model, or a state dict of named tensors (what `nn.Module.state_dict()` returns).
ModelOrState: TypeAlias = nn.Module | Mapping[str, torch.Tensor]


class BlobError(ValueError):
    """A blob is malformed, too large, or not what the caller expects."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]


def _state(model_or_state: ModelOrState) -> dict[str, torch.Tensor]:
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else dict(model_or_state)
    if not state:
        raise ValueError("nothing to flatten: empty state")
    for name, tensor in state.items():
        if not torch.is_floating_point(tensor):
            raise ValueError(f"state entry {name!r} has dtype {tensor.dtype}; only floating tensors can be flattened")
    return state


def flatten(model_or_state: ModelOrState) -> tuple[torch.Tensor, tuple[TensorSpec, ...]]:
    """All floating tensors of a model or state dict, in sorted-name order, as one float32 vector."""
    state = _state(model_or_state)
    names = sorted(state)
    spec = tuple(TensorSpec(n, tuple(state[n].shape)) for n in names)
    vector = torch.cat([state[n].detach().reshape(-1).to(torch.float32) for n in names])
    return vector, spec


def unflatten(vector: torch.Tensor, spec: tuple[TensorSpec, ...]) -> dict[str, torch.Tensor]:
    """The state dict (fresh float32 tensors) that `flatten` turned into `vector`."""
    total = sum(int(np.prod(s.shape, dtype=np.int64)) for s in spec)
    if vector.dim() != 1 or vector.numel() != total:
        raise ValueError(f"vector has shape {tuple(vector.shape)}, the spec needs ({total},)")
    state: dict[str, torch.Tensor] = {}
    offset = 0
    for s in spec:
        size = int(np.prod(s.shape, dtype=np.int64))
        state[s.name] = vector[offset : offset + size].reshape(s.shape).to(torch.float32).clone()
        offset += size
    return state


def encode_blob(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> bytes:
    """Canonical safetensors bytes of `tensors` with string metadata `meta`."""
    if not tensors:
        raise ValueError("a blob needs at least one tensor")
    header: dict[str, object] = {}
    if meta:
        for key, value in meta.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"metadata must map str to str, got {key!r}: {type(value).__name__}")
        header["__metadata__"] = dict(sorted(meta.items()))
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved and cannot name a tensor")
        tensor = tensors[name]
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}; allowed: {', '.join(map(str, _DTYPES))}")
        # numpy with an explicit little-endian dtype: the bytes do not depend on the host.
        array = tensor.detach().cpu().contiguous().numpy()
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": _DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def decode_blob(
    data: bytes, *, max_size: int, expected: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Parse and validate a blob: size cap, canonical encoding, names, shapes, dtypes, finite values."""
    if len(data) > max_size:
        raise BlobError(f"blob of {len(data)} bytes exceeds the {max_size}-byte limit")
    if len(data) < 8:
        raise BlobError(f"blob of {len(data)} bytes is shorter than the 8-byte safetensors header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > min(_MAX_HEADER, len(data) - 8):
        raise BlobError(f"blob header length {header_len} is larger than the blob or the {_MAX_HEADER}-byte cap")
    try:
        header = json.loads(data[8 : 8 + header_len])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BlobError(f"blob header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise BlobError("blob header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise BlobError("blob metadata must map strings to strings")

    try:
        tensors = load(bytes(data))
    except (SafetensorError, ValueError, TypeError) as exc:
        raise BlobError(f"blob is not valid safetensors: {exc}") from None
    if not tensors:
        raise BlobError("blob holds no tensors")
    if expected is not None:
        if set(tensors) != set(expected):
            raise BlobError(f"blob holds tensors {sorted(tensors)}, expected {sorted(expected)}")
        for name, (shape, dtype) in expected.items():
            tensor = tensors[name]
            if tuple(tensor.shape) != tuple(shape):
                raise BlobError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
            if tensor.dtype != dtype:
                raise BlobError(f"tensor {name!r} has dtype {tensor.dtype}, expected {dtype}")
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPES:
            raise BlobError(f"tensor {name!r} has disallowed dtype {tensor.dtype}")
        if torch.is_floating_point(tensor) and not bool(torch.isfinite(tensor).all()):
            raise BlobError(f"tensor {name!r} holds NaN or infinite values")
    if encode_blob(tensors, meta) != bytes(data):
        raise BlobError("blob is not in canonical encoding (sorted keys, packed data, compact header)")
    return tensors, meta


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def model_digest(model_or_state: ModelOrState) -> bytes:
    """sha256 of the canonical blob of a model's state (float tensors as stored, no metadata)."""
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else dict(model_or_state)
    return sha256(encode_blob(state, {}))
