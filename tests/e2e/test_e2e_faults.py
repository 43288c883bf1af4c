"""The fault suite: real Anvil, real `swarm node` processes, real SIGKILLs and a
real RPC outage. Two swarm runs hold every scenario, to keep the suite cheap:

1. six peers, six rounds: two peers killed at once (a third of the swarm) while one of them
   trains; an honest peer killed once it committed and before the round closed; in the same round
   a peer that served other bytes than it committed is frozen there (SIGSTOP: a hung peer, whose
   blob nobody can have), and another honest peer is killed as it fetches, the frozen one with it
   (honest blobs are already here, since peers fetch the blobs of an open round as their commits
   land, and a blob its committer claimed and does not serve is withheld within a second, so the
   step is short: the victim is frozen at the first phase it shows past the close, fetching if
   the test saw it in time, else a later one of that round); in a later round a peer killed after
   it attested (peer 4 if its vote got in, else another: a majority of six is four votes). Every
   killed peer is restarted from its workdir (same keys, store, accountant; the byzantine one
   honest) and follows the swarm to its last finalized model.
2. three peers behind a TCP proxy in front of Anvil, which the test cuts for 30 s mid-round.

What must hold in both: every round ends (finalized or aborted, none stuck), the swarm reaches its
last round, every peer exits 0, no committed eps is lost (each peer's on-chain eps never decreases
while the test watches; its accountant file holds exactly its commits on chain, sample count by
sample count, and the chain's cumulative eps is its last commit's), and no blob is lost: every blob
a peer committed (included or not, in finalized or aborted rounds) is in its own store at the end
and in the run's archive, whatever it held when it was killed is still there after its restart,
every finalized round's included blobs and aggregate are in the peers' stores, and `swarm verify`
holds. The one committed blob a crash may take is the one whose commit landed while the peer died
before writing it (phase "committing": the commit goes first, and its noise is never kept).

Phases are read from each peer's `<workdir>/status.json` (written by the peer on every phase
change) and from the chain. The suite waits on those events, never on how fast the machine is: a
victim is frozen (SIGSTOP) before the chain is read to check the phase it is in still holds, every
wait has a deadline of PATIENCE, and the windows leave a loaded peer the time to commit and vote
(a loaded machine is slow, not wrong: run it beside scripts/cpu_burner.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

import pytest

from mechanisms.record_level import DPSGDPolicy, RecordAccountant
from node.config import load_config
from node.protocol.wire import decode_bitmap
from node.runs.local import LocalSwarm, PeerProcess
from p2p.store import DiskBlobStore
from tests.e2e.tcpproxy import tcp_proxy

# slow; under load a run takes several times its 4 minutes alone: PATIENCE, not pytest's 600 s, bounds each wait
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

TINY = [
    "data.dataset=digits",
    "data.limit=600",
    "data.test_limit=200",
    "model.name=logreg",
    "train.epochs=1",
    "train.dp_sgd=true",  # a record-level accountant in every workdir, to check against the chain
    "chain.block_time=0.25",
]
OUTAGE_SECONDS = 30.0
PATIENCE = 900.0  # seconds: the longest the test waits for any one event (a loaded machine is slow, not wrong)
TICK_EVERY = 0.5  # seconds between two reads of every peer's eps while the test waits
# Windows in blocks of chain.block_time (0.25 s): the commit window is waited out only while a peer is
# down (a round closes as soon as every registered peer committed), the attestation window only by a
# round without a majority; both leave a peer that is slow to train or to vote on a loaded machine in.
WINDOWS = ["chain.commit_window=80", "chain.attest_window=80", "chain.fetch_timeout=8"]
BASELINE = Path(__file__).resolve().parents[2] / "scripts" / "baseline.toml"  # the settings TINY was tuned on

T = TypeVar("T")


def config(*sets: str):
    return load_config(BASELINE, [*TINY, *sets])


class Watch:
    """Polls the chain and the peers while a swarm runs: records every peer's on-chain eps at
    every tick (it must never decrease) and fails with the peers' logs on a timeout."""

    def __init__(self, swarm: LocalSwarm) -> None:
        self.swarm = swarm
        self.eps: dict[str, list[tuple[int, int]]] = {p.address: [] for p in swarm.peers}

    def tick(self) -> None:
        ledger = self.swarm.ledger
        for p in self.swarm.peers:
            self.eps[p.address].append((ledger.eps_spent(p.address), ledger.record_eps_spent(p.address)))

    def until(self, predicate: Callable[[], T | None], what: str, timeout: float = PATIENCE) -> T:
        """Until predicate() is truthy (read every 0.1 s, eps every TICK_EVERY); its value."""
        end = time.monotonic() + timeout
        ticked = 0.0
        while time.monotonic() < end:
            value = predicate()
            if value:
                return value
            if time.monotonic() - ticked >= TICK_EVERY:
                self.tick()
                ticked = time.monotonic()
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}\n{logs(self.swarm)}")

    def finish(self) -> None:
        """Until every peer process exited (the last round is over)."""
        self.until(lambda: not self.swarm.running(), "the peers to finish")
        self.tick()

    def assert_eps_never_decreased(self) -> None:
        for address, seen in self.eps.items():
            assert [e[0] for e in seen] == sorted(e[0] for e in seen), (address, seen)
            assert [e[1] for e in seen] == sorted(e[1] for e in seen), (address, seen)


