"""Per-coordinate local mechanisms (scope "coordinate": a tensor of d values costs d*eps).

Each perturb path draws one uniform u per coordinate into the output buffer and maps it in place
through the inverse CDF of the mechanism's output law (written branch-free: sign/copysign/clamp
instead of boolean masks, which are slow on CPU). Formulas cite the papers in docs/MECHANISMS.md.
"""
from __future__ import annotations

import math

import torch

from .base import (Guarantee, Mechanism, check_epsilon, check_finite, check_positive, check_tensor,
                   half_grid_threshold, map_chunks, uniform_like)

# exp(eps) overflows a double near 709; no useful local mechanism runs there.
MAX_EPSILON = 700.0


def _epsilon(epsilon) -> float:
    eps = check_epsilon(epsilon)
    if eps > MAX_EPSILON:
        raise ValueError(f"epsilon must be <= {MAX_EPSILON}, got {epsilon!r}")
    return eps


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=like.dtype)


# ---------------------------------------------------------------------------------------------
# Pure formulas (also used by tests and the audit)


def duchi_bound(epsilon: float) -> float:
    """B = (e^eps + 1) / (e^eps - 1): Duchi, Jordan, Wainwright (2013/2018), one dimension."""
    return (math.exp(epsilon) + 1.0) / math.expm1(epsilon)


def piecewise_bound(epsilon: float) -> float:
    """C = (z + 1) / (z - 1), z = e^(eps/2): Wang et al., ICDE 2019, the Piecewise Mechanism."""
    z = math.exp(epsilon / 2.0)
    return (z + 1.0) / (z - 1.0)


def pnpm_bound(epsilon: float) -> float:
    """C = (e^eps + 3) / (e^eps - 1): the PNPM paper, eq. (2)."""
    return (math.exp(epsilon) + 3.0) / math.expm1(epsilon)


def pnpm_t_variance(epsilon: float) -> float:
    """Var[t*] = 4 (e^eps + 1/3) / (e^eps - 1)^2: the PNPM paper, Lemma 1."""
    e = math.exp(epsilon)
    return 4.0 * (e + 1.0 / 3.0) / (e - 1.0) ** 2


def hybrid_pm_probability(epsilon: float) -> float:
    """HM runs PM w.p. 1 - e^(-eps/2) when eps > 0.61, else Duchi (Wang et al. 2019, Sec. III-C)."""
    return -math.expm1(-epsilon / 2.0) if epsilon > 0.61 else 0.0


def duchi_variance(t: torch.Tensor, epsilon: float) -> torch.Tensor:
    return duchi_bound(epsilon) ** 2 - t * t


def piecewise_variance(t: torch.Tensor, epsilon: float) -> torch.Tensor:
    z = math.exp(epsilon / 2.0)
    return t * t / (z - 1.0) + (z + 3.0) / (3.0 * (z - 1.0) ** 2)


# ---------------------------------------------------------------------------------------------


class _PureLocal(Mechanism):
    """Shared parts of the pure-eps per-coordinate mechanisms on the domain [-1, 1]."""

    protects = "value"
    domain = "[-1, 1]"

    def __init__(self, epsilon, clip: bool = False):
        self.epsilon = _epsilon(epsilon)
        if not isinstance(clip, bool):
            raise ValueError(f"clip must be True or False, got {clip!r}")
        self.clip = clip

    def _input(self, x):
        return check_tensor(x, low=-1.0, high=1.0, clip=self.clip)

    def params(self) -> dict:
        return {"name": self.name, "epsilon": self.epsilon, "clip": self.clip}

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(self.epsilon, 0.0, "value", "coordinate",
                         f"{self.name}: eps={self.epsilon:g}-LDP for each coordinate's value in "
                         f"{self.domain}; a tensor of d coordinates costs d*eps")


def _duchi_kernel(k: float, bound: torch.Tensor):
    """+B iff u < 1/2 + k t, else -B. copysign (not sign) so that u - 1/2 - k t == 0 maps to -B."""

    def kernel(u, t):
        u.sub_(t, alpha=k).sub_(0.5)
        torch.copysign(bound, u, out=u).neg_()

    return kernel


class Duchi(_PureLocal):
    """Duchi et al.: output +-B with P[+B] = 1/2 + t (e-1) / (2(e+1)); unbiased, Var = B^2 - t^2."""

    name = "duchi"

    def perturb(self, x, *, generator=None):
        t = self._input(x)
        u = uniform_like(t, generator)
        e = math.exp(self.epsilon)
        map_chunks(u, (t,), 0, _duchi_kernel((e - 1.0) / (2.0 * (e + 1.0)), _scalar(duchi_bound(self.epsilon), t)))
        return u.view(x.shape)

    def variance(self, x):
        return duchi_variance(self._input(x), self.epsilon).view(x.shape)


