# mypy: ignore-errors
# (numba-compiled code: its types are numba's, inferred per call signature, not Python's)
"""Fused per-coordinate kernels of the local mechanisms, compiled with numba.

Each kernel reads one block's keystream words and input and writes the block's output in one
pass (Laplace, the exponential mechanism and the Gaussian: between torch's and numpy's
transcendental passes, which stay theirs, as the float bounds are for those functions), with
exactly the roundings of the arithmetic the mechanism's docstring states (and its proof in
docs/MECHANISMS.md rests on): float32 where the mechanism computes in float32, a fused
multiply-add (`fma`, one rounding) where it says so, a separate multiply and add (two roundings)
elsewhere. No fastmath (LLVM may then neither reassociate nor contract a multiply and an add
into one rounding) and no threads: the bits are those of the written arithmetic, which
tests/mechanisms/test_kernel_bits.py checks against a whole-tensor reference.

Imported by the perturb paths on their first call, not by `import mechanisms`: importing numba
costs about 0.3 s, which a process that never perturbs should not pay. `cache=True`: the machine
code is compiled once per signature (about 5 s of CPU for all of them) and kept next to this file
(__pycache__, or numba's user cache directory); a later process loads it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

_MANTISSA23 = np.int32((1 << 23) - 1)
_EXPONENT32 = np.int32(0x7F800000)  # a float32's exponent field: all ones for inf and NaN
_TWO_M23 = np.float32(2.0**-23)
_TWO_M14 = np.float32(2.0**-14)
_ONE32 = np.float32(1.0)
_ZERO32 = np.float32(0.0)


@intrinsic
def float64_bits(typingctx, x):
    """The bits of the float64 x as an int64."""
    signature = types.int64(types.float64)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return signature, codegen


@intrinsic
def bits_float64(typingctx, x):
    """The float64 whose bits are the int64 x."""
    signature = types.float64(types.int64)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return signature, codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c rounded once (LLVM's llvm.fma: the hardware instruction where there is one,
    a correctly rounded library call otherwise); a, b, c of one float type."""
    signature = a(a, b, c)

    def codegen(context, builder, sig, args):
        return builder.fma(*args)

    return signature, codegen


def as_type_of(value, like):
    """`value` converted to the float type of `like` (float32 or float64), in compiled code."""
    raise NotImplementedError("compiled code only")


@overload(as_type_of)
def _as_type_of(value, like):
    if isinstance(like, types.Float) and like.bitwidth == 32:
        return lambda value, like: np.float32(value)
    return lambda value, like: np.float64(value)


@njit(cache=True, nogil=True, error_model="numpy")
def pnpm32(words, w, w_bits, out, slope, offset, threshold):
    """PNPM on one float32 block of n coordinates: words (int32, 2n) are the flip words then
    the magnitude words; out[i] = S fl(|w| M) as `PNPM` states. Returns the largest exponent
    field of w (from its int32 view `w_bits`): _EXPONENT32 when some w is inf or NaN."""
    n = w.size
    # slices, not words[n + i]: an index numba cannot prove non-negative gets a wraparound
    # select, which keeps LLVM from vectorizing the loop
    flips, magnitudes = words[:n], words[n:]
    seen = np.int32(0)
    for i in range(n):
        f = _ONE32 + np.float32(magnitudes[i] & _MANTISSA23) * _TWO_M23  # 1 + j 2^-23: exact
        y = fma(slope, f, offset) * w[i]  # M, rounded once; then M w, rounded once
        out[i] = -y if (flips[i] >> 1) < threshold else y  # a flip: -(M w) = (-M) w exactly
        seen = max(seen, w_bits[i] & _EXPONENT32)
    return seen


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _duchi_value(word, s, steps2, bound):
    """Duchi's output for one coordinate: +B' iff 2W + 1 + 2A s >= 0 (W = word >> 8; 2W + 1 exact,
    the sum one fused rounding, in s's dtype), else -B' (never -0: the sum
    of an odd integer and a product is +0 when it is zero)."""
    decision = fma(as_type_of(steps2, s), s, as_type_of((word >> 7) | 1, s))
    magnitude = as_type_of(bound, s)
    return magnitude if decision >= 0 else -magnitude


