# mypy: ignore-errors
# (numba-compiled code: its types are numba's, inferred per call signature, not Python's)
"""Fused per-coordinate kernels of the local mechanisms, compiled with numba.

Each kernel reads one block's keystream words and input and writes the block's output in one
pass (Laplace: on either side of torch's log), the exponential mechanism and the Gaussian with
their own log, exp, cos and sin (`log_table64`, `exp_pair64`, `normal_pair`: series and a table
whose error bounds docs/MECHANISMS.md proves and the mechanisms' float bounds use), with exactly
the roundings of the arithmetic the mechanism's docstring states (and its proof in
docs/MECHANISMS.md rests on): float32 where the mechanism computes in float32, a fused
multiply-add (`fma`, one rounding) where it says so, a separate multiply and add (two roundings)
elsewhere. No fastmath (LLVM may then neither reassociate nor contract a multiply and an add
into one rounding) and no threads: the bits are those of the written arithmetic, which
tests/mechanisms/test_kernel_bits.py checks against a whole-tensor reference.

Imported by the perturb paths on their first call, not by `import mechanisms`: importing numba
costs about 0.3 s, which a process that never perturbs should not pay. `cache=True`: the machine
code is compiled once per signature (about 8 s of CPU for all of them) and kept next to this file
(__pycache__, or numba's user cache directory); a later process loads it.
"""

from __future__ import annotations

import contextlib
import decimal
import math

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


@intrinsic
def wide_vectors(typingctx):
    """Let LLVM vectorize the calling kernel's loops with 512-bit registers where the CPU has them
    (its function attribute "prefer-vector-width"; without it LLVM stops at 256 bits on AVX-512
    CPUs). For the kernels dominated by arithmetic (the exponential mechanism and the Gaussian):
    about 1.4 times as fast here; a CPU without 512-bit registers ignores it. Bits unchanged:
    each lane does the arithmetic the scalar code states."""
    signature = types.none()

    def codegen(context, builder, sig, args):
        # llvmlite's attribute set accepts only a fixed list of names; LLVM takes string attributes.
        # A speed hint only: an llvmlite whose attributes are no set compiles the kernel without it.
        with contextlib.suppress(TypeError, AttributeError):
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

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
_ANGLE_BITS = np.int64((1 << 53) - 1)
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


# ---------------------------------------------------------------------------------------------
# log and exp with proven error bounds (docs/MECHANISMS.md, "Floating point": "The kernels' own
# log, exp, cos and sin"): Taylor and atanh series with stated remainders, evaluated with fma;
# branch-free, so that a loop calling them vectorizes. Each series is within 3 x 2^-53 of its
# result (relative), inside the LOG_ULPS = 4 the mechanisms' bounds assume; the exponential
# mechanism's table log (`log_table64`) has the absolute-and-relative bound its use needs.

