"""The compile pipeline, the in-process provider, the Anvil launcher and the key loading."""

from __future__ import annotations

import importlib.util
import json
import stat
from pathlib import Path

import pytest

from node.chain import client, errors, keys, records
from node.chain.anvil import start_anvil
from node.protocol import wire

ROOT = Path(__file__).resolve().parents[3]


def _compile_module():
    spec = importlib.util.spec_from_file_location("compile_contracts", ROOT / "scripts" / "compile_contracts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_artifact_is_fresh():
    compiler = _compile_module()
    committed = json.loads(compiler.ARTIFACT.read_text())
    assert committed["sourceSha256"] == compiler.hashlib.sha256(compiler.SOURCE.read_bytes()).hexdigest(), (
        "contracts/SwarmLedger.sol changed: run python scripts/compile_contracts.py"
    )
    fresh = compiler.compile_artifact()
    assert compiler.same_build(committed, fresh), "stale artifact: run python scripts/compile_contracts.py"
    assert committed["compiler"]["version"].startswith("0.8.28")


def test_in_process_provider_smoke():
    from eth_account import Account
    from eth_tester import EthereumTester
    from web3 import EthereumTesterProvider, Web3

    tester = EthereumTester()
    w3 = Web3(EthereumTesterProvider(tester))
    keys_ = [Account.from_key(k) for k in ("0x" + "11" * 32, "0x" + "22" * 32)]
    for account in keys_:
        w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": account.address, "value": 10**20})
    genesis = bytes.fromhex("ab" * 32)
    deployer = client.LedgerClient.deploy(
        w3,
        keys_[0],
        min_peers=2,
        commit_window=10,
        attest_window=2,
        commit_window_seconds=30,
        attest_window_seconds=30,
        eps_cap_micro=10,
        delta=1e-5,
        genesis_digest=genesis,
    )
    peers = [deployer, client.LedgerClient(w3, deployer.address, keys_[1])]
    for i, peer in enumerate(peers):
        peer.register(b"p%d" % i, b"")
    peers[0].commit(1, bytes([2]) * 32, 7, 3, b'{"name":"gaussian"}')
    with pytest.raises(errors.CommitWindowOpen):
        deployer.close_round(1)
    peers[1].commit(1, bytes([3]) * 32, 7, 3, b'{"name":"gaussian"}')
    deployer.close_round(1)  # every registered peer committed: no need to wait for the window
    for peer in peers:
        peer.attest(1, b"\x09" * 32, b"\x03")
    assert deployer.round_info(1).state is records.RoundState.FINALIZED
    assert deployer.params().delta == pytest.approx(1e-5)
    assert deployer.snapshot()["rounds"][0]["commitments"][0]["protects"] == records.NO_GUARANTEE


def test_describe_mechanism_takes_protects_from_the_guarantee_never_from_the_json():
    assert records.describe_mechanism(b'{"name":"pnpm","epsilon":1}')["protects"].startswith("sign only")
    # a peer's own "protects" field never upgrades the label: PNPM with "protects": "value" builds
    # no mechanism (an unknown parameter), so it protects nothing, never "the values"
    forged = records.describe_mechanism(b'{"name":"pnpm","epsilon":1,"protects":"value"}')["protects"]
    assert forged == records.NO_GUARANTEE
    assert records.describe_mechanism(b'{"name":"duchi","epsilon":1}')["protects"] == "the values"
    for bad in (b'{"name":"x","protects":"whole update"}', b'{"name":"brand-new"}', b'{"name":"pnpm","eps":1}'):
        assert records.describe_mechanism(bad)["protects"] == records.NO_GUARANTEE, bad
    assert records.describe_mechanism(b"\xff not json")["name"] == "unparsed"
    assert records.describe_mechanism(b"[1, 2]")["name"] == "unparsed"
    assert wire.decode_bitmap(wire.encode_bitmap([True, False, True] * 3), 9) == [True, False, True] * 3


def test_anvil_dump_and_reload(tmp_path):
    with start_anvil(accounts=1) as anvil:
        anvil.mine(5)
        assert anvil.block_number() == 5
        state = anvil.dump_state(tmp_path / "chain.json")
    assert anvil.process.poll() is not None  # stopped on exit
    with start_anvil(load_state=state, accounts=1) as again:
        assert again.block_number() == 5
    with pytest.raises(ValueError, match="load_state"):
        start_anvil(load_state=tmp_path / "missing.json")


def test_keys_env_then_keystore(tmp_path, monkeypatch):
    monkeypatch.delenv(keys.PRIVATE_KEY_ENV, raising=False)
    monkeypatch.setenv(keys.PASSWORD_ENV, "correct horse")
    path = tmp_path / "ks" / "keystore.json"
    with pytest.raises(keys.AccountLoadError, match="create"):
        keys.load_account(path)
    created = keys.load_account(path, create=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert created.key.hex() not in path.read_text()  # encrypted
    assert keys.load_account(path).address == created.address
    monkeypatch.setenv(keys.PASSWORD_ENV, "wrong")
    with pytest.raises(keys.AccountLoadError, match="wrong password"):
        keys.load_account(path)
    monkeypatch.setenv(keys.PRIVATE_KEY_ENV, "0x" + "33" * 32)
    assert keys.load_account(path).key.hex().removeprefix("0x") == "33" * 32
    monkeypatch.setenv(keys.PRIVATE_KEY_ENV, "not a key")
    with pytest.raises(keys.AccountLoadError, match="SWARM_PRIVATE_KEY"):
        keys.load_account(path)


# Opcodes newer than shanghai (cancun): chains that stop at shanghai (Ganache 7) reject them.
POST_SHANGHAI = {0x49: "BLOBHASH", 0x4A: "BLOBBASEFEE", 0x5C: "TLOAD", 0x5D: "TSTORE", 0x5E: "MCOPY"}


def _opcodes(code: bytes) -> list[int]:
    """The opcodes of EVM code, PUSH data skipped, the trailing CBOR metadata left out."""
    metadata = int.from_bytes(code[-2:], "big") + 2
    code, ops, i = code[:-metadata], [], 0
    while i < len(code):
        op = code[i]
        ops.append(op)
        i += 1 + (op - 0x5F if 0x60 <= op <= 0x7F else 0)
    return ops


def test_artifact_targets_shanghai_and_uses_no_newer_opcode():
    artifact = client.load_artifact()
    assert artifact["settings"]["evmVersion"] == "shanghai"
    for field in ("bytecode", "deployedBytecode"):
        code = bytes.fromhex(artifact[field].removeprefix("0x"))
        used = {POST_SHANGHAI[op] for op in _opcodes(code) if op in POST_SHANGHAI}
        assert not used, f"{field} uses {sorted(used)}"
    # the walk itself sees MCOPY where it is: a tiny cancun-style snippet
    assert 0x5E in _opcodes(bytes([0x60, 0x5E, 0x5E, 0x00]) + bytes([0xA1, 0x00, 0x01]))
