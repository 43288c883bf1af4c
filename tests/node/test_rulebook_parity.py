"""One rulebook (node/rules.py): the same bent commits, on one real Anvil with the real contract,
through the vetting a peer runs (`Vetter`, wired to the chain and to a `RegistryCache` as
`swarm node` wires it) and through `swarm verify`; both must reach the same verdict, check name for
check name. Then what the table does not show row by row: the contract refuses a sample count past
maxSamples before any rule sees it (and rule 2 holds commits to the genesis's smaller cap), a
front-run commit costs its victim the round but gains the front-runner nothing, and a majority that
includes the bent commits fails verification.

Two rounds. Round 1: three honest accounts (A, B and the later replayer) commit and finalize. Round
2: every account commits, each breaking one rule, and seven of them finalize a bitmap that includes
every decodable blob."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import pytest
import torch
import trio
from eth_account import Account
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

import mechanisms as M
from mechanisms.randomness import seeded_generator
from node.chain import errors
from node.chain.anvil import start_anvil
from node.chain.client import LedgerClient, connect
from node.chain.records import RoundState
from node.chain.registration import sign_registration
from node.peer.registry import RegistryCache
from node.peer.vetting import Vetter
from node.protocol import aggregate, policy, wire
from node.protocol.settings import PrivacyPolicy, SharedSettings
from node.rules import BlobRefused, Verdict
from node.verify import VerifyReport, verify
from p2p.store import MemoryBlobStore

D = 64
DUCHI = M.get("duchi", epsilon=1.0, clip=True).params()
SHARED = SharedSettings(
    model="mlp",
    dataset="digits",
    input_shape=(64,),
    num_classes=10,
    share="update",
    aggregation="fedavg",
    trim_ratio=0.1,
    krum_f=1,
    seed=0,
    privacy=PrivacyPolicy(DUCHI),
    max_samples=500,  # the genesis's cap, below the ledger's: rule 2 holds commits to the smaller
)
MECHANISM = wire.canonical(DUCHI)
SAMPLES = 100
MAX_SAMPLES = 1_000

# account name -> the check both must name for its round-2 commit (None: it counts)
TABLE = {
    "A": None,  # the vetting peer itself
    "B": None,
    "squatter": "registration",  # registered B's peer id without its key
    "over-genesis-cap": "samples",  # 700 samples: the ledger takes up to 1,000, the genesis 500
    "eps-up": "eps",
    "eps-down": "eps",
    "impossible-release": "release",  # a Duchi release scaled by 1.01
    "wrong-mechanism": "mechanism",  # Duchi without clipping, honestly accounted for it
    "malformed-blob": "blob",  # one value too many
    "replayed-blob": "binding",  # its own round-1 blob again
    "copied-blob": "binding",  # B's round-1 blob
    "front-run": "binding",  # the digest of the victim's pending round-2 commit, mined first
}
NAMES = [*TABLE, "victim"]  # the victim tries to commit in round 2 and is refused on chain


@dataclass
class Played:
    address: dict[str, str]
    peer: dict[tuple[int, str], Verdict | None] = field(default_factory=dict)  # (round, address) -> verdict
    report: VerifyReport | None = None
    refusals: dict[str, Exception] = field(default_factory=dict)  # what the contract refused, by attempt


def release(seed: int) -> torch.Tensor:
    update = torch.randn(D, generator=torch.Generator().manual_seed(seed)) * 0.01
    return M.from_params(DUCHI).perturb(update, generator=seeded_generator(seed)).to(torch.float32)


def eps(releases: int, params: dict[str, object] = DUCHI) -> int:
    return policy.privacy_spend(PrivacyPolicy(params), D, [SAMPLES] * releases).eps_micro


class Chain:
    """The deployment and its accounts, each registered with its own libp2p key."""

    def __init__(self, anvil) -> None:
        w3 = connect(anvil.url)
        self.anvil = anvil
        self.archive = MemoryBlobStore()
        self.genesis = torch.randn(D, generator=torch.Generator().manual_seed(1)) * 0.1
        accounts = [Account.from_key(k) for k in anvil.private_keys[: len(NAMES)]]
        deployer = LedgerClient.deploy(
            w3,
            accounts[0],
            min_peers=2,
            commit_window=50,
            attest_window=50,
            commit_window_seconds=60,
            attest_window_seconds=60,
            eps_cap_micro=10 * eps(1),
            delta=0.0,
            genesis_digest=bytes.fromhex(self.archive.put(wire.genesis_blob(self.genesis, SHARED.to_dict()))),
            max_samples=MAX_SAMPLES,
        )
        self.clients = {name: LedgerClient(w3, deployer.address, a) for name, a in zip(NAMES, accounts)}
        self.clients["A"] = deployer
        self.reader = LedgerClient(w3, deployer.address)
        self.peer_ids: dict[str, bytes] = {}

    def register(self, name: str, *, squat: str | None = None) -> None:
        client = self.clients[name]
        if squat is not None:  # someone else's peer id, with a signature it cannot make
            client.register(self.peer_ids[squat], b"\x01" * 64)
            return
        key = create_new_key_pair(bytes([NAMES.index(name) + 1]) * 32).private_key
        self.peer_ids[name] = ID.from_pubkey(key.get_public_key()).to_bytes()
        assert client.account is not None
        client.register(
            self.peer_ids[name], sign_registration(key, client.chain_id(), client.address, client.account.address)
        )

    def commit(
        self, name: str, r: int, data: bytes, *, eps_micro: int, mechanism: str = MECHANISM, samples: int = SAMPLES
    ) -> None:
        digest = self.archive.put(data)
        self.clients[name].commit(r, bytes.fromhex(digest), samples, eps_micro, mechanism.encode())

    def finalize(self, r: int, previous: torch.Tensor, attesters: list[str]) -> torch.Tensor:
        """The listed accounts attest the aggregate of every decodable blob of round r, until it finalizes."""
        commitments = self.reader.commitments(r)
        flags, vectors = [], []
        for c in commitments:
            try:
                vectors.append(wire.read_vector(self.archive.get(bytes(c.digest).hex()) or b"", D)[0])
                flags.append(True)
            except Exception:
                flags.append(False)
        weights = [int(c.num_samples) for c, included in zip(commitments, flags) if included]
        model = aggregate.next_global(SHARED, previous, vectors, weights)
        digest = bytes.fromhex(self.archive.put(wire.model_blob(model, r)))
        for name in attesters:
            self.clients[name].attest(r, digest, wire.encode_bitmap(flags))
        assert self.reader.round_info(r).state is RoundState.FINALIZED
        return model


def play(chain: Chain) -> Played:
    """Rounds 1 and 2 as the module doc says; records what the contract refused."""
    played = Played({name: c.account.address for name, c in chain.clients.items() if c.account is not None})
    address = played.address
    for name in ("A", "B", "replayed-blob"):
        chain.register(name)
    round1 = {
        name: wire.update_blob(release(i), 1, MECHANISM, address[name])
        for i, name in enumerate(("A", "B", "replayed-blob"))
    }
    for name, data in round1.items():
        chain.commit(name, 1, data, eps_micro=eps(1))
    chain.clients["A"].close_round(1)  # every registered account committed
    model = chain.finalize(1, chain.genesis, ["A", "B"])

    for name in NAMES:
        if name not in chain.peer_ids and name != "squatter":
            chain.register(name)
    chain.register("squatter", squat="B")

    def own(name: str, vector: torch.Tensor) -> bytes:
        return wire.update_blob(vector, 2, MECHANISM, address[name])

    chain.commit("A", 2, own("A", release(10)), eps_micro=eps(2))
    chain.commit("B", 2, own("B", release(11)), eps_micro=eps(2))
    chain.commit("squatter", 2, own("squatter", release(12)), eps_micro=eps(1))
    chain.commit("over-genesis-cap", 2, own("over-genesis-cap", release(18)), eps_micro=eps(1), samples=700)
    chain.commit("eps-up", 2, own("eps-up", release(13)), eps_micro=eps(1) + 1)
    chain.commit("eps-down", 2, own("eps-down", release(14)), eps_micro=eps(1) - 1)
    chain.commit("impossible-release", 2, own("impossible-release", release(15) * 1.01), eps_micro=eps(1))
    other = M.get("duchi", epsilon=1.0, clip=False).params()
    data = wire.update_blob(release(16), 2, wire.canonical(other), address["wrong-mechanism"])
    chain.commit("wrong-mechanism", 2, data, eps_micro=eps(1, other), mechanism=wire.canonical(other))
    chain.commit("malformed-blob", 2, own("malformed-blob", torch.zeros(D + 1)), eps_micro=eps(1))
    chain.commit("replayed-blob", 2, round1["replayed-blob"], eps_micro=eps(2))
    chain.commit("copied-blob", 2, round1["B"], eps_micro=eps(1))
    pending = own("victim", release(17))  # its commit transaction's digest is public while pending
    chain.commit("front-run", 2, pending, eps_micro=eps(1))
    for attempt, samples in (("over-max-samples", MAX_SAMPLES + 1), ("front-run-victim", SAMPLES)):
        try:
            chain.commit("victim", 2, pending, eps_micro=eps(1), samples=samples)
        except errors.LedgerError as exc:
            played.refusals[attempt] = exc
    chain.anvil.rpc("evm_increaseTime", [61])  # the victim never committed: its window must pass (blocks and seconds)
    chain.anvil.mine(51)
    chain.clients["A"].close_round(2)
    chain.finalize(2, model, ["A", "B", "squatter", "eps-up", "replayed-blob", "copied-blob", "over-genesis-cap"])
    return played


async def vet_as_a_peer(chain: Chain, played: Played) -> None:
    """A's vetting, as `swarm node` wires it: rules 1 to 3 for every commitment, and rules 4 to 6
    (the reader the agreement step decodes fetched blobs with) for those not refused unfetched."""

    async def call(fn, *args):
        return await trio.to_thread.run_sync(functools.partial(fn, *args))

    registry = RegistryCache(chain.reader)
    vetter = Vetter(chain.clients["A"], SHARED, D, me=played.address["A"], call=call, ownership=registry.ownership)
    for r in (1, 2):
        commitments = chain.reader.commitments(r)
        read = await vetter.update_reader(commitments)
        for c in commitments:
            _, verdict = await vetter.vet(r, c)
            if verdict is None:  # fetched: the bytes that match the digest, as any holder serves them
                try:
                    read(chain.archive.get(bytes(c.digest).hex()) or b"")
                except BlobRefused as refused:
                    verdict = refused.verdict
            played.peer[(r, c.peer)] = verdict


@pytest.fixture(scope="module")
def played():
    with start_anvil(accounts=len(NAMES)) as anvil:
        chain = Chain(anvil)
        result = play(chain)
        trio.run(vet_as_a_peer, chain, result)
        result.report = verify(chain.reader, chain.archive)
    return result


def verify_checks(report: VerifyReport, r: int, address: str) -> list[str]:
    """What verify names for one commit: every rule it breaks (the aggregate's failures apart)."""
    return [f.check for f in report.failures if (f.round, f.peer) == (r, address) and f.check != "aggregate"]


@pytest.mark.parametrize("name, check", list(TABLE.items()), ids=list(TABLE))
def test_a_peer_and_verify_reach_the_same_verdict(played, name, check):
    address = played.address[name]
    verdict = played.peer[(2, address)]
    assert (verdict.check if verdict else None) == check, verdict
    assert verify_checks(played.report, 2, address) == ([check] if check else [])


def test_round_one_is_honest_for_both(played):
    for name in ("A", "B", "replayed-blob"):
        address = played.address[name]
        assert played.peer[(1, address)] is None and verify_checks(played.report, 1, address) == []
    assert played.report.rounds[0].aggregate_ok


def test_the_contract_refuses_a_count_past_max_samples_before_any_rule_sees_it(played):
    """Rule 2 holds peers and verify to the bound the ledger's params report; the contract already
    refuses past it (tests/node/test_rules.py feeds the rule a count past it)."""
    refused = played.refusals["over-max-samples"]
    assert isinstance(refused, errors.NumSamplesOverCap)
    assert refused.fields == {"numSamples": MAX_SAMPLES + 1, "maxSamples": MAX_SAMPLES}


def test_a_front_run_digest_costs_the_victim_its_round_and_gains_the_front_runner_nothing(played):
    assert isinstance(played.refusals["front-run-victim"], errors.DuplicateDigest)
    assert played.address["victim"] not in [c for (r, c) in played.peer if r == 2]
    verdict = played.peer[(2, played.address["front-run"])]
    assert verdict is not None and played.address["victim"].lower() in verdict.reason


def test_a_majority_that_includes_bent_commits_fails_verification(played):
    """Seven of twelve participants finalized every decodable blob of round 2: verify names each
    commit honest peers leave out (replayed and copied blobs included) and fails the aggregate,
    although its digest recomputes (the malformed blob is outside the bitmap: nobody can aggregate it)."""
    report = played.report
    named = {f.peer for f in report.failures if f.round == 2 and f.check == "aggregate"}
    bent = {played.address[name] for name, check in TABLE.items() if check not in (None, "blob")}
    assert named == bent
    assert report.rounds[1].state == "finalized" and report.rounds[1].aggregate_ok is False
    assert not any("differs from the finalized digest" in f.detail for f in report.failures)
