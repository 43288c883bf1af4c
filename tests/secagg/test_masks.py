"""Masks cancel exactly mod 2^bits; a dropped member's pairwise masks come off through its
Shamir-reconstructed key; and the unmasked sum of masked vectors is, bit for bit, the sum
`swarm simulate` computes without masks (node.runs.secure_round)."""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms.randomness import seeded_generator
from mechanisms.secagg.masks import (
    MaskKey,
    MaskSum,
    check_key_matches,
    expand,
    mask,
    new_self_seed,
    session_id,
    unmask,
)
from mechanisms.secagg.member import decode, encode, sum_residues
from mechanisms.secagg.policy import SecAggPolicy
from mechanisms.secagg.quantize import wrap
from mechanisms.secagg.shamir import combine, split

BITS = 32
DIM = 1000
SESSION = session_id(b"genesis digest", 7, chain_id=1, ledger=bytes(20))


def members(n: int) -> tuple[list[MaskKey], dict[int, bytes], list[bytes]]:
    keys = [MaskKey.generate() for _ in range(n)]
    return keys, {i: k.public for i, k in enumerate(keys)}, [new_self_seed() for _ in range(n)]


def residues(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**BITS, DIM, dtype=np.int64) for _ in range(n)]


def test_pairwise_masks_cancel_and_the_sum_unmasks_exactly():
    n = 6
    keys, publics, seeds = members(n)
    xs = residues(n)
    ys = {u: mask(xs[u], u, keys[u], publics, seeds[u], SESSION, BITS) for u in range(n)}
    assert all(not np.array_equal(ys[u], xs[u]) for u in range(n))  # each vector is hidden
    total = unmask(ys, dict(enumerate(seeds)), {}, publics, SESSION, BITS)
    assert np.array_equal(total, sum_residues(xs, BITS))
    # without the self-masks, the pairwise masks alone cancel: sum(y) - sum(PRG(b)) = sum(x)
    plain = sum_residues(list(ys.values()), BITS)
    self_masks = sum_residues([expand(s, DIM, BITS, "self") for s in seeds], BITS)
    assert np.array_equal(wrap(plain - self_masks, BITS), sum_residues(xs, BITS))


def test_a_dropped_members_masks_come_off_through_its_reconstructed_key():
    n, t, dropped = 7, 5, 3
    keys, publics, seeds = members(n)
    xs = residues(n, 1)
    shares = split(keys[dropped].private, t, n)  # dealt to every member before it dropped
    survivors = [u for u in range(n) if u != dropped]
    ys = {u: mask(xs[u], u, keys[u], publics, seeds[u], SESSION, BITS) for u in survivors}
    rebuilt = MaskKey(combine([shares[u] for u in survivors[:t]], t))
    assert check_key_matches(rebuilt, publics[dropped])
    total = unmask(ys, {u: seeds[u] for u in survivors}, {dropped: rebuilt}, publics, SESSION, BITS)
    assert np.array_equal(total, sum_residues([xs[u] for u in survivors], BITS))
    with pytest.raises(ValueError):  # the dropped member's key is needed
        unmask(ys, {u: seeds[u] for u in survivors}, {}, publics, SESSION, BITS)


def test_masked_sum_equals_the_simulated_unmasked_sum():
    """What simulate computes (encode, then sum mod 2^bits) is what a swarm unmasks."""
    policy = SecAggPolicy(members=4, max_records=400, dim=DIM, clip=0.1, noise_multiplier=2.0)
    keys, publics, seeds = members(4)
    rng = np.random.default_rng(2)
    sums = [rng.normal(0, 3, DIM) for _ in range(4)]
    encoded = [
        encode(policy, sums[u], seeded_generator(u).mechanism, seeded_generator(u).dpsgd_noise) for u in range(4)
    ]
    ys = {u: mask(encoded[u], u, keys[u], publics, seeds[u], SESSION, policy.bits) for u in range(4)}
    unmasked = unmask(ys, dict(enumerate(seeds)), {}, publics, SESSION, policy.bits)
    assert np.array_equal(unmasked, sum_residues(encoded, policy.bits))
    mean = decode(policy, unmasked, 400)
    exact = np.sum(sums, axis=0) / 400
    # rounding (< 1 unit per member) and noise (sigma units on the sum) over scale x 400 records
    sigma = policy.noise_multiplier * policy.sensitivity * np.sqrt(policy.members / policy.counted_members)
    assert np.abs(mean - exact).max() < (6 * sigma + 4) / (policy.scale * 400)


@pytest.mark.parametrize("bits", [32, 33, 48, 62])
def test_masks_cancel_at_every_width_of_word(bits):
    """Above 32 bits the masks are 64-bit words: their sum must wrap mod 2^64 (int64 + uint64
    in numpy goes through float64 and loses the low bits)."""
    start = np.arange(5, dtype=np.int64)
    total = MaskSum(start, bits)
    seed = new_self_seed()
    total.add(seed, "self", +1)
    total.add(seed, "self", -1)
    assert np.array_equal(total.residues(), start)

    n = 3
    keys, publics, seeds = members(n)
    rng = np.random.default_rng(bits)
    xs = [rng.integers(0, 2**bits, DIM, dtype=np.int64) for _ in range(n)]
    ys = {u: mask(xs[u], u, keys[u], publics, seeds[u], SESSION, bits) for u in range(n)}
    assert np.array_equal(unmask(ys, dict(enumerate(seeds)), {}, publics, SESSION, bits), sum_residues(xs, bits))
    # a masked vector of zeros is the mask alone: uniform on [0, 2^bits), no mass at 0 or in the
    # low bits (each bit of a uniform residue is 1 with probability 1/2; 6 standard deviations)
    y = mask(np.zeros(DIM, dtype=np.int64), 0, keys[0], publics, seeds[0], SESSION, bits)
    assert np.count_nonzero(y == 0) == 0 and y.min() >= 0 and y.max() < 2**bits
    ones = np.array([np.count_nonzero((y >> b) & 1) for b in range(bits)])
    assert (np.abs(ones - DIM / 2) < 6 * np.sqrt(DIM / 4)).all()
