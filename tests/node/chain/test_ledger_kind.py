"""`ledger_kind` on a real Anvil: each shipped contract deployed (twice, with other settings in its
immutables) is named by its code; an address with no code, another contract, and a ledger whose code
was patched by one byte are refused with the address named."""

from __future__ import annotations

from typing import get_args

import pytest
from eth_account import Account

from node.chain.client import LedgerClient, connect, load_artifact
from node.chain.errors import LedgerError
from node.chain.kind import CONTRACT_NAMES, LedgerKind, ledger_kind, masked_code_differences
from node.chain.pipelined import PipelinedClient, load_pipelined_artifact
from node.config import LEDGER_KINDS
from tests.node.chain.conftest import GENESIS

# A runtime that returns 42 for any call: a contract that is no ledger
ANSWER_42 = bytes.fromhex("602a60005260206000f3")


def _terms(min_peers: int) -> dict:
    return dict(
        min_peers=min_peers,
        commit_window=10 + min_peers,
        attest_window=10,
        commit_window_seconds=60,
        attest_window_seconds=60,
        eps_cap_micro=5_000_000,
        delta=1e-5,
        genesis_digest=GENESIS,
    )


@pytest.fixture(scope="module")
def deployed(automine_chain):
    w3 = connect(automine_chain.url)
    account = Account.from_key(automine_chain.private_keys[7])
    return w3, {
        "swarm": [LedgerClient.deploy(w3, account, **_terms(n)).address for n in (1, 3)],
        "pipelined": [PipelinedClient.deploy(w3, account, **_terms(n)).address for n in (1, 3)],
    }


def test_each_deployed_ledger_is_named_by_its_code(deployed):
    w3, addresses = deployed
    for kind, pair in addresses.items():
        assert [ledger_kind(w3, address) for address in pair] == [kind, kind]
        assert ledger_kind(w3, pair[0].lower()) == kind  # any spelling of the address


def test_an_address_without_code_is_refused_by_name(deployed, automine_chain):
    w3, _ = deployed
    eoa = Account.from_key(automine_chain.private_keys[6]).address
    with pytest.raises(LedgerError, match=f"no contract at {eoa} on chain {automine_chain.chain_id}"):
        ledger_kind(w3, eoa)


def test_another_contract_is_refused_by_name(deployed):
    w3, _ = deployed
    other = "0x" + "c0de" * 10
    w3.provider.make_request("anvil_setCode", [other, "0x" + ANSWER_42.hex()])
    checksum = w3.to_checksum_address(other)
    with pytest.raises(LedgerError, match=f"the contract at {checksum} is neither a SwarmLedger nor a PipelinedLedger"):
        ledger_kind(w3, other)


@pytest.mark.parametrize("kind", ["swarm", "pipelined"])
def test_a_ledger_patched_outside_its_immutables_is_refused(deployed, kind):
    w3, addresses = deployed
    code = bytearray(w3.eth.get_code(addresses[kind][0]))
    code[0] ^= 0xFF  # its first opcode: in no immutable
    patched = "0x" + ("57" if kind == "swarm" else "58") * 20
    w3.provider.make_request("anvil_setCode", [patched, "0x" + bytes(code).hex()])
    with pytest.raises(LedgerError, match="is neither a SwarmLedger nor a PipelinedLedger"):
        ledger_kind(w3, patched)


def test_the_masking_ignores_immutables_only():
    artifact = load_pipelined_artifact()
    expected = bytes.fromhex(artifact["deployedBytecode"].removeprefix("0x"))
    references = artifact["immutableReferences"]
    start = references["_minPeers"][0]["start"]
    inside = bytearray(expected)
    inside[start] ^= 0xFF
    assert masked_code_differences(bytes(inside), expected, references) == []
    swarm = bytes.fromhex(load_artifact()["deployedBytecode"].removeprefix("0x"))
    assert masked_code_differences(swarm, expected, references) == [
        f"the code at the ledger address is {len(swarm)} bytes, the artifact's {len(expected)}"
    ]
    assert masked_code_differences(expected, expected, {}) == [
        "the contract artifact records no immutableReferences: run python scripts/compile_contracts.py"
    ]


def test_the_config_names_the_same_kinds():
    """node.config writes the kinds out (it imports no chain module); they must be these."""
    assert LEDGER_KINDS == get_args(LedgerKind) == tuple(CONTRACT_NAMES)
