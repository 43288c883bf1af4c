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
                "4",
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
    peer.commit(1, kit.digest("cli"), 9, 1_500_000, kit.MECHANISM)
    assert main(["ledger", "--rpc-url", automine_chain.url, "--ledger", deployed["address"]]) == 0
    text = capsys.readouterr().out
    assert "protects: sign only" in text and "eps spent 1.5" in text and "eps cap 4" in text
    assert "eps 1.5 (at most the swarm's delta" in text and "eps spent 1.5 (delta " in text  # delta beside every eps
    assert main(["ledger", "--rpc-url", automine_chain.url, "--ledger", deployed["address"], "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["rounds"][0]["commitments"][0]["num_samples"] == 9


def test_cli_errors_are_clean(automine_chain, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", automine_chain.private_keys[5])
    assert main(["deploy", "--rpc-url", automine_chain.url, "--genesis-digest", "abc"]) == 2
    assert "--genesis-digest" in capsys.readouterr().err
    assert main(["ledger", "--rpc-url", automine_chain.url, "--ledger", "0x" + "12" * 20]) == 2
    assert "no contract" in capsys.readouterr().err
