"""End to end: a peer that commits and serves its blob to nobody (`--fault withhold`: it answers
"not found" for its own blob, though it announces it, aggregates it and attests a set that
includes it). Real Anvil, real libp2p hosts on 127.0.0.1, real peer processes.

It used to make every round wait twice the fetch timeout for its blob, then (caught by its
attestation) until that attestation came; then each honest peer left it out at the close, as soon
as the withholder refused the blob its own announcement claims (node/peer/agree.py), but every
round still waited for its commit: the early close awaited every registered peer, and the
withholder, whose speculative training (on its own aggregate, its blob included) never matches
the finalized model, trains again and commits last. Now the early close does not await a member
the last finalized aggregate left out (contracts/SwarmLedger.sol, closeRound), so from round 2 on
the rounds close on the honest peers' commits.

The same swarm runs honest first, the baseline: each round of the withholding swarm is measured
against the same round of the honest one (`-s` prints both)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from node.config import load_config
from node.protocol.wire import decode_bitmap
from node.runs.local import LocalSwarm

pytestmark = pytest.mark.slow

FETCH_TIMEOUT = 20.0  # at most half the attestation window (40 s): a round that waited for the blob shows
TINY_SETS = ["data.dataset=digits", "data.limit=600", "data.test_limit=200", "model.name=logreg", "train.epochs=1"]
ROUNDS = 3
HONEST = (0, 1, 2)
WITHHOLDER = 3
# The rounds compared: round 1 starts from genesis (no speculative training, every member awaited).
COMPARED = range(2, ROUNDS + 1)
# What a withholding round may cost against the honest one. The two runs are measured one after
# the other on a shared 2-core machine: in the honest runs measured (docs/NODE.md, "Withholding") a
# round of 2 to 3 took 1.3 to 2.2 s, i.e. the load alone moves one round by up to 1.7x and a sum of
# two rounds by less (the rounds of one run share its load). The sum over the compared rounds of the
# median honest peer's round time is held to 1.5x, plus a margin for that load of 0.5 s a round (a
# quarter of a loaded honest round; a round that waited for the withholder's retraining cost 1.0 to
# 1.7 s more, docs/NODE.md, so the margin still fails that). The structural fact below holds on any load.
RATIO = 1.5
LOAD_MARGIN_S = 0.5


def _round_seconds(swarm: LocalSwarm) -> dict[int, float]:
    """Round -> the median honest peer's wall time for it (metrics.jsonl)."""
    per_round: dict[int, list[float]] = {}
    for i in HONEST:
        for m in swarm.peers[i].metrics():
            per_round.setdefault(m["round"], []).append(float(m["round_seconds"]))
    return {r: statistics.median(v) for r, v in per_round.items()}


def _run(tmp_path: Path, faults: dict[int, str]) -> LocalSwarm:
    sets = [
        *TINY_SETS,
        "swarm.peers=4",
        f"swarm.rounds={ROUNDS}",
        "chain.min_peers=3",  # the three honest peers are a quorum: a round need not wait for the fourth
        f"chain.fetch_timeout={FETCH_TIMEOUT}",
    ]
    return LocalSwarm(load_config(None, sets), tmp_path, faults=faults)


def _closable_without(swarm: LocalSwarm, r: int, absent: str) -> bool:
    """Whether round r could be closed early as soon as every participant but `absent` had
    committed: closeRound simulated (eth_call) on the chain as it stood after the last of those
    commits, or the round closed in that very block."""
    ledger = swarm.ledger
    others = [c for c in ledger.commitments(r) if c.peer != absent]
    block = max(c.block_number for c in others)
    if ledger.round_info(r).closed_block == block:
        return True
    try:
        ledger.contract.functions.closeRound(r).call(block_identifier=block)
    except Exception:  # CommitWindowOpen: the round still awaited the absent member
        return False
    return True


def test_a_withholding_peer_costs_the_rounds_nothing_and_is_named(tmp_path):
    with _run(tmp_path / "honest", {}) as honest:
        honest.start()
        honest.wait(900)  # generous: a loaded machine is slow, not wrong
        assert [p.process.returncode for p in honest.peers] == [0, 0, 0, 0]
        baseline = _round_seconds(honest)
        honest.finish(interrupted=False)

    with _run(tmp_path / "run", {WITHHOLDER: "withhold"}) as swarm:
        swarm.start()
        swarm.wait(900)
        assert [p.process.returncode for p in swarm.peers[:3]] == [0, 0, 0]
        withholder = swarm.peers[WITHHOLDER].address
        participated = {}
        for r in range(1, ROUNDS + 1):
            assert swarm.ledger.round_info(r).state.name == "FINALIZED"
            participants = swarm.ledger.participants(r)
            final = bytes(swarm.ledger.finalized_digest(r))
            (winning, *_) = [a for a in swarm.ledger.attestations(r) if a.aggregate_digest == final]
            included = decode_bitmap(winning.included, len(participants))
            participated[r] = withholder in participants
            # every honest blob in, the withholder's never (when it got a commit in at all)
            assert sum(included) == 3
            assert not participated[r] or not included[participants.index(withholder)]
        assert participated[1]  # round 1 awaits every member: the withholder commits, is left out
        for r in COMPARED:
            # the structural fact: the round could close without the withholder's commit as soon
            # as the honest peers had committed (it was not awaited: left out of the last aggregate)
            assert _closable_without(swarm, r, withholder), r
        for p in swarm.peers[:3]:
            rounds = [json.loads(line) for line in (p.workdir / "metrics.jsonl").read_text().splitlines() if line]
            assert [m["round"] for m in rounds] == list(range(1, ROUNDS + 1))
            for m in rounds:
                if not participated[m["round"]]:
                    assert m["left_out"] == [], m["left_out"]
                    continue
                (why,) = m["left_out"]
                assert withholder in why and ("is withheld" in why or "was not awaited" in why), why
                # the blob was never waited out: the step ended long before the fetch timeout
                assert m["phase_seconds"].get("fetching", 0.0) < FETCH_TIMEOUT / 2, m["phase_seconds"]
            assert "is withheld" in rounds[0]["left_out"][0]
            if sum(participated.values()) >= 2:  # two rounds its blob reached nobody: no longer awaited
                assert "served its blob to nobody in 2 rounds in a row" in (p.workdir / "peer.log").read_text()
        measured = _round_seconds(swarm)
        swarm.finish(interrupted=False)

    print("round seconds, median honest peer: honest", {r: round(s, 2) for r, s in baseline.items()})
    print("round seconds, median honest peer: withholding", {r: round(s, 2) for r, s in measured.items()})
    print("ratio per round", {r: round(measured[r] / baseline[r], 2) for r in baseline})
    print("withholder committed in rounds", [r for r, took_part in participated.items() if took_part])
    compared_honest = sum(baseline[r] for r in COMPARED)
    compared_withholding = sum(measured[r] for r in COMPARED)
    print(f"rounds {COMPARED.start}-{COMPARED.stop - 1}: ratio {compared_withholding / compared_honest:.2f}")
    assert compared_withholding <= RATIO * compared_honest + LOAD_MARGIN_S * len(COMPARED)

    verified = subprocess.run(
        [sys.executable, "-m", "node.cli", "verify", "--run", str(tmp_path / "run")], capture_output=True, text=True
    )
    assert verified.returncode == 0, verified.stdout[-3000:]
