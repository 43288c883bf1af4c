"""The fused kernels (mechanisms/kernels.py) give the bits of the whole-tensor arithmetic they
replaced (tests/mechanisms/reference_paths.py) for the same keystream: every coordinate, for
parameters across each mechanism's range, float32 and float64, edge inputs (+-0, +-1, the
smallest and largest magnitudes, clipped values), several blocks and a short last one, and words
prepared to reach the rare paths (a U* redrawn one level down) and the threshold edges."""

import math
import subprocess
import sys

import pytest
import torch

import mechanisms as M
from mechanisms.draws import BLOCK, float32_count_below
from mechanisms.randomness import seeded_generator

from . import reference_paths as R
from .replay import ReplayStream, replay

N = 2 * BLOCK + 4099  # two whole blocks and a short last one
EDGES_UNIT = [0.0, -0.0, 1.0, -1.0, 1e-38, -1e-38, 5e-324, -5e-324, 0.5, -0.5, 2.0**-24, 1.0 - 2.0**-24]
EDGES_WEIGHT = [0.0, -0.0, 1e-45, -1e-45, 1e-38, 3e38, -3e38, 1.0, -1.0, 0.01, -0.01]


def _bits(y: torch.Tensor) -> torch.Tensor:
    return y.view(torch.int32 if y.dtype == torch.float32 else torch.int64)


def assert_same_bits(new: torch.Tensor, reference: torch.Tensor) -> None:
    assert new.dtype == reference.dtype and new.shape == reference.shape
    differ = torch.nonzero(_bits(new) != _bits(reference)).view(-1)
    assert differ.numel() == 0, (
        f"{differ.numel()} coordinates differ, first {int(differ[0])}: "
        f"{float(new.view(-1)[differ[0]])!r} against {float(reference.view(-1)[differ[0]])!r}"
    )


def _input(kind: str, dtype: torch.dtype, seed: int, n: int = N) -> torch.Tensor:
    data = torch.Generator().manual_seed(seed)
    if kind == "unit":
        x, edges = torch.rand(N, generator=data, dtype=torch.float64) * 2 - 1, EDGES_UNIT
    elif kind == "clip":  # beyond [-1, 1], for clip=True
        x, edges = torch.randn(N, generator=data, dtype=torch.float64) * 2, EDGES_UNIT
    else:
        x, edges = torch.randn(N, generator=data, dtype=torch.float64) * 0.05, EDGES_WEIGHT
    x[: len(edges)] = torch.tensor(edges, dtype=torch.float64)
    x[BLOCK - 3 : BLOCK + 3] = torch.tensor([1.0, -1.0, 0.0, -0.0, 1.0, -1.0])  # across a block edge
    return x[:n].to(dtype) if n <= N else torch.cat([x, x[: n - N]]).to(dtype)


def _compare(mech, reference, kind: str, dtype: torch.dtype, seed: int) -> None:
    x = _input(kind, dtype, seed)
    new = mech.perturb(x, generator=seeded_generator(seed))
    assert_same_bits(new, reference(mech, x, seeded_generator(seed).mechanism))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("epsilon", [1e-6, 0.3, 1.0, 4.0, 30.0])
def test_duchi_kernel_gives_the_reference_bits(epsilon, dtype):
    _compare(M.get("duchi", epsilon=epsilon), R.duchi, "unit", dtype, 17)
    _compare(M.get("duchi", epsilon=epsilon, clip=True), R.duchi, "clip", dtype, 18)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("epsilon", "center", "radius"), [(1.0, 0.0, 1.0), (0.5, 0.0, 0.1), (2.0, 0.3, 0.07), (8.0, -5.0, 1e-3)]
)
def test_ldp_fl_kernel_gives_the_reference_bits(epsilon, center, radius, dtype):
    mech = M.get("ldp-fl", epsilon=epsilon, center=center, radius=radius)
    _compare(mech, R.ldp_fl, "weights", dtype, 19)
    _compare(mech, R.ldp_fl, "clip", dtype, 20)
    x = _input("weights", dtype, 21)
    x[BLOCK + 5] = math.inf
    with pytest.raises(ValueError):
        mech.perturb(x, generator=seeded_generator(21))


