"""The fast perturb paths take their decisions from the same keystream words a plain reference would.

Each mechanism reads its words block by block from its stream; the reference below reads the
same words from a second stream with the same key and computes each output in float64 or in
integers. Where the fast path rounds (a float32 product, a position in float32), a decision may
differ only where the exact value lies within that rounding of the threshold: each test derives
this band and requires every disagreement to lie inside it (no draw at all for these seeds).

u below is the unit roundoff (2^-24 in float32): one rounding of x moves it by at most u |x|.
"""

import torch

import mechanisms as M
from mechanisms.draws import BLOCK
from mechanisms.local import CELLS
from mechanisms.randomness import seeded_generator

N = 3 * BLOCK + 1234  # several blocks and a short last one
U32 = torch.finfo(torch.float32).eps / 2


def words(seed: int, per_coordinate: int) -> list[torch.Tensor]:
    """The int64 values of the int32 words a mechanism reads (per_coordinate words per
    coordinate, block by block), as one tensor per word of the coordinate."""
    stream = seeded_generator(seed).mechanism
    parts: list[list[torch.Tensor]] = [[] for _ in range(per_coordinate)]
    for lo in range(0, N, BLOCK):
        n = min(N, lo + BLOCK) - lo
        block = stream.fill_(torch.empty(per_coordinate * n, dtype=torch.int32)).to(torch.int64)
        for i in range(per_coordinate):
            parts[i].append(block[i * n : (i + 1) * n])
    return [torch.cat(p) for p in parts]


def below(word: torch.Tensor, threshold: float) -> torch.Tensor:
    """float32(word) < threshold, as the fast paths compare."""
    return word.to(torch.float32) < threshold


def test_pnpm_sign_and_magnitude_come_from_their_words():
    mech = M.get("pnpm", epsilon=1.0)
    w = torch.randn(N, generator=torch.Generator().manual_seed(6))
    flip, magnitude = words(5, 2)
    for dtype in (torch.float32, torch.float64):
        y = mech.perturb(w.to(dtype), generator=seeded_generator(5))
        flipped = torch.sign(y) != torch.sign(w.to(dtype))
        assert torch.equal(flipped, (flip >> 1) < mech.threshold)
        reference = 1.0 + mech._slope * ((magnitude & ((1 << 23) - 1)).double() + 0.5) * 2.0**-23
        # float32: the magnitude rounds once or twice at <= C', y = w M once more
        rel = 3 * U32 * mech.bound if dtype == torch.float32 else 1e-15
        assert torch.allclose((y.double() / w.double()).abs(), reference, rtol=rel, atol=0)


def test_duchi_decision_is_the_sign_of_its_sum():
    eps = 0.7
    mech = M.get("duchi", epsilon=eps)
    t = torch.rand(N, generator=torch.Generator().manual_seed(8)) * 2 - 1
    y = mech.perturb(t, generator=seeded_generator(9))
    (word,) = words(9, 1)
    exact = (2 * (word >> 8) + 1).double() + 2.0 * mech.steps * t.double()  # 2W + 1 + 2A t
    # fast: 2W + 1 + 2A t in float32 (the product rounded once unless fused, the sum once,
    # keeping its sign): a disagreement needs |exact| <= u |2A t|
    differ = (y > 0) != (exact >= 0)
    assert bool((exact.abs()[differ] <= U32 * (2.0 * mech.steps * t.double()).abs()[differ]).all())
    assert set(torch.unique(y).tolist()) == {float(torch.tensor(-mech.bound)), float(torch.tensor(mech.bound))}


def test_rr_binary_flips_exactly_below_its_threshold():
    mech = M.get("rr", epsilon=1.0, k=2)
    v = torch.randint(0, 2, (N,), generator=torch.Generator().manual_seed(10)).float()
    y = mech.perturb(v, generator=seeded_generator(11))
    (word,) = words(11, 1)
    assert torch.equal(y != v, below(word, mech.flip_threshold))


def _pm_reference(
    law, branch: torch.Tensor, position: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cell in float64 from exact arithmetic, distance of the exact window position to the
    nearest integer: inf for the all-branch, exact there)."""
    w = (position >> 8).double()  # the 24-bit draw, in [-2^23, 2^23)
    m = law.window
    window = (CELLS - m) * (t.double() + 1.0) / 2.0 + m * (w + 2**23) / 2**24
    everywhere = CELLS * (w + 2**23) / 2**24
    use_all = below(branch, law.threshold)
    exact = torch.where(use_all, everywhere, window)
    distance = torch.where(use_all, torch.full_like(window, float("inf")), (window - window.round()).abs())
    return exact.floor().clamp(0, CELLS - 1), distance


def test_pm_cells_come_from_their_words():
    mech = M.get("pm", epsilon=1.0)
    t = torch.rand(N, generator=torch.Generator().manual_seed(12)) * 2 - 1
    y = mech.perturb(t, generator=seeded_generator(13))
    branch, position = words(13, 2)
    cells, distance = _pm_reference(mech.law, branch, position, t)
    first, step, _ = mech.law.values
    got = ((y.double() - first) / step).round()
    differ = got != cells
    # the float32 position is within 2^-12 cell of the exact one (module docstring)
    assert bool((distance[differ] <= 2.0**-12).all()) and bool(((got - cells).abs() <= 1).all())


def test_hm_branches_come_from_their_words():
    mech = M.get("hm", epsilon=2.0)
    t = torch.full((N,), 0.3)
    y = mech.perturb(t, generator=seeded_generator(14))
    branch, drive = words(14, 2)
    duchi = below(branch, mech.duchi_threshold)
    bound = float(torch.tensor(mech.bound))
    assert bool((y[duchi].abs() == bound).all())
    cells, distance = _pm_reference(mech.law, branch[~duchi], drive[~duchi], t[~duchi])
    first, step, _ = mech.law.values
    got = ((y[~duchi].double() - first) / step).round()
    assert bool((distance[got != cells] <= 2.0**-12).all())
    # the Duchi share: 1 - beta' of the coordinates, within 5 binomial sd
    p = 1 - mech.pm_probability
    assert abs(int(duchi.sum()) - N * p) <= 5 * (N * p * (1 - p)) ** 0.5
