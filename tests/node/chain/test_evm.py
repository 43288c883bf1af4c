"""The EVM-target check (node/chain/evm.py) against real Anvil chains pinned to older hardforks:
`connect`, `swarm deploy` and `swarm node` refuse a chain that cannot run the artifact's EVM, before sending
anything, with one line that names the fix."""

from __future__ import annotations

import pytest

from node.chain.anvil import start_anvil
from node.chain.client import connect, load_artifact
from node.chain.errors import LedgerError
from node.chain.evm import PROBES, UnsupportedEVM, artifact_evm_version, check_evm_target
from node.cli import main


def test_the_artifact_records_a_target_the_check_knows():
    assert artifact_evm_version(load_artifact()) == "shanghai"
    assert PROBES["shanghai"] is not None  # the target is actually probed, not waved through
    with pytest.raises(LedgerError, match="no known EVM target"):
        artifact_evm_version({"settings": {"evmVersion": "frontier-2"}})
    with pytest.raises(LedgerError, match="no known EVM target"):
        artifact_evm_version({"abi": []})


def test_a_pre_shanghai_chain_is_refused_before_anything_is_sent(monkeypatch, capsys, tmp_path):
    with start_anvil(hardfork="paris", accounts=1) as paris:
        with pytest.raises(UnsupportedEVM, match="does not run EVM shanghai"):
            connect(paris.url)
        w3 = connect(paris.url, check_evm=False)  # readers may opt out; the chain answers
        monkeypatch.setenv("SWARM_PRIVATE_KEY", paris.private_keys[0])
        status = main(["deploy", "--rpc-url", paris.url, "--genesis-digest", "11" * 32, "--min-peers", "1"])
        err = capsys.readouterr().err
        assert status == 2
        assert len(err.strip().splitlines()) == 1, err
        assert f"the chain at {paris.url} does not run EVM shanghai (no PUSH0 opcode" in err
        assert "anvil --hardfork shanghai" in err
        deployer = w3.eth.account.from_key(paris.private_keys[0]).address
        assert w3.eth.get_transaction_count(deployer) == 0  # refused before any transaction

        monkeypatch.setenv("SWARM_P2P_PASSWORD", "pw")
        ledger = "0x" + "11" * 20  # never read: the chain is refused first
        status = main(["node", "--rpc-url", paris.url, "--ledger", ledger, "--workdir", str(tmp_path / "node")])
        err = capsys.readouterr().err
        assert status == 2 and len(err.strip().splitlines()) == 1, err
        assert "does not run EVM shanghai (no PUSH0 opcode" in err


def test_the_probe_tells_shanghai_from_cancun_on_one_chain():
    with start_anvil(hardfork="shanghai", accounts=1) as shanghai:
        w3 = connect(shanghai.url)  # the artifact's target runs: no error
        check_evm_target(w3, shanghai.url, "paris")  # an older target needs no probe
        with pytest.raises(UnsupportedEVM, match="no MCOPY opcode"):
            check_evm_target(w3, shanghai.url, "cancun")
        with pytest.raises(LedgerError, match="unknown EVM target"):
            check_evm_target(w3, shanghai.url, "osaka")