_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # ln 2's top 32 bits: k LN2_HI exact for |k| < 2^21
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")  # ln 2 - _LN2_HI, within 2^-86 of it
_INV_LN2 = 1.0 / math.log(2.0)
_SQRT2 = math.sqrt(2.0)
_ONE_BITS = np.int64(1023 << 52)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def log1p_reduced(f, e):
    """e ln 2 + ln(1 + f) for f exact in [sqrt(1/2) - 1, sqrt 2 - 1] and e an integer (a float64
    below 2^11 in magnitude): ln(1 + f) = 2 atanh(t), t = f/(2 + f), |t| <= 0.1716, as
    f - (f t - t P(t^2)) (2t = f - f t exactly in reals), P(s) = sum_{k=1..10} 2 s^k/(2k + 1)
    (the series' remainder below 2^-60 of the result); e ln 2 as e LN2_HI (exact) + e LN2_LO."""
    t = f / (2.0 + f)
    s = t * t
    p = 2.0 / 21.0
    p = fma(p, s, 2.0 / 19.0)
    p = fma(p, s, 2.0 / 17.0)
    p = fma(p, s, 2.0 / 15.0)
    p = fma(p, s, 2.0 / 13.0)
    p = fma(p, s, 2.0 / 11.0)
    p = fma(p, s, 2.0 / 9.0)
    p = fma(p, s, 2.0 / 7.0)
    p = fma(p, s, 2.0 / 5.0)
    p = fma(p, s, 2.0 / 3.0)
    inner = fma(f, t, -(t * (p * s))) - e * _LN2_LO
    return fma(e, _LN2_HI, f - inner)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def log_parts(x):
    """(f, e) with x = 2^e (1 + f), 1 + f in [sqrt(1/2), sqrt 2) (f exact), for a normal x > 0."""
    bits = float64_bits(x)
    m = bits_float64((bits & _LOW52) | _ONE_BITS)  # x's significand, in [1, 2)
    big = m > _SQRT2
    e = np.float64((bits >> 52) - 1022 if big else (bits >> 52) - 1023)
    return (m * 0.5 if big else m) - 1.0, e  # m/2 exact; m - 1 exact (Sterbenz)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def exp_pair_reduced(r):
    """(e^r, e^-r) for |r| <= 0.3466 + 2^-40, each within 2.1 x 2^-53 relative (r exact): the
    Taylor series of e^r to r^13 (remainder below 2^-57 of the result) split into its even part
    1 + a and odd part r + o, a = r^2 E(r^2), o = r^3 O(r^2): e^r = 1 + (r + (a + o)),
    e^-r = 1 + ((a - o) - r)."""
    r2 = r * r
    even = 1.0 / 479001600.0  # 1/12!
    even = fma(even, r2, 1.0 / 3628800.0)
    even = fma(even, r2, 1.0 / 40320.0)
    even = fma(even, r2, 1.0 / 720.0)
    even = fma(even, r2, 1.0 / 24.0)
    even = fma(even, r2, 0.5)
    odd = 1.0 / 6227020800.0  # 1/13!
    odd = fma(odd, r2, 1.0 / 39916800.0)
    odd = fma(odd, r2, 1.0 / 362880.0)
    odd = fma(odd, r2, 1.0 / 5040.0)
    odd = fma(odd, r2, 1.0 / 120.0)
    odd = fma(odd, r2, 1.0 / 6.0)
    a = r2 * even
    o = (r * r2) * odd
    return 1.0 + (r + (a + o)), 1.0 + ((a - o) - r)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def exp_pair64(x):
    """(e^x, e^-x) for |x| <= 700, each within 3 x 2^-53 relative, without a division:
    k = rint(x / ln 2), r = (x - k LN2_HI) (exact) - k LN2_LO, |r| <= 0.3466 + 2^-40,
    `exp_pair_reduced(r)` times 2^k and 2^-k (exact)."""
    k = np.rint(x * _INV_LN2)
    up, down = exp_pair_reduced(fma(-k, _LN2_HI, x) - k * _LN2_LO)
    scale = np.int64(k)
    return up * bits_float64((scale + 1023) << 52), down * bits_float64((1023 - scale) << 52)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def log1p_narrow(f):
    """ln(1 + f) for f exact in [-1/2, 0], within 2.1 x 2^-53 relative, without a reduction:
    t = f/(2 + f), |t| <= 1/3, f - (f t - t P(t^2)) with the atanh series P to t^33 (remainder
    below 2^-59 of the result)."""
    t = f / (2.0 + f)
    s = t * t
    p = 2.0 / 33.0
    p = fma(p, s, 2.0 / 31.0)
    p = fma(p, s, 2.0 / 29.0)
    p = fma(p, s, 2.0 / 27.0)
    p = fma(p, s, 2.0 / 25.0)
    p = fma(p, s, 2.0 / 23.0)
    p = fma(p, s, 2.0 / 21.0)
    p = fma(p, s, 2.0 / 19.0)
    p = fma(p, s, 2.0 / 17.0)
    p = fma(p, s, 2.0 / 15.0)
    p = fma(p, s, 2.0 / 13.0)
    p = fma(p, s, 2.0 / 11.0)
    p = fma(p, s, 2.0 / 9.0)
    p = fma(p, s, 2.0 / 7.0)
    p = fma(p, s, 2.0 / 5.0)
    p = fma(p, s, 2.0 / 3.0)
    return f - fma(f, t, -(t * (p * s)))