@pytest.mark.parametrize("epsilon", [0.05, 0.5, 1.0, 2.0, 5.0, 12.0, 60.0])
def test_pnpm_kernel_gives_the_reference_bits(epsilon):
    _compare(M.get("pnpm", epsilon=epsilon), R.pnpm, "weights", torch.float32, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("epsilon", [0.02, 0.3, 1.0, 1.37, 2.0, 4.0, 9.0, 30.0])
def test_pm_kernel_gives_the_reference_bits(epsilon, dtype):
    _compare(M.get("pm", epsilon=epsilon), R.piecewise, "unit", dtype, 2)
    _compare(M.get("pm", epsilon=epsilon, clip=True), R.piecewise, "clip", dtype, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("epsilon", [0.1, 0.61, 0.62, 1.0, 1.37, 2.0, 5.0, 30.0])
def test_hm_kernel_gives_the_reference_bits(epsilon, dtype):
    _compare(M.get("hm", epsilon=epsilon), R.hybrid, "unit", dtype, 4)
    _compare(M.get("hm", epsilon=epsilon, clip=True), R.hybrid, "clip", dtype, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("epsilon", [0.05, 1.0, 3.0, 20.0])
def test_binary_rr_kernel_gives_the_reference_bits(epsilon, dtype):
    x = (torch.rand(N, generator=torch.Generator().manual_seed(16)) < 0.3).to(dtype)
    x[:2] = torch.tensor([-0.0, 1.0])
    mech = M.get("rr", epsilon=epsilon, k=2)
    assert_same_bits(
        mech.perturb(x, generator=seeded_generator(16)), R.binary_rr(mech, x, seeded_generator(16).mechanism)
    )
    for bad in (0.5, 2.0, -1.0, math.nan):
        x[BLOCK + 7] = bad
        with pytest.raises(ValueError):
            mech.perturb(x, generator=seeded_generator(16))
        x[BLOCK + 7] = 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("epsilon", [0.01, 0.2, 1.0, 2.0, 8.0, 40.0])
def test_laplace_kernel_gives_the_reference_bits(epsilon, dtype):
    _compare(M.get("laplace", epsilon=epsilon), R.laplace, "unit", dtype, 6)
    _compare(M.get("laplace", epsilon=epsilon, clip=True), R.laplace, "clip", dtype, 7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("epsilon", [0.01, 0.2, 1.0, 2.0, 8.0, 30.0])
def test_exponential_kernel_gives_the_reference_bits(epsilon, dtype):
    _compare(M.get("exponential", epsilon=epsilon), R.exponential, "unit", dtype, 8)
    _compare(M.get("exponential", epsilon=epsilon, clip=True), R.exponential, "clip", dtype, 9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("clip_norm", "noise_multiplier"), [(1.0, 1.0), (0.1, 0.06), (3.0, 4.0), (1.0, 40.0)])
def test_gaussian_kernel_gives_the_reference_bits(clip_norm, noise_multiplier, dtype):
    mech = M.get("gaussian", clip_norm=clip_norm, noise_multiplier=noise_multiplier)
    for n, seed in ((N, 10), (N + 1, 11), (1, 12)):  # odd lengths: a pair's sin coordinate unused
        x = _input("weights", dtype, seed)[:n].clone()
        assert_same_bits(
            mech.perturb(x, generator=seeded_generator(seed)), R.gaussian(mech, x, seeded_generator(seed).mechanism)
        )
        x = torch.where(x.abs() < 1e30, x * 30, x)  # beyond the clip norm, one coordinate at a time
        new = mech.perturb_independent(x, generator=seeded_generator(seed))
        assert_same_bits(new, R.gaussian(mech, x, seeded_generator(seed).mechanism, independent=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dpsgd_noise_is_the_reference_noise_within_the_float_bound(dtype):
    """DP-SGD's noise is not snapped, so the kernels' own log, cos and sin (which replaced torch's
    and numpy's) change its low bits: same words, same pairs, and each value within what both
    samplers' float bounds allow (NOISE_ULPS 2^-53 r sigma each, r <= 12 here) plus one rounding
    of the output; the snapped mechanisms above keep their reference bits."""
    x = _input("weights", dtype, 13, N + 1)
    sigma, streams = 1.3, (seeded_generator(13).dpsgd_noise, seeded_generator(13).dpsgd_noise)
    new = M.gaussian.add_gaussian_noise(x, 0.7, sigma, torch.empty_like(x), streams[0])
    reference = R.add_gaussian_noise(x, 0.7, sigma, torch.empty_like(x), streams[1])
    assert streams[0].drawn == streams[1].drawn
    bound = 2.0 * M.gaussian.NOISE_ULPS * 2.0**-53 * 12.0 * sigma
    rounding = torch.finfo(dtype).eps * reference.double().abs()
    gap = (new.double() - reference.double()).abs()
    assert bool((gap <= bound + rounding).all()), float((gap - rounding).max())
    assert dtype == torch.float32 or not torch.equal(new, reference)  # float64: the low bits moved


def test_the_redraw_of_u_star_gives_the_reference_bits():
    """U* whose first binade draw is 0 (probability 2^-53 per Laplace coordinate, 2^-21 per
    Gaussian pair) is redrawn one level down from the words after the block's: prepared words make
    it happen for the first 40 coordinates (pairs), and again one level further down for 5."""
    stream = seeded_generator(14).mechanism
    x = torch.rand(1000, generator=torch.Generator().manual_seed(15), dtype=torch.float64) * 2 - 1
    laplace = M.get("laplace", epsilon=1.0)
    gauss = M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0)
    # Laplace: n words for the significands and binades, n more (bits 21..62: 42 binade bits);
    # the Gaussian: m pairs' first words (bits 52..62: 11 binade bits), m more (bits 53..62: 10)
    for n, extra_low, mech, reference in ((1000, 21, laplace, R.laplace), (500, 53, gauss, R.gaussian)):
        raw = stream.fill_(torch.empty(2 * n + 90, dtype=torch.int64))
        raw[:40] &= ~(((1 << 11) - 1) << 52)
        raw[n : n + 40] &= (1 << extra_low) - 1
        raw[2 * n : 2 * n + 5] = 0  # the redraw: 40 words for the binades (bits 21..62), 40 for
        raw[2 * n + 40 : 2 * n + 45] = 0  # the significands: 0 for five of them, drawn again
        generator = replay(raw.clone())
        new = mech.perturb(x, generator=generator)
        assert generator.mechanism.at == 2 * raw.numel()  # both redraws happened, and only they
        assert_same_bits(new, reference(mech, x, ReplayStream(raw.view(torch.int32))))


def _words_at(threshold: float) -> list[int]:
    """int32 words around a float32 threshold: the largest below it, the next ones, both ends."""
    below = float32_count_below(threshold) - 2**31 - 1  # the largest word with float32(word) < threshold
    return [below - 2, below - 1, below, below + 1, below + 2, -(2**31), 2**31 - 1]


@pytest.mark.parametrize("epsilon", [0.001, 1.0])
def test_binary_rr_flips_as_the_count_says(epsilon):
    """Binary RR flips iff float32(word) < threshold: exactly the `other` words the count says.
    At eps 1 the threshold is an integer and the reference agrees on every word; at eps 0.001
    (count within 2^24 of 2^31) it is not, and the reference's flip weight for the largest word
    below it was fractional (a release of 1 - weight: neither category)."""
    mech = M.get("rr", epsilon=epsilon, k=2)
    integer = float(mech.flip_threshold).is_integer()
    assert integer == (epsilon == 1.0)
    assert float32_count_below(mech.flip_threshold) == mech.other
    v = torch.tensor([0.0, 1.0])
    largest_below = _words_at(mech.flip_threshold)[2]
    for word in _words_at(mech.flip_threshold):
        words = torch.tensor([word, word], dtype=torch.int32)
        new = mech.perturb(v, generator=replay(words.clone()))
        flips = word <= largest_below
        assert torch.equal(new, 1.0 - v if flips else v)
        if integer or word != largest_below:
            assert_same_bits(new, R.binary_rr(mech, v, ReplayStream(words)))
        else:
            assert mech.release_violation(R.binary_rr(mech, v, ReplayStream(words))) is not None


@pytest.mark.parametrize("epsilon", [1.0, 1.38, 1.39])
def test_threshold_edges_follow_the_count(epsilon):
    """PM and HM take a branch iff float32(word) < threshold: exactly the words the count of
    `float32_threshold` says, so each branch has its stated probability. Where the threshold is
    an integer (eps 1) the reference agrees on every word; where it is not (eps 1.38, 1.39: its
    count within 2^24 of 2^31), the reference's lerp weight for the largest word below it was
    fractional (an output off the grid), and the kernel takes the branch the count gives it."""
    pm, hm = M.get("pm", epsilon=epsilon), M.get("hm", epsilon=epsilon)
    integer = float(pm.law.threshold).is_integer()
    assert integer == (epsilon == 1.0)
    t = torch.tensor([-1.0, -0.3, 0.0, 0.7, 1.0])
    for mech, threshold, reference in ((pm, pm.law.threshold, R.piecewise), (hm, hm.duchi_threshold, R.hybrid)):
        largest_below = _words_at(threshold)[2]
        for word in _words_at(threshold):
            for position in (-(2**31), -12345678, 0, 98765432, 2**31 - 1):
                words = torch.tensor([word] * t.numel() + [position] * t.numel(), dtype=torch.int32)
                new = mech.perturb(t, generator=replay(words.clone()))
                old = reference(mech, t, ReplayStream(words.clone()))
                if integer or word != largest_below:
                    assert_same_bits(new, old)
                    continue
                # the branch of the words below: as the reference takes it two words lower
                words[: t.numel()] = word - 1
                assert_same_bits(new, reference(mech, t, ReplayStream(words)))
                assert mech.release_violation(new) is None
                assert mech.release_violation(old) is not None or torch.equal(new, old)


def test_kernels_are_imported_on_the_first_perturb_only():
    """Importing mechanisms does not import numba (a process that never perturbs does not pay it)."""
    code = "import sys, mechanisms; print('numba' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "False"