def _piecewise_constants(epsilon: float):
    """Inverse CDF of PM as F^-1(u) = -C + k1 u + k2 clamp(u - a(t), 0, m).

    Density is p_low on [-C, l(t)), p_high on [l(t), r(t)], p_low on (r(t), C]; the CDF reaches
    a(t) = (t + 1) / (2(z + 1)) at l(t) and a(t) + m, m = z/(z+1), at r(t).
    """
    z = math.exp(epsilon / 2.0)
    c = (z + 1.0) / (z - 1.0)
    p_low = 1.0 / ((z + 1.0) * (c + 1.0))
    p_high = z / ((z + 1.0) * (c - 1.0))
    return c, 1.0 / p_low, 1.0 / p_high - 1.0 / p_low, 1.0 / (2.0 * (z + 1.0)), z / (z + 1.0)


class Piecewise(_PureLocal):
    """Wang et al. (ICDE 2019) Piecewise Mechanism: output in [-C, C], unbiased."""

    name = "pm"

    def perturb(self, x, *, generator=None):
        t = self._input(x)
        u = uniform_like(t, generator)
        c, k1, k2, alpha, m = _piecewise_constants(self.epsilon)

        def kernel(u, t, s):
            torch.sub(u, t, alpha=alpha, out=s)
            s.sub_(alpha).clamp_(0.0, m)
            u.mul_(k1).sub_(c).add_(s, alpha=k2).clamp_(-c, c)

        map_chunks(u, (t,), 1, kernel)
        return u.view(x.shape)

    def variance(self, x):
        return piecewise_variance(self._input(x), self.epsilon).view(x.shape)


class Hybrid(_PureLocal):
    """Wang et al. (ICDE 2019) Hybrid Mechanism: PM w.p. 1 - e^(-eps/2) if eps > 0.61, else Duchi.

    One uniform selects the branch (u < beta) and, rescaled, drives the chosen branch.
    """

    name = "hm"

    def perturb(self, x, *, generator=None):
        t = self._input(x)
        u = uniform_like(t, generator)
        e = math.exp(self.epsilon)
        k = (e - 1.0) / (2.0 * (e + 1.0))
        bound = _scalar(duchi_bound(self.epsilon), t)
        beta = hybrid_pm_probability(self.epsilon)
        if beta == 0.0:
            map_chunks(u, (t,), 0, _duchi_kernel(k, bound))
            return u.view(x.shape)
        cut = half_grid_threshold(beta, t.dtype)
        c, k1, k2, alpha, m = _piecewise_constants(self.epsilon)

        def kernel(u, t, pm_branch, duchi, s):
            torch.neg(u, out=pm_branch).add_(cut).sign_().add_(1.0).mul_(0.5)  # 1 iff u < beta
            # Duchi on (u - beta) / (1 - beta): +B iff u < beta + (1 - beta)(1/2 + k t)
            torch.sub(u, t, alpha=(1.0 - beta) * k, out=duchi).sub_(beta + (1.0 - beta) * 0.5)
            torch.copysign(bound, duchi, out=duchi).neg_()
            # PM on u / beta (clamped to 1 where the Duchi branch is taken; masked out below)
            u.mul_(1.0 / cut).clamp_(max=1.0)
            torch.sub(u, t, alpha=alpha, out=s)
            s.sub_(alpha).clamp_(0.0, m)
            u.mul_(k1).sub_(c).add_(s, alpha=k2)
            u.sub_(duchi).mul_(pm_branch).add_(duchi).clamp_(-c, c)

        map_chunks(u, (t,), 3, kernel)
        return u.view(x.shape)

    def variance(self, x):
        t = self._input(x)
        beta = hybrid_pm_probability(self.epsilon)
        # Both branches are unbiased, so the mixture's variance is the mixture of variances.
        return (beta * piecewise_variance(t, self.epsilon)
                + (1.0 - beta) * duchi_variance(t, self.epsilon)).view(x.shape)