# Below this span 2/b of -t/b (eps_run <= 1.38) |t/b| <= 0.345 needs no exp reduction and both
# masses stay below 1 - e^-0.69 = 0.4984, so 1 - |s| >= 1/2 needs no log reduction
NARROW_SPAN = 0.69

# `log_table64`: x = 2^k z with z in [0.6875, 1.375) (ARM's optimized-routines reduction), z's
# cell i (bits 44..51 of z's bits less 0.6875's: 256 cells, 2^-9 wide below 1, 2^-8 above)
_LOG_OFFSET = np.int64(0x3FE6000000000000)  # the bits of 0.6875
_LOG_CELL_SHIFT = 44
_LOG_CELLS = 1 << 8
_SIGN_AND_EXPONENT = np.int64(-(1 << 52))  # bits 52..63
_LN2 = float.fromhex("0x1.62e42fefa39efp-1")  # ln 2 rounded to nearest: 0.21 x 2^-53 below it


def _log_table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cells of `log_table64`: their 257 edges (cell i is [edge i, edge i + 1)), 1/c_i and
    -ln(1/c_i): c_i the cell's midpoint (exact), 1/c_i rounded once, its log from decimal
    arithmetic at 40 digits (correctly rounded there) rounded once to float64, so within
    2^-55 + 2^-130 of the exact -ln(1/c_i) (|ln c_i| < 1/2). Decimal, not the platform's libm:
    the same table, and bound, on every machine."""
    edges = (_LOG_OFFSET + (np.arange(_LOG_CELLS + 1, dtype=np.int64) << _LOG_CELL_SHIFT)).view(np.float64)
    inverses = 2.0 / (edges[:-1] + edges[1:])  # the sum of two edges: exact (at most 10 bits)
    context = decimal.Context(prec=40)
    logs = np.array([float(-context.ln(decimal.Decimal(float(v)))) for v in inverses])
    return edges, inverses, logs


LOG_CELL_EDGES, LOG_INVERSES, LOG_VALUES = _log_table()


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def log_table64(x):
    """ln x for a normal float64 x > 0, without a division, within 2^-53 (0.4 + 2.4 |ln x|): x =
    2^k z (exact: z's bits are x's less k 2^52), r = fma(z, 1/c_i, -1) for z's cell i (|r| <=
    2^-9, one rounding), ln x = (k LN2 + ln c_i) + (r + r^2 P(r)), P the Taylor series of
    ln(1 + r) from its r^2 term to r^6 (remainder below 2^-65), each sum rounded once. Any
    other x (0, a subnormal, negative, inf, NaN) gives some float: the cell index is masked, so
    it reads the table, never past it."""
    bits = float64_bits(x)
    above = bits - _LOG_OFFSET
    k = np.float64(above >> 52)
    z = bits_float64(bits - (above & _SIGN_AND_EXPONENT))
    cell = (above >> _LOG_CELL_SHIFT) & (_LOG_CELLS - 1)
    r = fma(z, LOG_INVERSES[cell], -1.0)
    p = fma(r, -1.0 / 6.0, 0.2)
    p = fma(p, r, -0.25)
    p = fma(p, r, 1.0 / 3.0)
    p = fma(p, r, -0.5)
    # (k LN2 + ln c_i) beside the series, summed last: adding ln c_i to the series before the
    # fma would round one sum fewer, but puts a rounding on the longest chain (a quarter slower)
    return fma(k, _LN2, LOG_VALUES[cell]) + fma(r * r, p, r)


@njit(cache=True, nogil=True, error_model="numpy")
def exponential(words, t, out, b, c, grid):
    """`Exponential.perturb` on one block, in float64 as the mechanism states: u = the words' 53
    bits 10..62, (h, 1/h) = (EXP(x), EXP(-x)) for x = fl(-t/b), neg_left = fma(c, h, -1),
    total = fma(-c 2^-53, 1/h, 2^-53) - 2^-53 neg_left (the last product exact),
    s = fma(u, total, neg_left) (one rounding), d = 1 - |s| (one rounding; at least e^(-2/b)
    less 2^-47 for t in [-1, 1], so a normal float > 0 for every eps the mechanism accepts),
    distance = sign(s) |LOG(d)|, y = fma(-b, distance, t) clamped to [-1, 1], snapped to the grid
    (exact: rint(y / grid) grid, grid a power of 2), rounded once into out. EXP and LOG:
    `exp_pair64`, `log_table64`. Returns whether every t lies in [-1, 1], as `duchi` (for a t
    outside, its d may be anything: that output is computed again from the checked input)."""
    wide_vectors()
    inside = True
    cells, neg_inv_b = 1.0 / grid, -1.0 / b
    for i in range(out.size):
        x = np.float64(t[i])
        inside &= (x >= -1.0) & (x <= 1.0)
        h, h_inverse = exp_pair64(x * neg_inv_b)
        mass = _exponential_mass(words[i], h, h_inverse, c)
        # no guard for d <= 0 (impossible, above): a select there cost a quarter of the kernel's time
        out[i] = _exponential_value(mass, log_table64(1.0 - abs(mass)), x, b, cells, grid)
    return inside


@njit(cache=True, nogil=True, error_model="numpy")
def exponential_narrow(words, t, out, b, c, grid):
    """`exponential` where 2/b <= NARROW_SPAN: EXP(x) = `exp_pair_reduced(x)` (|x| <= 0.345) and
    LOG(d) = `log1p_narrow(-|s|)` (|s| <= 0.4984: 1 - |s| is not rounded), the rest the same."""
    wide_vectors()
    inside = True
    cells, neg_inv_b = 1.0 / grid, -1.0 / b
    for i in range(out.size):
        x = np.float64(t[i])
        inside &= (x >= -1.0) & (x <= 1.0)
        h, h_inverse = exp_pair_reduced(x * neg_inv_b)
        mass = _exponential_mass(words[i], h, h_inverse, c)
        out[i] = _exponential_value(mass, log1p_narrow(-abs(mass)), x, b, cells, grid)
    return inside


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _exponential_mass(word, h, h_inverse, c):
    """s = fma(u, total, neg_left) from the word's 53-bit u and (h, 1/h), as `exponential` states."""
    u = np.float64((word & _LOW63) >> 10)  # 53 bits: exact
    neg_left = fma(c, h, -1.0)
    total = fma(-c * _TWO_M53, h_inverse, _TWO_M53) - _TWO_M53 * neg_left
    return fma(u, total, neg_left)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _exponential_value(mass, log_d, x, b, cells, grid):
    """The snapped output from s and LOG(d) <= 0, as `exponential` states."""
    y = min(max(fma(-b, -log_d if mass < 0.0 else log_d, x), -1.0), 1.0)
    return np.rint(y * cells) * grid


