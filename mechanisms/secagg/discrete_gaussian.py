"""The discrete Gaussian N_Z(0, t m), sampled exactly from uniform integers of a ChaCha20 stream.

The algorithm is Canonne, Kamath and Steinke's ("The discrete Gaussian for differential privacy",
NeurIPS 2020, Algorithms 1 to 3), vectorised over coordinates with every probability an exact ratio
of integers: no float touches the randomness. The variance parameter is sigma^2 = t m with the
discrete Laplace scale t and m = sigma^2 / t both integers (`DiscreteGaussian.covering`), so the
acceptance probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)) = exp(-(|Y| - m)^2 / (2 t m)) is
exp(-a/b) with integers a, b.

Steps, each a rejection sampler whose output law is exactly the target (CKS Propositions):
- Bernoulli(exp(-a/b)), a/b in [0, 1] (Algorithm 1): K = 1; while Bernoulli(a / (b K)): K += 1;
  return K odd. Bernoulli(a / (b K)) is [W < a] for W uniform on [0, b K) (where b K could reach
  2^62: Bernoulli(a / b) times Bernoulli(1 / K), so no range exceeds max(b, K)). For a/b > 1: the
  product of floor(a/b) Bernoulli(exp(-1)) and one Bernoulli(exp(-(a mod b)/b)).
- Bernoulli(exp(-1)) itself: [U < 1/e] for U uniform on [0, 1), its binary digits drawn 63 at a
  time and compared with the exact digits of 1/e (integer arithmetic on the series of e) until
  they differ: one word per draw but with probability 2^-63.
- discrete Laplace of scale t (Algorithm 2): U uniform on [0, t), kept with probability
  exp(-U/t); V geometric (count Bernoulli(exp(-1)) successes); a sign bit; (sign -, 0) rejected;
  Y = +-(U + t V), P[Y = y] proportional to exp(-|y|/t).
- the discrete Gaussian (Algorithm 3): keep Y with probability exp(-(|Y| - m)^2 / (2 t m)); then
  P[Y = y] is proportional to exp(-y^2 / (2 t m)).

Vectorised: each loop of trials draws a block of the next few trials of every entry still in it
(trials after an entry's deciding one are drawn and thrown away: independent trials, so the law is
unchanged), and each rejection step draws a batch of candidates sized so that one pass usually
yields enough, keeping the first n accepted (acceptance is independent across candidates, so the
kept ones are i.i.d. of the target law). Every draw uses fresh words of the stream.

Uniforms on [0, M) come from 63-bit words by rejection (a word below the largest multiple of M
under 2^63, reduced mod M): exact. Every array operation stays within int64: M < 2^62 is checked
where it is formed, and a coordinate whose (|Y| - m)^2 would overflow goes to the same algorithm in
Python integers (`_accept_python`: slower, as exact; met on a few percent of coordinates for sigma
near 2^30, about never for the sigmas the examples use).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import torch

from mechanisms.draws import bits63_
from mechanisms.randomness import RandomStream

Ints = npt.NDArray[np.int64]
_TWO63 = 1 << 63
_MAX_MODULUS = 1 << 62  # a uniform's range; accepting a word then has probability > 1/2
_SAFE_DEVIATION = 1 << 31  # |(|Y| - m)| below this: its square fits int64
_BLOCK = 3  # Bernoulli trials of one entry drawn at once (all 3 succeed with probability <= 1/6)
_STEPS = np.arange(_BLOCK, dtype=np.int64)
_BLOCK_ONES = 64  # Bernoulli(exp(-1)) factors of one entry drawn at once (all pass: e^-64)


def uniform_below(modulus: Ints, stream: RandomStream) -> Ints:
    """One uniform integer on [0, modulus[i]) per entry (1 <= modulus < 2^62), exactly: 63-bit
    words below the largest multiple of the modulus under 2^63 are accepted and reduced."""
    modulus = np.asarray(modulus, dtype=np.int64)
    if modulus.size and (int(modulus.min()) < 1 or int(modulus.max()) >= _MAX_MODULUS):
        raise ValueError("a uniform's range must lie in [1, 2^62)")
    return _uniform_below(modulus.reshape(-1), stream).reshape(modulus.shape)


def _uniform_below(modulus: Ints, stream: RandomStream) -> Ints:
    """`uniform_below` of a flat array of moduli known to lie in [1, 2^62)."""
    words = _words63(modulus.size, stream)
    out = words % modulus
    redo = np.nonzero(words >= (np.int64(_TWO63 - 1) // modulus) * modulus)[0]  # beyond the multiples
    if redo.size:
        out[redo] = _uniform_below(modulus[redo], stream)
    return out


def _words63(n: int, stream: RandomStream) -> Ints:
    return bits63_(torch.empty(n, dtype=torch.int64), stream).numpy()


def bernoulli_exp(a: Ints, b: Ints | np.int64, stream: RandomStream) -> npt.NDArray[np.bool_]:
    """Bernoulli(exp(-a[i]/b[i])) per entry, for integers 0 <= a <= b (CKS Algorithm 1)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.broadcast_to(np.asarray(b, dtype=np.int64), a.shape)
    if a.size and (int(a.min()) < 0 or bool((a > b).any()) or int(b.min()) < 1):
        raise ValueError("bernoulli_exp needs 0 <= a <= b, b >= 1")
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    b_max = int(b_flat.max()) if b_flat.size else 1
    k = np.ones(a.size, dtype=np.int64)
    active = np.arange(a.size)
    k_bound = 1  # every K is at most this
    while active.size:
        # the trials K, ..., K + BLOCK - 1 of every active entry at once (those after an entry's
        # first failure are drawn and discarded), each Bernoulli(a / (b K)): [W < a] for W uniform
        # on [0, b K), or, where b K could reach 2^62, Bernoulli(a / b) and Bernoulli(1 / K)
        k_bound += _BLOCK - 1
        ks = (k[active][:, None] + _STEPS).reshape(-1)
        bs, a_active = np.repeat(b_flat[active], _BLOCK), np.repeat(a_flat[active], _BLOCK)
        if b_max < _MAX_MODULUS // k_bound:
            success = _uniform_below(bs * ks, stream) < a_active
        else:
            success = _uniform_below(ks, stream) == 0
            success &= _uniform_below(bs, stream) < a_active
        leading, all_passed = _leading_true(success.reshape(-1, _BLOCK))
        k[active] += leading
        active = active[all_passed]
        k_bound += 1
    return ((k % 2) == 1).reshape(a.shape)


