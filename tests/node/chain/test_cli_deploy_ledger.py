"""`swarm deploy` and `swarm ledger` against a real Anvil, in-process through node.cli.main."""

from __future__ import annotations

import json

from node.cli import main


def test_deploy_then_show(automine_chain, kit, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", automine_chain.private_keys[5])
    genesis = kit.GENESIS.hex()
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
    peer.register(b"cli-peer")
    step = deployed["eps_step"]  # what one round of the default policy (PNPM, d x eps) spends
    assert step > 0 and deployed["record_eps_cap"] is None  # no DP-SGD in the default policy
    peer.commit(1, kit.digest("cli"), 9, round(step * 1e6), kit.MECHANISM)
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
