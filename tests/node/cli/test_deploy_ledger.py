"""`swarm deploy` of each ledger contract on a real Anvil, in-process through node.cli.main: the
chosen contract (`--ledger-kind`, or `--set chain.ledger_kind`) is what the deployed code says
(`node.chain.kind.ledger_kind`) and what `--json` names; what a pipelined ledger would not honour is
refused in one line before anything is sent; a pipelined ledger holds the settings given and its
fixed allowlist admits exactly its members; the commands that read a SwarmLedger only, or deploy one of
their own, refuse a pipelined one; `swarm node` on a pipelined ledger refuses what its loop does not run."""

from __future__ import annotations

import hashlib
import json

import pytest
from eth_account import Account

from node.chain.client import connect
from node.chain.errors import NotAllowed
from node.chain.kind import ledger_kind
from node.chain.pipelined import PipelinedClient
from node.cli import CLIError, common, main
from node.config import load_config
from node.derive import genesis
from node.protocol.blob import sha256

GENESIS = hashlib.sha256(b"genesis model").hexdigest()
DEPLOYER = 5


def _deploy(chain, *extra: str) -> int:
    return main(["deploy", "--rpc-url", chain.url, "--genesis-digest", GENESIS, "--min-peers", "1", "--json", *extra])


@pytest.fixture
def deployer(automine_chain, monkeypatch):
    monkeypatch.setenv("SWARM_PRIVATE_KEY", automine_chain.private_keys[DEPLOYER])
    return Account.from_key(automine_chain.private_keys[DEPLOYER]).address


@pytest.mark.parametrize(
    ("flags", "kind", "contract"),
    [
        ((), "swarm", "SwarmLedger"),
        (("--ledger-kind", "pipelined"), "pipelined", "PipelinedLedger"),
        (("--set", "chain.ledger_kind=pipelined"), "pipelined", "PipelinedLedger"),
        (("--set", "chain.ledger_kind=pipelined", "--ledger-kind", "swarm"), "swarm", "SwarmLedger"),  # the flag wins
    ],
)
def test_the_chosen_contract_is_deployed_and_named(automine_chain, deployer, capsys, flags, kind, contract):
    assert _deploy(automine_chain, *flags, "--max-samples", "300") == 0
    deployed = json.loads(capsys.readouterr().out)
    assert (deployed["ledger_kind"], deployed["contract"]) == (kind, contract)
    w3 = connect(automine_chain.url)
    assert ledger_kind(w3, deployed["address"]) == kind
    assert deployed["max_samples"] == 300 and deployed["gas_used"] > 0 and deployed["deployer"] == deployer
    # `block` is the deployment's: the code is there from that block on, not before
    assert w3.eth.get_code(deployed["address"], block_identifier=deployed["block"])
    assert not w3.eth.get_code(deployed["address"], block_identifier=deployed["block"] - 1)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--set", "privacy.mechanism=secagg"), "chain.ledger_kind must be swarm with privacy.mechanism = secagg"),
        (("--set", "chain.ledger_kind=serial"), "chain.ledger_kind must be one of swarm, pipelined"),
    ],
)
def test_what_a_pipelined_ledger_would_not_honour_is_refused_before_anything_is_sent(
    automine_chain, deployer, capsys, flags, said
):
    w3 = connect(automine_chain.url)
    sent = w3.eth.get_transaction_count(deployer)
    assert _deploy(automine_chain, "--set", "chain.ledger_kind=pipelined", *flags) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert w3.eth.get_transaction_count(deployer) == sent


def test_the_flag_takes_only_the_known_contracts(automine_chain, deployer, capsys):
    with pytest.raises(SystemExit) as refused:
        _deploy(automine_chain, "--ledger-kind", "serial")
    assert refused.value.code == 2 and "invalid choice: 'serial'" in capsys.readouterr().err


def test_a_pipelined_ledgers_allowlist_admits_exactly_its_members(automine_chain, deployer, capsys):
    member, outsider = (Account.from_key(k) for k in automine_chain.private_keys[6:8])
    assert _deploy(automine_chain, "--ledger-kind", "pipelined", "--allow", member.address) == 0
    deployed = json.loads(capsys.readouterr().out)
    assert deployed["admission"] == "allowlist"
    w3 = connect(automine_chain.url)
    with pytest.raises(NotAllowed):
        PipelinedClient(w3, deployed["address"], outsider).register(b"outsider", b"")
    assert PipelinedClient(w3, deployed["address"], member).register(b"member", b"")["status"] == 1


