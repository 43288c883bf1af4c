"""The record-level accountant (mechanisms/record_level.py): replace-one neighbours through
dp_accounting's PLD, checked against closed forms and against the steps DP-SGD really takes."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.pld.pld_pmf import DensePLDPmf
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

from mechanisms.gaussian import analytic_gaussian_epsilon
from mechanisms.pld_self_compose import self_compose
from mechanisms.record_level import (
    VALUE_DISCRETIZATION,
    DPSGDPolicy,
    RecordAccountant,
    _pld_epsilon,
    _step_pld,
    record_level_spend,
    round_steps,
)

POLICY = DPSGDPolicy(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=256, epochs=2, delta=1e-5)


@pytest.mark.parametrize("sigma", [1.0, 2.0, 4.0])
def test_one_full_batch_step_is_the_gaussian_mechanism_at_sensitivity_two(sigma):
    """q = 1, one step: replacing a record moves the clipped sum by up to 2 clips, so the step is
    the Gaussian mechanism with sensitivity 2 (noise sigma x clip); the analytic Gaussian
    (Balle & Wang 2018) gives its exact eps. The PLD's pessimistic grid may only add, by less than
    its discretisation allows (1e-3 per composed step, times a small factor)."""
    accountant = RecordAccountant([(sigma, 1.0, 1)])
    eps, delta = accountant.get_privacy_spent(1e-5)
    exact = analytic_gaussian_epsilon(sigma, 1e-5, sensitivity=2.0)
    assert delta == 1e-5
    assert exact <= eps <= exact + 0.01, (eps, exact)


def test_replace_one_costs_more_than_add_remove_and_less_than_group_privacy():
    sigma, q, steps = 1.0, 256 / 3000, 60
    ours = RecordAccountant([(sigma, q, steps)]).get_privacy_spent(1e-5)[0]
    add_remove = PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-3
    )
    add_remove.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    a = add_remove.get_epsilon(1e-5)
    # group privacy (replace = remove + add) gives (2 eps, (1 + e^eps) delta) from add/remove at delta / (1 + e^eps)
    a_small = add_remove.get_epsilon(1e-5 / (1 + math.exp(a)))
    assert a < ours < 2 * a_small, (a, ours, a_small)


def test_composition_is_monotone_and_grouping_does_not_change_it():
    spends = [record_level_spend(POLICY, [3000] * k).epsilon for k in range(0, 6)]
    assert spends[0] == 0.0 and all(x < y for x, y in zip(spends, spends[1:]))
    rate, steps = round_steps(256, 2, 3000)
    split = RecordAccountant([(1.0, rate, steps)] * 3).get_privacy_spent(1e-5)[0]
    merged = RecordAccountant([(1.0, rate, 3 * steps)]).get_privacy_spent(1e-5)[0]
    assert split == merged  # the same composition: grouped before the PLD is built
    # fewer records at the same batch: a larger sample rate, a larger eps
    assert record_level_spend(POLICY, [1000]).epsilon > record_level_spend(POLICY, [3000]).epsilon


def test_round_steps_follow_opacus_conventions():
    assert round_steps(256, 2, 3000) == (256 / 3000, 2 * math.ceil(3000 / 256))
    assert round_steps(500, 1, 100) == (1.0, 1)  # a batch larger than the data: every record, one step
    for bad in ((0, 1, 10), (1, 0, 10), (1, 1, 0), (True, 1, 10)):
        with pytest.raises(ValueError):
            round_steps(*bad)


def test_state_round_trips_and_rejects_garbage():
    accountant = RecordAccountant()
    accountant.step_round(POLICY, 3000)
    accountant.step_round(POLICY, 2500)
    again = RecordAccountant.from_dict(accountant.to_dict())
    assert again.history == accountant.history
    assert again.get_privacy_spent(1e-5) == accountant.get_privacy_spent(1e-5)
    for bad in ({}, {"accountant": "rdp", "history": []}, {"accountant": "pld-replace-one", "history": [[1.0, 0.5]]}):
        with pytest.raises(ValueError):
            RecordAccountant.from_dict(bad)
    with pytest.raises(ValueError):
        RecordAccountant([(1.0, 1.5, 3)])  # a sample rate above 1
    assert DPSGDPolicy.from_dict(POLICY.to_dict()) == POLICY
    with pytest.raises(ValueError):
        DPSGDPolicy.from_dict({"noise_multiplier": 1.0})


def test_the_spend_says_what_it_protects():
    spend = record_level_spend(POLICY, [3000, 3000])
    assert spend.protects == "each training record (DP-SGD)" and spend.scope == "record"
    assert spend.delta == 1e-5 and "replace-one" in spend.statement and "2 round(s)" in spend.statement


@pytest.mark.parametrize(
    "groups",
    [
        (((1.2, 512 / 2500), 10),),
        (((1.2, 512 / 2500), 30),),
        (((1.2, 512 / 10000), 200),),
        (((1.0, 0.1), 20), ((1.0, 0.3), 7), ((1.5, 0.05), 100)),
    ],
)
def test_the_figure_is_dp_accountings_pld_accountant_bit_for_bit(groups):
    """`_pld_epsilon` keeps one step's PLD across calls instead of building it per composition:
    its eps must be exactly the accountant's (peers and `swarm verify` compare micro-eps on chain),
    whether the step's PLD was built just now or kept from an earlier call."""
    reference = PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
        value_discretization_interval=VALUE_DISCRETIZATION,
    )
    for (sigma, rate), steps in groups:
        reference.compose(dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps)
    for delta in (1e-5, 1e-7):
        expected = float(reference.get_epsilon(delta))
        _pld_epsilon.cache_clear()
        _step_pld.cache_clear()
        assert _pld_epsilon(groups, delta) == expected  # the step PLDs built in this call
        _pld_epsilon.cache_clear()
        assert _pld_epsilon(groups, delta) == expected  # the step PLDs kept from the call before


@pytest.mark.parametrize("relation", [NeighboringRelation.REPLACE_ONE, NeighboringRelation.ADD_OR_REMOVE_ONE])
@pytest.mark.parametrize("times", [1, 10, 37, 400])
def test_the_kept_self_composition_is_the_librarys_float_for_float(relation, times):
    """`pld_self_compose.self_compose` keeps the step's log-MGFs across calls: each PMF it returns
    (both of an asymmetric PLD too) must be the library's, every probability, the lower loss and
    the infinity mass, whether the kept part was computed now or before; a sparse PMF goes to the library."""
    step = pld.from_gaussian_mechanism(
        standard_deviation=1.2,
        value_discretization_interval=VALUE_DISCRETIZATION,
        sampling_prob=0.2048,
        neighboring_relation=relation,
    )
    for _ in range(2):
        ours, theirs = self_compose(step, times), step.self_compose(times)
        assert ours._symmetric == theirs._symmetric == (relation == NeighboringRelation.REPLACE_ONE)
        pairs = [(ours._pmf_remove, theirs._pmf_remove)] + (
            [] if ours._symmetric else [(ours._pmf_add, theirs._pmf_add)]
        )
        for a, b in pairs:
            assert (a._lower_loss, a._infinity_mass, a._discretization) == (
                b._lower_loss,
                b._infinity_mass,
                b._discretization,
            )
            assert np.array_equal(a._probs, b._probs)
    sparse = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(1.0, 1e-6))
    assert not isinstance(sparse._pmf_remove, DensePLDPmf)
    assert self_compose(sparse, 3).get_epsilon_for_delta(1e-5) == sparse.self_compose(3).get_epsilon_for_delta(1e-5)
