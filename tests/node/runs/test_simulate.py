"""`swarm simulate`: the quick configuration learns, a seed reproduces its run bit for bit, the
privacy figures are the honest whole-update ones, and a run recorded on a real Anvil passes
`swarm verify`. Real code end to end (digits, a few peers, fixed seeds); about a minute in total."""

from __future__ import annotations

import json

import pytest

from node.cli import main
from node.config import load_config
from node.runs.simulate import SECRET_NOISE, SEEDED_NOISE, Simulation, SimulationError, sample_peers, summary_line

# Small and fast: 6 peers on 8x8 digits (1,347 training images), 2 rounds, PNPM at eps 1.
SMALL = [
    "data.dataset=digits",
    "model.name=auto",  # digits' CNN, without DP-SGD: the local mechanism's figure alone
    "train.dp_sgd=false",
    "train.momentum=0",
    "train.lr_decay=1",
    "privacy.perturb=weights",
    "swarm.peers=6",
    "swarm.rounds=2",
    "train.epochs=1",
    "train.batch_size=16",
    "train.lr=0.1",
    "privacy.mechanism=pnpm",
    "privacy.epsilon=1.0",
    "swarm.seed=7",
]


def run(tmp_path, name, overrides, **kwargs):
    return Simulation(load_config(None, overrides), out=tmp_path / name, **kwargs).run()


