"""k-of-d sampling (Wang et al., ICDE 2019, Algorithm 4) around Duchi, PM or HM (scope "vector").

Of the d coordinates of the tensor, k = max(1, min(d, floor(eps/2.5))) are chosen uniformly
without replacement; each is perturbed by the base mechanism at eps/k and scaled by d/k; every
other coordinate is reported as 0 (never its true value). The whole tensor is eps-LDP and each
coordinate's output is unbiased.
"""

from __future__ import annotations

import math

import torch

from .base import Guarantee, Mechanism, check_tensor, release_flat
from .local import Duchi, Hybrid, Piecewise, _epsilon, _PureLocal
from .randomness import PrivacyGenerator, RandomStream, secret_generator

BASES: dict[str, type[_PureLocal]] = {"duchi": Duchi, "pm": Piecewise, "hm": Hybrid}


def sample_count(epsilon: float, d: int) -> int:
    """k = max(1, min(d, floor(eps / 2.5))) (Wang et al. 2019, Sec. IV)."""
    return max(1, min(d, math.floor(epsilon / 2.5)))


def sample_without_replacement(d: int, k: int, stream: RandomStream) -> torch.Tensor:
    """k distinct indices of range(d), uniformly: Floyd's algorithm, k exact uniform integers
    (k <= floor(700 / 2.5) = 280 for any epsilon a mechanism accepts: a Python loop is cheap)."""
    chosen: list[int] = []
    seen: set[int] = set()
    for j in range(d - k, d):
        pick = stream.below(j + 1)
        pick = j if pick in seen else pick
        seen.add(pick)
        chosen.append(pick)
    return torch.tensor(chosen, dtype=torch.long)


class Sampled(Mechanism):
    name = "sampled"
    release_check = (
        "at most k = max(1, min(d, floor(eps/2.5))) non-zero coordinates, each in the base "
        "mechanism's output set at eps/k (duchi: two points, pm and hm: an interval) times d/k"
    )

    def __init__(self, base: str, epsilon: float, clip: bool = False) -> None:
        if base not in BASES:
            raise ValueError(f"base must be one of {sorted(BASES)}, got {base!r}")
        self.base = base
        self.epsilon = _epsilon(epsilon)
        if not isinstance(clip, bool):
            raise ValueError(f"clip must be True or False, got {clip!r}")
        self.clip = clip

    def base_mechanism(self, d: int) -> Mechanism:
        return BASES[self.base](self.epsilon / sample_count(self.epsilon, d), clip=self.clip)

    def perturb(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        t = check_tensor(x, low=-1.0, high=1.0, clip=self.clip)
        d = t.numel()
        out = torch.zeros_like(t)
        if d == 0:
            return out.view(x.shape)
        k = sample_count(self.epsilon, d)
        if generator is None:
            generator = secret_generator()
        idx = sample_without_replacement(d, k, generator.mechanism)
        out[idx] = self.base_mechanism(d).perturb(t[idx], generator=generator).mul_(d / k)
        return out.view(x.shape)

    def release_violation(self, y: torch.Tensor) -> str | None:
        flat = release_flat(y)
        if isinstance(flat, str):
            return flat
        d = flat.numel()
        if d == 0:
            return None
        k = sample_count(self.epsilon, d)
        nonzero = int(torch.count_nonzero(flat))  # NaN counts as non-zero (and fails below)
        if nonzero > k:
            return f"{nonzero} of {d} coordinates are non-zero; sampled(eps {self.epsilon:g}) releases at most {k}"
        base = self.base_mechanism(d)
        output = base.output_set() if isinstance(base, _PureLocal) else None
        if output is None:  # never for duchi, pm or hm (BASES)
            return None
        what = f"in the output set of {self.base}(eps {self.epsilon / k:g}) scaled by d/k = {d / k:g}:"
        return output.scaled(d / k).violation(flat, what, allow_zero=True)

    def perturb_independent(self, x: torch.Tensor, *, generator: PrivacyGenerator | None = None) -> torch.Tensor:
        """Each element as a one-coordinate tensor: k = 1, the base mechanism at the full eps."""
        return self.base_mechanism(1).perturb(x, generator=generator)

    def variance(self, x: torch.Tensor) -> torch.Tensor:
        t = check_tensor(x, low=-1.0, high=1.0, clip=self.clip)
        d = max(t.numel(), 1)
        k = sample_count(self.epsilon, d)
        base_var = self.base_mechanism(d).variance(t)
        # E[out^2] = (k/d) (d/k)^2 E[base^2]; E[out] = t
        return ((d / k) * (base_var + t * t) - t * t).view(x.shape)

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee(
            self.epsilon,
            0.0,
            "value",
            "vector",
            f"sampled({self.base}): the whole tensor passed to one perturb call is "
            f"eps={self.epsilon:g}-LDP (k of d coordinates at eps/k, the rest 0)",
        )

    def params(self) -> dict[str, object]:
        return {"name": self.name, "base": self.base, "epsilon": self.epsilon, "clip": self.clip}
