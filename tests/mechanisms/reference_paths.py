"""The whole-tensor arithmetic the fused kernels (mechanisms/kernels.py) replaced: torch passes
over each block, as the perturb paths computed them before, kept here as the reference the
kernels' bits are compared with (tests/mechanisms/test_kernel_bits.py).

Each function takes the mechanism (its constants), the input and a stream (a `RandomStream` or a
`ReplayStream`), draws the same words in the same order as the mechanism's perturb, and returns
the release. Where a threshold of `draws.float32_threshold` is not an integer (its count within
2^24 of 2^31), these passes gave the one word just below it a fractional lerp weight: an output
off the grid (`cells`, `hybrid`, `binary_rr` below), which the kernels do not reproduce (they compare
float32(word) < threshold, the count the proofs use).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from mechanisms.base import affine_, check_values, constant, flat_input, scratch
from mechanisms.draws import bits63_, blocks, round_down_uniform_, words32
from mechanisms.gaussian import Gaussian, l2_norm
from mechanisms.local import CELLS, LDPFL, PNPM, Duchi, Hybrid, Piecewise, PiecewiseGrid, RandomizedResponse
from mechanisms.snapping import EXPONENTIAL_GRID, Exponential, Laplace

_SIGN64 = torch.tensor(-(1 << 63))
_SIGN_BIT32 = torch.tensor(-(2**31), dtype=torch.int32)
_HALF_CELLS = torch.tensor(CELLS / 2.0)


def _output(like: torch.Tensor) -> torch.Tensor:
    return torch.empty(like.numel(), dtype=like.dtype)


def _block(mech, t: torch.Tensor) -> torch.Tensor:
    return check_values(t, low=-1.0, high=1.0, clip=mech.clip)


def _float32_words_(words: torch.Tensor) -> torch.Tensor:
    return words.view(torch.float32).copy_(words)


def _grid_values_(out: torch.Tensor, cells: torch.Tensor, values: tuple[float, float, int]) -> torch.Tensor:
    first, step, _ = values
    if out.dtype == torch.float32:
        return torch.add(constant(first, out.dtype), cells, alpha=step, out=out)
    return out.copy_(cells).mul_(step).add_(first)


def duchi_sign_(y: torch.Tensor, words: torch.Tensor, s: torch.Tensor, steps: int) -> torch.Tensor:
    """y <- W + 1/2 + A s (doubled: 2W + 1 + 2A s, odd integers plus a product, so that the
    half is exact), whose sign is the decision: >= 0 (+0 included) means +B. `words` (int32,
    possibly y's own bytes) are left holding 2W + 1; s in [-1, 1]."""
    words.bitwise_right_shift_(7).bitwise_or_(1)  # 2W + 1: W = w >> 8, odd values in (-2^24, 2^24)
    # converted in place (exact: |2W + 1| < 2^24), then one same-dtype pass: an int32 operand
    # would make torch convert it into a temporary first
    return y.copy_(words).add_(s, alpha=2.0 * steps)


def signed_(y: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """y <- copysign(magnitude, y) in place (magnitude: a positive 0-dim tensor of y's dtype):
    for float32, two integer passes on y's bits (keep the sign bit, set the magnitude's bits),
    cheaper than torch's copysign."""
    if y.dtype != torch.float32:
        return torch.copysign(magnitude, y, out=y)
    bits = y.view(torch.int32)
    bits.bitwise_and_(_SIGN_BIT32).bitwise_or_(magnitude.view(torch.int32))
    return y


def duchi(mech: Duchi, x: torch.Tensor, stream) -> torch.Tensor:
    t = flat_input(x)
    out = _output(t)
    magnitude = constant(mech.bound, t.dtype)
    for lo, hi in blocks(t.numel()):
        y = out[lo:hi]
        words = stream.fill_(y.view(torch.int32)) if y.dtype == torch.float32 else words32(stream, hi - lo)
        signed_(duchi_sign_(y, words, _block(mech, t[lo:hi]), mech.steps), magnitude)
    return out.view(x.shape)


def ldp_fl(mech: LDPFL, x: torch.Tensor, stream) -> torch.Tensor:
    w = flat_input(x)
    out = _output(w)
    magnitude, center = constant(mech.bound, w.dtype), constant(mech.center, w.dtype)
    for lo, hi in blocks(w.numel()):
        s = mech._scaled_(torch.empty(hi - lo, dtype=w.dtype), check_values(w[lo:hi]))
        y = out[lo:hi]
        words = stream.fill_(y.view(torch.int32)) if y.dtype == torch.float32 else words32(stream, hi - lo)
        signed_(duchi_sign_(y, words, s, mech.steps), magnitude)
        if mech.center != 0.0:
            y.add_(center)
    return out.view(x.shape)


def pnpm(mech: PNPM, x: torch.Tensor, stream) -> torch.Tensor:
    """PNPM on float32 (the float64 path is unchanged)."""
    w = flat_input(x)
    out = _output(w)
    offset = constant(mech._offset, torch.float32)
    threshold = np.int32(mech.threshold)
    w_np, out_np = w.numpy(), out.numpy()
    for lo, hi in blocks(w.numel()):
        n = hi - lo
        words = words32(stream, 2 * n)
        flip, magnitude = words.numpy()[:n], words.numpy()[n:]
        np.bitwise_and(magnitude, np.int32((1 << 23) - 1), out=magnitude)
        np.bitwise_or(magnitude, np.int32(0x3F800000), out=magnitude)
        f = words[n:].view(torch.float32)
        torch.add(offset, f, alpha=mech._slope, out=f)
        np.right_shift(flip, 1, out=flip)
        np.subtract(flip, threshold, out=flip)
        np.bitwise_and(flip, np.int32(-(2**31)), out=flip)
        np.bitwise_or(magnitude, flip, out=magnitude)
        with np.errstate(over="ignore"):  # |w| near the float32 maximum: +-inf, as the kernel's
            np.multiply(magnitude.view(np.float32), w_np[lo:hi], out=out_np[lo:hi])
    return out.view(x.shape)


def cells(law: PiecewiseGrid, branch: torch.Tensor, position: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """PM's cells: branch (float32 words), position (24-bit int32 words), t (float32)."""
    m = law.window
    pos = torch.empty(t.numel(), dtype=torch.float32)
    w = position.view(torch.float32).copy_(position)
    torch.add(_HALF_CELLS, w, alpha=m * 2.0**-24, out=pos).add_(t, alpha=(CELLS - m) / 2.0)
    pos.floor_().clamp_(0.0, CELLS - 1.0)
    everywhere = torch.add(_HALF_CELLS, w, alpha=2.0**-14, out=w).floor_()
    chosen = torch.sub(torch.tensor(law.threshold), branch, out=branch).clamp_(0.0, 1.0)
    return pos.lerp_(everywhere, chosen)


def piecewise(mech: Piecewise, x: torch.Tensor, stream) -> torch.Tensor:
    t = flat_input(x)
    out = _output(t)
    for lo, hi in blocks(t.numel()):
        n = hi - lo
        words = words32(stream, 2 * n).clone()
        block = _block(mech, t[lo:hi]).to(torch.float32)
        pos = cells(mech.law, _float32_words_(words[:n]), words[n:].bitwise_right_shift_(8), block)
        _grid_values_(out[lo:hi], pos, mech.law.values)
    return out.view(x.shape)


def hybrid(mech: Hybrid, x: torch.Tensor, stream) -> torch.Tensor:
    t = flat_input(x)
    out = _output(t)
    threshold, magnitude = constant(mech.duchi_threshold, torch.float32), constant(mech.bound, t.dtype)
    for lo, hi in blocks(t.numel()):
        n = hi - lo
        block = _block(mech, t[lo:hi])
        words = words32(stream, 2 * n).clone()
        branch, drive = words[:n], words[n:]
        duchi = signed_(duchi_sign_(torch.empty(n, dtype=t.dtype), drive, block, mech.steps), magnitude)
        if mech.law is None:
            out[lo:hi].copy_(duchi)
            continue
        branch = _float32_words_(branch)
        duchi_weight = torch.sub(threshold, branch).clamp_(0.0, 1.0)
        position = drive.bitwise_right_shift_(1)
        pos = cells(mech.law, branch, position, block.to(torch.float32))
        y = _grid_values_(out[lo:hi], pos, mech.law.values)
        y.lerp_(duchi, duchi_weight if y.dtype == torch.float32 else duchi_weight.to(y.dtype))
    return out.view(x.shape)


def binary_rr(mech: RandomizedResponse, x: torch.Tensor, stream) -> torch.Tensor:
    v = flat_input(x)
    out = _output(v)
    for lo, hi in blocks(v.numel()):
        block = check_values(v[lo:hi], low=0.0, high=1.0)
        assert float(torch.frac(block).amax()) == 0.0
        flip = _float32_words_(words32(stream, hi - lo).clone())
        torch.sub(torch.tensor(mech.flip_threshold), flip, out=flip)
        torch.sub(flip.clamp_(0.0, 1.0), block, out=out[lo:hi]).abs_()
    return out.view(x.shape)


def laplace(mech: Laplace, x: torch.Tensor, stream) -> torch.Tensor:
    t = flat_input(x)
    out = _output(t)
    snap, steps, c = mech.snap, float(mech.steps), mech.scale / mech.snap
    for lo, hi in blocks(t.numel()):
        n = hi - lo
        bits = bits63_(torch.empty(n, dtype=torch.int64), stream)
        aux = bits63_(torch.empty(n, dtype=torch.int64), stream)
        extra = torch.bitwise_right_shift(aux, 21)
        noise = round_down_uniform_(torch.empty(n, dtype=torch.float64), bits, extra, 42, stream).log_()
        s = torch.empty(n, dtype=torch.float64).copy_(aux.bitwise_and_(4095))
        torch.sub(torch.tensor(2047.5, dtype=torch.float64), s, out=s)
        sign = torch.bitwise_and(s.view(torch.int64), _SIGN64, out=aux)
        noise.view(torch.int64).bitwise_xor_(sign)
        neg_phi = affine_(s.abs_(), -1.0 / 2048.0, 0.5)
        v = torch.empty(n, dtype=torch.float64).copy_(_block(mech, t[lo:hi]))
        torch.add(neg_phi, v, alpha=1.0 / snap, out=v)
        v.add_(noise, alpha=c).clamp_(-steps, steps).round_()
        torch.sub(v, neg_phi, out=v).mul_(snap)
        out[lo:hi].copy_(v)
    return out.view(x.shape)


def exponential(mech: Exponential, x: torch.Tensor, stream) -> torch.Tensor:
    t = flat_input(x)
    out = _output(t)
    b = 4.0 / mech.run_epsilon
    c = math.exp(-1.0 / b)
    for lo, hi in blocks(t.numel()):
        n = hi - lo
        bits = bits63_(torch.empty(n, dtype=torch.int64), stream).bitwise_right_shift_(10)
        u = torch.empty(n, dtype=torch.float64).copy_(bits)
        tb = torch.empty(n, dtype=torch.float64).copy_(_block(mech, t[lo:hi]))
        h = torch.mul(tb, -1.0 / b).exp_()
        neg_left = torch.add(torch.tensor(-1.0, dtype=torch.float64), h, alpha=c)
        total = affine_(h.reciprocal_(), -c * 2.0**-53, 2.0**-53).sub_(neg_left, alpha=2.0**-53)
        s = torch.addcmul(neg_left, u, total, out=u)
        distance = affine_(torch.abs(s, out=total), -1.0, 1.0).clamp_(min=0.0).log_()
        distance.view(torch.int64).bitwise_xor_(torch.bitwise_and(s.view(torch.int64), _SIGN64, out=bits))
        y = torch.add(tb, distance, alpha=-b, out=distance).clamp_(-1.0, 1.0)
        y.mul_(1.0 / EXPONENTIAL_GRID).round_().mul_(EXPONENTIAL_GRID)
        out[lo:hi].copy_(y)
    return out.view(x.shape)


def standard_normal_pairs_(out: torch.Tensor, stream) -> torch.Tensor:
    m = out.numel() // 2
    first = stream.fill_(torch.empty(m, dtype=torch.int64))
    coin = torch.bitwise_right_shift(first, 63)
    bits = first.bitwise_and_((1 << 63) - 1)
    aux = bits63_(torch.empty(m, dtype=torch.int64), stream)
    extra = torch.bitwise_right_shift(aux, 53)
    y = round_down_uniform_(torch.empty(m, dtype=torch.float64), bits, extra, 10, stream).mul_(0.5)
    low = torch.log(y)
    minus_y = y.neg_().numpy()
    np.log1p(minus_y, out=minus_y)
    high = y
    picked = low.view(torch.int64).bitwise_xor_(high.view(torch.int64)).bitwise_and_(coin)
    radius = high.view(torch.int64).bitwise_xor_(picked).view(torch.float64).mul_(-2.0).sqrt_()
    theta = torch.empty(m, dtype=torch.float64).copy_(aux.bitwise_and_((1 << 53) - 1)).mul_(2.0 * math.pi * 2.0**-53)
    torch.mul(torch.cos(theta, out=out[:m]), radius, out=out[:m])
    torch.mul(torch.sin(theta, out=out[m:]), radius, out=out[m:])
    return out


def add_gaussian_noise(x: torch.Tensor, scale: float, sigma: float, out: torch.Tensor, stream) -> torch.Tensor:
    for lo, hi in blocks(x.numel()):
        n = hi - lo
        z = standard_normal_pairs_(torch.empty(n + n % 2, dtype=torch.float64), stream)[:n]
        noise = z.mul_(sigma).to(out.dtype)
        torch.add(noise, x[lo:hi], alpha=scale, out=out[lo:hi])
    return out


def gaussian(mech: Gaussian, x: torch.Tensor, stream, *, independent: bool = False) -> torch.Tensor:
    if independent:
        flat, scale = flat_input(x).clamp(-mech.clip_norm, mech.clip_norm), 1.0
    else:
        flat = flat_input(x)
        norm = l2_norm(flat)
        if not math.isfinite(norm):
            norm = float(torch.linalg.vector_norm(check_values(flat), dtype=torch.float64))
        scale = min(1.0, mech.clip_norm / norm) if norm > 0 else 1.0
    grid, steps, out = mech.grid, float(mech.steps), torch.empty_like(flat)
    for lo, hi in blocks(flat.numel()):
        n = hi - lo
        v = standard_normal_pairs_(torch.empty(n + n % 2, dtype=torch.float64), stream)[:n]
        xb = flat[lo:hi] if flat.dtype == torch.float64 else scratch(n, torch.float64, 4).copy_(flat[lo:hi])
        torch.add(v.mul_(mech.sigma / grid), xb, alpha=scale / grid, out=v)
        v.round_().clamp_(-steps, steps).mul_(grid)
        out[lo:hi].copy_(v)
    return out.view(x.shape)
