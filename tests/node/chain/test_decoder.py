"""Revert data is found wherever a client puts it: Anvil's `data`, eth-tester's nested causes,
and Ganache's `{"message": ..., "result": "0x..."}` in the exception's arguments."""

from __future__ import annotations

import json
from importlib import resources

from eth_abi import encode
from eth_utils import keccak

from node.chain import errors
from node.chain.decoder import RevertDecoder
from node.chain.records import RoundState


def _decoder() -> RevertDecoder:
    artifact = json.loads(resources.files("node.chain").joinpath("artifacts/SwarmLedger.json").read_text())
    return RevertDecoder(artifact["abi"])


def _round_not_closed(round_: int, state: RoundState) -> str:
    selector = keccak(text="RoundNotClosed(uint64,uint8)")[:4]
    return "0x" + (selector + encode(["uint64", "uint8"], [round_, int(state)])).hex()


def test_ganache_revert_data_in_a_dict_argument_is_decoded():
    data = _round_not_closed(3, RoundState.OPEN)
    exc = ValueError("VM Exception while processing transaction: revert", {"message": "revert", "result": data})
    found = _decoder().from_exception(exc)
    assert isinstance(found, errors.RoundNotClosed), found
    assert "round 3" in str(found) and "OPEN" in str(found)


def test_anvil_style_data_attribute_and_nested_cause_still_decode():
    data = _round_not_closed(5, RoundState.OPEN)

    class RpcError(Exception):
        def __init__(self) -> None:
            super().__init__("execution reverted")
            self.data = data

    outer = RuntimeError("send failed")
    outer.__cause__ = RpcError()
    found = _decoder().from_exception(outer)
    assert isinstance(found, errors.RoundNotClosed) and "round 5" in str(found)


def test_a_dict_without_revert_data_decodes_to_nothing():
    assert _decoder().from_exception(ValueError("boom", {"message": "out of gas"})) is None
