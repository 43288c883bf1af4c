"""Hostile blobs against the decoder (`blob.decode_blob`, `wire.read_vector`) and the aggregation:
whatever bytes a registered peer publishes, decoding ends in a vector or a `BlobError`, never a
crash, a hang or another exception, and what decodes the exact aggregation can hold.

The 99,000-deep header runs in a subprocess that imports eth_account first, as a peer does: it
raises the recursion limit to 100,000, so CPython's JSON parser overflowed the C stack (SIGSEGV)
before the header bytes were scanned."""

from __future__ import annotations

import contextlib
import json
import struct
import subprocess
import sys
import textwrap
from datetime import timedelta

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.protocol import aggregate as agg
from node.protocol import wire
from node.protocol.blob import MAX_HEADER_BYTES, MAX_HEADER_DEPTH, BlobError, check_header, decode_blob

D = 5  # parameters of the vectors below
MECHANISM = wire.canonical({"epsilon": 1.0, "name": "pnpm"})
COMMITTER = "0x" + "a1" * 20
BOUND = agg.VALUE_BOUND
BELOW = float(np.nextafter(np.float32(BOUND), np.float32(0)))  # the largest float32 inside the bound
# Bounded examples and a deadline (generous: the machine is busy): a hang fails, it cannot pass.
HOSTILE = settings(
    max_examples=300, deadline=timedelta(seconds=5), derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def update(values: list[float] | torch.Tensor) -> bytes:
    return wire.update_blob(torch.as_tensor(values, dtype=torch.float32), 1, MECHANISM, COMMITTER)


def with_header(text: bytes, data: bytes = b"") -> bytes:
    """A blob whose header is `text` (padded to 8 bytes as the format requires), then `data`."""
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def read(data: bytes) -> torch.Tensor | None:
    """What a peer does with a fetched blob: the vector, or None for a malformed one (left out).
    Any exception other than BlobError fails the test."""
    try:
        vector, meta = wire.read_vector(data, D, kind="update")
    except BlobError:
        return None
    assert vector.dtype == torch.float32 and tuple(vector.shape) == (D,) and meta["kind"] == "update"
    assert bool(torch.isfinite(vector).all()) and float(vector.abs().max()) < BOUND
    return vector


# ------------------------------------------------------------------ the crash that was


SUBPROCESS = textwrap.dedent(
    """
    import struct, sys
    import eth_account  # noqa: F401  (as in a peer: py_ecc raises the recursion limit)
    assert sys.getrecursionlimit() >= 100_000, sys.getrecursionlimit()
    from node.protocol import blob, wire

    d = 42_090  # pnpm-fmnist: max_blob_size 233,896 bytes lets a 198,008-byte blob through
    text = b"[" * 99_000 + b"]" * 99_000
    data = struct.pack("<Q", len(text)) + text
    assert len(data) <= wire.max_blob_size(d)
    try:
        wire.read_vector(data, d, kind="update")
    except blob.BlobError as exc:
        print("read_vector:", exc)
    # the depth scan alone, with the old 1 MiB header cap: still a BlobError, before any parser
    blob.MAX_HEADER_BYTES = 1 << 20
    try:
        blob.decode_blob(data, max_size=len(data))
    except blob.BlobError as exc:
        print("decode_blob:", exc)
    """
)


def test_a_header_nested_99000_deep_is_a_blob_error_not_a_segfault():
    done = subprocess.run([sys.executable, "-c", SUBPROCESS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode} (-11 is SIGSEGV): {done.stderr[-2000:]}"
    lines = done.stdout.splitlines()
    assert lines[0].startswith("read_vector:") and f"{MAX_HEADER_BYTES}-byte cap" in lines[0]
    assert lines[1].startswith("decode_blob:") and f"deeper than {MAX_HEADER_DEPTH} levels" in lines[1]


# ------------------------------------------------------------------ the header scan


def test_the_depth_scan_counts_brackets_outside_strings_only():
    assert MAX_HEADER_DEPTH == 4 and MAX_HEADER_BYTES == 64 * 1024
    check_header(b'{"a":{"b":[[1]]}}')  # 4 levels: the cap
    with pytest.raises(BlobError, match="deeper than 4 levels"):
        check_header(b'{"a":{"b":[[[1]]]}}')
    check_header(b'{"a":"[[[[[{{{{{"}')  # inside a string: text, not nesting
    check_header(b'{"a":"\\"[[[[[[[["}')  # an escaped quote does not end the string
    with pytest.raises(BlobError, match="deeper"):
        check_header(b'{"a":"\\\\",[[[[[[[[')  # an escaped backslash does: the brackets count
    with pytest.raises(BlobError, match="never opened"):
        check_header(b"]]]]]" + b"[" * 8)  # closing first buys no depth
    with pytest.raises(BlobError, match="not ASCII"):
        check_header('{"a":"\u00e9"}'.encode())
    with pytest.raises(BlobError, match="not ASCII"):  # UTF-16 JSON, which json.loads(bytes) would accept
        check_header('{"a":"\u00e9[[[[[[[["}'.encode("utf-16-le"))
    # UTF-16 of ASCII text is ASCII bytes, but the parser then gets the text with its NUL bytes, not
    # bytes it could decode as UTF-16: invalid JSON, whatever the scan saw
    with pytest.raises(BlobError, match="not valid JSON"):
        decode_blob(with_header('{"a":"b"}'.encode("utf-16-le")), max_size=1 << 20)
    with pytest.raises(BlobError, match="exceeds"):
        check_header(b" " * (MAX_HEADER_BYTES + 1))


def test_every_real_header_passes_the_scan():
    genesis = wire.genesis_blob(torch.zeros(D), {"nested": {"settings": [1, [2, {"x": "[[[["}]]}})
    for data in (update([0.5] * D), wire.model_blob(torch.zeros(D), 3), genesis):
        (n,) = struct.unpack("<Q", data[:8])
        check_header(data[8 : 8 + n])
        assert decode_blob(data, max_size=len(data))[1]["kind"] in {"update", "model", "genesis"}


@pytest.mark.parametrize(
    "header,data,message",
    [
        (b'{"vector":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}', b"\0", "valid safetensors"),  # KeyError
        (b'{"vector":{"dtype":"F32","shape":[' + b"9" * 5000 + b"]}}", b"", "not valid JSON"),  # int digits
        (b'{"vector":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}', b"\0" * 8, "disallowed dtype"),
        (b'{"vector":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}}', b"\0" * 4, "valid safetensors"),
        (b"[]", b"", "not a JSON object"),
        (b"{}", b"", "no tensors"),
    ],
    ids=["dtype-torch-lacks", "5000-digit-int", "complex", "infinite-shape", "array", "empty"],
)
def test_what_the_libraries_raise_on_hostile_headers_is_a_blob_error(header, data, message):
    with pytest.raises(BlobError, match=message):
        decode_blob(with_header(header, data), max_size=1 << 20)


# ------------------------------------------------------------------ values


def test_update_values_must_lie_inside_what_the_fixed_point_holds():
    assert (agg.MAX_WEIGHT_BITS, agg.VALUE_BOUND_BITS, BOUND) == (40, 20, 1_048_576.0)
    assert read(update([BELOW, -BELOW, 0.0, 1.0, -0.0])) is not None
    for value in (BOUND, -BOUND, 1e30, -3.4e38, float("inf"), float("-inf"), float("nan")):
        with pytest.raises(BlobError, match="coordinate 2|NaN or infinite"):
            wire.read_vector(update([0.0, 1.0, value, 0.0, 0.0]), D, kind="update")
    with pytest.raises(BlobError, match="update value 1e\\+30 at coordinate 3"):
        wire.read_vector(update([0.0, 0.0, 0.0, 1e30, 0.0]), D)  # the blob's kind decides, not the caller's
    # the bound is about aggregating updates: a model or genesis blob is not an input to the sums
    huge = torch.full((D,), 1e30)
    assert torch.equal(wire.read_vector(wire.model_blob(huge, 1), D, kind="model")[0], huge)


def test_the_bound_is_exactly_what_the_largest_round_can_hold():
    """MAX_PARTICIPANTS participants at the ledger's largest sample count: inside the bound every
    exact rule aggregates; one step out (2^20, which read_vector refuses) the fixed point cannot."""
    n = agg.MAX_PARTICIPANTS
    rows = [torch.tensor([BELOW, -BELOW, 1.0], dtype=torch.float32) for _ in range(n)]
    weights = [agg.MAX_WEIGHT] * n
    for rule in ("fedavg", "trimmed-mean"):
        out = agg.aggregate(rule, rows, weights, trim_ratio=0.1)
        # s = 0 here: quantization error up to 1/2 (docs/NODE.md, "Aggregation")
        assert torch.allclose(out.double(), rows[0].double(), rtol=0, atol=0.5)
    with pytest.raises(ValueError, match="too large for exact fixed-point"):
        agg.aggregate("fedavg", [torch.tensor([BOUND], dtype=torch.float32)] * n, weights)


# ------------------------------------------------------------------ properties


def blob_with(header: object, data: bytes) -> bytes:
    return with_header(json.dumps(header, separators=(",", ":")).encode(), data)


# bits per element of safetensors dtypes (and one name it does not know)
BITS = {"F32": 32, "F64": 64, "F16": 16, "BF16": 16, "I64": 64, "U8": 8, "BOOL": 8, "C64": 64, "F4": 4, "X": 8}
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
values = st.one_of(
    st.floats(width=32),  # NaN, inf, huge, tiny, -0.0
    st.floats(min_value=-BELOW, max_value=BELOW, width=32),
    st.sampled_from([1e30, -1e30, BOUND, -BOUND, BELOW, 3.4e38]),
)


@st.composite
def valid_updates(draw: st.DrawFn) -> bytes:
    return update(draw(st.lists(st.floats(min_value=-BELOW, max_value=BELOW, width=32), min_size=D, max_size=D)))


@st.composite
def hostile_blobs(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["random", "truncated", "mutated", "nested", "dtype", "shape", "values", "header"]))
    if kind == "random":
        return draw(st.binary(max_size=600))
    if kind == "truncated":
        good = draw(valid_updates())
        return good[: draw(st.integers(0, len(good) - 1))]
    if kind == "mutated":
        good = bytearray(draw(valid_updates()))
        for _ in range(draw(st.integers(1, 4))):
            good[draw(st.integers(0, len(good) - 1))] = draw(st.integers(0, 255))
        return bytes(good)
    if kind == "nested":
        depth = draw(st.integers(1, 3000))
        brackets = draw(st.lists(st.sampled_from(["[", "{"]), min_size=depth, max_size=depth))
        closing = "".join({"[": "]", "{": "}"}[b] for b in reversed(brackets))
        text = draw(st.sampled_from(['{"vector":', '{"__metadata__":', ""])) + "".join(brackets) + closing
        return with_header(text.encode(), draw(st.binary(max_size=40)))
    if kind == "dtype":
        dtype = draw(st.sampled_from([torch.float64, torch.int64, torch.int32, torch.uint8]))
        return wire.update_blob(torch.zeros(D, dtype=dtype), 1, MECHANISM, COMMITTER)
    if kind == "shape":
        shape = draw(st.sampled_from([(0,), (D - 1,), (D + 1,), (1, D), (D, 1)]))
        return wire.update_blob(torch.zeros(shape), 1, MECHANISM, COMMITTER)
    if kind == "values":
        return update(draw(st.lists(values, min_size=D, max_size=D)))
    # a hand-written header: any dtype name the format (or not) knows, with a shape and offsets
    # that agree with the data (so the library accepts it and the checks after it run), or not
    dtype = draw(st.sampled_from(sorted(BITS)))
    if draw(st.booleans()):
        shape = draw(st.lists(st.integers(0, 2 * D), max_size=2))
        size = -(-int(np.prod(shape, dtype=np.int64)) * BITS[dtype] // 8)
        entry: dict[str, object] = {"dtype": dtype, "shape": shape, "data_offsets": [0, size]}
        data = draw(st.binary(min_size=size, max_size=size))
    else:
        entry = {
            "dtype": dtype,
            "shape": draw(st.lists(st.integers(-2, 2**63), max_size=3)),
            "data_offsets": draw(st.lists(st.integers(-1, 2**64), max_size=3)),
        }
        data = draw(st.binary(max_size=64))
    header = {draw(st.sampled_from(["vector", "other", "__metadata__"])): entry}
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=5), st.one_of(st.text(max_size=5), finite32)))
    return blob_with(header, data)