def test_quick_non_private_run_learns(tmp_path, capsys):
    # The --quick run through the CLI, as CI and users run it.
    rc = main(["simulate", "--quick", "--json", "--out", str(tmp_path / "quick")])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, len(rounds) + 1)) and len(rounds) >= 3
    # Chance on 10 classes is 0.10; with 450 test images its standard deviation is
    # sqrt(0.1 * 0.9 / 450) = 0.014, so 0.5 is more than 25 standard deviations above chance
    # (the run reaches about 0.8 with this seed; CPUs differ only in float rounding, which
    # moves logits by ~1e-7, not predictions by tens of images).
    assert rounds[-1]["accuracy"] > 0.5
    assert rounds[-1]["accuracy"] > rounds[0]["accuracy"]
    assert doc["summary"]["privacy"] is None and rounds[-1]["protects"].startswith("nothing")
    lines = (tmp_path / "quick" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rounds


def test_seed_reproduces_its_run_bit_for_bit(tmp_path):
    # Same machine, same seed, same kernels: bit-for-bit by design. (Across CPUs the local
    # training differs in the last bits; only the aggregate of given updates is bit-identical.)
    sampled = SMALL + ["swarm.peers=8"]
    first = run(tmp_path, "a", sampled, fraction=0.5)
    second = run(tmp_path, "b", sampled, fraction=0.5)
    other = run(tmp_path, "c", sampled + ["swarm.seed=8"], fraction=0.5)
    a = (tmp_path / "a" / "metrics.jsonl").read_bytes()
    assert a == (tmp_path / "b" / "metrics.jsonl").read_bytes()
    assert first.records == second.records
    assert all(r["participants"] == 4 for r in first.records)
    # A different seed changes the genesis, the sampling and every draw: no digest in common.
    digests = {r["model_digest"] for r in first.records}
    assert digests.isdisjoint(r["model_digest"] for r in other.records)


def test_privacy_is_the_whole_update_eps_and_pnpm_says_sign_only(tmp_path):
    result = run(tmp_path, "pnpm", SMALL)
    d = result.summary["num_params"]
    assert d == 8714  # digits-cnn
    # PNPM at eps 1 per coordinate: d coordinates per round (basic composition), T rounds.
    # Exact: integer release counts times eps = 1.0 (no rounding anywhere).
    assert result.records[0]["eps_per_contribution"] == d * 1.0
    assert result.records[-1]["eps_max"] == 2 * d * 1.0
    assert result.summary["privacy"]["protects"] == "sign"
    assert all(r["protects"] == "sign" for r in result.records)


def test_vector_mechanism_from_explicit_params_costs_its_eps_per_contribution(tmp_path):
    # k-of-d sampling is eps-LDP for the whole tuple: 2 contributions cost 2 * eps, whatever d.
    params = {"name": "sampled", "base": "pm", "epsilon": 5.0, "clip": True}
    result = Simulation(
        load_config(None, SMALL + ["privacy.perturb=update"]), out=tmp_path / "s", mechanism_params=params
    ).run()
    assert result.summary["mechanism"] == params
    assert result.records[0]["eps_per_contribution"] == 5.0  # exact: 1 and 2 times eps = 5.0
    assert result.summary["privacy"]["eps_whole_update_max"] == 10.0
    assert result.summary["privacy"]["protects"] == "value"


def test_sampling_is_seeded_sorted_and_sized():
    chosen = sample_peers(3, 1, 100, 0.1)
    assert chosen == sorted(chosen) and len(set(chosen)) == 10
    assert chosen == sample_peers(3, 1, 100, 0.1)
    assert chosen != sample_peers(3, 2, 100, 0.1) and chosen != sample_peers(4, 1, 100, 0.1)
    assert sample_peers(3, 1, 5, 0.01) and len(sample_peers(3, 1, 5, 0.01)) == 1
    with pytest.raises(SimulationError, match="fraction"):
        sample_peers(3, 1, 5, 0.0)


def test_baseline_cannot_go_on_the_ledger(tmp_path):
    with pytest.raises(SimulationError, match="none"):
        Simulation(load_config(None, SMALL + ["privacy.mechanism=none"]), out=tmp_path / "x", ledger=True)


@pytest.mark.timeout(300)
def test_ledger_run_passes_swarm_verify_and_tampering_fails_it(tmp_path, capsys):
    plain = run(tmp_path, "plain", SMALL)
    recorded = run(tmp_path, "chain", SMALL, ledger=True)
    # The ledger records the run, it does not change it.
    assert recorded.records == plain.records
    out = tmp_path / "chain"
    assert (out / "run.json").exists() and (out / "chain" / "state.json").exists()
    capsys.readouterr()
    assert main(["verify", "--run", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["rounds"]) >= 2
    assert all(r["aggregate_ok"] for r in report["rounds"][:2])
    # Flip one byte of one archived update blob (a committed one; its header names its kind):
    # verify must now fail.
    blob = next(
        p for p in sorted((out / "archive").rglob("*")) if p.is_file() and b'"kind":"update"' in p.read_bytes()[:4096]
    )
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0x01
    blob.write_bytes(bytes(data))
    assert main(["verify", "--run", str(out), "--json"]) == 1


def test_noise_is_labelled_and_secret_noise_does_not_repeat(tmp_path):
    """Seeded noise (the default) is reproducible, so every file says it is a simulation; with
    --secret-noise the same seed gives other releases, and a DP-SGD run is never called non-private."""
    seeded = run(tmp_path, "seeded", SMALL)
    assert seeded.summary["noise"] == SEEDED_NOISE and all(r["noise"] == SEEDED_NOISE for r in seeded.records)
    assert SEEDED_NOISE in summary_line(seeded.summary)
    assert json.loads((tmp_path / "seeded" / "summary.json").read_text())["noise"] == SEEDED_NOISE
    secret = [run(tmp_path, name, SMALL, secret_noise=True) for name in ("s1", "s2")]
    assert all(s.summary["noise"] == SECRET_NOISE for s in secret)
    assert secret[0].records[0]["model_digest"] != secret[1].records[0]["model_digest"]
    dp_only = run(tmp_path, "dp", SMALL + ["privacy.mechanism=none", "train.dp_sgd=true", "swarm.rounds=1"])
    assert "non-private" not in dp_only.records[0]["protects"] and "DP-SGD" in dp_only.records[0]["protects"]
    assert dp_only.summary["dp_sgd"]["epsilon"] > 0


@pytest.mark.parametrize("mechanism", ["none", "pnpm"])
def test_json_headline_is_the_record_level_pair_under_dp_sgd(tmp_path, capsys, mechanism):
    """`swarm simulate --json` with DP-SGD: `final_accuracy`, and under the privacy summary the
    record-level `epsilon` and `delta` (what the ledger would record for each peer), with DP-SGD
    alone and with a local mechanism on top (whose sign-only figure keeps its own keys)."""
    from mechanisms.record_level import DPSGDPolicy, record_level_spend
    from node.learning.data import load_dataset
    from node.learning.partition import partition

    sets = [*SMALL, "train.dp_sgd=true", "train.dp_noise_multiplier=2.0", f"privacy.mechanism={mechanism}"]
    args = ["simulate", "--json", "--out", str(tmp_path / mechanism)] + [a for s in sets for a in ("--set", s)]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert 0 <= summary["final_accuracy"] <= 1
    privacy = summary["privacy"]
    policy = DPSGDPolicy(noise_multiplier=2.0, max_grad_norm=1.0, batch_size=16, epochs=1)
    train = load_dataset("digits", split="train")
    shards = partition(train.y.numpy(), 6, scheme="iid", alpha=0.5, shards_per_peer=2, seed=7)
    # the largest over peers: the smallest shard spends the most per record
    expected = max(record_level_spend(policy, [len(s), len(s)]).epsilon for s in shards)
    assert privacy["scope"] == "record" and privacy["delta"] == 1e-5
    assert privacy["epsilon"] == pytest.approx(expected, rel=1e-12) == summary["dp_sgd"]["epsilon"]
    assert privacy["protects"].startswith("each training record")
    line = summary_line(summary)
    assert f"DP-SGD: ({privacy['epsilon']:.4g}, 1e-05)-DP for each training record" in line
    if mechanism == "pnpm":
        assert privacy["mechanism_protects"] == "sign" and privacy["eps_whole_update_max"] > 0
        assert "protects sign (sign only" in line  # the mechanism's figure keeps its own scope
    else:
        assert "eps_whole_update_max" not in privacy and line.startswith("no local DP on the shared vector")