# ---------------------------------------------------------------------------------------------
# The Gaussian's pairs: Box-Muller from U* and a 53-bit angle, with the log above and cos, sin
# from Taylor series on an eighth of the circle.

_TWO_M21 = 2.0**-21
_ANGLE_STEP = 2.0 * np.pi * 2.0**-53
_OCTANT = np.int64(1 << 50)
_ONE_MINUS_SQRT_HALF = 1.0 - math.sqrt(0.5)  # Y below it: |f/(2 + f)| <= 0.1716 for f = -Y


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _pair_uniform(first, aux):
    """U* from a pair's two raw words (as `draws.round_down_uniform_` makes it with 10 extra
    bits): significand the low 52 bits of `first`, binade that of h 2^-21, h = (first's bits
    52..62) 2^10 + aux's bits 53..62; below 2^-1022 exactly when h = 0."""
    b = first & _LOW63
    h = ((b >> 52) << 10) | ((aux & _LOW63) >> 53)
    binade = float64_bits(np.float64(h) * _TWO_M21) & _EXPONENT64  # h 2^-21: exact
    return bits_float64(binade | (b & _LOW52))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def normal_pair(first, aux, u):
    """(r cos 2 pi V, r sin 2 pi V), each rounded once, for one pair: the coin is `first`'s sign
    bit, Y = u/2 (u = U*, at least 2^-1022), R = Y (coin set: ln R = ln u - ln 2 from u's bits)
    or 1 - Y (ln R = ln(1 + f) with f = -Y for Y below 1 - sqrt(1/2), else ln(1 + f) - ln 2 with
    f = 1 - 2Y: both exact), r = sqrt(-2 ln R) (correctly rounded); V = j
    2^-53, j = aux's low 53 bits: its top 3 bits the octant, the angle within it phi = j' 2pi
    2^-53 (one rounding) in [0, pi/4], j' = the low 50 bits, or 2^50 minus them in odd octants
    (exact); cos and sin of phi by Taylor series (below), then swapped and signed by the octant
    (exact)."""
    y = 0.5 * u
    f, e = log_parts(u)
    near_one = y < _ONE_MINUS_SQRT_HALF  # R = 1 - Y in [sqrt(1/2), 1): f = -Y
    f = f if first < 0 else (-y if near_one else 1.0 - 2.0 * y)  # 2(1 - Y) - 1 (Sterbenz)
    log_r = log1p_reduced(f, e - 1.0 if first < 0 else (0.0 if near_one else -1.0))
    radius = np.sqrt(-2.0 * log_r)
    j = aux & _ANGLE_BITS
    octant = j >> 50
    low = j & (_OCTANT - 1)
    phi = np.float64(_OCTANT - low if octant & 1 else low) * _ANGLE_STEP
    s = phi * phi
    # sin phi = phi - phi^3 S(phi^2) to phi^15 (remainder below 2^-54), cos phi = 1 - (s/2 -
    # s^2 C(s)) to phi^16 (remainder below 2^-58): |phi| <= pi/4
    sp = 1.0 / 1307674368000.0  # 1/15!
    sp = fma(sp, s, -1.0 / 6227020800.0)
    sp = fma(sp, s, 1.0 / 39916800.0)
    sp = fma(sp, s, -1.0 / 362880.0)
    sp = fma(sp, s, 1.0 / 5040.0)
    sp = fma(sp, s, -1.0 / 120.0)
    sp = fma(sp, s, 1.0 / 6.0)
    sin_phi = fma(-(phi * s), sp, phi)
    cp = 1.0 / 20922789888000.0  # 1/16!
    cp = fma(cp, s, -1.0 / 87178291200.0)
    cp = fma(cp, s, 1.0 / 479001600.0)
    cp = fma(cp, s, -1.0 / 3628800.0)
    cp = fma(cp, s, 1.0 / 40320.0)
    cp = fma(cp, s, -1.0 / 720.0)
    cp = fma(cp, s, 1.0 / 24.0)
    cos_phi = 1.0 - fma(-(s * s), cp, 0.5 * s)
    swap = ((octant + 1) >> 1) & 1  # octants 1, 2, 5, 6: the angle is pi/2 +- phi (mod pi)
    cos_abs, sin_abs = (sin_phi, cos_phi) if swap else (cos_phi, sin_phi)
    cos_v = -cos_abs if ((octant + 2) >> 2) & 1 else cos_abs  # octants 2..5
    sin_v = -sin_abs if octant >= 4 else sin_abs
    return cos_v * radius, sin_v * radius