@njit(cache=True, nogil=True, error_model="numpy")
def duchi(words, t, out, steps2, bound):
    """Duchi (`Duchi`) on one block: out[i] = +-B' from words[i] and t[i]. Returns whether every t
    lies in [-1, 1] (False for NaN; the caller checks or clips the block and runs it again)."""
    inside = True
    for i in range(out.size):
        x = t[i]
        inside &= (x >= -1.0) & (x <= 1.0)
        out[i] = _duchi_value(words[i], x, steps2, bound)
    return inside


@njit(cache=True, nogil=True, error_model="numpy")
def ldp_fl(words, w, out, center, radius, steps2, bound):
    """LDP-FL (`LDPFL`) on one block: s = (w - c)/r clamped to [-1, 1] in w's dtype (the
    subtraction and the division each rounded once; w - 0 is w), Duchi's +-rB' on s, then + c
    (skipped for c = 0). Returns whether every w is finite."""
    finite = True
    c, r = as_type_of(center, w[0]), as_type_of(radius, w[0])
    shift = center != 0.0
    for i in range(out.size):
        x = w[i]
        finite &= np.isfinite(x)
        s = min(max((x - c) / r, -1.0), 1.0)
        y = _duchi_value(words[i], as_type_of(s, x), steps2, bound)
        out[i] = y + c if shift else y
    return finite


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _pm_cell(branch, position, t, window_slope, input_slope, pm_threshold):
    """PM's cell for one coordinate (`PiecewiseGrid.kernel_constants`), an integer-valued float32,
    from the branch word as a float32, the 24-bit position word W and the float32 input t."""
    w = np.float32(position)  # 24 bits: exact
    if branch < pm_threshold:  # "uniform over all": floor(N/2 + W 2^-14), exact
        return np.floor(fma(_TWO_M14, w, np.float32(512.0)))
    pos = np.floor(fma(input_slope, t, fma(window_slope, w, np.float32(512.0))))
    return min(max(pos, _ZERO32), np.float32(1023.0))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _grid_value(cell, first, step, first32, step32, fused):
    """first + step * cell: one fused rounding in float32 (`fused`), else float64 cell * step
    then + first, two roundings."""
    if fused:
        return fma(step32, cell, first32)
    return np.float64(cell) * step + first


@njit(cache=True, nogil=True, error_model="numpy")
def pm(words, t, out, window_slope, input_slope, pm_threshold, first, step, fused):
    """PM (`Piecewise`) on one block of n coordinates: words (int32, 2n) are the branch words
    then the position words; t the input block (float32 or float64: converted to float32 as the
    grid computes); out the output block (float32: `fused` True; float64: False). Returns whether
    every t lies in [-1, 1], as `duchi`."""
    n = t.size
    first32, step32 = np.float32(first), np.float32(step)
    branches, positions = words[:n], words[n:]  # slices: see `pnpm32`
    inside = True
    for i in range(n):
        x = t[i]
        inside &= (x >= -1.0) & (x <= 1.0)
        cell = _pm_cell(
            np.float32(branches[i]), positions[i] >> 8, np.float32(x), window_slope, input_slope, pm_threshold
        )
        out[i] = _grid_value(cell, first, step, first32, step32, fused)
    return inside


@njit(cache=True, nogil=True, error_model="numpy")
def hm(words, t, out, steps2, bound, duchi_threshold, window_slope, input_slope, pm_threshold, first, step, fused):
    """HM (`Hybrid`) on one block of n coordinates: words (int32, 2n) are the branch words U
    then the drive words J; Duchi's decision is the sign of 2W + 1 + 2A t (W = J >> 8) in t's
    dtype, one fused rounding (`_duchi_value`), +B' iff >= 0; PM's position is W. `pm_threshold`
    NaN: Duchi only (eps <= 0.61). Returns whether every t lies in [-1, 1], as `duchi`."""
    n = t.size
    first32, step32 = np.float32(first), np.float32(step)
    pm_branch = not np.isnan(pm_threshold)
    branches, drives = words[:n], words[n:]  # slices: see `pnpm32`
    inside = True
    for i in range(n):
        drive = drives[i]
        x = t[i]
        inside &= (x >= -1.0) & (x <= 1.0)
        duchi = _duchi_value(drive, x, steps2, bound)
        branch = np.float32(branches[i])
        if pm_branch and not branch < duchi_threshold:
            cell = _pm_cell(branch, drive >> 8, np.float32(x), window_slope, input_slope, pm_threshold)
            out[i] = _grid_value(cell, first, step, first32, step32, fused)
        else:
            out[i] = duchi
    return inside


