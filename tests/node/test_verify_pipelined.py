"""`swarm verify` on a pipelined deployment (node/verify_pipelined.py): three peers play rounds
by hand on a real Anvil through `PipelinedClient` (each commit carrying its vote on the round
before, the last round finalized by final votes) with real blobs in an archive, and verify holds
every commit to the rulebook, recomputes every finalized aggregate, checks the finalizing key
against the transaction holding RoundFinalized and an abort's cascade, and names what was tampered
with: a finalized key that is not the aggregate, a missing blob, an altered blob, patched code."""

from __future__ import annotations

import json

import pytest
import torch
from eth_account import Account
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from mechanisms.accounting import cumulative_spend
from node.chain.anvil import start_anvil
from node.chain.client import connect
from node.chain.pipelined import PipelinedClient
from node.chain.registration import sign_registration
from node.cli import main
from node.protocol import aggregate, wire
from node.protocol.blob import sha256
from node.verify_pipelined import verify_pipelined
from p2p.store import DiskBlobStore, MemoryBlobStore
from tests.node.test_verify_gaps import EPS_CAP, SHARED, D, genuine

WINDOW = 20  # blocks and seconds of each window
ALL = wire.encode_bitmap([True] * 3)


@pytest.fixture(scope="module")
def anvil():
    with start_anvil() as chain:
        yield chain


class Swarm:
    """A PipelinedLedger with 3 registered members, an archive with the genesis, and `play` to run rounds."""

    def __init__(self, anvil) -> None:
        self.anvil = anvil
        w3 = connect(anvil.url)
        accounts = [Account.from_key(k) for k in anvil.private_keys[:3]]
        self.archive = MemoryBlobStore()
        self.model = torch.randn(D, generator=torch.Generator().manual_seed(1)) * 0.1  # the model to train from
        genesis = wire.genesis_blob(self.model, SHARED.to_dict())
        self.archive.put(genesis)
        first = PipelinedClient.deploy(
            w3,
            accounts[0],
            min_peers=2,
            commit_window=WINDOW,
            attest_window=WINDOW,
            commit_window_seconds=WINDOW,
            attest_window_seconds=WINDOW,
            eps_cap_micro=EPS_CAP * 1000,
            delta=1e-5,
            genesis_digest=sha256(genesis),
        )
        self.members = [first] + [PipelinedClient(w3, first.address, a) for a in accounts[1:]]
        for i, member in enumerate(self.members):
            key = create_new_key_pair(bytes([i + 1]) * 32).private_key
            signature = sign_registration(key, member.chain_id(), member.address, member.account.address)
            member.register(ID.from_pubkey(key.get_public_key()).to_bytes(), signature)
        self.reader = PipelinedClient(w3, first.address)
        self.mechanism = wire.canonical(dict(SHARED.privacy.mechanism))
        self.commits = [0, 0, 0]
        self.vote = (bytes(32), b"")  # what a commit carries with no round before it to vote on
        self.updates: dict[int, list[str]] = {}  # round -> its update digests

    def play(
        self, r: int, votes: list[tuple[bytes, bytes]] | None = None, included: tuple[bool, ...] = (True,) * 3
    ) -> tuple[str, torch.Tensor, bytes]:
        """Round r: each member commits a genuine update carrying its vote on r - 1 (`votes`: one per
        member, else `self.vote` for all); returns r's aggregate of the `included` updates from
        `self.model` (archived) and its bitmap."""
        vectors = []
        for i, member in enumerate(self.members):
            self.commits[i] += 1
            vector = genuine(100 * r + i).to(torch.float32)
            digest = self.archive.put(wire.update_blob(vector, r, self.mechanism, member.account.address))
            self.updates.setdefault(r, []).append(digest)
            eps = wire.eps_to_micro(cumulative_spend(dict(SHARED.privacy.mechanism), D, self.commits[i]).epsilon)
            named = self.mechanism.encode() if self.commits[i] == 1 else b""
            member.commit(r, bytes.fromhex(digest), 10, eps, named, *(votes[i] if votes else self.vote))
            if included[i]:
                vectors.append(vector)
        model = aggregate.next_global(SHARED, self.model, vectors, [10] * len(vectors))
        return self.archive.put(wire.model_blob(model, r)), model, wire.encode_bitmap(list(included))

    def settle(self, played: tuple[str, torch.Tensor, bytes]) -> None:
        """Take a round's aggregate as the next base and vote."""
        digest, self.model, bitmap = played
        self.vote = (bytes.fromhex(digest), bitmap)

    def final_votes(self, r: int) -> None:
        for member in self.members[:2]:
            member.vote(r, *self.vote)

    def pass_window(self) -> None:
        self.anvil.rpc("evm_increaseTime", [WINDOW])
        self.anvil.mine(WINDOW + 1)


def failures(report):
    return sorted({(f.round, f.check) for f in report.failures})


def three_rounds(anvil) -> Swarm:
    swarm = Swarm(anvil)
    for r in (1, 2, 3):
        swarm.settle(swarm.play(r))
    swarm.final_votes(3)
    return swarm