def alive(p: PeerProcess) -> bool:
    return p.process is not None and p.process.poll() is None


def phase(p: PeerProcess) -> tuple[int, str]:
    status = p.status()
    return int(status.get("round", 0)), str(status.get("phase", ""))


def logs(swarm: LocalSwarm) -> str:
    parts = []
    for p in swarm.peers:
        code = p.process.poll() if p.process else None
        text = (p.workdir / "peer.log").read_text(errors="replace") if (p.workdir / "peer.log").exists() else ""
        lines = [line for line in text.splitlines() if "Failed to open TCP" not in line]
        parts.append(f"--- peer {p.index} ({'running' if code is None else f'exit {code}'})\n" + "\n".join(lines[-40:]))
    return "\n".join(parts)


Death = tuple[int, int, str, frozenset[str]]  # peer index, its round and phase then, the blobs its store held


def freeze(swarm: LocalSwarm, *indexes: int, resume: bool = False) -> None:
    """SIGSTOP (SIGCONT if `resume`): a frozen peer does nothing and answers nobody, as a hung one."""
    for i in indexes:
        process = swarm.peers[i].process
        assert process is not None and process.poll() is None, f"peer {i} must be running"
        process.send_signal(signal.SIGCONT if resume else signal.SIGSTOP)


def kill(swarm: LocalSwarm, *indexes: int) -> list[Death]:
    """SIGKILL, all at once, then reap. Returns what each victim had when it died: its round and
    phase (from its status file) and the blobs in its store (a dead process writes nothing more)."""
    processes = [swarm.peers[i].process for i in indexes]
    for process in processes:
        assert process is not None and process.poll() is None, "the victim must be running when it is killed"
        process.send_signal(signal.SIGKILL)
    for process in processes:
        assert process is not None
        process.wait()
    deaths = []
    for i in indexes:
        p = swarm.peers[i]
        r, ph = phase(p)
        deaths.append((i, r, ph, frozenset(DiskBlobStore(p.workdir / "blobs").digests())))
    return deaths


def swarm_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=PATIENCE)


