"""Tensors on the wire: canonical safetensors bytes, strict decoding, digests. Never pickle.

`encode_blob` writes the safetensors format itself (8-byte little-endian header length, JSON
header, raw little-endian tensor bytes) so the bytes are canonical: keys sorted, data laid out
in key order, header JSON without spaces, padded with spaces to a multiple of 8 as the format
requires. The same tensors and metadata therefore always give the same bytes and the same
sha256 on every peer and every version of the safetensors library. `decode_blob` parses with
the safetensors library (no code execution), then insists that re-encoding gives back the
exact input bytes, so a blob has exactly one valid encoding.

Blobs come from peers that may be hostile, so decoding is bounded before any parser runs: the
header is at most `MAX_HEADER_BYTES`, ASCII (as every canonical header is), and nested at most
`MAX_HEADER_DEPTH` levels, counted by a byte scan outside JSON strings. (CPython's JSON parser
recurses in C once per level; importing eth_account raises the recursion limit to 100,000, so a
header nested ~100,000 levels deep overflowed the C stack and killed the process.) Whatever goes
wrong while decoding raises `BlobError`, never anything else, so every caller leaves the blob out.
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
# The JSON header's byte cap. A canonical update header is ~160 bytes plus its mechanism JSON,
# a genesis header (with the swarm's settings) a few hundred; wire.max_blob_size leaves 64 KiB
# beside the vector for header and metadata, and no header may be larger than that room.
MAX_HEADER_BYTES = 64 * 1024
# Nesting of [ and { outside strings. A valid header needs 3: the header object, a tensor's
# entry, its shape and data_offsets lists (metadata values are strings, whatever they hold).
MAX_HEADER_DEPTH = 4
_QUOTE, _BACKSLASH, _OPENING, _CLOSING = 0x22, 0x5C, (0x5B, 0x7B), (0x5D, 0x7D)

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


def check_header(header: bytes) -> str:
    """The header as text, if it is ASCII and nested at most MAX_HEADER_DEPTH levels; else
    BlobError. Runs before any JSON parser: one pass over at most MAX_HEADER_BYTES bytes, no
    recursion. The scan follows JSON's lexical rules (a string runs from a quote to the next
    unescaped quote; a backslash escapes the byte after it), so a parser never reaches a depth
    the scan has not seen: on valid JSON they agree, and a parser stops at the first invalid byte."""
    if len(header) > MAX_HEADER_BYTES:
        raise BlobError(f"blob header of {len(header)} bytes exceeds the {MAX_HEADER_BYTES}-byte cap")
    if not header.isascii():  # canonical headers are ASCII (and the parser gets text: no UTF-16/32 guessing)
        raise BlobError("blob header is not ASCII")
    depth = 0
    in_string = escaped = False
    for position, byte in enumerate(header):
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPENING:
            depth += 1
            if depth > MAX_HEADER_DEPTH:
                raise BlobError(
                    f"blob header nests deeper than {MAX_HEADER_DEPTH} levels (at byte {position} of the header)"
                )
        elif byte in _CLOSING:
            if depth == 0:
                raise BlobError(f"blob header closes a bracket it never opened (at byte {position} of the header)")
            depth -= 1
    return header.decode("ascii")


def decode_blob(
    data: bytes, *, max_size: int, expected: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Parse and validate a blob: size cap, bounded header, canonical encoding, names, shapes,
    dtypes, finite values. Every failure is a `BlobError`."""
    if len(data) > max_size:
        raise BlobError(f"blob of {len(data)} bytes exceeds the {max_size}-byte limit")
    if len(data) < 8:
        raise BlobError(f"blob of {len(data)} bytes is shorter than the 8-byte safetensors header length")
    data = bytes(data)
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > min(MAX_HEADER_BYTES, len(data) - 8):
        raise BlobError(f"blob header length {header_len} is larger than the blob or the {MAX_HEADER_BYTES}-byte cap")
    text = check_header(data[8 : 8 + header_len])
    try:
        return _decode(data, text, expected)
    except (BlobError, MemoryError):  # MemoryError: this peer's trouble, not the blob's
        raise
    except Exception as exc:  # the JSON parser, safetensors or torch on hostile bytes: still just a bad blob
        raise BlobError(f"blob could not be decoded: {type(exc).__name__}: {exc}") from None


def _decode(
    data: bytes, text: str, expected: dict[str, tuple[tuple[int, ...], torch.dtype]] | None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """decode_blob after the header checks (`text`: the bounded header)."""
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or an integer of > 4,300 digits
        raise BlobError(f"blob header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise BlobError("blob header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise BlobError("blob metadata must map strings to strings")

    try:
        tensors = load(data)
    except (SafetensorError, ValueError, TypeError, KeyError) as exc:  # KeyError: a dtype torch lacks ("F4")
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
    if encode_blob(tensors, meta) != data:
        raise BlobError("blob is not in canonical encoding (sorted keys, packed data, compact header)")
    return tensors, meta


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def model_digest(model_or_state: ModelOrState) -> bytes:
    """sha256 of the canonical blob of a model's state (float tensors as stored, no metadata)."""
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else dict(model_or_state)
    return sha256(encode_blob(state, {}))
