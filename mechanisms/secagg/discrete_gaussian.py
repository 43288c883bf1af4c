"""The discrete Gaussian N_Z(0, t m), sampled exactly from uniform integers of a ChaCha20 stream.

The algorithm is Canonne, Kamath and Steinke's ("The discrete Gaussian for differential privacy",
NeurIPS 2020, Algorithms 1 to 3), vectorised over coordinates with every probability an exact ratio
of integers: no float touches the randomness. The variance parameter is sigma^2 = t m with the
discrete Laplace scale t and m = sigma^2 / t both integers (`DiscreteGaussian.covering`), so the
acceptance probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)) = exp(-(|Y| - m)^2 / (2 t m)) is
exp(-a/b) with integers a, b.

Steps, each a rejection sampler whose output law is exactly the target (CKS Propositions):
- Bernoulli(exp(-a/b)), a/b in [0, 1] (Algorithm 1): K = 1; while Bernoulli(a / (b K)): K += 1;
  return K odd. Bernoulli(a / (b K)) is [W < a] for W uniform on [0, b K). For a/b > 1: the
  product of floor(a/b) Bernoulli(exp(-1)) and one Bernoulli(exp(-(a mod b)/b)).
- discrete Laplace of scale t (Algorithm 2): U uniform on [0, t), kept with probability
  exp(-U/t); V geometric (count Bernoulli(exp(-1)) successes); a sign bit; (sign -, 0) rejected;
  Y = +-(U + t V), P[Y = y] proportional to exp(-|y|/t).
- the discrete Gaussian (Algorithm 3): keep Y with probability exp(-(|Y| - m)^2 / (2 t m)); then
  P[Y = y] is proportional to exp(-y^2 / (2 t m)).

Uniforms on [0, M) come from 63-bit words by rejection (a word below the largest multiple of M
under 2^63, reduced mod M): exact. Every array operation stays within int64: M < 2^62 is checked
where it is formed, and a coordinate whose (|Y| - m)^2 would overflow goes to the same algorithm in
Python integers (`_accept_python`: slower, as exact; met on a few percent of coordinates for sigma
near 2^30, about never for the sigmas the examples use). Bernoulli(exp(-a/b)) draws its
Bernoulli(a / (b K)) steps as Bernoulli(a / b) times Bernoulli(1 / K), so no range exceeds max(b, K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from mechanisms.draws import bits63_
from mechanisms.randomness import RandomStream

Ints = npt.NDArray[np.int64]
_TWO63 = 1 << 63
_MAX_MODULUS = 1 << 62  # a uniform's range; accepting a word then has probability > 1/2
_SAFE_DEVIATION = 1 << 31  # |(|Y| - m)| below this: its square fits int64


def uniform_below(modulus: Ints, stream: RandomStream) -> Ints:
    """One uniform integer on [0, modulus[i]) per entry (1 <= modulus < 2^62), exactly: 63-bit
    words below the largest multiple of the modulus under 2^63 are accepted and reduced."""
    modulus = np.asarray(modulus, dtype=np.int64)
    if modulus.size and (int(modulus.min()) < 1 or int(modulus.max()) >= _MAX_MODULUS):
        raise ValueError("a uniform's range must lie in [1, 2^62)")
    out = np.empty(modulus.shape, dtype=np.int64)
    todo = np.arange(modulus.size)
    flat_mod = modulus.reshape(-1)
    flat_out = out.reshape(-1)
    while todo.size:
        words = _words63(todo.size, stream)
        m = flat_mod[todo]
        limit = (np.int64(_TWO63 - 1) // m) * m  # the multiples of m below 2^63 - 1 (exclusive bound)
        ok = words < limit
        flat_out[todo[ok]] = words[ok] % m[ok]
        todo = todo[~ok]
    return out


def _words63(n: int, stream: RandomStream) -> Ints:
    return bits63_(torch.empty(n, dtype=torch.int64), stream).numpy()


def bernoulli_exp(a: Ints, b: Ints | np.int64, stream: RandomStream) -> npt.NDArray[np.bool_]:
    """Bernoulli(exp(-a[i]/b[i])) per entry, for integers 0 <= a <= b (CKS Algorithm 1)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.broadcast_to(np.asarray(b, dtype=np.int64), a.shape)
    if a.size and (int(a.min()) < 0 or bool((a > b).any()) or int(b.min()) < 1):
        raise ValueError("bernoulli_exp needs 0 <= a <= b, b >= 1")
    k = np.ones(a.shape, dtype=np.int64)
    active = np.arange(a.size)
    a_flat, b_flat, k_flat = a.reshape(-1), b.reshape(-1), k.reshape(-1)
    while active.size:
        # Bernoulli(a / (b K)) as Bernoulli(a / b) and Bernoulli(1 / K) at once: the same law, and
        # no range past max(b, K), so no product b K can leave int64
        success = (uniform_below(b_flat[active], stream) < a_flat[active]) & (
            uniform_below(k_flat[active], stream) == 0
        )
        k_flat[active[success]] += 1
        active = active[success]
    return (k % 2) == 1


