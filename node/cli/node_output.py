"""What `swarm node` prints while its peer runs: the addresses to give to other peers, one line
per round, warnings about shared training data, and a summary at the end.

The peer writes `<workdir>/peer.json` once its host listens and one line per round to
`<workdir>/metrics.jsonl` (node/peer/runner.py); `NodeReporter` follows those files from a thread
of its own, so the peer's event loop never waits for the terminal or for the reporter's chain reads.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from node.peer.addresses import tcp_endpoint as tcp_endpoint  # re-exported: the tests and callers use it here
from node.peer.addresses import tcp_problem

log = logging.getLogger("swarm.node.output")

Say = Callable[[str], None]
# round -> [(committer address, numSamples)] from the chain, in commit order
CommitmentReader = Callable[[int], list[tuple[str, int]]]


def format_start(info: dict[str, Any]) -> list[str]:
    """The lines printed once the peer listens, from its peer.json."""
    from node.peer.addresses import is_loopback

    addrs = [str(a) for a in info.get("addrs", [])]
    shareable = [a for a in addrs if not is_loopback(a)] or addrs
    lines = [f"peer id {info.get('peer_id')}", f"eth address {info.get('address')}"]
    lines += [f"listening on {a}" for a in addrs]
    if shareable:
        lines.append(f"other peers join with: --bootstrap {shareable[0]}")
    return lines


def _eps(record: dict[str, Any]) -> str:
    eps = record.get("eps_cumulative")
    if eps is None:
        return "eps -"
    text = (
        f"eps {eps:.4g} (delta {record.get('delta_cumulative') or 0:g}, {record.get('eps_protects') or 'whole update'})"
    )
    if record.get("record_eps_cumulative") is not None:
        text += (
            f", record-level eps {record['record_eps_cumulative']:.4g} (delta {record.get('record_delta') or 0:g}, "
            f"each training record)"
        )
    return text


def format_round(record: dict[str, Any], rounds: int) -> str:
    """One metrics record of the peer (a RoundOutcome) as one line."""
    included = record.get("included")
    accuracy = record.get("accuracy")
    parts = [
        f"round {record.get('round')}/{rounds}: {record.get('state')}",
        "committed" if record.get("committed") else "followed (no commit)",
        f"{included} peers included" if included is not None else "included -",
        f"accuracy {accuracy:.4f}" if accuracy is not None else "accuracy -",
        _eps(record),
    ]
    return ", ".join(parts)


def format_summary(records: Sequence[dict[str, Any]], rounds: int) -> str:
    if not records:
        return "finished: this peer played no round"
    finalized = sum(r.get("state") == "finalized" for r in records)
    aborted = sum(r.get("state") == "aborted" for r in records)
    committed = sum(bool(r.get("committed")) for r in records)
    accuracies = [r["accuracy"] for r in records if r.get("accuracy") is not None]
    spent = [r for r in records if r.get("eps_cumulative") is not None]
    return (
        f"finished: {len(records)} of {rounds} rounds played here ({finalized} finalized, {aborted} aborted), "
        f"committed in {committed}; final accuracy "
        + (f"{accuracies[-1]:.4f}" if accuracies else "-")
        + f"; {_eps(spent[-1]) if spent else 'eps -'} spent in total"
    )


def same_data_suspects(commitments: list[tuple[str, int]], me: str, partitioned: bool) -> list[tuple[str, int]]:
    """Other committers whose numSamples equal this peer's while this peer trains on the whole
    dataset (no --partition): they most likely train on the same shared files. Equal counts are
    normal between distinct IID shards, so a partitioned peer is never a suspect's witness."""
    mine = [n for who, n in commitments if who.lower() == me.lower()]
    if partitioned or not mine:
        return []
    return [(who, n) for who, n in commitments if who.lower() != me.lower() and n == mine[0]]


