"""Does this chain run the EVM the contract was compiled for? Asked of the chain itself.

The artifact records its target (`settings.evmVersion`, written by scripts/compile_contracts.py).
Code compiled for a newer EVM than the chain runs deploys fine and then fails at its first call
with "invalid opcode" (seen: a cancun build's MCOPY on Ganache, whose newest hardfork is
shanghai). So before deploying or joining, `check_evm_target` runs a few bytes of creation code
in an `eth_call` (nothing is sent or mined): one that uses the newest opcode of the target and
returns 0x2a. A chain whose configured hardfork lacks the opcode answers with an error instead.

Why a probe rather than `web3_clientVersion`: the version names a client, not the hardfork it
runs (anvil --hardfork, ganache --chain.hardfork, a private chain's genesis config), and a
gateway may hide it. A baseline probe without the new opcode must succeed first, so an RPC that
refuses creation calls altogether is reported as "cannot tell" (a warning), not as too old.
"""

from __future__ import annotations

import logging
from typing import Any

from eth_typing import HexStr
from web3 import Web3

from node.chain.errors import LedgerError, LedgerUnavailable
from node.chain.retries import with_retries

log = logging.getLogger("swarm.chain")

EXPECTED = b"\x2a"
# Creation code that stores 0x2a at memory 0 and returns that one byte, with only pre-shanghai opcodes:
# PUSH1 2a PUSH1 00 MSTORE8 PUSH1 01 PUSH1 00 RETURN
BASELINE_PROBE = "0x602a60005360016000f3"
# The same through the newest opcode of each target. Targets that added no opcode (paris: PREVRANDAO
# reuses DIFFICULTY's byte; london's BASEFEE is older than any chain that runs a current client) need
# no probe beyond the baseline.
PROBES: dict[str, str | None] = {
    "london": None,
    "paris": None,
    # PUSH0 (0x5f): PUSH1 2a PUSH0 MSTORE8 PUSH1 01 PUSH0 RETURN
    "shanghai": "0x602a5f5360015ff3",
    # MCOPY (0x5e) copies the byte from 32 to 0: PUSH1 2a PUSH1 20 MSTORE8
    # PUSH1 01 PUSH1 20 PUSH0 MCOPY (dst 0, src 32, len 1) PUSH1 01 PUSH0 RETURN
    "cancun": "0x602a602053600160205f5e60015ff3",
}
NEWEST_OPCODE = {"shanghai": "PUSH0", "cancun": "MCOPY"}


class UnsupportedEVM(LedgerError):
    """The chain does not run the EVM version the contract was compiled for."""


def artifact_evm_version(artifact: dict[str, Any]) -> str:
    """The EVM version the artifact was compiled for (its `settings.evmVersion`)."""
    settings = artifact.get("settings")
    version = settings.get("evmVersion") if isinstance(settings, dict) else None
    if not isinstance(version, str) or version not in PROBES:
        raise LedgerError(
            f"the contract artifact records no known EVM target ({version!r}; known: {', '.join(PROBES)}): "
            "rebuild it with python scripts/compile_contracts.py"
        )
    return version


def _runs(w3: Web3, creation_code: str) -> tuple[bool, str]:
    """(whether the chain ran `creation_code` in an eth_call and returned 0x2a, what it said)."""
    try:
        answer = bytes(with_retries(lambda: w3.eth.call({"data": HexStr(creation_code)}), what="EVM probe"))
    except LedgerUnavailable:
        raise  # no answer at all is not an answer about the EVM
    except Exception as exc:  # an error answer is the chain saying no; the caller tells the kinds apart
        return False, f"{type(exc).__name__}: {exc}"
    return answer == EXPECTED, f"returned 0x{answer.hex()}"


def check_evm_target(w3: Web3, rpc_url: str, target: str) -> None:
    """Raise UnsupportedEVM if the chain at `rpc_url` cannot run code compiled for `target`.

    Logs a warning (and returns) when even the baseline probe fails: the RPC refuses creation
    calls, so the chain's support cannot be told and the first contract call will."""
    probe = PROBES.get(target)
    if target not in PROBES:
        raise LedgerError(f"unknown EVM target {target!r} (known: {', '.join(PROBES)})")
    if probe is None:
        return
    supported, said = _runs(w3, probe)
    if supported:
        return
    baseline, baseline_said = _runs(w3, BASELINE_PROBE)
    if not baseline:
        log.warning(
            "cannot tell whether %s runs EVM %s: it refused a plain eth_call of creation code (%s)",
            rpc_url,
            target,
            baseline_said[:200],
        )
        return
    raise UnsupportedEVM(
        f"the chain at {rpc_url} does not run EVM {target} (no {NEWEST_OPCODE[target]} opcode: {said[:120]}), "
        f"which the SwarmLedger contract is compiled for: start the chain with hardfork {target} or newer "
        f"(anvil --hardfork {target}, ganache --chain.hardfork {target}), or use another chain"
    )