class LDPFL(Mechanism):
    """Sun, Qian, Chen (IJCAI 2021): clamp w to [c - r, c + r], then Duchi on (w - c)/r, rescaled.

    Output c +- r B; unbiased for the clamped weight; Var = r^2 B^2 - (w - c)^2.
    """

    name = "ldp-fl"

    def __init__(self, epsilon, center=0.0, radius=1.0):
        self.epsilon = _epsilon(epsilon)
        self.center = check_finite(center, "center")
        self.radius = check_positive(radius, "radius")

    def _clamped(self, x):
        w = check_tensor(x)
        return w.clamp(self.center - self.radius, self.center + self.radius)

    def perturb(self, x, *, generator=None):
        w = check_tensor(x)
        u = uniform_like(w, generator)
        e = math.exp(self.epsilon)
        k = (e - 1.0) / (2.0 * (e + 1.0))
        c, r = self.center, self.radius
        bound = _scalar(r * duchi_bound(self.epsilon), w)
        duchi = _duchi_kernel(k, bound)

        def kernel(u, w, t):
            torch.clamp(w, c - r, c + r, out=t)  # the paper's clamp: without it eps does not hold
            t.sub_(c).mul_(1.0 / r)
            duchi(u, t)
            u.add_(c)

        map_chunks(u, (w,), 1, kernel)
        return u.view(x.shape)

    def variance(self, x):
        w = self._clamped(x)
        return ((self.radius * duchi_bound(self.epsilon)) ** 2 - (w - self.center) ** 2).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(self.epsilon, 0.0, "value", "coordinate",
                         f"ldp-fl: eps={self.epsilon:g}-LDP for each weight clamped to "
                         f"[{self.center - self.radius:g}, {self.center + self.radius:g}]; "
                         "a tensor of d weights costs d*eps")

    def params(self) -> dict:
        return {"name": self.name, "epsilon": self.epsilon, "center": self.center, "radius": self.radius}


class PNPM(Mechanism):
    """Positive and Negative Piecewise Mechanism (seed paper 004, Algorithm 2), applied as
    w <- |w| * PNPM(w / |w|) (Algorithm 1, line 20).

    t = sign(w); t* is uniform on the same-sign interval ([1, C] for t = 1) w.p. e/(e+1), else on
    the opposite one; C = (e+3)/(e-1). Unbiased; Var = w^2 * 4(e + 1/3)/(e-1)^2.
    PROTECTS THE SIGN ONLY: |output| lies in [|w|, C|w|], so weights of different magnitude have
    disjoint output supports, and w = 0 is released exactly. No finite eps holds for the value.
    """

    name = "pnpm"

    def __init__(self, epsilon):
        self.epsilon = _epsilon(epsilon)

    def perturb(self, x, *, generator=None):
        w = check_tensor(x)
        u = uniform_like(w, generator)
        e = math.exp(self.epsilon)
        c = pnpm_bound(self.epsilon)
        q = half_grid_threshold(1.0 / (e + 1.0), w.dtype)  # P[sign flip] = 1/(e+1)
        k_flip, k_keep = (c - 1.0) / q, (c - 1.0) / (1.0 - q)
        # s = u - q < 0 (probability q) flips the sign: t* = -1 + k_flip s on [-C, -1); else
        # t* = 1 + k_keep s on (1, C]. With L = leaky_relu(s, k_flip/k_keep) that is
        # t* = k_keep L + sign(L), and since t*(-1) = -t*(+1) for the same u,
        # out = |w| t*(sign w) = w t*(+1) = k_keep (w L) + |w| sign(w L).

        def kernel(u, w, jump):
            u.sub_(q)
            torch.nn.functional.leaky_relu_(u, k_flip / k_keep)
            u.mul_(w)
            torch.copysign(w, u, out=jump)
            torch.add(jump, u, alpha=k_keep, out=u)

        map_chunks(u, (w,), 1, kernel)
        return u.view(x.shape)

    def variance(self, x):
        w = check_tensor(x)
        return (w * w * pnpm_t_variance(self.epsilon)).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(self.epsilon, 0.0, "sign", "coordinate",
                         f"pnpm: eps={self.epsilon:g}-LDP for the SIGN of each weight only; the "
                         "magnitude |w| is released up to a factor in [1, C] and w = 0 exactly, so "
                         "there is no finite eps for the weight's value")

    def params(self) -> dict:
        return {"name": self.name, "epsilon": self.epsilon}


class Laplace(_PureLocal):
    """Laplace mechanism on [-1, 1] (sensitivity 2): t + Lap(2/eps); unbiased, Var = 8/eps^2.

    Noise by inverse CDF from 53-bit uniforms (float32 uniforms would cap |noise| at 16.6 scales
    and leave an event of probability 2^-24 with an infinite likelihood ratio).
    """

    name = "laplace"
    domain = "[-1, 1]"

    def perturb(self, x, *, generator=None):
        t = self._input(x)
        u = uniform_like(t, generator, torch.float64)
        out = torch.empty_like(t)
        scale = 2.0 / self.epsilon
        below_one = 1.0 - 2.0**-53  # u = 0 would give log(0)

        def kernel(o, t, u, m):
            u.mul_(2.0).sub_(1.0)  # y in [-1, 1): sign and magnitude of the noise
            torch.abs(u, out=m).clamp_(max=below_one).neg_().log1p_().mul_(-scale)
            torch.copysign(m, u, out=m).add_(t)
            o.copy_(m)

        map_chunks(out, (t, u), 1, kernel, scratch_dtype=torch.float64)
        return out.view(x.shape)

    def variance(self, x):
        t = self._input(x)
        return torch.full_like(t, 8.0 / self.epsilon**2).view(x.shape)