class NodeReporter:
    """Follows a peer's workdir files from a daemon thread and prints what happens."""

    def __init__(
        self,
        workdir: Path,
        *,
        rounds: int,
        say: Say,
        warn: Say,
        commitments: CommitmentReader | None = None,
        partitioned: bool = True,
        bootstrap: Sequence[str] = (),
        bootstrap_grace: float = 20.0,
        bootstrap_timeout: float = 0.0,
        poll: float = 0.5,
    ) -> None:
        self.workdir, self.rounds, self.say, self.warn = workdir, rounds, say, warn
        self.commitments, self.partitioned, self.poll_interval = commitments, partitioned, poll
        self.bootstrap, self.bootstrap_grace = list(bootstrap), bootstrap_grace
        self.bootstrap_timeout = bootstrap_timeout  # when the peer gives up (node.peer.runner): for the warning
        self.records: list[dict[str, Any]] = []
        self.address: str | None = None
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # stop() polls once more while the thread may be polling
        self._threads: list[threading.Thread] = []
        # A previous run's peer.json names addresses that may be gone; metrics are appended across
        # runs, so only lines written from now on are this run's.
        (workdir / "peer.json").unlink(missing_ok=True)
        metrics = workdir / "metrics.jsonl"
        self._offset = metrics.stat().st_size if metrics.exists() else 0

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._follow, name="swarm-node-output", daemon=True)]
        if self.bootstrap:
            self._threads.append(threading.Thread(target=self._check_bootstrap, name="swarm-bootstrap", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._poll()  # the last round's line, written just before the peer returned

    def summary(self) -> str:
        return format_summary(self.records, self.rounds)

    def _follow(self) -> None:
        while not self._stop.wait(self.poll_interval):
            self._poll()

    def _poll(self) -> None:
        with self._lock:
            try:
                self._poll_files()
            except Exception as exc:  # printing must never take the peer down
                log.debug("reporter: %s", exc)

    def _poll_files(self) -> None:
        if self.address is None:
            try:
                info = json.loads((self.workdir / "peer.json").read_text())
            except (OSError, ValueError):
                info = None
            if isinstance(info, dict):
                self.address = str(info.get("address"))
                for line in format_start(info):
                    self.say(line)
        path = self.workdir / "metrics.jsonl"
        if not path.exists():
            return
        with path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self._offset += len(complete)
        for line in complete.decode("utf-8", "replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "round" in record:
                self.records.append(record)
                self.say(format_round(record, self.rounds))
                self._check_samples(int(record["round"]))

    def _check_samples(self, r: int) -> None:
        if self.commitments is None or self.address is None or self.partitioned:
            return
        try:
            commitments = self.commitments(r)
        except Exception as exc:  # a chain hiccup: the next round checks again
            log.debug("reporter: commitments of round %d unreadable: %s", r, exc)
            return
        for who, n in same_data_suspects(commitments, self.address, self.partitioned):
            if who.lower() not in self._warned:
                self._warned.add(who.lower())
                self.warn(
                    f"warning: round {r}: {who} committed {n:,} samples, as many as this peer, which trains on "
                    "the whole dataset (no --partition): the peers likely train on the same data; give each "
                    "peer its own shard with --partition i/N"
                )

    def _check_bootstrap(self) -> None:
        """Warn about bootstrap peers whose TCP port stays unreachable for `bootstrap_grace`
        seconds (they may still be starting, so not at once; the peer keeps re-dialing them)."""
        pending = {addr: "not tried" for addr in self.bootstrap}
        deadline = time.monotonic() + self.bootstrap_grace
        while pending and not self._stop.is_set():
            for addr in list(pending):
                problem = tcp_problem(addr)
                if problem is None:
                    del pending[addr]
                else:
                    pending[addr] = problem
            if time.monotonic() >= deadline:
                break
            self._stop.wait(1.0)
        if self._stop.is_set():
            return
        keeps = "this peer keeps trying"
        if self.bootstrap_timeout > 0:
            keeps += f"; with no peer at all it stops after {self.bootstrap_timeout:g} s (--bootstrap-timeout)"
        for addr, problem in pending.items():
            self.warn(
                f"warning: bootstrap peer {addr} is unreachable ({problem}) after {self.bootstrap_grace:.0f} s: "
                f"check its address, that it runs and that its port is open to this host ({keeps})"
            )


class Libp2pOneLine(logging.Filter):
    """Without -v, py-libp2p's records are one line each, and its "Failed to open stream" blocks
    (nine lines and a lock-registry dump whenever a peer went away) and "Failed to open TCP stream"
    lines (one per dial of a peer that does not answer) are dropped: the blob fetch retries another
    holder, the host re-dials bootstrap peers, and the peer reports in its own terms what it could
    not fetch and which bootstrap peer it cannot reach (a warning, then one error line)."""

    DROPPED = ("Failed to open stream", "Failed to open TCP stream")

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("libp2p"):
            return True
        message = record.getMessage()
        if message.startswith(self.DROPPED):
            return False
        record.msg, record.args = message.splitlines()[0] if message else message, None
        record.exc_info = record.exc_text = None
        return True