def assert_the_swarm_survived(swarm: LocalSwarm, watch: Watch, rounds: int, deaths: Sequence[Death] = ()) -> list[str]:
    """The common checks after a run (every peer running at the end exited 0; `deaths`: what
    `kill` returned for each SIGKILL): rounds ended, eps, accountants, blobs, archive, verify.
    Returns the rounds' end states."""
    ledger = swarm.ledger
    params = ledger.params()
    codes = [p.process.returncode if p.process else None for p in swarm.peers]
    assert codes == [0] * len(codes), logs(swarm)
    assert ledger.current_round() == rounds + 1  # the swarm went on to its last round and past it
    states = [ledger.round_info(r).state.name for r in range(1, rounds + 1)]
    assert set(states) <= {"FINALIZED", "ABORTED"}, states  # none stuck
    assert states[-1] == "FINALIZED", states  # and it still learns at the end

    watch.assert_eps_never_decreased()
    committed: dict[int, list[str]] = {}  # each peer's committed blobs, oldest first
    for p in swarm.peers:  # no committed eps lost: the accountant file is the chain's history
        history = ledger.commit_history(p.address)
        committed[p.index] = [bytes(c.digest).hex() for c in history]
        saved = json.loads((p.workdir / "privacy-accountant.json").read_text())
        expected = RecordAccountant()
        for c in history:  # one (noise, sample rate, steps) row per commit, from its sample count
            expected.step_round(DPSGDPolicy.from_dict(saved["policy"]), c.num_samples)
        assert saved["history"] == expected.to_dict()["history"], (p.index, saved, history)
        assert saved["epsilon"] == pytest.approx(ledger.record_eps_spent(p.address) / 1e6, abs=2e-6), p.index
        assert history, p.index  # every peer committed at least once
        assert (ledger.eps_spent(p.address), ledger.record_eps_spent(p.address)) == (
            history[-1].eps_micro,
            history[-1].record_eps_micro,
        ), p.index
        if params.eps_step_micro:  # a fixed price per release: the chain's total counts every commit
            assert ledger.eps_spent(p.address) == len(history) * params.eps_step_micro, p.index

    # No committed blob lost: each peer's store holds every blob it committed, through its crashes
    # and restarts; what it held when it was killed is still there. The exception: a crash between
    # the commit's transaction and the blob's write (phase "committing"), which nobody can redo.
    for p in swarm.peers:
        held = set(DiskBlobStore(p.workdir / "blobs").digests())
        mine = [d for d in deaths if d[0] == p.index]
        died_committing = {r for _, r, ph, _ in mine if ph == "committing"}
        for c in ledger.commit_history(p.address):
            digest = bytes(c.digest).hex()
            stored_before = any(digest in before for *_, before in mine)
            assert digest in held or (c.round in died_committing and not stored_before), (
                f"peer {p.index} lost its committed blob of round {c.round} ({digest[:16]}); its kills: "
                f"{[(r, ph) for _, r, ph, _ in mine]}"
            )

    stores = [DiskBlobStore(p.workdir / "blobs") for p in swarm.peers]
    for r, state in enumerate(states, start=1):  # no archived blob lost
        if state != "FINALIZED":
            continue
        final = bytes(ledger.finalized_digest(r))
        commitments = ledger.commitments(r)
        winning = next(a for a in ledger.attestations(r) if a.aggregate_digest == final)
        included = decode_bitmap(winning.included, len(commitments))
        wanted = [final.hex()] + [bytes(c.digest).hex() for c, inc in zip(commitments, included) if inc]
        missing = [d for d in wanted if not any(s.has(d) for s in stores)]
        assert not missing, (r, missing)

    swarm.finish(interrupted=False)  # collects the peers' stores into the run's archive
    for p in swarm.peers:
        held = set(stores[p.index].digests())
        unarchived = [d for d in committed[p.index] if d in held and not swarm.archive.has(d)]
        assert not unarchived, (p.index, unarchived)
    proc = swarm_cli("verify", "--run", str(swarm.out), "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(proc.stdout)["ok"]
    return states


def test_sigkill_in_every_phase_a_third_at_once_and_restarts(tmp_path):
    rounds = 6  # the peer killed after attesting (round 3 or so) restarts with rounds to go
    cfg = config(
        "swarm.peers=6",
        f"swarm.rounds={rounds}",
        "chain.min_peers=2",  # a round closes at its window's end with two peers up, not waiting for restarts
        *WINDOWS,
    )
    # peer 2 serves other bytes than it commits until it is frozen and then killed (restarted
    # honest), so that nobody can have its blob: the others then fetch for fetch_timeout, and
    # peer 3 dies there. Peer 5, honest, is the one killed once it committed and before the round closed.
    with LocalSwarm(cfg, tmp_path / "run", faults={2: "wrong-bytes"}) as swarm:
        watch = Watch(swarm)
        swarm.start()
        peers = swarm.peers
        ledger = swarm.ledger
        deaths: list[Death] = []

        # A third of the swarm at once, one of them while training. They stay down until the next
        # kills: with registered peers missing, no round can close before its commit window ends,
        # which keeps "committed, not closed" a phase of seconds rather than a race.
        watch.until(lambda: phase(peers[0])[1] == "training", "peer 0 training")
        deaths += kill(swarm, 0, 1)

        # Committed in an open round, blob stored and announced (waiting-close comes after both):
        # the honest peer 5 is killed there and the byzantine peer 2 frozen. Both are frozen first
        # and the round read after: it is still open, so they stopped before its close, however
        # long the test took to look. (If it closed meanwhile, they go on and a later round serves.)
        # Once the round closes, nobody can fetch peer 2's blob (its bytes were wrong, now it says
        # nothing): peer 3 is killed in the fetching step that follows, or as close after it as the
        # test saw it (frozen first, so its phase at death is the one its status file shows).
        def committed_in_open_round() -> int | None:
            r, ph = phase(peers[5])
            if ph != "waiting-close" or phase(peers[2]) != (r, "waiting-close"):
                return None
            committed = ledger.participants(r)
            if ledger.round_info(r).state.name != "OPEN" or not all(peers[i].address in committed for i in (2, 3, 5)):
                return None
            return r

        while True:
            committed_in = watch.until(committed_in_open_round, "peers 2, 3 and 5 committed in an open round")
            freeze(swarm, 5, 2)
            if ledger.round_info(committed_in).state.name == "OPEN":
                break
            freeze(swarm, 5, 2, resume=True)
            watch.until(lambda r=committed_in: ledger.current_round() > r, "the next round")
        killed = kill(swarm, 5)
        deaths += killed
        assert killed[0][1:3] == (committed_in, "waiting-close")  # killed before the close
        honest_blob = bytes(ledger.commitment_of(committed_in, peers[5].address).digest).hex()
        assert honest_blob in killed[0][3]  # peer 5 had stored the blob it committed

        def past_the_close() -> bool:
            r, ph = phase(peers[3])
            return r > committed_in or (r == committed_in and ph not in ("training", "committing", "waiting-close"))

        watch.until(past_the_close, "peer 3 past the close")
        freeze(swarm, 3)
        deaths += kill(swarm, 3, 2)
        assert deaths[-1][1:3] == (committed_in, "waiting-close")  # peer 2, frozen there
        swarm.faults.pop(2)
        for i in (0, 1, 2, 3, 5):  # from their workdirs: same keys, blob store and accountant
            swarm.start_peer(i)

        # After attesting, in a later round: killed as soon as its attestation is seen on chain
        # (a round finalizes within a block of its majority, so the peer may be evaluating by
        # then), and restarted at once, with rounds left to rejoin in. Peer 4 (never killed yet)
        # if it attested, else any running peer that did: with six participants a majority is
        # four, and the other two votes routinely come after the round finalized (they are
        # refused), so no one peer is sure to get a vote in within the rounds that are left.
        def attested() -> tuple[int, int] | None:
            current = ledger.current_round()
            last = min(current, rounds - 2)
            for r in range(last, committed_in, -1):  # the newest vote: the kill comes right after it
                voters = {a.peer for a in ledger.attestations(r)}
                running = [i for i in (4, 0, 1, 2, 3, 5) if peers[i].address in voters and alive(peers[i])]
                if running:
                    return r, running[0]
            if current > rounds - 2:
                raise AssertionError(f"no running peer attested in rounds {committed_in + 1}-{last}\n{logs(swarm)}")
            return None

        attested_in, victim = watch.until(attested, "a peer attests in a later round")
        deaths += kill(swarm, victim)
        swarm.start_peer(victim)

        watch.finish()
        assert_the_swarm_survived(swarm, watch, rounds, deaths)
        # the honest peer killed after committing kept its commit (its eps stayed spent) and its
        # blob, whether or not the round it committed in finalized without it
        assert peers[5].address in ledger.participants(committed_in)
        assert DiskBlobStore(peers[5].workdir / "blobs").has(honest_blob)
        assert swarm.archive.has(honest_blob)
        assert any(a.peer == peers[victim].address for a in ledger.attestations(attested_in))
        # the restarted peers rejoined: each followed the swarm to its last finalized model, and
        # every model it took after its restart is the one the chain finalized
        final = bytes(ledger.finalized_digest(rounds)).hex()
        for p in peers:
            rows = p.metrics()
            assert (rows[-1]["round"], rows[-1]["global_digest"]) == (rounds, final), (p.index, rows[-1])
            assert DiskBlobStore(p.workdir / "blobs").has(final), p.index
            for row in rows:
                if row["state"] == "finalized":
                    assert row["global_digest"] == bytes(ledger.finalized_digest(row["round"])).hex(), (p.index, row)


def test_rpc_unreachable_for_30_s_mid_round(tmp_path):
    rounds = 2
    cfg = config(
        "swarm.peers=3",
        f"swarm.rounds={rounds}",
        "chain.min_peers=2",
        *WINDOWS,
    )
    with LocalSwarm(cfg, tmp_path / "run") as swarm:
        anvil = urlparse(swarm.anvil.url)
        with tcp_proxy(anvil.hostname or "127.0.0.1", anvil.port or 80) as proxy:
            direct = swarm.anvil.url
            swarm.anvil.url = proxy.url  # only the peers' --rpc-url: the test itself reads the chain directly
            try:
                swarm.start()
            finally:
                swarm.anvil.url = direct
            watch = Watch(swarm)
            peers, ledger = swarm.peers, swarm.ledger

            # Mid-round: once the first commit of round 1 is on chain (whether or not the others'
            # commits closed it since: the peers are in the middle of a round either way).
            watch.until(lambda: ledger.round_info(1).participant_count >= 1, "a first commit")
            cut_at = time.monotonic()
            proxy.cut()
            while time.monotonic() - cut_at < OUTAGE_SECONDS:
                assert all(p.process and p.process.poll() is None for p in peers), logs(swarm)
                watch.tick()
                time.sleep(0.5)
            assert all(p.process and p.process.poll() is None for p in peers), logs(swarm)  # nobody gave up
            proxy.restore()
            watch.finish()
        assert proxy.connections > 0
        felt = [p.index for p in peers if "the chain does not answer" in (p.workdir / "peer.log").read_text()]
        assert felt, logs(swarm)  # the outage reached the peers (and they waited it out)
        assert_the_swarm_survived(swarm, watch, rounds)