@HOSTILE
@given(data=st.one_of(hostile_blobs(), valid_updates()))
def test_any_blob_decodes_to_a_bounded_vector_or_a_blob_error(data):
    read(data)  # asserts the vector's properties; anything but BlobError fails
    with contextlib.suppress(BlobError):
        decode_blob(data, max_size=1 << 20)  # as `swarm verify` decodes the genesis: no `expected`


@HOSTILE
@given(
    blobs=st.lists(st.one_of(hostile_blobs(), valid_updates()), min_size=1, max_size=8),
    weights=st.lists(st.integers(1, agg.MAX_WEIGHT), min_size=8, max_size=8),
    rule=st.sampled_from(agg.RULES),
)
def test_what_decodes_always_aggregates(blobs, weights, rule):
    """The peer's pipeline: decode every blob, leave out the malformed, aggregate the rest (any
    sample counts the ledger accepts). The rule never raises on what read_vector let through."""
    kept = [(v, w) for v, w in zip(map(read, blobs), weights) if v is not None]
    if not kept or (rule == "krum" and len(kept) < 4):  # krum's own minimum (f = 1): n >= f + 3
        return
    out = agg.aggregate(rule, [v for v, _ in kept], [w for _, w in kept], trim_ratio=0.2, krum_f=1)
    assert out.dtype == torch.float32 and bool(torch.isfinite(out).all()) and float(out.abs().max()) <= BOUND


