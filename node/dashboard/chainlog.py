"""The ledger's events, read while `swarm up` or `swarm node` runs (with or without a live page)
and kept in `<folder>/chain-events.jsonl`, so the page can show them and `swarm dashboard --run
DIR` still can after the chain has stopped. `stop()` reads once more first: the run's last events
(its final round's) are in the file although they came after the previous read.

A thread of its own: web3 is synchronous and the peer's trio loop must not wait for it. The file
is rewritten from the ledger's deploy block whenever the log starts, so a workdir reused for
another run holds only this ledger's events. Event values come from the chain (hostile): they are
decoded by the contract's ABI, and every byte string is shown as bounded hex or text."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eth_utils import event_abi_to_log_topic
from web3 import Web3

from node.chain.client import LedgerClient, connect, load_artifact
from node.chain.kind import ledger_kind
from node.chain.pipelined import PipelinedClient, load_pipelined_artifact
from node.dashboard.snapshot import EVENTS_FILE
from node.runfiles import MetricsWriter

log = logging.getLogger(__name__)

MAX_TEXT = 120  # characters of a byte string kept for the page (a mechanism's JSON, a signature)
POLL_SECONDS = 1.0  # with a live page
QUIET_POLL_SECONDS = 5.0  # without one: the file is read after the run (and `stop()` reads once more)
CHUNK_BLOCKS = 5_000  # blocks per eth_getLogs request (public RPCs cap the range)


def _plain(value: Any) -> Any:
    """An event argument as a bounded JSON value: bytes as hex (or text when it is printable JSON
    such as a mechanism), integers past 2^53 as strings (JavaScript numbers lose them)."""
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
        if raw[:1] == b"{" and raw.isascii():
            text = raw.decode("ascii")
        else:
            text = "0x" + raw.hex()
        return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**53 else str(value)
    return str(value)[:MAX_TEXT]


class ChainEventLog:
    """Poll the ledger's logs every `poll` seconds and append them, decoded, to the folder's events file.
    `source()` gives (rpc_url, ledger address) once they are known (a `swarm up` run writes
    run.json only after deploying), or None meanwhile."""

    def __init__(
        self, folder: Path, source: Callable[[], tuple[str, str] | None], *, poll: float = POLL_SECONDS
    ) -> None:
        self.folder = Path(folder)
        self.source = source
        self.poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chain-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Read the chain once more, then end (waiting at most `timeout` s: a chain that stopped
        answering must not hold up the command's exit)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            last = self._stop.is_set()  # set before this pass: it is the last one
            where = self.source()
            if where is not None:
                try:
                    self._follow(*where)
                    return
                except Exception as exc:  # the chain went away or answered nonsense: try again
                    log.info("chain events: %s", exc)
            if last:
                return
            self._stop.wait(self.poll)

    def _follow(self, rpc_url: str, address: str) -> None:
        w3 = connect(rpc_url, timeout=5.0, check_evm=False)  # read only: any EVM serves logs
        # either ledger kind (`swarm up` deploys the config's): its own client and its artifact's events
        pipelined = ledger_kind(w3, address) == "pipelined"
        ledger = PipelinedClient(w3, address) if pipelined else LedgerClient(w3, address)
        artifact = load_pipelined_artifact() if pipelined else load_artifact()
        abi = [item for item in artifact["abi"] if item.get("type") == "event"]
        events = {event_abi_to_log_topic(item): getattr(ledger.contract.events, item["name"])() for item in abi}
        next_block = ledger.params().deploy_block
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / EVENTS_FILE).unlink(missing_ok=True)
        with MetricsWriter(self.folder / EVENTS_FILE) as out:
            while True:
                last = self._stop.is_set()
                try:
                    latest = int(w3.eth.block_number)
                    while next_block <= latest:
                        end = min(latest, next_block + CHUNK_BLOCKS - 1)
                        for record in self._read(w3, address, events, next_block, end):
                            out.write(record)
                        next_block = end + 1
                except Exception as exc:  # transient (or the chain stopped after the run): keep polling
                    log.debug("chain events: %s", exc)
                if last:
                    return
                self._stop.wait(self.poll)

    @staticmethod
    def _read(w3: Web3, address: str, events: dict[bytes, Any], start: int, end: int) -> list[dict[str, Any]]:
        logs = w3.eth.get_logs({"address": Web3.to_checksum_address(address), "fromBlock": start, "toBlock": end})
        records = []
        for entry in sorted(logs, key=lambda e: (e["blockNumber"], e["logIndex"])):
            topics = entry["topics"]
            event = events.get(bytes(topics[0])) if topics else None
            if event is None:
                continue  # not an event of the artifact's ABI
            try:
                decoded = event.process_log(entry)
            except Exception:  # malformed log data: not shown
                continue
            records.append(
                {
                    "block": int(entry["blockNumber"]),
                    "log_index": int(entry["logIndex"]),
                    "event": str(decoded["event"]),
                    "args": {str(k): _plain(v) for k, v in decoded["args"].items()},
                }
            )
        return records
