"""Record-level eps of the distributed discrete Gaussian sum, composed over full-batch rounds.

The mechanism of one round: each counted member adds N_Z(0, sigma_local^2) to its rounded sum;
the sum of n such shares is not a discrete Gaussian, but Kairouz, Liu and Steinke ("The
distributed discrete Gaussian mechanism for federated learning with secure aggregation", ICML
2021, Proposition 14) bound its Renyi divergence for an integer shift of l2 norm Delta in d
dimensions:

    RDP(alpha) <= min( alpha/2 s^2 + tau d,  alpha/2 (s + sqrt(d) tau)^2 ),
    s = Delta / (sqrt(n) sigma_local),  tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma_local^2 k/(k+1)).

For one member (n = 1) tau = 0: the discrete Gaussian itself, which is as private as the
continuous one (Canonne, Kamath, Steinke 2020). Delta is the sensitivity of the rounded sum
under REPLACE-ONE neighbours (one record replaced: its clipped gradient moves the sum by at most
2 clip, `quantize.rounded_sensitivity` adds the rounding), as the ledger's DP-SGD figure.

Rounds are full batch (every record of every member in every round), so no subsampling lemma is
involved: T rounds compose to T x RDP(alpha), and (eps, delta) follows from the conversion of
Canonne, Kamath and Steinke (2020, Proposition 12; also Asoodeh et al. 2021), the one
dp_accounting's RDP accountant uses:

    eps = min over alpha > 1 of  RDP(alpha) + log((alpha - 1)/alpha) - (log delta + log alpha)/(alpha - 1).

Poisson-subsampled rounds are not offered: the discrete Gaussian sum has no tight subsampled RDP
(the generic bound of Zhu and Wang 2019 needs about 11 times the noise at Fashion-MNIST's
batch 4,096: ../shared/research/ddp_accounting.out), while full-batch rounds lose nothing to it.
"""

from __future__ import annotations

import math

import numpy as np

# Renyi orders for the conversion: log-spaced from 1 + 1e-3 to 1e5, dense enough that the
# minimum over the grid is within 1e-4 relative of the continuous minimum for eps in [0.1, 20].
ORDERS = 1.0 + np.logspace(-3, 5, 4001)


def tau(members: int, local_variance: float) -> float:
    """KLS's tau: 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k/(k+1)) (0 for one member)."""
    k = np.arange(1, members, dtype=np.float64)
    return float(10.0 * np.exp(-2.0 * math.pi**2 * local_variance * k / (k + 1)).sum())


def round_rdp(orders: np.ndarray, sensitivity: float, members: int, local_variance: float, dim: int) -> np.ndarray:
    """RDP of one round at each order: KLS Proposition 14 (see the module docstring)."""
    if members < 1 or not local_variance > 0 or dim < 1 or not sensitivity > 0:
        raise ValueError("round_rdp needs members >= 1, local_variance > 0, dim >= 1, sensitivity > 0")
    s = sensitivity / math.sqrt(members * local_variance)
    t = tau(members, local_variance)
    first = orders / 2.0 * s**2 + t * dim
    second = orders / 2.0 * (s + math.sqrt(dim) * t) ** 2
    return np.minimum(first, second)


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """(eps, delta)-DP from an RDP curve (Canonne, Kamath, Steinke 2020, Proposition 12)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    eps = rdp + np.log1p(-1.0 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1.0)
    return max(0.0, float(np.min(eps)))


def epsilon(sensitivity: float, members: int, local_variance: float, dim: int, rounds: int, delta: float) -> float:
    """Record-level eps after `rounds` full-batch rounds in which `members` members each added
    N_Z(0, local_variance) to a rounded sum of l2 sensitivity `sensitivity` (integer units)."""
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    if rounds == 0:
        return 0.0
    return rdp_to_epsilon(ORDERS, rounds * round_rdp(ORDERS, sensitivity, members, local_variance, dim), delta)


def calibrate_noise_multiplier(target_epsilon: float, rounds: int, delta: float, *, precision: float = 1e-4) -> float:
    """The smallest noise multiplier z (total noise std / sensitivity) whose `rounds` rounds stay
    within target_epsilon, for the sum's limit tau -> 0 (a Gaussian of std z Delta): z to within
    a relative `precision`, rounded up. The policy's actual eps (with its integer variance and
    its tau) is computed by `epsilon` and checked against the target where it is used."""
    if not target_epsilon > 0 or rounds < 1:
        raise ValueError("calibration needs target_epsilon > 0 and rounds >= 1")

    def eps_at(z: float) -> float:
        return rdp_to_epsilon(ORDERS, rounds * ORDERS / (2.0 * z * z), delta)

    lo, hi = 1e-3, 1.0
    while eps_at(hi) > target_epsilon:
        lo, hi = hi, hi * 2.0
    while hi - lo > precision * hi:
        mid = (lo + hi) / 2.0
        if eps_at(mid) > target_epsilon:
            lo = mid
        else:
            hi = mid
    return hi