@settings(max_examples=60, deadline=timedelta(seconds=5), derandomize=True)
@given(
    rows=st.lists(
        st.lists(st.floats(min_value=-BELOW, max_value=BELOW, width=32), min_size=2, max_size=2),
        min_size=1,
        max_size=agg.MAX_PARTICIPANTS,
    ),
    data=st.data(),
)
def test_the_fixed_point_never_overflows_inside_the_bound(rows, data):
    """Up to MAX_PARTICIPANTS bounded rows, weights up to the ledger's cap: fedavg and
    trimmed-mean never refuse, and the mean lies between the inputs' extremes up to the
    quantization step (<= 1/2) and the final float32 rounding (<= 1/32 below 2^20)."""
    weight = st.one_of(st.just(agg.MAX_WEIGHT), st.integers(1, agg.MAX_WEIGHT))
    weights = data.draw(st.lists(weight, min_size=len(rows), max_size=len(rows)))
    vectors = [torch.tensor(r, dtype=torch.float32) for r in rows]
    stacked = torch.stack(vectors).double()
    low, high = stacked.min(0).values - 0.5625, stacked.max(0).values + 0.5625
    for rule in ("fedavg", "trimmed-mean"):
        out = agg.aggregate(rule, vectors, weights, trim_ratio=0.1).double()
        assert bool((out >= low).all()) and bool((out <= high).all())
