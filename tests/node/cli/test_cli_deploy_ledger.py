"""`swarm deploy` and `swarm ledger` against a real Anvil, in-process through node.cli.main."""

from __future__ import annotations

import hashlib
import json

import pytest
from eth_account import Account

from node.chain.client import LedgerClient, connect
from node.cli import deploy, main

GENESIS = hashlib.sha256(b"genesis model").digest()
MECHANISM = json.dumps({"name": "pnpm", "epsilon": 1.0}, separators=(",", ":")).encode()


def test_deploy_then_show(automine_chain, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", automine_chain.private_keys[5])
    genesis = GENESIS.hex()
    assert (
        main(
            [
                "deploy",
                "--rpc-url",
                automine_chain.url,
                "--genesis-digest",
                genesis,
                "--min-peers",
                "1",
                "--eps-cap",
                "40000",
                "--set",
                "train.dp_sgd=false",  # PNPM's figure alone: the commit below records no record-level eps
                "--json",
            ]
        )
        == 0
    )
    deployed = json.loads(capsys.readouterr().out)
    assert deployed["chain_id"] == automine_chain.chain_id and deployed["gas_used"] > 0
    from eth_account import Account

    from node.chain.client import LedgerClient, connect

    peer = LedgerClient(
        connect(automine_chain.url), deployed["address"], Account.from_key(automine_chain.private_keys[6])
    )
    peer.register(b"cli-peer", b"")
    step = deployed["eps_step"]  # what one round of the default policy (PNPM, d x eps) spends
    assert step > 0 and deployed["record_eps_cap"] is None  # no DP-SGD in this policy
    peer.commit(1, hashlib.sha256(b"cli").digest(), 9, round(step * 1e6), MECHANISM)
    assert main(["ledger", "--rpc-url", automine_chain.url, "--ledger", deployed["address"]]) == 0
    text = capsys.readouterr().out
    assert "protects: sign only" in text and f"eps spent {step:g}" in text and "eps cap 40000" in text
    assert f"eps {step:g} (at most the swarm's delta" in text and f"eps spent {step:g} (delta " in text
    assert main(["ledger", "--rpc-url", automine_chain.url, "--ledger", deployed["address"], "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["rounds"][0]["commitments"][0]["num_samples"] == 9


def test_cli_errors_are_clean(automine_chain, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", automine_chain.private_keys[5])
    assert main(["deploy", "--rpc-url", automine_chain.url, "--genesis-digest", "abc"]) == 2
    assert "--genesis-digest" in capsys.readouterr().err
    assert main(["ledger", "--rpc-url", automine_chain.url, "--ledger", "0x" + "12" * 20]) == 2
    assert "no contract" in capsys.readouterr().err


def _deploy(chain, *extra: str) -> int:
    genesis = hashlib.sha256(b"genesis model").hexdigest()
    return main(["deploy", "--rpc-url", chain.url, "--genesis-digest", genesis, "--min-peers", "1", "--json", *extra])


def test_deploy_to_a_non_local_chain_needs_an_admission_choice(testnet_chain, monkeypatch, capsys):
    """Anvil with chain id 11155111 (Sepolia's) on 127.0.0.1: the chain id, not the URL, makes a
    chain local, so admission must be chosen."""
    monkeypatch.setenv("SWARM_PRIVATE_KEY", testnet_chain.private_keys[5])
    assert testnet_chain.chain_id not in deploy.LOCAL_CHAIN_IDS
    assert _deploy(testnet_chain) == 2
    err = capsys.readouterr().err
    assert "not a local chain" in err and "--allow" in err and "--open" in err

    members = [Account.from_key(k).address for k in testnet_chain.private_keys[6:8]]
    assert _deploy(testnet_chain, "--allow", *members, "--max-samples", "500") == 0
    out = capsys.readouterr()
    deployed = json.loads(out.out)
    assert "warning" not in out.err
    assert (deployed["admission"], deployed["max_samples"]) == ("allowlist", 500)
    ledger = LedgerClient(connect(testnet_chain.url), deployed["address"])
    assert ledger.params().allowlist_enabled and ledger.params().max_samples == 500
    assert all(ledger.is_allowed(m) for m in members)
    assert not ledger.is_allowed(Account.from_key(testnet_chain.private_keys[4]).address)

    assert _deploy(testnet_chain, "--open") == 0
    out = capsys.readouterr()
    deployed = json.loads(out.out)  # the warning goes to stderr: --json output stays parseable
    # the sample cap derived from the data: the largest shard of the default partition, 60,000 / 4
    assert deployed["admission"] == "open" and deployed["max_samples"] == 15_000
    assert "anyone may register" in out.err and "Sybil" in out.err and "majority" in out.err
    assert not LedgerClient(connect(testnet_chain.url), deployed["address"]).params().allowlist_enabled

    with pytest.raises(SystemExit) as both:  # one choice or the other
        _deploy(testnet_chain, "--open", "--allow", members[0])
    assert both.value.code == 2
    capsys.readouterr()


def test_max_samples_defaults_to_the_config(automine_chain, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", automine_chain.private_keys[5])
    assert _deploy(automine_chain, "--set", "chain.max_samples=250") == 0  # a local chain: open without a flag
    out = capsys.readouterr()
    deployed = json.loads(out.out)
    assert (deployed["admission"], deployed["max_samples"]) == ("open", 250) and "warning" not in out.err
    assert _deploy(automine_chain, "--set", "chain.max_samples=-1") == 2
    assert "chain.max_samples" in capsys.readouterr().err


def test_window_seconds_come_from_the_flags_or_the_blocks_at_the_block_time(automine_chain, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", automine_chain.private_keys[5])
    flags = ("--commit-window", "100", "--set", "chain.block_time=0.5", "--attest-window-seconds", "90")
    assert _deploy(automine_chain, *flags) == 0
    deployed = json.loads(capsys.readouterr().out)
    params = LedgerClient(connect(automine_chain.url), deployed["address"]).params()
    assert (params.commit_window, params.commit_window_seconds) == (100, 50)  # derived: 100 blocks x 0.5 s
    assert params.attest_window_seconds == 90  # given
    assert deployed["commit_window"] == [100, 50] and deployed["attest_window"] == [params.attest_window, 90]
    assert _deploy(automine_chain, "--commit-window-seconds", "-1") == 2
    assert "chain.commit_window_seconds" in capsys.readouterr().err
