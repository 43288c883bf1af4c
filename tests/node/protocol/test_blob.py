"""Blobs: canonical safetensors bytes, strict decoding, every validation error.

Tensor and digest equalities are exact by design: encoding and decoding copy bits, and digests
hash bytes; no arithmetic is involved."""

import json
import struct

import pytest
import torch
from safetensors.torch import load as st_load

from node.learning.models import init_model
from node.protocol.blob import BlobError, decode_blob, encode_blob, flatten, model_digest, sha256, unflatten

MAX = 1 << 20


def tensors():
    return {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a": torch.tensor([1.5, -2.0])}


def test_round_trip_is_canonical_and_readable_by_safetensors():
    data = encode_blob(tensors(), {"round": "3", "kind": "update"})
    assert data == encode_blob(dict(reversed(list(tensors().items()))), {"kind": "update", "round": "3"})
    out, meta = decode_blob(data, max_size=MAX, expected={"a": ((2,), torch.float32), "b": ((2, 3), torch.float32)})
    assert meta == {"kind": "update", "round": "3"}
    assert all(torch.equal(out[k], v) for k, v in tensors().items())
    assert all(torch.equal(st_load(data)[k], v) for k, v in tensors().items())  # the library agrees
    (header_len,) = struct.unpack("<Q", data[:8])
    assert header_len % 8 == 0 and list(json.loads(data[8 : 8 + header_len])) == ["__metadata__", "a", "b"]


def test_flatten_unflatten_model():
    model = init_model("digits-cnn", input_shape=(1, 8, 8), num_classes=10, seed=0)
    vector, spec = flatten(model)
    assert vector.dtype == torch.float32 and vector.dim() == 1 and vector.numel() == 8714
    assert [s.name for s in spec] == sorted(model.state_dict())
    state = unflatten(vector, spec)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    other = init_model("digits-cnn", input_shape=(1, 8, 8), num_classes=10, seed=1)
    other.load_state_dict(state)
    assert (
        model_digest(other)
        == model_digest(model)
        != model_digest(init_model("digits-cnn", input_shape=(1, 8, 8), num_classes=10, seed=2))
    )
    assert len(sha256(b"x")) == 32
    with pytest.raises(ValueError, match="spec needs"):
        unflatten(vector[:-1], spec)


def reencode(data: bytes, edit) -> bytes:
    """Rewrite a blob's header with `edit(header)` and keep its data bytes."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + n :]


def test_validation_errors():
    good = encode_blob(tensors(), {"k": "v"})
    expected = {"a": ((2,), torch.float32), "b": ((2, 3), torch.float32)}
    cases = [
        (good, {"max_size": len(good) - 1}, "exceeds the"),
        (good[:5], {}, "shorter than"),
        (struct.pack("<Q", 10**9) + good[8:], {}, "header length"),
        (struct.pack("<Q", 8) + b"{not json" + good[17:], {}, "not valid JSON"),
        (good[:-4], {}, "not valid safetensors"),
        (good, {"expected": {"a": ((2,), torch.float32)}}, r"holds tensors \['a', 'b'\]"),
        (good, {"expected": {**expected, "a": ((3,), torch.float32)}}, "'a' has shape"),
        (good, {"expected": {**expected, "a": ((2,), torch.float64)}}, "'a' has dtype"),
        (encode_blob({"a": torch.tensor([float("nan")])}, {}), {}, "NaN or infinite"),
        (encode_blob({"a": torch.tensor([float("inf")])}, {}), {}, "NaN or infinite"),
        (reencode(good, lambda h: h.update({"__metadata__": {"k": 1}})), {}, "metadata must map"),
    ]
    for data, kwargs, message in cases:
        with pytest.raises(BlobError, match=message):
            decode_blob(data, **{"max_size": MAX, **kwargs})


def test_non_canonical_encoding_refused():
    good = encode_blob(tensors(), {})
    (n,) = struct.unpack("<Q", good[:8])
    spaced = json.dumps(json.loads(good[8 : 8 + n])).encode()  # ", " and ": " separators
    spaced += b" " * (-len(spaced) % 8)
    data = struct.pack("<Q", len(spaced)) + spaced + good[8 + n :]
    assert st_load(data)["a"].tolist() == [1.5, -2.0]  # valid safetensors ...
    with pytest.raises(BlobError, match="canonical"):  # ... but a second encoding of the same blob
        decode_blob(data, max_size=MAX)


def test_bf16_and_bad_metadata_refused_on_encode():
    with pytest.raises(ValueError, match="dtype"):
        encode_blob({"a": torch.zeros(2, dtype=torch.bfloat16)}, {})
    with pytest.raises(ValueError, match="metadata must map str to str"):
        encode_blob(tensors(), {"round": 3})
    with pytest.raises(ValueError, match="at least one tensor"):
        encode_blob({}, {})
