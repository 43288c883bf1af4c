"""What a commit must record under the swarm's policy (node/protocol/policy.py); the rule that holds
commits to it is in tests/node/test_rules.py."""

from __future__ import annotations

import mechanisms as M
from mechanisms.accounting import cumulative_spend
from mechanisms.record_level import DPSGDPolicy, record_level_spend
from node.protocol.policy import eps_step_micro, expected_micro
from node.protocol.settings import PrivacyPolicy
from node.protocol.wire import eps_to_micro

D = 1_000
PNPM = M.get("pnpm", epsilon=2.0).params()
GAUSSIAN = M.get("gaussian", clip_norm=1.0, noise_multiplier=1.0, delta=1e-5).params()
DP = DPSGDPolicy(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=64, epochs=1)


def test_pure_mechanisms_spend_an_exact_step_per_release():
    step = eps_step_micro(PNPM, D)
    assert step == eps_to_micro(2.0 * D)
    assert expected_micro(PrivacyPolicy(PNPM), D, [10, 20, 30]) == (3 * step, 0)
    # the case found: PNPM at eps 2 then 1.5 recorded 3,000 where 3,500 was spent: one policy, no mixing
    assert expected_micro(PrivacyPolicy(PNPM), D, [10, 10])[0] == eps_to_micro(4_000)


def test_the_gaussian_is_composed_with_rdp_and_dp_sgd_per_sample_count():
    assert eps_step_micro(GAUSSIAN, D) == 0  # not a constant: the contract cannot check it
    eps, record = expected_micro(PrivacyPolicy(GAUSSIAN, DP), D, [600, 500])
    assert eps == eps_to_micro(cumulative_spend(GAUSSIAN, D, 2).epsilon)
    assert record == eps_to_micro(record_level_spend(DP, [600, 500]).epsilon)
    assert record != eps_to_micro(record_level_spend(DP, [600, 600]).epsilon)  # the counts on chain matter


def test_concurrent_checks_of_the_same_history_compose_once(monkeypatch):
    """A peer vets a round's commits in parallel threads; with equal shards they all ask for the same
    history, and only the first may pay for the PLD composition (0.1 CPU-s each)."""
    import threading
    import time

    from node.protocol import policy as policy_module

    composed: list[tuple[int, ...]] = []

    def slow_spend(dp, counts):
        composed.append(tuple(counts))
        time.sleep(0.05)  # widen the window in which the other threads would miss the cache
        return record_level_spend(dp, counts)

    monkeypatch.setattr(policy_module, "record_level_spend", slow_spend)
    policy = PrivacyPolicy(PNPM, DP)
    counts = [613, 613, 613]  # a history no other test asked for: not cached yet
    answers: list[tuple[int, int]] = []
    threads = [threading.Thread(target=lambda: answers.append(expected_micro(policy, D, counts))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert composed == [(613, 613, 613)], f"{len(composed)} compositions for one history"
    assert len(answers) == 8 and len(set(answers)) == 1
