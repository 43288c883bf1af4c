"""The interface every mechanism implements, its guarantee object, and input validation.

Perturb paths draw ONE uniform per coordinate into the output buffer and transform it in place
with whole-tensor ops and at most a few scratch buffers, so a mechanism costs little more than
its random numbers (docs/BENCHMARKS.md, section "Mechanisms"). The scratch buffers are kept
per thread and reused across calls: fresh 40 MB allocations cost more page faults than the
arithmetic (and small chunks cost more in per-op overhead on a loaded 2-core machine).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import ClassVar, SupportsFloat, cast

import torch

_WORKSPACE = threading.local()


@dataclass(frozen=True)
class Guarantee:
    """What one call of `perturb` guarantees.

    epsilon, delta: the (eps, delta)-DP bound of one release.
    protects: "value" (the input value is protected) or "sign" (only the sign of each input is).
    scope: "coordinate" (each coordinate is one release: a tensor of d coordinates costs d*eps)
           or "vector" (the whole tensor passed to one `perturb` call is one release).
    statement: one line a human can read.
    residual_delta: the part of `delta` that the floating-point sampler adds to the exact
           mechanism's (already included in delta; docs/MECHANISMS.md, "Floating point").
    """

    epsilon: float
    delta: float
    protects: str
    scope: str
    statement: str
    residual_delta: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _as_float(value: object, name: str) -> float:
    """float(value), or ValueError naming `name` when it is not a number (nor a numeric string)."""
    try:
        return float(cast(SupportsFloat, value))  # float() itself refuses anything else
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def check_epsilon(epsilon: object, name: str = "epsilon") -> float:
    value = _as_float(epsilon, name)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {epsilon!r}")
    return value


def check_delta(delta: object, name: str = "delta") -> float:
    value = _as_float(delta, name)
    if not (0.0 < value < 1.0):
        raise ValueError(f"{name} must lie in (0, 1), got {delta!r}")
    return value


def check_positive(value: object, name: str) -> float:
    out = _as_float(value, name)
    if not math.isfinite(out) or out <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return out


def check_finite(value: object, name: str) -> float:
    out = _as_float(value, name)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def check_tensor(
    x: torch.Tensor, *, low: float | None = None, high: float | None = None, clip: bool = False, what: str = "x"
) -> torch.Tensor:
    """Validate `x` and return it flat and contiguous.

    Refuses non-float32/64 tensors and NaN/inf. With bounds, values outside [low, high] are refused
    (ValueError) unless `clip` is set, in which case they are clamped to the bounds (a bound left
    None is no bound).
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{what} must be float32 or float64, got {x.dtype}")
    flat = x.detach().reshape(-1).contiguous()
    if flat.numel() == 0:
        return flat
    lo_t, hi_t = torch.aminmax(flat)  # one pass; NaN propagates into the result
    lo, hi = float(lo_t), float(hi_t)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{what} contains NaN or infinite values")
    if (low is not None and lo < low) or (high is not None and hi > high):
        if not clip:
            raise ValueError(
                f"{what} has values in [{lo:.6g}, {hi:.6g}], outside the domain [{low}, {high}] "
                "this mechanism needs; rescale the input or build the mechanism with clip=True"
            )
        flat = flat.clamp(low, high)
    return flat


def half_grid_threshold(q: float, dtype: torch.dtype) -> float:
    """The threshold that selects the same uniform draws as `u < q` but never equals a draw.

    torch's CPU `uniform_` returns multiples of 2^-24 (float32) or 2^-53 (float64). Moving the
    threshold to the middle between two grid points keeps P[u < q] as the grid allows and makes
    `u - q` never zero, so `sign(u - q)` is always +-1 (a zero would output a wrong value).
    Exact in the dtype only for q < 1/2 (above, the half grid needs one more bit): callers
    with larger q decide with `floor` instead, which needs no such care.
    """
    if not 0.0 < q < 0.5:
        raise ValueError(f"half_grid_threshold needs 0 < q < 1/2, got {q!r}")
    bits = 24 if dtype == torch.float32 else 53
    scale = 2.0**bits
    return (math.ceil(q * scale) - 0.5) / scale


def scratch(n: int, dtype: torch.dtype, slot: int) -> torch.Tensor:
    """A per-thread buffer of n elements, reused across calls (slot tells a caller's buffers apart)."""
    cache: dict[tuple[torch.dtype, int], torch.Tensor] | None = getattr(_WORKSPACE, "buffers", None)
    if cache is None:
        cache = _WORKSPACE.buffers = {}
    buf = cache.get((dtype, slot))
    if buf is None or buf.numel() < n:
        buf = cache[(dtype, slot)] = torch.empty(n, dtype=dtype)
    return buf[:n]


def uniform_draw(out: torch.Tensor, low: float, high: float, generator: torch.Generator | None) -> torch.Tensor:
    """Fill `out` with one uniform draw per element on [low, high): the only randomness a local
    mechanism uses.

    torch computes low + (high - low) * x for x on the 2^-24 (float32) or 2^-53 (float64) grid
    inside the generator's own pass, so an affine map of the uniform costs nothing. With
    high - low == 1 and low a float of the dtype the result is exactly x + low rounded once,
    whose sign is exactly the sign of x + low.
    """
    return out.uniform_(low, high, generator=generator)


