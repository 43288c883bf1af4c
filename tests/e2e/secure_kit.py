"""What the secure-aggregation e2e tests share: a run folder with one MASKED frame of its archive
altered, for `swarm verify` to catch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from node.chain.anvil import start_anvil
from node.chain.client import LedgerClient, connect
from node.chain.records import Commitment


def altered_masked_copy(run: Path, copy: Path, r: int) -> Commitment:
    """`run` copied to `copy` with one byte flipped in the MASKED frame of round r's second
    committer (read from the run's saved chain); that committer's commitment."""
    shutil.copytree(run, copy)
    info = json.loads((copy / "run.json").read_text())
    with start_anvil(load_state=copy / "chain" / "state.json", chain_id=info["chain_id"]) as anvil:
        sender = LedgerClient(connect(anvil.url), info["ledger"]).commitments(r)[1]
    digest = bytes(sender.digest).hex()  # its MASKED frame
    path = copy / "archive" / digest[:2] / digest
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return sender
