"""The interface every mechanism implements, its guarantee object, and input validation.

Perturb paths draw keystream words block by block (mechanisms/draws.py) and transform each block
with compiled per-coordinate kernels (mechanisms/kernels.py) or whole-tensor ops on a few scratch
buffers, so a mechanism costs little more than its random bits (docs/BENCHMARKS.md, section
"Mechanisms"). The scratch buffers are kept per thread and reused across calls: fresh
allocations cost more page faults than the arithmetic.
"""

from __future__ import annotations

import abc
import functools
import math
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import ClassVar, SupportsFloat, cast

import torch

from .randomness import PrivacyGenerator

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
    residual_delta_per_coordinate: what the floating-point sampler adds per coordinate of the
           release on top (NOT included in delta, which cannot know the release's size): a
           release of d coordinates is (epsilon, delta + d * this)-DP. 0 except for the Gaussian.
    """

    epsilon: float
    delta: float
    protects: str
    scope: str
    statement: str
    residual_delta: float = 0.0
    residual_delta_per_coordinate: float = 0.0

    def delta_for(self, num_coordinates: int) -> float:
        """The delta of one release of `num_coordinates` coordinates, floating point included."""
        return self.delta + num_coordinates * self.residual_delta_per_coordinate

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
    flat = flat_input(x, what)
    return check_values(flat, low=low, high=high, clip=clip, what=what, out=None)


def flat_input(x: torch.Tensor, what: str = "x") -> torch.Tensor:
    """`x` flat and contiguous, if it is a float32/64 tensor (its values unchecked: perturb paths
    check them block by block with `check_values`, while the block is in the cache)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{what} must be float32 or float64, got {x.dtype}")
    return x.detach().reshape(-1).contiguous()


def check_values(
    values: torch.Tensor,
    *,
    low: float | None = None,
    high: float | None = None,
    clip: bool = False,
    what: str = "x",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`values` if finite and inside [low, high]; clamped (into `out`, or a new tensor) when outside
    and `clip` is set; else ValueError."""
    if values.numel() == 0:
        return values
    # two reductions: faster than torch.aminmax's one; NaN propagates into both
    lo, hi = float(values.amin()), float(values.amax())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"{what} contains NaN or infinite values")
    if (low is not None and lo < low) or (high is not None and hi > high):
        if not clip:
            raise ValueError(
                f"{what} has values in [{lo:.6g}, {hi:.6g}], outside the domain [{low}, {high}] "
                "this mechanism needs; rescale the input or build the mechanism with clip=True"
            )
        return torch.clamp(values, low, high, out=out) if out is not None else values.clamp(low, high)
    return values


def check_finite_block(values: torch.Tensor, what: str = "x") -> torch.Tensor:
    """`values` if all finite (ValueError otherwise): one cheap sum, NaN and inf propagate into it;
    a non-finite sum of finite values (float32 overflow) falls back to `check_values`."""
    if values.numel() and not math.isfinite(float(values.sum())):
        check_values(values, what=what)
    return values


def scratch(n: int, dtype: torch.dtype, slot: int) -> torch.Tensor:
    """A per-thread buffer of n elements, reused across calls (slot tells a caller's buffers apart)."""
    cache: dict[tuple[torch.dtype, int], torch.Tensor] | None = getattr(_WORKSPACE, "buffers", None)
    if cache is None:
        cache = _WORKSPACE.buffers = {}
    buf = cache.get((dtype, slot))
    if buf is None or buf.numel() < n:
        buf = cache[(dtype, slot)] = torch.empty(n, dtype=dtype)
    return buf[:n]


def constant(value: float, dtype: torch.dtype) -> torch.Tensor:
    """`value` as a 0-dim tensor of `dtype`: an operand of whole-tensor passes (a Python number
    costs a conversion per call). Cached, since making one costs about as much as a pass over a
    small block: never write into it."""
    return _constant(value, math.copysign(1.0, value), dtype)  # the sign keeps -0.0 apart from 0.0


@functools.lru_cache(maxsize=256)
def _constant(value: float, sign: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(value, dtype=dtype)


def affine_(u: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
    """u <- shift + scale * u in ONE pass (a 0-dim tensor as `input` broadcasts for free)."""
    return torch.add(constant(shift, u.dtype), u, alpha=scale, out=u)


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


@dataclass(frozen=True)
class OutputSet:
    """The values one output coordinate can take, before the float tolerance of
    `release_tolerance`: isolated `points`, a `grid` (first, step, count: first + i step for
    0 <= i < count) and/or an `interval` (low, high)."""

    points: tuple[float, ...] = ()
    grid: tuple[float, float, int] | None = None
    interval: tuple[float, float] | None = None

    def scaled(self, factor: float) -> OutputSet:
        grid = None if self.grid is None else (self.grid[0] * factor, self.grid[1] * factor, self.grid[2])
        interval = None if self.interval is None else (self.interval[0] * factor, self.interval[1] * factor)
        return replace(self, points=tuple(p * factor for p in self.points), grid=grid, interval=interval)

    @property
    def magnitude(self) -> float:
        """The largest |value| of the set."""
        ends = list(self.points)
        if self.grid is not None:
            first, step, count = self.grid
            ends += [first, first + (count - 1) * step]
        if self.interval is not None:
            ends += list(self.interval)
        return max(abs(v) for v in ends)

    def describe(self) -> str:
        parts = [f"{{{', '.join(f'{p:.9g}' for p in self.points)}}}"] if self.points else []
        if self.grid is not None:
            first, step, count = self.grid
            parts.append(f"the grid {first:.9g} + i {step:.9g}, 0 <= i < {count}")
        if self.interval is not None:
            parts.append(f"[{self.interval[0]:.9g}, {self.interval[1]:.9g}]")
        return " or ".join(parts)

    def violation(self, y: torch.Tensor, what: str, *, allow_zero: bool = False) -> str | None:
        """None if every coordinate of `y` (zeros aside with `allow_zero`) lies in the set up to
        `release_tolerance`, else how many do not and the first of them."""
        flat = release_flat(y)
        if isinstance(flat, str):
            return flat
        tol = release_tolerance(flat.dtype, self.magnitude)

        def bad(block: torch.Tensor) -> torch.Tensor:
            good = torch.zeros_like(block, dtype=torch.bool)
            for p in self.points:
                good |= (block - p).abs_() <= tol  # NaN is near nothing
            if self.grid is not None:
                first, step, count = self.grid
                index = (block - first).div_(step)
                nearest = torch.round(index).clamp_(0, count - 1)
                good |= (index - nearest).abs_().mul_(abs(step)) <= tol
            if self.interval is not None:
                low, high = self.interval
                good |= (block >= low - tol) & (block <= high + tol)
            return ~good

        return first_violation(flat, bad, f"{what} {self.describe()}", allow_zero=allow_zero)


class Mechanism(abc.ABC):
    """Base of every mechanism: `perturb`, `variance`, `guarantee`, `params`, `release_violation`.

    `perturb` draws from `generator.mechanism` (mechanisms.randomness: a ChaCha20 stream); without
    a generator it draws from a fresh secret one."""

    name: ClassVar[str]
    # What `release_violation` checks of a published output, in one line (docs, `swarm verify`).
    release_check: ClassVar[str] = "nothing: the output set of this mechanism is not checked"

    @abc.abstractmethod
    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        """A release of `x`: same shape and dtype (float32 or float64)."""

    @abc.abstractmethod
    def variance(self, x: torch.Tensor) -> torch.Tensor:
        """The variance of each output coordinate, in closed form."""

    @property
    @abc.abstractmethod
    def guarantee(self) -> Guarantee:
        """What one call of `perturb` guarantees."""

    @abc.abstractmethod
    def params(self) -> dict[str, object]:
        """The constructor's parameters plus "name": what `mechanisms.from_params` rebuilds from."""

    def release_violation(self, y: torch.Tensor) -> str | None:
        """Is `y` a possible output of `perturb` with these parameters, on an input it accepts?

        None: consistent with the mechanism's output set (or nothing about it is checkable: see
        `release_check`); a string: what is impossible about it. Only the SHAPE of the output is
        checked, never its law: a dishonest peer can always publish a vector drawn from the output
        set without its input, so passing this check rests on each peer's own software. The check
        allows the float rounding of the real implementation (`release_tolerance`), so a genuine
        output is never flagged. This default checks nothing and returns None.
        """
        return None

    def perturb_independent(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
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
