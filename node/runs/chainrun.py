"""The chain side of a run folder, shared by `swarm up` (`LocalSwarm`) and `swarm simulate
--ledger` (`ChainRecorder`): start Anvil on loopback, archive the genesis blob, deploy the ledger
(a SwarmLedger, or for `swarm up` with chain.ledger_kind = pipelined a PipelinedLedger) from
Anvil's first dev account, write run.json, and dump the chain's state into the folder so
`swarm verify --run DIR` can re-check the run after the chain has stopped.

    out/run.json          ledger address, chain id, RPC URL, start time, plus the caller's fields
    out/archive/          every blob of the run (content-addressed), the genesis first
    out/chain/state.json  the chain's state (Anvil dump)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from node.chain.anvil import Anvil, start_anvil
from node.chain.client import LedgerClient, connect
from node.chain.pipelined import PipelinedClient
from node.config import LEDGER_KINDS
from node.protocol.blob import sha256
from node.runfiles import write_json_atomic
from p2p.store import DiskBlobStore


@dataclass(frozen=True)
class LedgerTerms:
    """The swarm parameters fixed at deployment (the genesis digest comes from the genesis blob)."""

    min_peers: int
    commit_window: int  # blocks
    attest_window: int  # blocks
    commit_window_seconds: int  # the window ends once its blocks and its seconds have passed
    attest_window_seconds: int
    eps_cap_micro: int
    delta: float
    max_samples: int  # cap on a commit's numSamples, the genesis's (node.derive.max_samples)
    eps_step_micro: int = 0  # what one release spends under the policy (0: not a constant)
    record_eps_cap_micro: int = 0  # record-level (DP-SGD) cap; 0 = no DP-SGD
    record_delta: float = 0.0
    secure_aggregation: bool = False  # postFrame and acknowledge taken (docs/SECAGG.md)


class RunChain:
    """A local Anvil with a freshly deployed ledger, owned by one run folder. Account 0 deploys;
    peer i sends from account i + 1 (`peer_account`). Use as a context manager or call `close()`."""

    def __init__(
        self,
        out: Path,
        genesis_blob: bytes,
        terms: LedgerTerms,
        *,
        peers: int,
        block_time: float | None = None,
        mixed_mining: bool = False,
        ledger_kind: str = "swarm",
    ) -> None:
        if ledger_kind not in LEDGER_KINDS:
            raise ValueError(f"ledger_kind is one of {', '.join(LEDGER_KINDS)}, not {ledger_kind!r}")
        if ledger_kind == "pipelined" and terms.secure_aggregation:
            raise ValueError("a pipelined ledger has no secure-aggregation steps")
        self.out = Path(out)
        (self.out / "chain").mkdir(parents=True, exist_ok=True)
        self.archive = DiskBlobStore(self.out / "archive")
        self.archive.put(genesis_blob)
        self.anvil: Anvil = start_anvil(block_time=block_time, accounts=peers + 1, mixed_mining=mixed_mining)
        try:
            self.w3 = connect(self.anvil.url)
            self.chain_id = int(self.w3.eth.chain_id)
            self.ledger = _deploy(
                self.w3, Account.from_key(self.anvil.private_keys[0]), genesis_blob, terms, ledger_kind
            )
        except BaseException:
            self.anvil.stop()
            raise

    def peer_key(self, i: int) -> str:
        """Peer i's private key: an Anvil dev key, public knowledge, for local chains only."""
        return self.anvil.private_keys[i + 1]

    def peer_account(self, i: int) -> LocalAccount:
        return Account.from_key(self.peer_key(i))

    def write_run_info(self, **fields: object) -> dict:
        """Write run.json: where the ledger is, plus `fields` (config, peers, ...); returns it."""
        info = {
            "ledger": self.ledger.address,
            "chain_id": self.chain_id,
            "rpc_url": self.anvil.url,
            "started": time.time(),
            **fields,
        }
        write_json_atomic(self.out / "run.json", info)
        return info

    def save_state(self) -> None:
        self.anvil.dump_state(self.out / "chain" / "state.json")

    def close(self) -> None:
        self.anvil.stop()

    def __enter__(self) -> RunChain:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _deploy(
    w3: Web3, account: LocalAccount, genesis_blob: bytes, terms: LedgerTerms, ledger_kind: str
) -> LedgerClient | PipelinedClient:
    """The run's ledger of `ledger_kind`, deployed from `account` with `terms`."""
    # LedgerTerms' fields are the deploy functions' keyword arguments; only a SwarmLedger takes secure_aggregation
    common: dict[str, Any] = {k: v for k, v in asdict(terms).items() if k != "secure_aggregation"}
    common["genesis_digest"] = sha256(genesis_blob)
    if ledger_kind == "pipelined":
        return PipelinedClient.deploy(w3, account, **common)
    return LedgerClient.deploy(w3, account, secure_aggregation=terms.secure_aggregation, **common)