@njit(cache=True, nogil=True, error_model="numpy")
def pair_uniforms(first, aux, u):
    """u[i] <- U* of pair i (`_pair_uniform`). Returns True when some is below 2^-1022 (h = 0:
    `draws.redraw_below_grid_` redraws it)."""
    below = False
    for i in range(u.size):
        u[i] = _pair_uniform(first[i], aux[i])
        below |= u[i] < _NORMAL_MIN
    return below


@njit(cache=True, nogil=True, error_model="numpy")
def normal_pairs(first, aux, u, out):
    """`gaussian.standard_normal_pairs_` on one block of m pairs from the raw words: out[i] <-
    r cos 2 pi V, out[m + i] <- r sin 2 pi V (`normal_pair`). u: the pairs' U* (`pair_uniforms`, after
    a redraw), or empty: then each is built from the words here. Returns True when some U* built
    here is below 2^-1022 (h = 0): the caller redraws it and calls again with u."""
    wide_vectors()
    m = first.size
    cos, sin = out[:m], out[m:]  # slices: see `pnpm32`
    if u.size > 0:
        for i in range(m):
            cos[i], sin[i] = normal_pair(first[i], aux[i], max(u[i], _NORMAL_MIN))
        return False
    below = False
    for i in range(m):
        v = _pair_uniform(first[i], aux[i])
        below |= v < _NORMAL_MIN
        cos[i], sin[i] = normal_pair(first[i], aux[i], max(v, _NORMAL_MIN))
    return below