def test_an_honest_pipelined_swarm_verifies(anvil, tmp_path, capsys):
    """Every check holds over three rounds (the last finalized by final votes), through `swarm
    verify` too, which tells the ledger by its code; the open fourth round is not started."""
    swarm = three_rounds(anvil)
    report = verify_pipelined(swarm.reader, swarm.archive)
    assert report.ok, report.failures
    assert [
        (r.round, r.state, r.participants, r.included, r.blobs_ok, r.releases_ok, r.eps_ok) for r in report.rounds
    ] == [(r, "finalized", 3, 3, 3, 3, 3) for r in (1, 2, 3)]
    assert all(r.aggregate_ok for r in report.rounds) and report.not_started == 4
    assert {entry["commits"] for entry in report.peers.values()} == {3}
    store = DiskBlobStore(tmp_path)
    for digest in swarm.archive.digests():
        store.put(swarm.archive.get(digest))
    args = ["verify", "--rpc-url", anvil.url, "--ledger", swarm.reader.address, "--archive", str(tmp_path), "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and [r["state"] for r in out["rounds"]] == ["finalized"] * 3


def test_an_aborted_round_and_its_cascade_verify_and_the_next_round_starts_from_the_last_model(anvil):
    """Round 2's votes split three ways: nobody finalizes it, round 3 (trained from it) is full but
    cannot close, and both are aborted in one transaction; round 4 trains from round 1's model and
    finalizes from final votes. Verify recomputes round 4 from round 1's model and holds the
    cascade."""
    swarm = Swarm(anvil)
    swarm.settle(swarm.play(1))
    after_1 = swarm.vote, swarm.model
    digest_2, _, _ = swarm.play(2)
    split = [(bytes.fromhex(digest_2), ALL), (sha256(b"another"), ALL), (sha256(b"a third"), ALL)]
    swarm.play(3, votes=split)
    swarm.pass_window()
    swarm.members[0].abort_round(2)
    swarm.vote, swarm.model = (bytes(32), b""), after_1[1]  # round 4 opens from round 1's model
    swarm.settle(swarm.play(4))
    swarm.final_votes(4)
    report = verify_pipelined(swarm.reader, swarm.archive)
    assert report.ok, report.failures
    assert [(r.round, r.state, r.aggregate_ok) for r in report.rounds] == [
        (1, "finalized", True),
        (2, "aborted", None),
        (3, "aborted", None),
        (4, "finalized", True),
    ]


def test_a_finalized_key_that_is_not_the_aggregate_is_named(anvil):
    """Round 2's majority votes, for round 1, an aggregate that leaves a blob out under a bitmap that
    includes it (and archives that model): the recomputed aggregate differs."""
    swarm = Swarm(anvil)
    swarm.play(1)
    wrong = aggregate.next_global(SHARED, swarm.model, [genuine(100), genuine(101)], [10, 10])
    swarm.settle((swarm.archive.put(wire.model_blob(wrong, 1)), wrong, ALL))
    swarm.settle(swarm.play(2))
    swarm.final_votes(2)
    report = verify_pipelined(swarm.reader, swarm.archive)
    assert failures(report) == [(1, "aggregate")]
    assert "recomputed aggregate" in report.failures[0].detail
    assert [r.aggregate_ok for r in report.rounds] == [False, True], "round 2 goes on from the chain's model"


@pytest.mark.parametrize("included", [False, True])
def test_a_commit_trained_from_another_base_is_named_where_an_aggregate_includes_it(anvil, included):
    """Member 2's round 3 commit names another model than round 2's finalized one as its base (its
    vote lost): honest peers leave it out of round 3, and verify passes; a round 3 aggregate that
    includes it fails, naming it."""
    swarm = Swarm(anvil)
    for r in (1, 2):
        swarm.settle(swarm.play(r))
    lost = (sha256(b"a model that lost"), ALL)
    swarm.settle(swarm.play(3, votes=[swarm.vote, swarm.vote, lost], included=(True, True, included)))
    swarm.final_votes(3)
    report = verify_pipelined(swarm.reader, swarm.archive)
    assert report.rounds[2].included == 2 + included
    if not included:
        assert report.ok, report.failures
        return
    assert {(f.round, f.peer, f.check) for f in report.failures} == {(3, swarm.members[2].account.address, "aggregate")}
    assert "trained from another base" in report.failures[0].detail and report.rounds[2].aggregate_ok is False


@pytest.mark.parametrize("how", ["missing", "altered"])
def test_a_missing_or_altered_update_blob_is_named(anvil, how):
    swarm = three_rounds(anvil)
    target = swarm.updates[2][1]
    archive = MemoryBlobStore()
    for digest in swarm.archive.digests():
        if digest != target:
            archive.put(swarm.archive.get(digest))
    source = archive if how == "missing" else _Altered(archive, target, swarm.archive.get(target) + b"\0")
    report = verify_pipelined(swarm.reader, source)
    committer = swarm.members[1].account.address
    assert {(f.round, f.peer, f.check) for f in report.failures} == {(2, committer, "blob")}
    details = " ".join(f.detail for f in report.failures)
    assert ("altered" in details) == (how == "altered") and "cannot be recomputed" in details
    assert [r.aggregate_ok for r in report.rounds] == [True, False, True], "round 3 goes on from the archived model"


def test_code_that_is_not_the_artifacts_is_named(anvil):
    swarm = three_rounds(anvil)
    code = bytes(swarm.reader.w3.eth.get_code(swarm.reader.address))
    patched = code[:-1] + bytes([code[-1] ^ 1])  # the metadata's last byte: every function still runs
    anvil.rpc("anvil_setCode", [swarm.reader.address, "0x" + patched.hex()])
    report = verify_pipelined(swarm.reader, swarm.archive)
    assert failures(report) == [(0, "code")]
    assert "differs from the artifact's deployedBytecode" in report.failures[0].detail


class _Altered:
    """An archive serving other bytes for one digest."""

    def __init__(self, archive: MemoryBlobStore, digest: str, data: bytes) -> None:
        self.archive, self.digest, self.data = archive, digest, data

    def get(self, digest: str) -> bytes | None:
        return self.data if digest == self.digest else self.archive.get(digest)