def test_the_commands_reading_a_swarm_ledger_only_refuse_a_pipelined_one(automine_chain, deployer, capsys):
    assert _deploy(automine_chain, "--ledger-kind", "pipelined") == 0
    address = json.loads(capsys.readouterr().out)["address"]
    assert main(["ledger", "--rpc-url", automine_chain.url, "--ledger", address]) == 2
    err = capsys.readouterr().err
    assert f"the ledger at {address} is a PipelinedLedger" in err and len(err.strip().splitlines()) == 1
    w3 = connect(automine_chain.url)
    assert isinstance(common.open_deployed_ledger(w3, address), PipelinedClient)


def test_an_address_without_a_ledger_is_one_line(automine_chain, deployer):
    w3 = connect(automine_chain.url)
    eoa = Account.from_key(automine_chain.private_keys[7]).address
    with pytest.raises(CLIError, match=f"no contract at {eoa} .*: check --ledger"):
        common.open_deployed_ledger(w3, eoa)
    other = "0x" + "c0de" * 10
    w3.provider.make_request("anvil_setCode", [other, "0x602a60005260206000f3"])
    with pytest.raises(CLIError, match="is neither a SwarmLedger nor a PipelinedLedger"):
        common.open_deployed_ledger(w3, other)


def test_the_simulators_ledger_refuses_a_pipelined_one(tmp_path, capsys):
    """`swarm simulate --ledger` records on a SwarmLedger only (`swarm up` runs either kind:
    tests/e2e/test_e2e_swarm.py)."""
    out = tmp_path / "run"
    assert main(["simulate", "--ledger", "--out", str(out), "--set", "chain.ledger_kind=pipelined"]) == 2
    err = capsys.readouterr().err
    assert "swarm simulate --ledger runs on a SwarmLedger only, not chain.ledger_kind = pipelined" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


NODE_SETS = ["data.dataset=digits", "swarm.peers=2", "chain.min_peers=2", "train.dp_sgd=false"]


@pytest.mark.parametrize(
    ("sets", "rpc_urls", "said"),
    [
        ([], 2, "whose peers hold no second endpoint to the first yet: give --rpc-url once"),
        (
            ["privacy.mechanism=secagg"],
            1,
            "which has no secure-aggregation steps: a secure swarm runs on a SwarmLedger",
        ),
    ],
    ids=["witness", "secure"],
)
def test_a_node_on_a_pipelined_ledger_refuses_what_its_loop_does_not_run(
    automine_chain, tmp_path, monkeypatch, capsys, sets, rpc_urls, said
):
    """The node learns the kind from the deployed code alone (its config says nothing of it) and
    refuses, in one line before it loads its data or listens, a witness endpoint or a secure policy
    (a pipelined ledger for a secure genesis, deployed through the client: `swarm deploy` refuses it)."""
    config = load_config(None, NODE_SETS + sets)
    config_file = tmp_path / "swarm.toml"
    config_file.write_text(config.to_toml())
    w3 = connect(automine_chain.url)
    ledger = PipelinedClient.deploy(
        w3,
        Account.from_key(automine_chain.private_keys[DEPLOYER]),
        min_peers=2,
        commit_window=20,
        attest_window=20,
        commit_window_seconds=60,
        attest_window_seconds=60,
        eps_cap_micro=10**12,
        delta=1e-5,
        genesis_digest=sha256(genesis(config)),
    )
    monkeypatch.setenv("SWARM_PRIVATE_KEY", automine_chain.private_keys[6])
    monkeypatch.setenv("SWARM_P2P_PASSWORD", "pw")
    workdir = tmp_path / "node"
    node = ["node", "--ledger", ledger.address, "--config", str(config_file), "--workdir", str(workdir)]
    assert main([*node, "--partition", "0/2", *["--rpc-url", automine_chain.url] * rpc_urls]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"the ledger at {ledger.address} is a PipelinedLedger, {said}" in err
    assert not (workdir / "peer.json").exists()  # it never listened


def test_a_pipelined_ledger_holds_the_settings_given(automine_chain, deployer, capsys):
    flags = ("--ledger-kind", "pipelined", "--delta", "2e-6", "--eps-cap", "40000", "--commit-window", "77")
    assert _deploy(automine_chain, *flags, "--attest-window-seconds", "90", "--max-samples", "400") == 0
    deployed = json.loads(capsys.readouterr().out)
    params = PipelinedClient(connect(automine_chain.url), deployed["address"]).params()
    assert (params.delta, params.eps_cap_micro, params.min_peers, params.max_samples) == (2e-6, 40_000_000_000, 1, 400)
    assert (params.commit_window, params.attest_window_seconds, params.deployer) == (77, 90, deployer)
    assert deployed["commit_window"] == [77, params.commit_window_seconds] and deployed["eps_cap"] == 40000
