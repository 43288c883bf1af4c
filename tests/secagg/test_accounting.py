"""The distributed discrete Gaussian's record-level eps against an independent reference:
dp_accounting's RDP accountant for the continuous Gaussian (the same RDP curve when tau = 0, so
the figures must agree within the order grids' difference, 1%) and its PLD accountant (tight for
the Gaussian, so a lower bracket)."""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

from mechanisms.secagg import accounting
from mechanisms.secagg.policy import SecAggPolicy

DELTA = 1e-5


def reference_rdp(z: float, rounds: int) -> float:
    acc = RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), rounds)
    return acc.get_epsilon(DELTA)


def reference_pld(z: float, rounds: int) -> float:
    acc = PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.GaussianDpEvent(z), rounds)
    return acc.get_epsilon(DELTA)


@pytest.mark.parametrize(("z", "rounds"), [(1.0, 1), (5.0, 10), (15.0, 100), (30.0, 400)])
def test_epsilon_between_the_gaussian_pld_and_rdp(z, rounds):
    sensitivity, members = 1000.0, 10
    local_variance = (z * sensitivity) ** 2 / members
    eps = accounting.epsilon(sensitivity, members, local_variance, 40_000, rounds, DELTA)
    assert reference_pld(z, rounds) <= eps <= reference_rdp(z, rounds) * 1.0001
    assert eps >= reference_rdp(z, rounds) * 0.99


def test_small_local_noise_pays_tau():
    """With local standard deviation below 1 the sum is far from a discrete Gaussian: tau > 0 and
    the figure grows, with d."""
    small = accounting.epsilon(2.0, 10, 0.3, 1000, 1, DELTA)
    assert accounting.tau(10, 0.3) > 1e-3
    assert small > accounting.epsilon(2.0, 1, 3.0, 1000, 1, DELTA)


def test_calibration_reaches_the_target_and_no_further():
    z = accounting.calibrate_noise_multiplier(3.0, 100, DELTA)
    assert reference_rdp(z, 100) <= 3.0 * 1.001
    assert reference_rdp(z * 0.99, 100) > 3.0


def test_policy_spends_what_it_was_calibrated_for_with_dropouts_counted():
    z = accounting.calibrate_noise_multiplier(3.0, 50, DELTA)
    full = SecAggPolicy(members=100, max_records=60_000, dim=39_862, clip=0.1, noise_multiplier=z)
    robust = SecAggPolicy(
        members=100, max_records=60_000, dim=39_862, clip=0.1, noise_multiplier=z, dropout_fraction=1 / 3
    )
    assert full.epsilon(50) <= 3.0 + 1e-3
    assert robust.counted_members == 67
    # each of the 67 counted members adds 1/67 of the variance: the same guarantee
    assert robust.local_noise.variance > full.local_noise.variance
    assert abs(robust.epsilon(50) - full.epsilon(50)) < 1e-3
    assert full.epsilon(0) == 0.0
