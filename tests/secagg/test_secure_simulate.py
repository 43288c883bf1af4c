"""privacy.mechanism = secagg: the policy enters the genesis settings, and `swarm simulate` learns
with the integer arithmetic and spends exactly what the policy's accountant says."""

from __future__ import annotations

import pytest

from mechanisms.secagg.policy import SecAggPolicy
from node.config import load_config
from node.derive import eps_cap_micro, secagg_policy, shared_settings
from node.protocol.policy import privacy_spend
from node.protocol.wire import eps_to_micro
from node.runs.simulate import Simulation, SimulationError

# 3 peers on 8x8 digits (1,347 training images), logistic regression, 4 full-batch rounds
SECURE = [
    "data.dataset=digits",
    "model.name=logreg",
    "train.dp_sgd=false",
    "train.dp_max_grad_norm=1.0",
    "train.lr=2.0",
    "train.momentum=0.5",
    "train.lr_decay=1",
    "swarm.peers=3",
    "swarm.rounds=4",
    "swarm.seed=3",
    "privacy.mechanism=secagg",
    "privacy.epsilon=8.0",
    "privacy.perturb=update",
]


def test_policy_is_in_the_genesis_and_calibrated_to_the_target():
    config = load_config(None, SECURE)
    policy = secagg_policy(config)
    genesis = shared_settings(config).to_dict()["privacy"]["mechanism"]
    assert SecAggPolicy.from_dict(genesis) == policy
    assert policy.epsilon(4) <= 8.0
    assert policy.epsilon(4) > 7.99  # the smallest noise that meets it
    spent = privacy_spend(shared_settings(config).privacy, policy.dim, [449, 449, 449, 449])
    assert spent.record is not None and spent.record.epsilon == policy.epsilon(4)
    with pytest.raises(ValueError, match="dp_sgd"):
        secagg_policy(load_config(None, [*SECURE, "train.dp_sgd=true"]))
    assert eps_cap_micro(config) == eps_to_micro(policy.epsilon(4))  # a swarm's cap: what its rounds spend


def test_simulate_learns_under_secure_aggregation(tmp_path):
    result = Simulation(load_config(None, SECURE), out=tmp_path / "secure").run()
    policy = secagg_policy(load_config(None, SECURE))
    accuracies = [r["accuracy"] for r in result.records]
    # 4 full-batch steps of logistic regression on digits: 0.81 with the noise made negligible
    # (eps 1000), 0.74 to 0.80 at eps 8 over seeds 3 to 5; chance is 0.1
    assert accuracies[-1] > 0.7
    assert accuracies == sorted(accuracies)
    assert [r["record_eps_max"] for r in result.records] == [policy.epsilon(k) for k in range(1, 5)]
    assert result.summary["privacy"]["scope"] == "record"
    assert result.summary["privacy"]["epsilon"] == policy.epsilon(4)
    with pytest.raises(SimulationError):
        Simulation(load_config(None, SECURE), fraction=0.5)


def test_scatter_linear_closed_form_equals_opacus_ghost_clipping():
    """The closed-form clipped sum of ScatterNet + linear is the opacus path's, to float32 rounding."""
    import torch

    from node.learning.clipped_sum import ghost_clipped_sum, scatter_linear_sum
    from node.learning.models import init_model

    model = init_model("scatter-linear", input_shape=(1, 28, 28), num_classes=10, seed=1)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(300, 81, 7, 7, generator=generator) * 3 + 1
    y = torch.randint(0, 10, (300,), generator=generator)
    fast, fast_loss = scatter_linear_sum(model, x, y, 0.1)
    hooks, hooks_loss = ghost_clipped_sum(model, x, y, 0.1)
    assert torch.allclose(fast, hooks, rtol=0, atol=1e-6 * float(hooks.abs().max()))
    assert abs(fast_loss - hooks_loss) < 1e-4
    assert float(hooks.norm()) > 1.0  # many records, most clipped: a sum to compare


def test_records_prepared_once_give_the_sum_at_every_later_model():
    """A member's ScatterNet + linear records are prepared at the genesis model and reused each
    round: at a model with other weights, gamma and beta, their sum is still opacus' (to float32
    rounding of the opacus path: its per-record norms and products are float32)."""
    import torch

    from node.learning.clipped_sum import CLIP_MARGIN, MemberRecords, ghost_clipped_sum
    from node.learning.models import init_model

    model = init_model("scatter-linear", input_shape=(1, 28, 28), num_classes=10, seed=1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(300, 81, 7, 7, generator=generator) * 3 + 1
    y = torch.randint(0, 10, (300,), generator=generator)
    records = MemberRecords(model, x, y)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    fast, fast_loss = records.clipped_sum(model, 0.1)
    hooks, hooks_loss = ghost_clipped_sum(model, x, y, 0.1 * CLIP_MARGIN)
    assert torch.allclose(fast, hooks, rtol=0, atol=1e-5 * float(hooks.abs().max()))
    assert abs(fast_loss - hooks_loss) < 1e-4
    assert float(hooks.norm()) > 1.0