def bernoulli_exp_one(n: int, stream: RandomStream) -> npt.NDArray[np.bool_]:
    """n draws of Bernoulli(exp(-1)) as [U < 1/e] for U uniform on [0, 1): U's binary digits are
    drawn 63 at a time and compared with those of 1/e (`_inverse_e_digits`, exact integers) until
    they differ, which they do (1/e is irrational; a tie has probability 2^-63 a word)."""
    out = np.zeros(n, dtype=bool)
    undecided = np.arange(n)
    level = 0
    while undecided.size:
        words = _words63(undecided.size, stream)
        digits = np.int64(_inverse_e_digits(level))
        out[undecided] = words < digits
        undecided = undecided[words == digits]
        level += 1
    return out


def _inverse_e_digits(level: int) -> int:
    """Binary digits 63 level + 1 to 63 (level + 1) of 1/e, as an integer below 2^63."""
    while len(_INVERSE_E) <= level:
        _INVERSE_E.append(_inverse_e_floor(63 * (len(_INVERSE_E) + 1)) % (1 << 63))
    return _INVERSE_E[level]


def _inverse_e_floor(bits: int) -> int:
    """floor(2^bits / e), exactly: e between sum_{k<=K} 1/k! and that plus 2/(K+1)!, K raised
    until both bounds give the same floor (they do: 2^bits / e is not an integer)."""
    terms = 2 * bits
    while True:
        low = sum(Fraction(1, math.factorial(k)) for k in range(terms + 1))
        high = low + Fraction(2, math.factorial(terms + 1))
        floor_high, floor_low = math.floor((1 << bits) / low), math.floor((1 << bits) / high)
        if floor_high == floor_low:
            return floor_low
        terms *= 2


_INVERSE_E: list[int] = []