def affine_(u: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
    """u <- shift + scale * u in ONE pass (a 0-dim tensor as `input` broadcasts for free)."""
    return torch.add(torch.tensor(shift, dtype=u.dtype), u, alpha=scale, out=u)


# ---------------------------------------------------------------------------------------------
# Release checks (`Mechanism.release_violation`): is a published vector a possible output?

# Tolerance of a release check, in units of the release dtype's machine epsilon times the
# magnitude of the output set (its largest |value|). An output value is computed from the
# float64 constants in at most three float32 roundings (constant -> dtype, one fused affine
# step, a scaling by d/k), each within half an ulp of the magnitude: 8 eps leaves a margin of
# more than 2x, while a release scaled by 1.01 is ~10^5 eps away in float32.
RELEASE_ULPS = 8.0
_CHECK_BLOCK = 1 << 20  # float64 working copies of at most 8 MB


def release_tolerance(dtype: torch.dtype, magnitude: float) -> float:
    """RELEASE_ULPS machine epsilons of `dtype`, relative to `magnitude`."""
    return RELEASE_ULPS * torch.finfo(dtype).eps * abs(magnitude)


def release_flat(y: object) -> torch.Tensor | str:
    """A release as a flat tensor, or why it cannot be one (every mechanism outputs float32/64)."""
    if not isinstance(y, torch.Tensor):
        return f"the release is not a tensor but {type(y).__name__}"
    if y.dtype not in (torch.float32, torch.float64):
        return f"the release is {y.dtype}, not float32 or float64"
    return y.detach().reshape(-1)


def first_violation(
    flat: torch.Tensor, bad: Callable[[torch.Tensor], torch.Tensor], what: str, *, allow_zero: bool = False
) -> str | None:
    """None if `bad` (on float64 blocks of `flat`; NaN must come out True) holds nowhere (zeros
    skipped with `allow_zero`), else how many coordinates violate `what` and the first of them."""
    count, first = 0, -1
    first_value = 0.0
    for lo in range(0, flat.numel(), _CHECK_BLOCK):
        block = flat[lo : lo + _CHECK_BLOCK].to(torch.float64)
        mask = bad(block)
        if allow_zero:
            mask &= block != 0.0
        n = int(torch.count_nonzero(mask))
        if n and first < 0:
            first = lo + int(torch.nonzero(mask)[0, 0])
            first_value = float(flat[first])
        count += n
    if count == 0:
        return None
    return f"{count} of {flat.numel()} coordinates are not {what} (first: index {first} = {first_value!r})"


def points_violation(y: torch.Tensor, points: tuple[float, ...], what: str, *, allow_zero: bool = False) -> str | None:
    """Every coordinate (zeros aside with `allow_zero`) within `release_tolerance` of one of
    `points` (finite floats), or what is wrong."""
    flat = release_flat(y)
    if isinstance(flat, str):
        return flat
    tol = release_tolerance(flat.dtype, max(abs(p) for p in points))

    def bad(block: torch.Tensor) -> torch.Tensor:
        near = torch.zeros_like(block, dtype=torch.bool)
        for p in points:
            near |= (block - p).abs_() <= tol  # NaN is near nothing
        return ~near

    return first_violation(flat, bad, what, allow_zero=allow_zero)


def interval_violation(y: torch.Tensor, low: float, high: float, what: str, *, allow_zero: bool = False) -> str | None:
    """Every coordinate in [low, high] widened by `release_tolerance`, or what is wrong."""
    flat = release_flat(y)
    if isinstance(flat, str):
        return flat
    tol = release_tolerance(flat.dtype, max(abs(low), abs(high)))
    lo_b, hi_b = low - tol, high + tol
    return first_violation(flat, lambda b: ~((b >= lo_b) & (b <= hi_b)), what, allow_zero=allow_zero)


class Mechanism:
    """Base of every mechanism: `perturb`, `variance`, `guarantee`, `params`, `release_violation`."""

    name: ClassVar[str]
    # What `release_violation` checks of a published output, in one line (docs, `swarm verify`).
    release_check: ClassVar[str] = "nothing: the output set of this mechanism is not checked"

    def perturb(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        raise NotImplementedError

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def guarantee(self) -> Guarantee:
        raise NotImplementedError

    def params(self) -> dict[str, object]:
        """The constructor's parameters plus "name": what `mechanisms.from_params` rebuilds from."""
        raise NotImplementedError

    def release_violation(self, y: torch.Tensor) -> str | None:
        """Is `y` a possible output of `perturb` with these parameters, on an input it accepts?

        None: consistent with the mechanism's output set (or nothing about it is checkable: see
        `release_check`); a string: what is impossible about it. Only the SHAPE of the output is
        checked, never its law: a dishonest peer can always publish a vector drawn from the output
        set without its input, so passing this check rests on each peer's own software. The check
        allows the float rounding of the real implementation (`release_tolerance`), so a genuine
        output is never flagged. The default checks nothing and returns None.
        """
        return None

    def perturb_independent(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Perturb every element of `x` as its own release (used by the audit).

        For coordinate-scope mechanisms this is `perturb`; vector-scope mechanisms override it
        with the one-coordinate case of their definition.
        """
        return self.perturb(x, generator=generator)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params().items() if k != "name")
        return f"{type(self).__name__}({inner})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mechanism) and self.params() == other.params()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.params().items())))