def bernoulli_exp_ratio(numerator: Ints, denominator: int, stream: RandomStream) -> npt.NDArray[np.bool_]:
    """Bernoulli(exp(-numerator[i]/denominator)) for any integers numerator >= 0: floor(n/d)
    Bernoulli(exp(-1)) in a row (stopping at the first failure) and one Bernoulli(exp(-(n mod d)/d))."""
    numerator = np.asarray(numerator, dtype=np.int64)
    whole, part = np.divmod(numerator, np.int64(denominator))
    out = bernoulli_exp(part, np.int64(denominator), stream)
    alive = np.nonzero(out & (whole > 0))[0]
    done = np.zeros(numerator.shape, dtype=np.int64)
    while alive.size:
        ones = np.ones(alive.size, dtype=np.int64)
        success = bernoulli_exp(ones, ones, stream)
        out[alive[~success]] = False
        done[alive] += 1
        alive = alive[success]
        alive = alive[done[alive] < whole[alive]]
    return out


@dataclass(frozen=True)
class DiscreteGaussian:
    """N_Z(0, sigma^2) with sigma^2 = scale x ratio (integers): P[X = x] proportional to
    exp(-x^2 / (2 sigma^2)) on the integers."""

    scale: int  # t, the discrete Laplace scale of the proposal (about sigma)
    ratio: int  # m = sigma^2 / t

    def __post_init__(self) -> None:
        for name in ("scale", "ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if 2 * self.scale * self.ratio >= _MAX_MODULUS:
            raise ValueError("sigma^2 must stay below 2^61")

    @classmethod
    def covering(cls, variance: float) -> DiscreteGaussian:
        """The discrete Gaussian with t = floor(sigma) + 1 (CKS's choice: few rejections) and the
        smallest integer m with t m >= variance: never less noise than asked for."""
        if not (math.isfinite(variance) and variance >= 1):
            raise ValueError(f"variance must be finite and >= 1, got {variance!r}")
        t = math.isqrt(math.floor(variance)) + 1
        return cls(t, max(1, math.ceil(variance / t)))

    @property
    def variance(self) -> int:
        """sigma^2 (the discrete Gaussian's parameter; its true variance is below it, CKS Prop. 19)."""
        return self.scale * self.ratio

    def sample(self, n: int, stream: RandomStream) -> Ints:
        """n independent draws."""
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        while todo.size:
            y = self._laplace(todo.size, stream)
            keep = self._accept(y, stream)
            out[todo[keep]] = y[keep]
            todo = todo[~keep]
        return out

    def _laplace(self, n: int, stream: RandomStream) -> Ints:
        """n draws of the discrete Laplace of scale t (CKS Algorithm 2)."""
        t = self.scale
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        while todo.size:
            k = todo.size
            u = uniform_below(np.full(k, t, dtype=np.int64), stream)
            keep = bernoulli_exp(u, np.int64(t), stream)
            v = np.zeros(k, dtype=np.int64)
            counting = np.nonzero(keep)[0]
            while counting.size:
                ones = np.ones(counting.size, dtype=np.int64)
                success = bernoulli_exp(ones, ones, stream)
                v[counting[success]] += 1
                counting = counting[success]
            negative = uniform_below(np.full(k, 2, dtype=np.int64), stream) == 1
            magnitude = u + t * v
            keep &= ~(negative & (magnitude == 0))
            signed = np.where(negative, -magnitude, magnitude)
            out[todo[keep]] = signed[keep]
            todo = todo[~keep]
        return out

    def _accept(self, y: Ints, stream: RandomStream) -> npt.NDArray[np.bool_]:
        """Bernoulli(exp(-(|y| - m)^2 / (2 t m))) per entry (CKS Algorithm 3's last step)."""
        deviation = np.abs(y) - self.ratio
        safe = np.abs(deviation) < _SAFE_DEVIATION
        out = np.zeros(y.shape, dtype=bool)
        index = np.nonzero(safe)[0]
        out[index] = bernoulli_exp_ratio(deviation[index] ** 2, 2 * self.scale * self.ratio, stream)
        for i in np.nonzero(~safe)[0]:
            out[i] = _accept_python(int(deviation[i]) ** 2, 2 * self.scale * self.ratio, stream)
        return out


def _accept_python(numerator: int, denominator: int, stream: RandomStream) -> bool:
    """`bernoulli_exp_ratio` for one entry whose numerator exceeds int64 (Python integers)."""
    whole, part = divmod(numerator, denominator)
    for _ in range(whole):  # each passes with probability e^-1: the loop ends after a few
        if not bool(bernoulli_exp(np.ones(1, dtype=np.int64), np.ones(1, dtype=np.int64), stream)[0]):
            return False
    k = 1
    while stream.below(denominator) < part and stream.below(k) == 0:  # Bernoulli(part / (denominator k))
        k += 1
    return k % 2 == 1