@njit(cache=True, nogil=True, error_model="numpy")
def binary_rr(words, v, out, threshold):
    """Binary randomized response (`RandomizedResponse`, k = 2) on one block: out = |flip - v|,
    flip 1 iff float32(word) < threshold (the count of `draws.float32_threshold`), in v's dtype
    (exact: 0 or 1). Returns whether every v is 0 or 1 (False for NaN)."""
    categories = True
    for i in range(v.size):
        x = v[i]
        categories &= (x == 0.0) | (x == 1.0)
        flip = as_type_of(1.0 if np.float32(words[i]) < threshold else 0.0, x)
        out[i] = abs(flip - x)
    return categories


_LOW63 = np.int64((1 << 63) - 1)
_LOW52 = np.int64((1 << 52) - 1)
_EXPONENT64 = np.int64(0x7FF0000000000000)
_TWO_M53 = 2.0**-53
_NORMAL_MIN = 2.0**-1022


@njit(cache=True, nogil=True, error_model="numpy")
def round_down_uniform53(bits, aux, out):
    """out <- U* as `draws.round_down_uniform_` makes it with 42 extra bits, from raw words (int64:
    their top bit is dropped, as `draws.bits63_` does): the significand is the low 52 bits of
    `bits`, the binade that of h 2^-53, h = (bits's next 11 bits) 2^42 + (aux's bits 21..62).
    Returns True when some h is 0 (U* below 2^-1022: `draws.redraw_below_grid_` redraws those)."""
    below = False
    for i in range(out.size):
        b = bits[i] & _LOW63
        h = ((b >> 52) << 42) | ((aux[i] & _LOW63) >> 21)
        binade = float64_bits(np.float64(h) * _TWO_M53) & _EXPONENT64  # h 2^-53: exact
        u = bits_float64(binade | (b & _LOW52))
        below |= u < _NORMAL_MIN
        out[i] = u
    return below


@njit(cache=True, nogil=True, error_model="numpy")
def laplace(aux, log_u, t, out, inv_snap, snap, c, steps):
    """`Laplace.perturb` after the log, on one block: aux the raw second words (the dither and sign
    in their low 12 bits), log_u = LOG(U*), t the input block, out the output block.
    Per coordinate, in float64: s = 2047.5 - (aux & 4095), -phi = fma(-1/2048, |s|, 1/2),
    v = fma(1/L, t, -phi) (t/L exact), v = fma(c, S |LOG(U*)|, v) (S = -sign(s): one rounding),
    k = rint(clamp(v, -steps, steps)), (k - (-phi)) L (exact), rounded once into out. Returns
    whether every t lies in [-1, 1], as `duchi`."""
    inside = True
    for i in range(out.size):
        x = np.float64(t[i])
        inside &= (x >= -1.0) & (x <= 1.0)
        s = 2047.5 - np.float64(aux[i] & 4095)  # never 0
        noise = -log_u[i] if s < 0.0 else log_u[i]
        neg_phi = fma(-1.0 / 2048.0, abs(s), 0.5)
        v = fma(c, noise, fma(inv_snap, x, neg_phi))
        k = np.rint(min(max(v, -steps), steps))
        out[i] = (k - neg_phi) * snap
    return inside


@njit(cache=True, nogil=True, error_model="numpy")
def scaled_unit(t, out, factor):
    """out (float64) <- float64(t) * factor, rounded once. Returns whether every t lies in
    [-1, 1] (False for NaN): the input check, in the same pass."""
    inside = True
    for i in range(out.size):
        x = np.float64(t[i])
        inside &= (x >= -1.0) & (x <= 1.0)
        out[i] = x * factor
    return inside


@njit(cache=True, nogil=True, error_model="numpy")
def exponential_mass(words, h, left, c):
    """`Exponential.perturb` between its exp and its log, on one block: from the raw words (their
    53 bits 10..62: u) and h = exp(-t/b), the signed mass s from t over b; left (uint8) <- s < 0
    and h <- 1 - |s| clamped at 0 (the log's argument). In float64, as the mechanism states: neg_left = fma(c, h,
    -1), total = fma(-c 2^-53, 1/h, 2^-53) - 2^-53 neg_left (the last product exact),
    s = fma(u, total, neg_left) (one rounding), 1 - |s| (one rounding)."""
    for i in range(h.size):
        u = np.float64((words[i] & _LOW63) >> 10)  # 53 bits: exact
        neg_left = fma(c, h[i], -1.0)
        total = fma(-c * _TWO_M53, 1.0 / h[i], _TWO_M53) - _TWO_M53 * neg_left
        mass = fma(u, total, neg_left)
        left[i] = mass < 0.0
        h[i] = max(1.0 - abs(mass), 0.0)


