"""Shamir sharing over F_p, p = 2^256 + 297: any t shares recover the secret, t - 1 are consistent
with every secret (so they reveal nothing), and a wrong share is caught."""

from __future__ import annotations

import itertools
import os

import pytest

from mechanisms.secagg.shamir import PRIME, Share, combine, lagrange_at_zero, lagrange_without, split, threshold_for


def test_p_is_the_prime_just_above_2_256():
    assert PRIME > 2**256
    assert all(pow(a, PRIME - 1, PRIME) == 1 for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37))


def test_any_t_shares_recover_the_secret():
    secret = os.urandom(32)
    shares = split(secret, 3, 5)
    for subset in itertools.permutations(shares, 3):
        assert combine(list(subset), 3) == secret
    assert combine(split(b"\xff" * 32, 1, 1), 1) == b"\xff" * 32


def test_t_minus_one_shares_fit_every_secret_equally():
    """For any t - 1 shares and ANY candidate secret there is exactly one polynomial of degree
    t - 1 through them and (0, candidate): the shares rule no secret out."""
    t, n = 4, 7
    shares = split(os.urandom(32), t, n)
    known = shares[: t - 1]
    for candidate in (0, 1, 2**256 - 1, int.from_bytes(os.urandom(32), "big")):
        # the polynomial through (0, candidate) and the t - 1 known shares has degree < t and
        # passes through all of them: a sharing of `candidate` that the holders cannot tell apart
        points = [(0, candidate)] + [(s.x, s.y) for s in known]
        assert [_interpolate(points, x) for x, _ in points] == [y for _, y in points]
        # and it is a genuine sharing: t of its shares (the known ones plus a fresh point) recover the candidate
        extra = Share(n + 1, _interpolate(points, n + 1))
        assert int.from_bytes(combine([*known, extra], t), "big") == candidate


def _interpolate(points: list[tuple[int, int]], x: int) -> int:
    value = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (x - xj) % PRIME
                den = den * (xi - xj) % PRIME
        value = (value + yi * num * pow(den, -1, PRIME)) % PRIME
    return value


def test_a_wrong_share_does_not_give_the_secret():
    secret = os.urandom(32)
    shares = split(secret, 3, 5)
    forged = [shares[0], shares[1], Share(shares[2].x, (shares[2].y + 1) % PRIME)]
    try:
        recovered = combine(forged, 3)
    except ValueError:  # interpolates above 2^256: caught
        recovered = None
    assert recovered != secret


def test_threshold_survives_a_third_and_needs_a_majority():
    assert threshold_for(100, 1 / 3) == 67
    assert threshold_for(10, 0.0) == 10
    assert threshold_for(10, 0.9) == 6
    with pytest.raises(ValueError):
        split(b"short", 2, 3)


def test_coefficients_without_some_points_equal_a_fresh_computation():
    points = [1, 2, 4, 5, 8, 11, 12, 17, 30]
    everyone = lagrange_at_zero(points)
    for missing in ([], [4], [1, 30], [2, 5, 8, 12]):
        kept = [x for x in points if x not in missing]
        assert lagrange_without(points, everyone, missing) == lagrange_at_zero(kept)
    with pytest.raises(ValueError):
        lagrange_without(points, everyone, [3])
