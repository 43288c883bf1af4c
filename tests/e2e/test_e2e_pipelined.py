"""End to end on a pipelined ledger (docs/LEDGER.md "One transaction per round", "Selecting the
ledger"): `swarm deploy --ledger-kind pipelined` on a real Anvil that mines a block every half
second and every transaction at once, then 4 real `swarm node` processes started from the CLI with
the same config (each its own shard, dev key and libp2p key, registered up front as `swarm up` does).
Nothing tells a node which ledger it joins but the deployed code: each runs the pipelined round loop
(`PipelinedPeer`) on a `PipelinedClient`. The 3 rounds finalize on chain and in every node's
metrics, each member commits once a round (its vote riding in the next round's commit, the last
round's in a final vote), and `swarm verify` holds over the nodes' blob stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from eth_account import Account
from libp2p.peer.id import ID

from node.chain.anvil import free_port, start_anvil
from node.chain.client import connect
from node.chain.kind import ledger_kind
from node.chain.pipelined import PipelinedClient
from node.chain.records import RoundState
from node.chain.registration import sign_registration
from node.config import load_config
from node.peer.runner import P2P_PASSWORD_ENV
from node.runfiles import read_metrics
from p2p import peer_id_to_bytes
from p2p.identity import load_or_create_identity

pytestmark = pytest.mark.slow

PEERS, ROUNDS = 4, 3
PASSWORD = "e2e-pipelined"
SETS = [
    "data.dataset=digits",
    "data.limit=600",
    "data.test_limit=200",
    "model.name=logreg",
    "train.epochs=1",
    "train.dp_sgd=false",
    f"swarm.peers={PEERS}",
    f"swarm.rounds={ROUNDS}",
    "chain.min_peers=3",
    "chain.block_time=0.5",
    # 5 minutes at 0.5 s: room for 4 processes starting on 2 loaded cores (a full round closes at once)
    "chain.commit_window=600",
    "chain.attest_window=600",
    "chain.fetch_timeout=10",
    "chain.ledger_kind=pipelined",
]
RUN_TIMEOUT_S = 480
BASELINE = Path(__file__).resolve().parents[2] / "scripts" / "baseline.toml"
UP_PEERS, UP_ROUNDS = 3, 2
UP_SETS = [
    "data.limit=600",
    "data.test_limit=200",
    "model.name=logreg",
    "train.epochs=1",
    f"swarm.peers={UP_PEERS}",
    f"swarm.rounds={UP_ROUNDS}",
    "chain.min_peers=2",
    "chain.ledger_kind=pipelined",
]


def cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "node.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _tail(workdirs: list[Path]) -> str:
    return "\n".join(
        f"--- node {i}\n" + (w / "node.log").read_text(errors="replace")[-3000:] for i, w in enumerate(workdirs)
    )


def test_four_nodes_three_rounds_on_a_pipelined_ledger(tmp_path):
    config_file = tmp_path / "swarm.toml"
    config_file.write_text(load_config(None, SETS).to_toml())
    env = {k: v for k, v in os.environ.items() if k not in ("SWARM_PRIVATE_KEY", "SWARM_KEYSTORE_PASSWORD")}
    env[P2P_PASSWORD_ENV] = PASSWORD
    with start_anvil(block_time=0.5, mixed_mining=True, accounts=PEERS + 1) as anvil:
        deploy = cli(
            "deploy", "--rpc-url", anvil.url, "--config", str(config_file), "--json",
            env={**env, "SWARM_PRIVATE_KEY": anvil.private_keys[0]},
        )  # fmt: skip
        assert deploy.returncode == 0, deploy.stderr
        deployed = json.loads(deploy.stdout)
        assert (deployed["ledger_kind"], deployed["contract"]) == ("pipelined", "PipelinedLedger")
        w3 = connect(anvil.url)
        address = deployed["address"]
        assert ledger_kind(w3, address) == "pipelined"

        workdirs = [tmp_path / f"node{i}" for i in range(PEERS)]
        accounts = [Account.from_key(k) for k in anvil.private_keys[1 : PEERS + 1]]
        multiaddrs = []
        for workdir, account in zip(workdirs, accounts):  # registered up front: round 1 awaits all four
            workdir.mkdir()
            keys = load_or_create_identity(workdir / "p2p.key", PASSWORD.encode())
            peer_id = ID.from_pubkey(keys.public_key).to_base58()
            multiaddrs.append(f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{peer_id}")
            member = PipelinedClient(w3, address, account)
            member.register(
                peer_id_to_bytes(peer_id),
                sign_registration(keys.private_key, w3.eth.chain_id, address, account.address),
            )

        nodes = []
        try:
            for i, workdir in enumerate(workdirs):
                cmd = [sys.executable, "-m", "node.cli", "node", "--rpc-url", anvil.url, "--ledger", address]
                cmd += ["--config", str(config_file), "--workdir", str(workdir), "--partition", f"{i}/{PEERS}"]
                cmd += ["--listen", multiaddrs[i].rsplit("/p2p/", 1)[0], "--bootstrap-timeout", "0"]
                cmd += [arg for j, m in enumerate(multiaddrs) if j != i for arg in ("--bootstrap", m)]
                with open(workdir / "node.log", "wb") as log:
                    nodes.append(
                        subprocess.Popen(
                            cmd,
                            env={**env, "SWARM_PRIVATE_KEY": anvil.private_keys[i + 1]},
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                        )
                    )
            deadline = time.monotonic() + RUN_TIMEOUT_S
            codes = [n.wait(timeout=max(1.0, deadline - time.monotonic())) for n in nodes]
        finally:
            for n in nodes:
                if n.poll() is None:
                    n.kill()
                    n.wait()
        assert codes == [0] * PEERS, _tail(workdirs)

        # on chain: every round finalized, each member committed once a round, the last round's votes final votes
        reader = PipelinedClient(w3, address, from_block=deployed["block"])
        for r in range(1, ROUNDS + 1):
            assert reader.round_info(r).state is RoundState.FINALIZED, (r, _tail(workdirs))
            assert reader.finalized(r) is not None
            assert sorted(c.peer for c in reader.voted_commits(r)) == sorted(a.address for a in accounts), r
        voters = [v.peer for v in reader.final_votes(ROUNDS)]
        assert set(voters) <= {a.address for a in accounts} and len(voters) > PEERS // 2  # they finalized it
        # one transaction per member per round and nothing else: its registration (sent here), a commit a
        # round, its final vote unless the last round was final before it (the vote is then not sent)
        sent = [w3.eth.get_transaction_count(a.address) for a in accounts]
        assert sent == [1 + ROUNDS + (a.address in voters) for a in accounts], (sent, voters)

        # in every node's metrics: the three rounds, finalized, ending with the model finalized on chain
        final = reader.finalized_digest(ROUNDS)
        assert final is not None
        for workdir in workdirs:
            rounds = {m["round"]: m for m in read_metrics(workdir / "metrics.jsonl") if "round" in m}
            assert [rounds[r]["state"] for r in range(1, ROUNDS + 1)] == ["finalized"] * ROUNDS, rounds
            assert rounds[ROUNDS]["global_digest"] == final.hex(), rounds[ROUNDS]
            # each node keeps the pipelined ledger's events, decoded, for its dashboard (chain-events.jsonl)
            events = read_metrics(workdir / "chain-events.jsonl")
            assert sum(e["event"] == "Committed" for e in events) == PEERS * ROUNDS, events

        verify = cli(
            "verify", "--rpc-url", anvil.url, "--ledger", address, "--rounds", str(ROUNDS), "--json",
            *(arg for w in workdirs for arg in ("--archive", str(w))),
            env=env,
        )  # fmt: skip
        assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
        report = json.loads(verify.stdout)
        assert report["ok"] and [r["round"] for r in report["rounds"]] == list(range(1, ROUNDS + 1))


def test_swarm_up_runs_a_pipelined_swarm_that_verifies(tmp_path):
    """`swarm up --set chain.ledger_kind=pipelined` deploys a PipelinedLedger (node/runs/chainrun.py) and
    runs its peers on it: every round finalized in report.json; the events it keeps in chain-events.jsonl
    are the pipelined ledger's (each member's vote riding in its next commit, the last round's in final
    votes, no attestation), one commit per member and round; `swarm verify --run` holds from the saved
    chain."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("SWARM_PRIVATE_KEY", "SWARM_KEYSTORE_PASSWORD")}
    up = cli(
        "up", "--config", str(BASELINE), "--out", str(out), "--json", *(a for s in UP_SETS for a in ("--set", s)),
        env=env, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(out.glob("peers/*/peer.log")))
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:] + logs
    report = json.loads((out / "report.json").read_text())
    assert report["failure"] is None and [r["state"] for r in report["rounds"]] == ["finalized"] * UP_ROUNDS

    events = read_metrics(out / "chain-events.jsonl")
    names = Counter(e["event"] for e in events)
    assert names["Attested"] == 0 and names["Voted"] >= 2 and names["RoundFinalized"] == UP_ROUNDS, names
    commits = Counter((e["args"]["round"], e["args"]["peer"]) for e in events if e["event"] == "Committed")
    assert len(commits) == UP_PEERS * UP_ROUNDS and set(commits.values()) == {1}, commits
    round_2 = [e["args"] for e in events if e["event"] == "Committed" and e["args"]["round"] == 2]
    assert all(int(str(c["voteDigest"]), 16) != 0 for c in round_2), round_2  # the vote on round 1 rides along

    verify = cli("verify", "--run", str(out), "--json", env=env)
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    verdict = json.loads(verify.stdout)
    assert verdict["ok"] and [r["round"] for r in verdict["rounds"] if r["state"] != "open"] == [1, 2], verdict