@njit(cache=True, nogil=True, error_model="numpy")
def exponential(left, log_d, t, out, b, grid):
    """`Exponential.perturb` after the log, on one block: y = fma(-b, sign(s) |log d|, t) (one
    rounding; |log d| = -log d, d <= 1), clamped to [-1, 1], snapped to the grid (exact:
    rint(y / grid) grid, grid a power of 2), rounded once into out."""
    cells = 1.0 / grid
    for i in range(out.size):
        distance = -log_d[i] if left[i] else log_d[i]
        y = min(max(fma(-b, distance, np.float64(t[i])), -1.0), 1.0)
        out[i] = np.rint(y * cells) * grid


_ANGLE_BITS = np.int64((1 << 53) - 1)
_ANGLE_STEP = 2.0 * np.pi * 2.0**-53
_TWO_M21 = 2.0**-21


@njit(cache=True, nogil=True, error_model="numpy")
def box_muller_uniforms(first, aux, y, neg_y, theta):
    """`gaussian.standard_normal_pairs_` before its logs, on one block of m pairs, from the raw
    words: y <- U*/2 (U* as `draws.round_down_uniform_` makes it with 10 extra bits: significand
    the low 52 bits of `first`, binade that of h 2^-21, h = (first's bits 52..62) 2^10 + aux's
    bits 53..62), neg_y <- -y, theta <- (aux's low 53 bits) 2 pi 2^-53 (one rounding).
    Returns True when some h is 0 (that U* is redrawn: `draws.redraw_below_grid_`)."""
    below = False
    for i in range(y.size):
        b = first[i] & _LOW63
        a = aux[i] & _LOW63
        h = ((b >> 52) << 10) | (a >> 53)
        binade = float64_bits(np.float64(h) * _TWO_M21) & _EXPONENT64  # h 2^-21: exact
        u = bits_float64(binade | (b & _LOW52))
        below |= u < _NORMAL_MIN
        half = u * 0.5
        y[i] = half
        neg_y[i] = -half
        theta[i] = np.float64(a & _ANGLE_BITS) * _ANGLE_STEP
    return below


@njit(cache=True, nogil=True, error_model="numpy")
def box_muller_radius_squared(first, low, high):
    """low <- -2 l: l = low (LOG(Y), R = Y) where `first`'s sign bit (the coin) is set, else high
    (LOG1P(-Y), R = 1 - Y); the product exact."""
    for i in range(low.size):
        by_log, by_log1p = low[i], high[i]  # both loaded: a select, not a branch (vectorized)
        low[i] = -2.0 * (by_log if first[i] < 0 else by_log1p)


@njit(cache=True, nogil=True, error_model="numpy")
def box_muller_products(out, radius):
    """out[i] <- out[i] radius[i], out[m + i] <- out[m + i] radius[i] (out: cos, then sin)."""
    m = radius.size
    cos, sin = out[:m], out[m:]  # slices: see `pnpm32`
    for i in range(m):
        cos[i] *= radius[i]
        sin[i] *= radius[i]


@njit(cache=True, nogil=True, error_model="numpy")
def gaussian_snap(angles, radius, x, out, noise_scale, input_scale, steps, grid):
    """`Gaussian._snap` on one block of n coordinates: angles (2m >= n: cos, then sin of the
    pairs), radius (m), x the input block, out the output block. Coordinate i < m takes pair i's
    cos, m + i its sin: z = angle radius (rounded), v = fma(input_scale, x, z noise_scale)
    (sigma/L and scale/L; two roundings), k = clamp(rint(v), -steps, steps), out = k L (exact),
    rounded once into out."""
    m = radius.size
    _snap_half(angles[:m], radius, x[:m], out[:m], noise_scale, input_scale, steps, grid)  # cos
    _snap_half(angles[m:], radius, x[m:], out[m:], noise_scale, input_scale, steps, grid)  # sin


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _snap_half(angles, radius, x, out, noise_scale, input_scale, steps, grid):
    for i in range(out.size):  # slices, not radius[i - m]: see `pnpm32`
        k = min(max(np.rint(fma(input_scale, np.float64(x[i]), angles[i] * radius[i] * noise_scale)), -steps), steps)
        out[i] = k * grid
