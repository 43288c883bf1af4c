"""`PrivacyLossDistribution.self_compose` of dp_accounting 0.6.0, bit for bit, for a PLD composed
again and again: the part of the computation that depends on the PLD alone is kept across calls.

Why: every peer recomputes its own and each committer's record-level eps every round (the key
grows by one round, so no cache of whole answers helps), and in `self_compose` (`common.
self_convolve`) half of the CPU is `compute_self_convolve_bounds`'s 40 log moment-generating
functions of the step's PMF (a `logsumexp` over the whole PMF each), which do not depend on how
many times it is composed. Measured on the demo's 16-peer step (noise 1.2, rate 0.2048, 20 to 110
steps, the whole `_pld_epsilon` of a round): 0.036 -> 0.012 CPU-s. The FFT, the bounds and the
result are the library's operations on the same inputs in the same order, so the figure is the
same float (tests/mechanisms/test_record_level.py compares every probability, and the eps with
`PLDAccountant`'s); a PMF that is not dense goes to the library itself.

dp_accounting is pinned (pyproject.toml); this mirrors private parts of it (`pld_pmf.DensePLDPmf`,
`common.self_convolve`, `common.compute_self_convolve_bounds`), so a new version needs this file
read again (the bit-for-bit test fails first); any other installed version is left to its own
`self_compose`.
"""

from __future__ import annotations

import math
import weakref
from importlib import metadata

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy import fft, special

TAIL_MASS_TRUNCATION = 1e-15  # `self_compose`'s default, the one `PLDAccountant` composes with
MIRRORED_VERSION = "0.6.0"  # the dp_accounting whose code this mirrors
_MIRRORS = metadata.version("dp-accounting") == MIRRORED_VERSION
# per step PMF (kept no longer than the PMF: the caller's `_step_pld` cache decides that)
_KEPT: weakref.WeakKeyDictionary[pld_pmf.DensePLDPmf, tuple[np.ndarray, list[float]]] = weakref.WeakKeyDictionary()


def self_compose(step: pld.PrivacyLossDistribution, num_times: int) -> pld.PrivacyLossDistribution:
    """`step.self_compose(num_times)`, the same float for float; `step` must not change afterwards
    (PLDs are not changed by composing them: each composition returns a new one)."""
    if not _MIRRORS:
        return step.self_compose(num_times, TAIL_MASS_TRUNCATION)
    remove = _dense_self_compose(step._pmf_remove, num_times)
    if step._symmetric:
        return pld.PrivacyLossDistribution(remove)
    return pld.PrivacyLossDistribution(remove, _dense_self_compose(step._pmf_add, num_times))


def _dense_self_compose(pmf: pld_pmf.PLDPmf, num_times: int) -> pld_pmf.PLDPmf:
    """`DensePLDPmf.self_compose(num_times, TAIL_MASS_TRUNCATION)`, with `common.self_convolve` inlined."""
    if not isinstance(pmf, pld_pmf.DensePLDPmf) or num_times <= 0:
        return pmf.self_compose(num_times, TAIL_MASS_TRUNCATION)
    probs = pmf._probs
    orders, log_mgfs = _log_mgfs(pmf)
    lower, upper = _bounds(len(probs), num_times, orders, log_mgfs)
    output_len = upper - lower + 1
    fast_len = fft.next_fast_len(max(output_len, len(probs)))
    convolved = np.real(fft.ifft(fft.fft(probs, fast_len) ** num_times))
    out = np.array(np.roll(convolved, -lower)[:output_len])
    infinity_mass = TAIL_MASS_TRUNCATION - math.expm1(num_times * math.log1p(-pmf._infinity_mass))
    return pld_pmf.DensePLDPmf(
        pmf._discretization, pmf._lower_loss * num_times + lower, out, infinity_mass, pmf._pessimistic_estimate
    )


def _log_mgfs(pmf: pld_pmf.DensePLDPmf) -> tuple[np.ndarray, list[float]]:
    """The orders and log moment-generating functions `compute_self_convolve_bounds` computes for
    `pmf`'s probabilities, kept while the PMF lives (the caller's step PLDs are kept, `_step_pld`)."""
    kept = _KEPT.get(pmf)
    if kept is None:
        probs = pmf._probs
        orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / len(probs)
        kept = _KEPT[pmf] = (orders, [special.logsumexp(np.arange(len(probs)) * order, b=probs) for order in orders])
    return kept


def _bounds(length: int, num_times: int, orders: np.ndarray, log_mgfs: list[float]) -> tuple[int, int]:
    """`compute_self_convolve_bounds`'s Chernoff bounds from the kept log-MGFs."""
    upper_bound, lower_bound = (length - 1) * num_times, 0
    for order, log_mgf_value in zip(orders, log_mgfs, strict=True):
        bound = (num_times * log_mgf_value + math.log(2 / TAIL_MASS_TRUNCATION)) / order
        if not math.isfinite(bound):
            continue
        if order > 0:
            upper_bound = min(upper_bound, math.ceil(bound))
        if order < 0:
            lower_bound = max(lower_bound, math.floor(bound))
    return lower_bound, upper_bound
