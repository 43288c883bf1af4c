"""What a commit must record under the swarm's privacy policy, as pure functions of what is on
chain: the policy (in the genesis blob, whose digest the ledger holds) and the sample count of
each round the peer committed. The peer uses them to commit; the rulebook (node/rules.py) holds
every commit to them, for every other peer and `swarm verify`.

Two figures per commit (docs/PRIVACY-MODEL.md):
- the local mechanism's whole-update eps: d x eps per round for a pure coordinate mechanism (the
  contract itself requires exactly that step, `eps_step_micro`), RDP over the rounds for the
  Gaussian (not a constant step: the rulebook checks it);
- DP-SGD's record-level eps (`mechanisms.record_level`), 0 without DP-SGD.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import mechanisms
from mechanisms.accounting import Spend, cumulative_spend
from mechanisms.gaussian import Gaussian
from mechanisms.record_level import record_level_spend
from mechanisms.secagg.policy import NAME as SECAGG
from mechanisms.secagg.policy import SecAggPolicy, secagg_spend
from node.protocol.settings import PrivacyPolicy
from node.protocol.wire import canonical, eps_to_micro

_spend_lock = threading.Lock()  # see privacy_spend


def eps_step_micro(mechanism_params: dict[str, object], num_params: int) -> int:
    """What one release spends under a pure mechanism, rounded up to whole micro-eps: the contract
    requires every commit to add exactly this. 0 for the Gaussian (its RDP spend per round is not
    a constant) and under secure aggregation (likewise)."""
    if mechanism_params.get("name") == SECAGG:
        return 0
    if isinstance(mechanisms.from_params(mechanism_params), Gaussian):
        return 0
    return eps_to_micro(cumulative_spend(mechanism_params, num_params, 1).epsilon)


@dataclass(frozen=True)
class PrivacySpend:
    """What a peer has spent after releasing one round per committed sample count: the local
    mechanism's whole-update figure and DP-SGD's record-level figure (None without DP-SGD), with
    the micro-eps the ledger records for each. Computed once per (policy, d, counts) by
    `privacy_spend`, the one call the peer, `swarm simulate`'s recorder, the rulebook and
    `swarm verify` make."""

    mechanism: Spend
    record: Spend | None
    eps_micro: int
    record_eps_micro: int


def privacy_spend(policy: PrivacyPolicy, num_params: int, sample_counts: Sequence[int]) -> PrivacySpend:
    """The cumulative spend of a peer that released one round per entry of `sample_counts` (its
    committed numSamples, oldest first) under `policy`.

    One computation at a time: a peer vets a round's commits in parallel threads, and without the
    lock each of them missed the cache at once and composed the same PLD again (counted in a swarm
    of 16 on 2 cores: 15 compositions of 0.1 CPU-s per peer per round, more CPU than the training;
    docs/SCALING.md has the round profile). With it, the first computes and the others read its answer."""
    key = (canonical(policy.to_dict()), num_params, tuple(int(n) for n in sample_counts))
    with _spend_lock:
        return _privacy_spend(*key)


@lru_cache(maxsize=1024)
def _privacy_spend(policy_json: str, num_params: int, sample_counts: tuple[int, ...]) -> PrivacySpend:
    # Cached: every peer checks every committer's record each round, and a PLD composition costs
    # about a tenth of a second; peers with equal shards share one answer.
    policy = PrivacyPolicy.from_dict(json.loads(policy_json))
    params = dict(policy.mechanism)
    k = len(sample_counts)
    if params.get("name") == SECAGG:
        secure = secagg_spend(SecAggPolicy.from_dict(params), k)
        micro = eps_to_micro(secure.epsilon)
        return PrivacySpend(secure, secure, micro, micro)
    spend = cumulative_spend(params, num_params, k)
    step = eps_step_micro(params, num_params)
    eps = k * step if step else eps_to_micro(spend.epsilon)
    record = record_level_spend(policy.dp_sgd, sample_counts) if policy.dp_sgd else None
    return PrivacySpend(spend, record, eps, eps_to_micro(record.epsilon) if record else 0)


def expected_micro(policy: PrivacyPolicy, num_params: int, sample_counts: Sequence[int]) -> tuple[int, int]:
    """(whole-update eps, record-level eps), in micro-eps, that a peer records after releasing
    one round per entry of `sample_counts` (`privacy_spend`'s two ledger figures)."""
    spent = privacy_spend(policy, num_params, sample_counts)
    return spent.eps_micro, spent.record_eps_micro


def tolerance(expected: int) -> int:
    """Slack for a figure an accountant computes in floating point (RDP, the PLD's FFT): its last
    digits may differ across machines and math libraries. One part in a million, at least 1
    micro-eps. A pure mechanism's figure is an exact multiple of its step and gets none."""
    return max(1, expected // 1_000_000)
