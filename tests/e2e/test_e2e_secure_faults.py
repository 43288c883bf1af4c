"""Secure aggregation's dropouts and faults for real: six `swarm node` processes on a real Anvil,
a third of them (two) SIGKILLed at each step of the protocol, in a round of their own, and
restarted from their workdirs; two more sending a wrong share and a malformed masked vector.

- First, peer 4 reveals a wrong share (`--fault secagg-wrong-share`) and peer 5 masks a malformed
  vector (`--fault secagg-bad-masked`): both are left out and named, and the round finalizes.
- Then, each in a round of its own where all six posted their keys, two peers are frozen (SIGSTOP)
  once the chain shows them past one step and not yet at the next, the chain is read again (still
  so: they stopped there), and they are SIGKILLed: after KEYS (peers 4, 5; restarted honest),
  after DEALING (0, 1), after the MASKED commit (2, 3), after the acknowledgment (4, 5) and after
  the REVEAL (0, 1). Each is restarted at once from its workdir (same keys, store, accountant), and
  the next kill waits for a round all six are in again. A round where a slow member dropped out
  too (more than a third: no round is meant to survive that) does not count: its kill is tried
  again in a later round.

What must hold: every round with a kill finalizes, every round of the run ends (finalized or
aborted, none stuck: a secure round that never reaches its quorum is aborted once its windows
passed) and the last one finalizes, every peer exits 0 and ends on the last finalized model, and
`swarm verify` recomputes every round's sum and model from the archive, naming the two faulty
members in each finalized round they played faulty (check "secure") and nobody else.

The test waits on events (the chain's postings and commits, each peer's status file), never on how
fast the machine is; PATIENCE only bounds a broken run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from node.chain.records import RoundState
from node.config import load_config
from node.runs.local import LocalSwarm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

DEMO = Path(__file__).resolve().parents[2] / "examples" / "secure-demo.toml"
ROUNDS = 11  # a round with the faults, five rounds with kills, slack for restarted peers and retries
SETS = [
    "swarm.peers=6",
    f"swarm.rounds={ROUNDS}",
    "data.limit=3000",
    "data.test_limit=500",
    "privacy.params.dropout_fraction=0.34",  # the noise counted on four of six: two may drop
    "chain.block_time=0.25",
    # KEYS and DEALING windows of 10 s each, then 20 s for the MASKED commits; ACK and REVEAL 8 s each
    "chain.commit_window=160",
    "chain.attest_window=128",
    "chain.fetch_timeout=6",
    "chain.min_peers=4",
]
PATIENCE = 900.0  # seconds: the longest the test waits for any one event
STEPS = ("keys", "dealing", "masked", "ack", "reveal")
KILLS = [("keys", (4, 5)), ("dealing", (0, 1)), ("masked", (2, 3)), ("ack", (4, 5)), ("reveal", (0, 1))]
FAULTS = {4: "secagg-wrong-share", 5: "secagg-bad-masked"}
FAULT_STEP = {"secagg-wrong-share": "reveal", "secagg-bad-masked": "masked"}  # where each fault shows

T = TypeVar("T")


def logs(swarm: LocalSwarm) -> str:
    parts = []
    for p in swarm.peers:
        code = p.process.poll() if p.process else None
        path = p.workdir / "peer.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        lines = [line for line in text.splitlines() if "Failed to open TCP" not in line]
        parts.append(f"--- peer {p.index} ({'running' if code is None else f'exit {code}'})\n" + "\n".join(lines[-30:]))
    return "\n".join(parts)


def until(swarm: LocalSwarm, predicate: Callable[[], T | None], what: str) -> T:
    end = time.monotonic() + PATIENCE
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{logs(swarm)}")


def steps_done(swarm: LocalSwarm, r: int) -> dict[str, set[str]]:
    """Who did each step of round r, as the chain shows it (addresses, lower case)."""
    ledger = swarm.ledger
    info = ledger.round_info(r)
    head = ledger.block_number()
    done: dict[str, set[str]] = {step: set() for step in STEPS}
    for event in ledger.frame_postings(r, info.opened_block, head):
        step = {0: "keys", 1: "dealing", 3: "reveal"}.get(int(event["args"]["step"]))
        if step is not None:
            done[step].add(str(event["args"]["peer"]).lower())
    done["masked"] = {a.lower() for a in ledger.participants(r)}
    done["ack"] = {str(e["args"]["peer"]).lower() for e in ledger.acknowledgments(r, info.opened_block, head)}
    return done


def between(swarm: LocalSwarm, step: str, victims: tuple[int, ...], after: int) -> int | None:
    """The current round (> after) if all six posted their keys in it and every victim did `step`
    and not the next one (after REVEAL: the round is not finalized yet); else None."""
    ledger = swarm.ledger
    r = ledger.current_round()
    if r > ROUNDS:
        raise AssertionError(f"the run ended before a kill after {step.upper()}\n{logs(swarm)}")
    if r <= after:
        return None
    done = steps_done(swarm, r)
    if len(done["keys"]) < len(swarm.peers):
        return None
    addresses = [swarm.peers[i].address.lower() for i in victims]
    if step == "reveal":
        if ledger.round_info(r).state is RoundState.FINALIZED:
            return None
        return r if all(a in done["reveal"] for a in addresses) else None
    following = STEPS[STEPS.index(step) + 1]
    return r if all(a in done[step] and a not in done[following] for a in addresses) else None


def kill_after(swarm: LocalSwarm, step: str, victims: tuple[int, ...], after: int) -> int:
    """Freeze the victims once the chain shows them past `step` (and not at the next) in a round
    after `after` that all six are in; read the chain again (still so: they stopped there), else
    let them go on and wait for a later round; SIGKILL them and restart them (honest) from their
    workdirs. The round they were killed in."""
    while True:
        r = until(swarm, partial(between, swarm, step, victims, after), f"peers {victims} past {step}")
        signal_all(swarm, victims, signal.SIGSTOP)
        if between(swarm, step, victims, after) == r:
            break
        signal_all(swarm, victims, signal.SIGCONT)
    signal_all(swarm, victims, signal.SIGKILL)
    for i in victims:
        process = swarm.peers[i].process
        assert process is not None
        process.wait()
        swarm.faults.pop(i, None)
        swarm.start_peer(i)
    return r


def only_victims_dropped(swarm: LocalSwarm, r: int, victims: tuple[int, ...]) -> bool:
    """Whether every member but the victims did every step of round r (else more than the victims dropped)."""
    done = steps_done(swarm, r)
    others = [p.address.lower() for p in swarm.peers if p.index not in victims]
    return all(a in done[step] for a in others for step in STEPS)


def signal_all(swarm: LocalSwarm, victims: tuple[int, ...], sig: int) -> None:
    for i in victims:
        process = swarm.peers[i].process
        assert process is not None and process.poll() is None, f"peer {i} must be running"
        process.send_signal(sig)


def swarm_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=PATIENCE)


def test_a_third_killed_at_each_step_and_two_faulty_members(tmp_path):
    config = load_config(DEMO, SETS)
    with LocalSwarm(config, tmp_path / "run", faults=dict(FAULTS)) as swarm:
        swarm.start()
        ledger = swarm.ledger
        killed_in: dict[str, int] = {}
        faulty = {i: swarm.peers[i].address.lower() for i in FAULTS}

        def faults_acted() -> int | None:
            """A finalized round both faulty members played to their fault's step."""
            for q in range(1, ledger.current_round()):
                if ledger.round_info(q).state is RoundState.FINALIZED:
                    done = steps_done(swarm, q)
                    if all(a in done[FAULT_STEP[FAULTS[i]]] for i, a in faulty.items()):
                        return q
            return None

        last = until(swarm, faults_acted, "a finalized round with both faulty members in it") if FAULTS else 0
        retried: list[tuple[str, int]] = []
        for step, victims in KILLS:
            while True:
                r = kill_after(swarm, step, victims, last)
                last = r
                until(swarm, lambda r=r: ledger.current_round() > r, f"round {r} to end")
                if only_victims_dropped(swarm, r, victims):
                    killed_in[step] = r
                    break
                # a slow member dropped out of the round too (a loaded machine): more than a third,
                # which no round is meant to survive; the kill is tried again in a later round
                retried.append((step, r))

        until(swarm, lambda: not swarm.running(), "the peers to finish")
        codes = [p.process.returncode if p.process else None for p in swarm.peers]
        assert codes == [0] * len(codes), logs(swarm)
        assert ledger.current_round() == ROUNDS + 1
        states = [ledger.round_info(r).state for r in range(1, ROUNDS + 1)]
        assert set(states) <= {RoundState.FINALIZED, RoundState.ABORTED}, states
        assert states[-1] is RoundState.FINALIZED, states
        for step, r in killed_in.items():  # a third dropped at this step, and the round still finalized
            assert states[r - 1] is RoundState.FINALIZED, (step, r, states, retried)
        final = bytes(ledger.finalized_digest(ROUNDS)).hex()
        for p in swarm.peers:
            rows = p.metrics()
            assert (rows[-1]["round"], rows[-1]["global_digest"]) == (ROUNDS, final), (p.index, rows[-1])

        swarm.finish(interrupted=False)  # the peers' stores into the run's archive
        proc = swarm_cli("verify", "--run", str(swarm.out), "--json")
        verdict = json.loads(proc.stdout)
        named = {(f["round"], f["peer"].lower(), f["check"]) for f in verdict["failures"]}
        # the faulty two are named in every finalized round they played to their fault's step
        # (before they were killed and restarted honest), and nobody else in any round
        expected = set()
        for r in range(1, killed_in["keys"] + 1):
            done = steps_done(swarm, r) if states[r - 1] is RoundState.FINALIZED else None
            for i, a in faulty.items():
                if done and a in done[FAULT_STEP[FAULTS[i]]]:
                    expected.add((r, a, "secure"))
        assert named == expected, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert proc.returncode == (1 if expected else 0)  # a named member is a finding of the audit
        finalized = [r for r in verdict["rounds"] if r["state"] == "finalized"]
        assert len(finalized) == states.count(RoundState.FINALIZED)
        assert all(r["aggregate_ok"] for r in finalized), finalized
