"""The generator privacy draws come from: full-state seeding from the OS CSPRNG, no seed kept."""

from __future__ import annotations

import math

import torch

import mechanisms
from mechanisms.randomness import secret_generator


def test_torch_manual_seed_keeps_only_32_bits():
    """Why secret_generator fills the whole state: manual_seed(k) and manual_seed(k + 2^32) draw the
    same stream, so a CSPRNG seed passed to manual_seed has only 2^32 values to try."""
    k = 123_456_789
    a = torch.rand(8, generator=torch.Generator().manual_seed(k))
    b = torch.rand(8, generator=torch.Generator().manual_seed(k + 2**32))
    assert torch.equal(a, b)


def test_secret_generators_differ_and_keep_no_seed():
    draws = [torch.rand(64, generator=secret_generator()) for _ in range(4)]
    assert all(not torch.equal(draws[i], draws[j]) for i in range(4) for j in range(i + 1, 4))
    g = secret_generator()
    assert g.initial_seed() == 0  # nothing recorded that could reproduce the stream
    # no 32-bit seed reproduces it either: none of 2^16 small seeds, nor the low words of the state
    first = torch.rand(4, generator=g)
    probe = torch.Generator()
    assert not any(torch.equal(first, torch.rand(4, generator=probe.manual_seed(s))) for s in range(1 << 16))


def test_secret_draws_have_the_right_distribution():
    """Uniform mean and variance, and a standard normal's, within 5 standard errors (n = 200,000)."""
    n = 200_000
    g = secret_generator()
    u = torch.rand(n, generator=g, dtype=torch.float64)
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(float(u.var()) - 1 / 12) < 5 * math.sqrt(1 / 180 / n)  # Var(u^2-ish): (1/80 - 1/144) = 1/180
    z = torch.randn(n, generator=g, dtype=torch.float64)
    assert abs(float(z.mean())) < 5 / math.sqrt(n) and abs(float(z.var()) - 1) < 5 * math.sqrt(2 / n)


def test_a_mechanism_perturbs_differently_each_time_with_secret_noise():
    w = torch.linspace(-1, 1, 1000)
    pnpm = mechanisms.get("pnpm", epsilon=1.0)
    a = pnpm.perturb(w, generator=secret_generator())
    b = pnpm.perturb(w, generator=secret_generator())
    assert not torch.equal(a, b)
    # the seeded generator, as a simulation uses it, reproduces (that is what makes it public)
    seeded = [pnpm.perturb(w, generator=torch.Generator().manual_seed(9)) for _ in range(2)]
    assert torch.equal(*seeded)
