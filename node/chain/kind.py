"""Which ledger contract runs at an address: SwarmLedger (three transactions a round) or the
pipelined PipelinedLedger (one), told by the deployed runtime code against each shipped artifact's
deployedBytecode with the immutables masked out (the constructor's settings live there, so two
deployments of one contract differ only inside them). `swarm node` builds its client and round
loop from the answer, `swarm verify` its checks; an address holding no code or other code is a
`LedgerError` naming it, before anything reads or sends."""

from __future__ import annotations

from typing import Any, Literal

from web3 import Web3

from node.chain.client import load_artifact
from node.chain.errors import LedgerError
from node.chain.pipelined import load_pipelined_artifact
from node.chain.retries import with_retries

LedgerKind = Literal["swarm", "pipelined"]
CONTRACT_NAMES: dict[str, str] = {"swarm": "SwarmLedger", "pipelined": "PipelinedLedger"}


def ledger_kind(w3: Web3, address: str) -> LedgerKind:
    """The kind of ledger deployed at `address`; `LedgerError` when it holds no code, or code that
    is neither shipped artifact's (another contract, an older build, a patched one)."""
    checksum = Web3.to_checksum_address(address)
    code = bytes(with_retries(lambda: w3.eth.get_code(checksum), what="get_code"))
    if not code:
        chain_id = with_retries(lambda: w3.eth.chain_id, what="chain_id")
        raise LedgerError(f"no contract at {checksum} on chain {chain_id}: not a ledger address")
    artifacts: dict[LedgerKind, dict[str, Any]] = {"swarm": load_artifact(), "pipelined": load_pipelined_artifact()}
    for kind, artifact in artifacts.items():
        expected = bytes.fromhex(artifact["deployedBytecode"].removeprefix("0x"))
        if not masked_code_differences(code, expected, artifact.get("immutableReferences", {})):
            return kind
    names = " nor a ".join(CONTRACT_NAMES.values())
    raise LedgerError(
        f"the contract at {checksum} is neither a {names} of this version ({len(code)} bytes of code that "
        "match neither artifact): not a swarm's ledger, or one deployed by another version of this software"
    )


def masked_code_differences(code: bytes, expected: bytes, references: dict[str, list[dict[str, int]]]) -> list[str]:
    """What differs between deployed runtime `code` and an artifact's `expected` deployedBytecode
    once the immutables (`references`: the artifact's immutableReferences) are zeroed in both."""
    if not references:
        return ["the contract artifact records no immutableReferences: run python scripts/compile_contracts.py"]
    if len(code) != len(expected):
        return [f"the code at the ledger address is {len(code)} bytes, the artifact's {len(expected)}"]
    masked, reference = bytearray(code), bytearray(expected)
    for refs in references.values():
        for ref in refs:
            masked[ref["start"] : ref["start"] + ref["length"]] = bytes(ref["length"])
            reference[ref["start"] : ref["start"] + ref["length"]] = bytes(ref["length"])
    if masked != reference:
        first = next(i for i, (a, b) in enumerate(zip(masked, reference)) if a != b)
        return [f"the code at the ledger address differs from the artifact's deployedBytecode (first at byte {first})"]
    return []