def _leading_true(rows: npt.NDArray[np.bool_]) -> tuple[Ints, npt.NDArray[np.bool_]]:
    """Per row, the number of True entries before the first False (the row's length if none),
    and whether the row is all True."""
    all_true: npt.NDArray[np.bool_] = np.asarray(rows.all(axis=1))
    return np.where(all_true, rows.shape[1], np.argmin(rows, axis=1)).astype(np.int64), all_true


def bernoulli_exp_ratio(numerator: Ints, denominator: int, stream: RandomStream) -> npt.NDArray[np.bool_]:
    """Bernoulli(exp(-numerator[i]/denominator)) for any integers numerator >= 0: one
    Bernoulli(exp(-(n mod d)/d)) and floor(n/d) Bernoulli(exp(-1)), all of which must succeed
    (drawn up to _BLOCK_ONES of an entry's at a time; an entry stops at its first failing block)."""
    numerator = np.asarray(numerator, dtype=np.int64)
    whole, part = np.divmod(numerator, np.int64(denominator))
    out = bernoulli_exp(part, np.int64(denominator), stream)
    alive = np.nonzero(out & (whole > 0))[0]
    while alive.size:
        counts = np.minimum(whole[alive], _BLOCK_ONES)
        trials = bernoulli_exp_one(int(counts.sum()), stream)
        starts = np.cumsum(counts) - counts
        passed = np.logical_and.reduceat(trials, starts)
        out[alive[~passed]] = False
        whole[alive] -= counts
        alive = alive[passed & (whole[alive] > 0)]
    return out


def _batch(remaining: int, expected_yield: float) -> int:
    """Candidates to draw for `remaining` outputs of a rejection step that keeps about
    `expected_yield` of them: usually enough for one pass (the rest comes in another)."""
    return math.ceil(remaining / expected_yield) + 16


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
        """n independent draws: candidates in batches, the accepted ones taken in order (each
        candidate's acceptance is independent of the others, so they are i.i.d. of the target law)."""
        return _rejection(n, 0.7, lambda k: self._accept_candidates(self._laplace(k, stream), stream))

    def _accept_candidates(self, y: Ints, stream: RandomStream) -> Ints:
        return y[self._accept(y, stream)]

    def _laplace(self, n: int, stream: RandomStream) -> Ints:
        """n draws of the discrete Laplace of scale t (CKS Algorithm 2)."""
        return _rejection(n, 0.6, lambda k: self._laplace_candidates(k, stream))

    def _laplace_candidates(self, k: int, stream: RandomStream) -> Ints:
        """The accepted ones of k candidates of CKS Algorithm 2."""
        t = self.scale
        u = _uniform_below(np.full(k, t, dtype=np.int64), stream)
        keep = bernoulli_exp(u, np.int64(t), stream)
        v = np.zeros(k, dtype=np.int64)
        counting = np.nonzero(keep)[0]
        while counting.size:  # V: Bernoulli(exp(-1)) successes before the first failure
            leading, all_passed = _leading_true(bernoulli_exp_one(counting.size * _BLOCK, stream).reshape(-1, _BLOCK))
            v[counting] += leading
            counting = counting[all_passed]
        negative = _uniform_below(np.full(k, 2, dtype=np.int64), stream) == 1
        magnitude = u + t * v
        keep &= ~(negative & (magnitude == 0))
        return np.where(negative, -magnitude, magnitude)[keep]

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


def _rejection(n: int, expected_yield: float, accepted_of: Callable[[int], Ints]) -> Ints:
    """n outputs of a rejection sampler: `accepted_of(k)` returns the accepted ones of k fresh
    candidates, in order; the first n accepted are kept, batches drawn until there are n."""
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        values = accepted_of(_batch(n - filled, expected_yield))[: n - filled]
        out[filled : filled + values.size] = values
        filled += values.size
    return out


def _accept_python(numerator: int, denominator: int, stream: RandomStream) -> bool:
    """`bernoulli_exp_ratio` for one entry whose numerator exceeds int64 (Python integers)."""
    whole, part = divmod(numerator, denominator)
    for _ in range(whole):  # each passes with probability e^-1: the loop ends after a few
        if not bool(bernoulli_exp_one(1, stream)[0]):
            return False
    k = 1
    while stream.below(denominator) < part and stream.below(k) == 0:  # Bernoulli(part / (denominator k))
        k += 1
    return k % 2 == 1