class Exponential(_PureLocal):
    """Exponential mechanism (McSherry & Talwar 2007) on the output range [-1, 1] with utility
    -|t - y| (sensitivity 2): density proportional to exp(-eps |t - y| / 4), a Laplace truncated
    to [-1, 1]. Biased toward 0 near the edges; variance in closed form below.
    """

    name = "exponential"

    def perturb(self, x, *, generator=None):
        t = self._input(x)
        u = uniform_like(t, generator, torch.float64)
        out = torch.empty_like(t)
        b = 4.0 / self.epsilon

        def kernel(o, t, u, left, z):
            # mass left of t: b (1 - exp(-(1 + t)/b)); right of t: b (1 - exp(-(1 - t)/b))
            torch.add(t, 1.0, out=left)
            left.mul_(-1.0 / b).expm1_().mul_(-b)
            z.copy_(t)
            z.neg_().add_(1.0).mul_(-1.0 / b).expm1_().mul_(-b).add_(left)  # normaliser
            u.mul_(z).sub_(left)  # signed mass from t: < 0 goes left
            torch.abs(u, out=z).mul_(-1.0 / b).log1p_().mul_(-b)  # distance from t
            torch.copysign(z, u, out=z).add_(t).clamp_(-1.0, 1.0)
            o.copy_(z)

        map_chunks(out, (t, u), 2, kernel, scratch_dtype=torch.float64)
        return out.view(x.shape)

    def variance(self, x):
        t = self._input(x).to(torch.float64)
        b = 4.0 / self.epsilon

        def moments(length):  # integrals of s^k exp(-s/b) over [0, length], k = 0, 1, 2
            g = torch.exp(-length / b)
            l_b = length / b
            return (b * (1 - g), b**2 * (1 - g * (1 + l_b)), b**3 * (2 - g * (l_b * l_b + 2 * l_b + 2)))

        l0, l1, l2 = moments(1.0 + t)
        r0, r1, r2 = moments(1.0 - t)
        z = l0 + r0
        mean_offset = (r1 - l1) / z
        var = (l2 + r2) / z - mean_offset**2
        return var.to(x.dtype).view(x.shape)


class RandomizedResponse(Mechanism):
    """k-ary randomized response (Warner 1965; k = 2 is binary): inputs are categories 0..k-1
    stored as floats; keep w.p. e/(e + k - 1), else one of the other k - 1 uniformly.
    """

    name = "rr"

    def __init__(self, epsilon, k=2):
        self.epsilon = _epsilon(epsilon)
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"k must be an integer >= 2, got {k!r}")
        self.k = k

    def keep_probability(self) -> float:
        e = math.exp(self.epsilon)
        return e / (e + self.k - 1)

    def perturb(self, x, *, generator=None):
        v = check_tensor(x, low=0.0, high=float(self.k - 1))
        u = uniform_like(v, generator)
        e = math.exp(self.epsilon)
        keep, other = e / (e + self.k - 1), 1.0 / (e + self.k - 1)
        k = self.k

        def kernel(u, v, frac):
            torch.frac(v, out=frac)
            if bool(frac.any()):
                raise ValueError(f"x must hold integer categories 0..{k - 1}")
            # shift = 0 if u < keep, else 1 + floor((u - keep)/other) in 1..k-1
            u.sub_(keep).mul_(1.0 / other).floor_().add_(1.0).clamp_(0.0, k - 1.0)
            u.add_(v).remainder_(k)

        map_chunks(u, (v,), 1, kernel)
        return u.view(x.shape)

    def variance(self, x):
        v = check_tensor(x, low=0.0, high=float(self.k - 1)).to(torch.float64)
        keep = self.keep_probability()
        other = (1.0 - keep) / (self.k - 1)
        total = self.k * (self.k - 1) / 2.0
        total_sq = (self.k - 1) * self.k * (2 * self.k - 1) / 6.0
        mean = keep * v + other * (total - v)
        second = keep * v * v + other * (total_sq - v * v)
        return (second - mean * mean).to(x.dtype).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(self.epsilon, 0.0, "value", "coordinate",
                         f"rr: eps={self.epsilon:g}-LDP for each coordinate's category in "
                         f"0..{self.k - 1}; a tensor of d coordinates costs d*eps")

    def params(self) -> dict:
        return {"name": self.name, "epsilon": self.epsilon, "k": self.k}
