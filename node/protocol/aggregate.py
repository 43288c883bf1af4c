"""Aggregation rules that give the same bits on every peer, in any input order, on any hardware.

Floating-point sums depend on the order of the additions, and torch's reductions choose an
order by SIMD width and thread count. So no rule here reduces floats in an order torch picks:
- fedavg (McMahan et al., AISTATS 2017), the sample-weighted mean: every coordinate is
  quantized to an int64 at scale 2^s, the weighted sum is exact integer arithmetic (associative:
  order cannot matter), and one final integer division rounds half up before scaling back.
  The scale s is chosen from the inputs' largest magnitude and the total weight (both
  order-independent), capped at `MAX_SCALE_BITS`, so that no partial sum can overflow.
  Quantization error per input coordinate is at most 2^-(s+1).
- median (Yin et al., ICML 2018): coordinate-wise, by sorting (exact); for an even count the
  midpoint of the two middle values is computed in float64 (exact) and rounded once to float32.
- trimmed-mean (same paper): sort each coordinate, drop floor(trim_ratio * n) values at each
  end, at least one in a round of three or more when trim_ratio > 0 (so that one member's
  extreme value is always dropped, whatever n: floor(0.1 * 5) alone would trim nothing), average
  the rest with the exact fixed-point sum above (unweighted).
- krum (Blanchard et al., NeurIPS 2017): inputs are first put in a canonical order (by the
  sha256 of their bytes), squared distances are elementwise float64 operations (IEEE, exact
  rounding) summed by a sequential cumulative sum (one fixed order), scores are summed in
  Python in sorted order, and ties go to the lowest canonical index. The result is one input
  vector, bit for bit.
-0.0 is replaced by +0.0 on input, so a sort cannot leak the input order through the sign of zero.
median, trimmed-mean and krum ignore the weights (they are checked, not used).

The fixed point holds any input with |v| < VALUE_BOUND (2^20) in a round of at most
MAX_PARTICIPANTS (256) participants whose weights are at most MAX_WEIGHT (the ledger's cap on a
commit's sample count, 2^32 - 1): then max|v| < 2^20 and the total weight W < 2^40, so the scale
s = min(40, 61 - 20 - 40 - 1) >= 0 exists and no sum overflows. node.protocol.wire.read_vector
refuses update blobs outside that bound (a malformed blob, left out alike by every peer).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
import torch

from node.protocol.settings import SharedSettings

RULES = ("fedavg", "median", "trimmed-mean", "krum")
MAX_SCALE_BITS = 40  # finer than float32's resolution for any value above 2^-16
SUM_BOUND_BITS = 61  # |sum of weight * quantized value| < 2^61, so 2 * sum + W fits in int64
# What the fixed point is guaranteed to hold (module doc): the inputs' bound follows from the
# largest total weight, MAX_PARTICIPANTS * MAX_WEIGHT < 2^MAX_WEIGHT_BITS.
MAX_PARTICIPANTS = 256  # a round's participants the guarantee is computed for
MAX_WEIGHT = 2**32 - 1  # a weight is a commit's sample count; the ledger refuses larger ones
MAX_WEIGHT_BITS = (MAX_PARTICIPANTS * MAX_WEIGHT - 1).bit_length()  # ceil(log2(max W)) = 40
VALUE_BOUND_BITS = SUM_BOUND_BITS - 1 - MAX_WEIGHT_BITS  # 20: max|v| < 2^20 keeps s >= 0
VALUE_BOUND = 2.0**VALUE_BOUND_BITS  # 1,048,576: inputs must satisfy |v| < VALUE_BOUND


def aggregate(
    rule: str, vectors: list[torch.Tensor], weights: list[int], *, trim_ratio: float = 0.1, krum_f: int = 1
) -> torch.Tensor:
    """Aggregate 1-D float32 `vectors` with per-vector sample counts `weights` by `rule`."""
    if rule not in RULES:
        raise ValueError(f"unknown aggregation rule {rule!r}; choose one of {', '.join(RULES)}")
    rows = _validate(vectors, weights)
    if rule == "fedavg":
        return _fixed_point_mean(rows, weights)
    if rule == "median":
        return _median(torch.stack(rows))
    if rule == "trimmed-mean":
        return _trimmed_mean(torch.stack(rows), trim_ratio)
    return _krum(rows, krum_f)


def aggregate_digest(vector: torch.Tensor) -> bytes:
    """sha256 of the vector's float32 little-endian bytes: a quick equality check across peers
    (the ledger's model digest is the sha256 of the model blob, see node.protocol.wire)."""
    return hashlib.sha256(_le_bytes(vector)).digest()


def _le_bytes(vector: torch.Tensor) -> bytes:
    return vector.detach().contiguous().numpy().astype("<f4", copy=False).tobytes()


def _validate(vectors: list[torch.Tensor], weights: list[int]) -> list[torch.Tensor]:
    if not vectors:
        raise ValueError("cannot aggregate an empty list of vectors")
    if len(weights) != len(vectors):
        raise ValueError(f"got {len(vectors)} vectors but {len(weights)} weights")
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
            raise ValueError(f"weights[{i}] must be a positive integer sample count, got {w!r}")
    shape = tuple(vectors[0].shape)
    if len(shape) != 1 or shape[0] == 0:
        raise ValueError(f"vectors must be non-empty 1-D tensors, vectors[0] has shape {shape}")
    for i, v in enumerate(vectors):
        if tuple(v.shape) != shape:
            raise ValueError(f"vectors[{i}] has shape {tuple(v.shape)}, vectors[0] has {shape}")
        if v.dtype != torch.float32:
            raise ValueError(f"vectors[{i}] has dtype {v.dtype}, expected torch.float32")
        if not bool(torch.isfinite(v).all()):
            raise ValueError(f"vectors[{i}] holds NaN or infinite values")
    zero = torch.zeros((), dtype=torch.float32)
    return [torch.where(v == 0, zero, v.detach()) for v in vectors]  # -0.0 -> +0.0


def _fixed_point_mean(rows: Sequence[torch.Tensor], weights: Sequence[int]) -> torch.Tensor:
    """Exact weighted mean in int64 fixed point, one rounding at the end (see module doc).
    Rows are quantized one at a time: memory stays O(d) beyond the inputs."""
    total_weight = int(sum(int(w) for w in weights))
    max_abs = max(float(row.abs().max()) for row in rows)
    # max_abs < 2^e exactly (frexp gives max_abs = m * 2^e with 0.5 <= m < 1).
    e = math.frexp(max_abs)[1] if max_abs > 0 else 0
    weight_bits = (total_weight - 1).bit_length()  # ceil(log2 W), exactly (a float log2 rounds above 2^53)
    scale_bits = min(MAX_SCALE_BITS, SUM_BOUND_BITS - e - weight_bits - 1)
    if scale_bits < 0:  # never for |v| < VALUE_BOUND and W <= MAX_PARTICIPANTS * MAX_WEIGHT
        raise ValueError(
            f"values too large for exact fixed-point averaging: max |v| = {max_abs:.3g} "
            f"with total weight {total_weight} (the bound is |v| < {VALUE_BOUND:.0f} for a total weight "
            f"below 2^{MAX_WEIGHT_BITS})"
        )
    total = torch.zeros(rows[0].shape[0], dtype=torch.int64)
    for row, w in zip(rows, weights):
        # v * 2^s is exact in float64 (a float32 times a power of two); rounding is half-to-even.
        quantized = torch.round(row.to(torch.float64) * 2.0**scale_bits).to(torch.int64)
        total += quantized * int(w)  # sum |q * w| <= 2^(s+e) * W <= 2^60: exact, no overflow
    # Round half up: floor((2 * total + W) / (2 * W)).
    mean_q = torch.div(2 * total + total_weight, 2 * total_weight, rounding_mode="floor")
    # Two IEEE roundings (int64 -> float64 -> float32), both deterministic on any hardware.
    return (mean_q.to(torch.float64) * 2.0**-scale_bits).to(torch.float32)


def _median(stacked: torch.Tensor) -> torch.Tensor:
    n = stacked.shape[0]
    ordered = torch.sort(stacked, dim=0).values
    if n % 2:
        return ordered[n // 2].clone()
    low, high = ordered[n // 2 - 1].to(torch.float64), ordered[n // 2].to(torch.float64)
    return ((low + high) / 2).to(torch.float32)


def trim_count(trim_ratio: float, n: int) -> int:
    """How many values the trimmed mean drops at each end of n: floor(trim_ratio * n), and at
    least one of three or more when trim_ratio > 0 (still under n / 2: 1 <= (n - 1) / 2)."""
    if not 0 <= trim_ratio < 0.5:
        raise ValueError(f"trim_ratio must be in [0, 0.5), got {trim_ratio!r}")
    trim = int(math.floor(trim_ratio * n))
    return max(trim, 1) if trim_ratio > 0 and n >= 3 else trim


def _trimmed_mean(stacked: torch.Tensor, trim_ratio: float) -> torch.Tensor:
    n = stacked.shape[0]
    trim = trim_count(trim_ratio, n)
    kept = torch.sort(stacked, dim=0).values[trim : n - trim]
    return _fixed_point_mean(list(kept), [1] * kept.shape[0])


def _krum(rows: list[torch.Tensor], f: int) -> torch.Tensor:
    """O(n^2 d): fine for the tens of peers of a round, slow for hundreds."""
    n = len(rows)
    if f < 0:
        raise ValueError(f"krum_f must be >= 0, got {f}")
    neighbours = n - f - 2
    if neighbours < 1:
        raise ValueError(
            f"krum with krum_f={f} needs at least f + 3 = {f + 3} vectors, got {n} (its guarantee needs n > 2f + 2)"
        )
    order = sorted(range(n), key=lambda i: hashlib.sha256(_le_bytes(rows[i])).digest())
    canonical = [rows[i].to(torch.float64).numpy() for i in order]
    distance = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            diff = canonical[i] - canonical[j]
            distance[i, j] = distance[j, i] = np.cumsum(diff * diff)[-1]  # sequential: one fixed order
    best, best_score = 0, math.inf
    for i in range(n):
        score = 0.0
        for d in sorted(distance[i, j] for j in range(n) if j != i)[:neighbours]:
            score += d
        if score < best_score:  # strict: ties keep the lowest canonical index
            best, best_score = i, score
    return rows[order[best]].clone()


def next_global(
    shared: SharedSettings, previous: torch.Tensor, vectors: list[torch.Tensor], weights: list[int]
) -> torch.Tensor:
    """The global model after a round, from the included blobs in ledger order. The single
    place this is computed: the peer and `swarm verify` both call it."""
    agg = aggregate(shared.aggregation, vectors, weights, trim_ratio=shared.trim_ratio, krum_f=shared.krum_f)
    if shared.share == "update":
        return (previous + agg).to(torch.float32)
    return agg.to(torch.float32)
