"""The blob fetch timeout of a local swarm, sized for its peers sharing this machine's cores
(node/runs/local.py `size_exchange`), and the default of a node on its own (node/config.py)."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path

import pytest

from node.config import DEFAULT_FETCH_TIMEOUT, ConfigError, fetch_timeout, load_config, window_seconds
from node.derive import peer_settings
from node.runs.local import LOCAL_EXCHANGE_LOAD, _check_fetch_fits_attestation, local_fetch_timeout, size_exchange

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.toml"


def demo(*overrides: str):
    return load_config(DEMO, list(overrides))


def test_a_node_on_its_own_waits_the_default_and_a_set_figure_is_kept():
    assert demo().chain.fetch_timeout == 0
    assert fetch_timeout(demo()) == DEFAULT_FETCH_TIMEOUT == 10.0
    assert peer_settings(demo()).fetch_timeout == 10.0
    assert peer_settings(demo("chain.fetch_timeout=3.5")).fetch_timeout == 3.5
    with pytest.raises(ConfigError, match="chain.fetch_timeout must be >= 0"):
        demo("chain.fetch_timeout=-1")


@pytest.mark.parametrize(
    ("peers", "cores", "expected"),
    [(4, 2, 10.0), (16, 2, 10.0), (17, 2, 10.0 * 289 / 256), (32, 2, 40.0), (32, 8, 10.0), (64, 8, 40.0), (1, 1, 10.0)],
)
def test_the_local_timeout_grows_as_peers_squared_over_cores_past_16_peers_on_2(peers, cores, expected):
    assert local_fetch_timeout(peers, cores) == pytest.approx(expected)
    assert LOCAL_EXCHANGE_LOAD == 16 * 16 / 2  # the load the measured default covers


@pytest.mark.parametrize(("peers", "cores"), [(0, 2), (4, 0)])
def test_the_local_timeout_refuses_no_peers_or_no_cores(peers, cores):
    with pytest.raises(ValueError, match="need peers >= 1 and cores >= 1"):
        local_fetch_timeout(peers, cores)


def test_a_local_swarm_of_32_on_2_cores_gets_40_s_and_an_attestation_window_twice_that():
    config = demo("swarm.peers=32")
    assert window_seconds(config)[1] == 40  # 160 blocks of 0.25 s: too short for a 40 s fetch
    with pytest.raises(ValueError, match="must be at most half the attestation window"):
        _check_fetch_fits_attestation(demo("swarm.peers=32", "chain.fetch_timeout=40"))
    assert size_exchange(config, 2)
    assert (config.chain.fetch_timeout, config.chain.attest_window_seconds) == (40.0, 80)
    assert window_seconds(config)[1] == 80
    _check_fetch_fits_attestation(config)  # passes


def test_a_small_local_swarm_keeps_the_default_and_its_window_and_set_figures_are_kept():
    config = demo("swarm.peers=4")
    size_exchange(config, 2)
    assert (config.chain.fetch_timeout, config.chain.attest_window_seconds) == (10.0, 0)
    for overrides in (["chain.fetch_timeout=12"], ["chain.attest_window_seconds=600"]):
        config = demo("swarm.peers=32", *overrides)
        before = copy.deepcopy(config.chain)
        assert size_exchange(config, 2) is overrides[0].startswith("chain.attest_window_seconds")
        if overrides[0].startswith("chain.fetch_timeout"):
            assert config.chain == before  # an operator's timeout is theirs
        else:
            assert (config.chain.fetch_timeout, config.chain.attest_window_seconds) == (40.0, 600)


def test_swarm_up_says_when_it_sized_the_timeout_and_writes_the_figure_into_the_peers_config(tmp_path):
    from node.runs.local import LocalSwarm

    cores = len(os.sched_getaffinity(0))
    said: list[str] = []
    swarm = LocalSwarm(demo("swarm.peers=128"), tmp_path / "run", say=said.append)
    expected = local_fetch_timeout(128, cores)
    assert expected > DEFAULT_FETCH_TIMEOUT  # 128 peers on fewer than 128 cores
    assert swarm.config.chain.fetch_timeout == pytest.approx(expected)
    assert swarm.config.chain.attest_window_seconds == math.ceil(2 * expected)
    assert said == [
        f"128 peers share {cores} cores: each waits up to {expected:g} s for a round's blobs (chain.fetch_timeout), "
        f"and a round's attestation window lasts at least {math.ceil(2 * expected)} s"
    ]
    assert "fetch_timeout = 0" not in swarm.config.to_toml()  # what the peers run with: the figure
    quiet: list[str] = []
    LocalSwarm(demo("swarm.peers=4"), tmp_path / "small", say=quiet.append)
    assert quiet == []