@njit(cache=True, nogil=True, error_model="numpy")
def gaussian_snap(first, aux, u, x, out, noise_scale, input_scale, steps, grid):
    """`Gaussian._snap` on one block of n coordinates from the m = ceil(n/2) pairs' raw words:
    coordinate i < m takes pair i's r cos, m + i its r sin (`normal_pair`); z rounded, v =
    fma(input_scale, x, z noise_scale) (sigma/L and scale/L; two roundings), k = clamp(rint(v),
    -steps, steps), out = k L (exact), rounded once into out. u as in `normal_pairs`, and the
    same return value (True: the block is written again after the redraw)."""
    wide_vectors()
    m = first.size
    n_sin = x.size - m  # m or m - 1
    x_cos, x_sin, out_cos, out_sin = x[:m], x[m:], out[:m], out[m:]  # slices: see `pnpm32`
    if u.size > 0:
        for i in range(n_sin):
            out_cos[i], out_sin[i] = _snapped_pair(
                first[i], aux[i], u[i], x_cos[i], x_sin[i], noise_scale, input_scale, steps, grid
            )
        for i in range(n_sin, m):  # an odd n: the last pair's sin is not used
            out_cos[i] = _snapped_pair(
                first[i], aux[i], u[i], x_cos[i], x_cos[i], noise_scale, input_scale, steps, grid
            )[0]
        return False
    below = False
    for i in range(n_sin):
        v = _pair_uniform(first[i], aux[i])
        below |= v < _NORMAL_MIN
        out_cos[i], out_sin[i] = _snapped_pair(
            first[i], aux[i], v, x_cos[i], x_sin[i], noise_scale, input_scale, steps, grid
        )
    for i in range(n_sin, m):
        v = _pair_uniform(first[i], aux[i])
        below |= v < _NORMAL_MIN
        out_cos[i] = _snapped_pair(first[i], aux[i], v, x_cos[i], x_cos[i], noise_scale, input_scale, steps, grid)[0]
    return below


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _snapped_pair(first, aux, u, x_cos, x_sin, noise_scale, input_scale, steps, grid):
    """Pair (first, aux, U* = u)'s two snapped values for the inputs x_cos and x_sin."""
    z_cos, z_sin = normal_pair(first, aux, max(u, _NORMAL_MIN))
    return (
        _snap_value(z_cos, x_cos, noise_scale, input_scale, steps, grid),
        _snap_value(z_sin, x_sin, noise_scale, input_scale, steps, grid),
    )


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _snap_value(z, x, noise_scale, input_scale, steps, grid):
    """clamp(rint(fma(input_scale, x, z noise_scale)), -steps, steps) grid."""
    k = np.rint(fma(input_scale, np.float64(x), z * noise_scale))
    return min(max(k, -steps), steps) * grid
