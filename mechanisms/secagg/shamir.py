"""Shamir secret sharing of 32-byte secrets over the prime field F_p, p = 2^256 + 297 (the smallest
prime above 2^256, so every 32-byte string is a field element and nothing is cut into chunks).

A secret s is the constant term of a random polynomial f of degree t - 1 (coefficients uniform on
[0, p) from the OS CSPRNG, or from a caller's byte source in tests); member i (1-based) holds
f(i). Any t shares give s back by Lagrange interpolation at 0; any t - 1 of them are uniformly
distributed whatever s is (for each s there is exactly one polynomial through them and (0, s)),
so they reveal nothing.

Why not a library: pycryptodome's Shamir works on 16-byte blocks (a 32-byte seed is two
independent sharings) and measured 148 ms to split and 232 ms to combine at n = 100, t = 51 (the
research note); Flower pickles its shares; `galois` pulls numba in for what is a dozen lines of
Python integer arithmetic (about 1 ms to deal to 100 members).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PRIME = (1 << 256) + 297
SECRET_BYTES = 32
SHARE_BYTES = 33  # a field element: 257 bits
MAX_MEMBERS = 1 << 16


@dataclass(frozen=True)
class Share:
    x: int  # the holder's point, 1..n
    y: int  # f(x) in [0, p)

    def __post_init__(self) -> None:
        if not 1 <= self.x < MAX_MEMBERS or not 0 <= self.y < PRIME:
            raise ValueError("a share is a point 1 <= x < 2^16 and a field element y")

    def y_bytes(self) -> bytes:
        return self.y.to_bytes(SHARE_BYTES, "big")


def random_field_element(random_bytes: Callable[[int], bytes] = os.urandom) -> int:
    """Uniform on [0, p): 257-bit values by rejection (each accepted with probability ~1/2)."""
    while True:
        value = int.from_bytes(random_bytes(SHARE_BYTES), "big") & ((1 << 257) - 1)
        if value < PRIME:
            return value


def split(
    secret: bytes, threshold: int, members: int, random_bytes: Callable[[int], bytes] = os.urandom
) -> list[Share]:
    """Shares f(1), ..., f(members) of `secret` (32 bytes), any `threshold` of which recover it."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a secret is {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= threshold <= members < MAX_MEMBERS:
        raise ValueError(f"need 1 <= threshold <= members < 2^16, got {threshold}, {members}")
    coefficients = [int.from_bytes(secret, "big")] + [random_field_element(random_bytes) for _ in range(threshold - 1)]
    shares = []
    for x in range(1, members + 1):
        y = 0
        for c in reversed(coefficients):  # Horner
            y = (y * x + c) % PRIME
        shares.append(Share(x, y))
    return shares


def lagrange_at_zero(points: Sequence[int]) -> list[int]:
    """The coefficients l_i with f(0) = sum l_i f(x_i) for every f of degree < len(points): one
    set serves every secret shared at the same points (a round reconstructs up to n secrets from
    the same survivors' shares, so the coefficients are computed once per set of points)."""
    if len(set(points)) != len(points):
        raise ValueError("shares must be at distinct points")
    coefficients = []
    for i, xi in enumerate(points):
        numerator, denominator = 1, 1
        for j, xj in enumerate(points):
            if i != j:
                numerator = numerator * (-xj) % PRIME
                denominator = denominator * (xi - xj) % PRIME
        coefficients.append(numerator * pow(denominator, -1, PRIME) % PRIME)
    return coefficients


def interpolate_secret(coefficients: Sequence[int], ys: Sequence[int]) -> bytes:
    """The secret sum l_i y_i from `lagrange_at_zero`'s coefficients and the shares' values at the
    same points. Raises if the value is not a 32-byte string (shares of different secrets, or
    forged ones, almost surely give a value above 2^256)."""
    if len(coefficients) != len(ys):
        raise ValueError("one share value per coefficient")
    secret = sum(c * y for c, y in zip(coefficients, ys)) % PRIME
    if secret >= 1 << (8 * SECRET_BYTES):
        raise ValueError("the shares do not interpolate to a 32-byte secret")
    return secret.to_bytes(SECRET_BYTES, "big")


def combine(shares: Sequence[Share], threshold: int) -> bytes:
    """The secret from `threshold` or more shares at distinct points (the first `threshold` used)."""
    if len({s.x for s in shares}) != len(shares):
        raise ValueError("shares must be at distinct points")
    if len(shares) < threshold:
        raise ValueError(f"need {threshold} shares, got {len(shares)}")
    used = shares[:threshold]
    return interpolate_secret(lagrange_at_zero([s.x for s in used]), [s.y for s in used])


def threshold_for(members: int, dropout_fraction: float) -> int:
    """t such that the round survives `dropout_fraction` of the members dropping (at least t stay)
    while fewer than t colluding members learn nothing: members - floor(fraction x members), and
    more than half of the members (so that two disjoint groups cannot both reconstruct)."""
    if not 0 <= dropout_fraction < 1 or members < 1:
        raise ValueError("need members >= 1 and 0 <= dropout_fraction < 1")
    staying = members - int(dropout_fraction * members)
    return max(staying, members // 2 + 1) if members > 1 else 1


def lagrange_without(points: Sequence[int], coefficients: Sequence[int], missing: Sequence[int]) -> list[int]:
    """`lagrange_at_zero` of `points` less the points in `missing`, from the coefficients of all of
    `points`: l_i prod over m missing of (x_m - x_i) / x_m, in the order of the points kept.
    O(kept x missing) multiplications and one inversion per missing point, where a fresh set costs
    O(kept^2): a round whose revealers each leave out different dealers gets one set per dealer."""
    gone = set(missing)
    if not gone <= set(points):
        raise ValueError("missing points must be among the points")
    inverses = [(m, pow(m, -1, PRIME)) for m in gone]
    adjusted = []
    for x, c in zip(points, coefficients):
        if x in gone:
            continue
        for m, inverse in inverses:
            c = c * (m - x) % PRIME * inverse % PRIME
        adjusted.append(c)
    return adjusted
