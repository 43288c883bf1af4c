import tomllib

import pytest

from node.config import ConfigError, load_config


def test_defaults_load_and_round_trip_through_toml(tmp_path):
    config = load_config(None, [])
    assert config.swarm.peers == 4 and config.aggregation.rule == "auto" and config.data.data_dir is None
    assert config.model_name == "logreg" and config.data.dataset == "fashion-mnist" and config.train.dp_sgd
    path = tmp_path / "swarm.toml"
    config.privacy.params["k"] = 3.0
    path.write_text(config.to_toml())
    assert load_config(path, []) == config
    assert tomllib.loads(config.to_toml())["privacy"]["params"] == {"k": 3.0}


def test_file_then_overrides(tmp_path):
    path = tmp_path / "swarm.toml"
    path.write_text('[swarm]\npeers = 8\n[train]\nlr = 1\n[p2p]\nbootstrap = ["/ip4/127.0.0.1/tcp/1"]\n')
    config = load_config(
        path,
        [
            "swarm.rounds=3",
            "train.lr=0.02",
            "data.partition=dirichlet",
            "train.dp_sgd=true",
            "privacy.params.clip=0.5",
            "data.data_dir=/data/fm",
            "data.limit=600",
            "model.name=pnpm-fmnist",
            "p2p.bootstrap=a,b",
        ],
    )
    assert config.swarm.peers == 8 and config.swarm.rounds == 3
    assert config.train.lr == 0.02 and isinstance(config.train.lr, float) and config.train.dp_sgd is True
    assert config.data.partition == "dirichlet" and config.data.data_dir == "/data/fm" and config.data.limit == 600
    assert config.privacy.params == {"clip": 0.5} and config.model_name == "pnpm-fmnist"
    assert config.p2p.bootstrap == ["a", "b"]
    assert load_config(None, ["data.limit=none"]).data.limit is None
    assert load_config(path, []).train.lr == 1.0  # an int is accepted for a float


@pytest.mark.parametrize(
    "override,message",
    [
        ("swarm.peerz=3", "unknown key swarm.peerz"),
        ("swarms.peers=3", "unknown section 'swarms'"),
        ("swarm.peers", "must look like section.key=value"),
        ("swarm.peers=three", "swarm.peers must be an integer"),
        ("swarm.peers=2.5", "swarm.peers must be an integer"),
        ("train.lr=fast", "train.lr must be a finite number"),
        ("train.lr=nan", "train.lr must be a finite number"),
        ("train.dp_sgd=yes", "train.dp_sgd must be true or false"),
        ("swarm.peers=0", "swarm.peers must be >= 1, got 0"),
        ("aggregation.rule=mean", "aggregation.rule must be auto or one of"),
        ("aggregation.trim_ratio=0.5", r"aggregation.trim_ratio must be in \[0, 0.5\)"),
        ("data.dataset=svhn", "data.dataset must be one of"),
        ("privacy.perturb=grads", "privacy.perturb must be weights or update"),
        ("privacy.params=3", "set one entry as privacy.params.NAME=value"),
        ("privacy.params.k=big", r"privacy.params.k must be a finite number"),
        ("swarm.peers.x=1", "has no sub-keys"),
        ("p2p.linger=-1", r"p2p.linger must be in 0..3600 s, got -1.0"),
        ("p2p.linger=inf", "p2p.linger must be a finite number"),
        ("p2p.linger=90", r"p2p.linger_max must be in p2p.linger \(90\)..3600 s, got 60.0"),
        ("p2p.linger_max=4", r"p2p.linger_max must be in p2p.linger \(5\)..3600 s, got 4.0"),
        ("p2p.linger_max=3601", r"p2p.linger_max must be in p2p.linger \(5\)..3600 s"),
    ],
)
def test_override_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError, match="unknown key train.learning_rate"):
        load_config(bad, [])
    bad.write_text("[trainer]\nlr = 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown section \[trainer\]"):
        load_config(bad, [])
    bad.write_text("[train]\nlr = '0.1'\n")
    with pytest.raises(ConfigError, match="train.lr must be a finite number"):
        load_config(bad, [])
    bad.write_text("[train\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, [])
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml", [])


def test_auto_aggregation_is_the_trimmed_mean_under_pnpm_and_fedavg_otherwise():
    """PNPM can release any vector, so under it one member's weight bounds nothing: auto takes the
    trimmed mean there (docs/THREATS.md); a rule set in the config wins."""
    assert load_config(None, []).aggregation_rule == "trimmed-mean"  # the defaults: PNPM
    assert load_config(None, ["privacy.mechanism=duchi"]).aggregation_rule == "fedavg"
    assert load_config(None, ["privacy.mechanism=none"]).aggregation_rule == "fedavg"
    assert load_config(None, ["aggregation.rule=median"]).aggregation_rule == "median"
    assert load_config(None, ["privacy.mechanism=duchi", "aggregation.rule=krum"]).aggregation_rule == "krum"


def test_a_secure_swarm_refuses_step_windows_no_deeper_than_its_confirmations():
    secure = ["privacy.mechanism=secagg", "chain.confirmations=4"]
    # each step's window more than 4 + 2 blocks: eighths of 56 commit blocks, quarters of 28 attestation blocks
    load_config(None, [*secure, "chain.commit_window=56", "chain.attest_window=28"])
    with pytest.raises(ConfigError, match=r"chain.commit_window of 55 blocks .* KEYS window 6 blocks.* >= 56"):
        load_config(None, [*secure, "chain.commit_window=55", "chain.attest_window=28"])
    with pytest.raises(ConfigError, match=r"chain.attest_window of 27 blocks .* MASKED_ACK window 6 blocks.* >= 28"):
        load_config(None, [*secure, "chain.commit_window=56", "chain.attest_window=27"])
    load_config(None, ["chain.confirmations=4", "chain.attest_window=24"])  # not secure: no step windows


def test_linger_reaches_the_peer_settings():
    """p2p.linger and p2p.linger_max are how long a peer serves on after its last round (node/peer/linger.py)."""
    from node.derive import peer_settings

    default = peer_settings(load_config(None, []))
    assert (default.linger, default.linger_max) == (5.0, 60.0)
    settings = peer_settings(load_config(None, ["p2p.linger=0", "p2p.linger_max=0"]))
    assert (settings.linger, settings.linger_max) == (0.0, 0.0)
    settings = peer_settings(load_config(None, ["p2p.linger=12.5", "p2p.linger_max=600"]))
    assert (settings.linger, settings.linger_max) == (12.5, 600.0)
