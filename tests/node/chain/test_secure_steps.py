"""A secure-aggregation round's steps on a real Anvil: postFrame's windows, each step's set read
back from the chain (node.chain.secure_steps), the members' Ed25519 keys bound by their
registrations, and `verify_secure_round` recomputing the sum from the chain's digests and an
archive of frames, with a third of the members gone at any step, naming a member whose share or
frame does not fit."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mechanisms.secagg import messages as m
from mechanisms.secagg import round as r
from mechanisms.secagg.masks import session_id
from mechanisms.secagg.member import sum_residues
from mechanisms.secagg.shamir import PRIME
from mechanisms.secagg.unmask import survivors
from node.chain.errors import InvalidStep, NotRegistered, StepWindowClosed
from node.chain.secure_steps import Step, chain_steps, round_members
from node.verify import verify_secure_round

BITS, DIM = 32, 64
WINDOWS = dict(min_peers=3, commit_window=60, commit_window_seconds=120, attest_window=40, attest_window_seconds=80)


class Store:
    """A blob store holding frames by their sha256 (what a peer's store serves)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, raw: bytes) -> bytes:
        digest = hashlib.sha256(raw).digest()
        self.blobs[digest.hex()] = raw
        return digest

    def get(self, digest: str) -> bytes | None:
        return self.blobs.get(digest)


def signing_key(kit, i: int) -> Ed25519PrivateKey:
    """Member i's frame-signing key: its libp2p identity's own Ed25519 key."""
    return Ed25519PrivateKey.from_private_bytes(kit.identity(i).to_bytes())


class SecureRound:
    """n registered members playing round 1 through the ledger, each step's digest on chain."""

    def __init__(self, kit, chain, n: int) -> None:
        self.kit, self.n = kit, n
        self.swarm = kit.Swarm(chain, n + 1, **WINDOWS)
        self.swarm.register(n)
        self.store = Store()
        self.members = round_members(self.swarm.reader, 1)
        self.setup = r.RoundSetup.for_members(
            session_id(kit.GENESIS, 1), self.members.signing, BITS, DIM, counted_members=1
        )
        rng = np.random.default_rng(7)
        self.inputs = {i: rng.integers(0, 2**BITS, DIM, dtype=np.int64) for i in range(n)}
        self.info = self.swarm.reader.round_info(1)

    def post(self, i: int, step: Step, raw: bytes) -> None:
        self.swarm.peers[i].post_frame(1, step, self.store.put(raw))

    def pass_part(self, parts: int) -> None:
        p = self.swarm.params
        self.swarm.pass_window(
            self.info.opened_block + p["commit_window"] // parts,
            self.info.opened_at + p["commit_window_seconds"] // parts,
        )

    def play(self, *, drop_before: dict[str, set[int]] | None = None, reveal_hook=None) -> None:
        """drop_before["keys" | "deal" | "mask" | "reveal"]: the members that send nothing from that step on."""
        drops = {"keys": set(), "deal": set(), "mask": set(), "reveal": set(), **(drop_before or {})}
        setup, reader, gone = self.setup, self.swarm.reader, set(drops["keys"])
        states = {}
        for i in set(range(self.n)) - gone:
            states[i], frame = r.start(setup, i, signing_key(self.kit, i))
            self.post(i, Step.KEYS, frame)
        self.pass_part(4)
        steps = chain_steps(reader, 1, self.members)
        keys, faults = r.key_set(setup, {i: self.store.get(d.hex()) for i, d in steps.digests[Step.KEYS].items()})
        assert faults == {} and set(keys) == set(range(self.n)) - gone
        gone |= drops["deal"]
        for i in set(keys) - gone:
            dealing, sealed = r.deal(states[i], setup, keys)
            self.post(i, Step.DEALING, m.dealing_bundle(dealing, sealed))
        self.pass_part(2)
        steps = chain_steps(reader, 1, self.members)
        bundles = {i: m.split_bundle(self.store.get(d.hex()), i) for i, d in steps.digests[Step.DEALING].items()}
        dealt, _ = r.dealt_set(setup, keys, {i: dealing for i, (dealing, _) in bundles.items()})
        for i in set(keys) - gone:
            sealed_for_i = {dealer: sealed[i] for dealer, (_, sealed) in bundles.items()}
            assert r.receive(states[i], setup, keys, dealt, sealed_for_i) == {}
        gone |= drops["mask"]
        for i in sorted(set(dealt) - gone):
            masked = r.masked_vector(states[i], setup, keys, dealt, self.inputs[i])
            self.swarm.peers[i].commit(1, self.store.put(masked), 10, 1_000_000, self.kit.MECHANISM)
        self.swarm.pass_commit_window(1)
        self.swarm.peers[0].close_round(1)
        steps = chain_steps(reader, 1, self.members)
        masked_frames = {i: self.store.get(d.hex()) for i, d in steps.digests[Step.MASKED].items()}
        vectors, _ = survivors(setup, dealt, masked_frames)
        self.alive = set(vectors)
        gone |= drops["reveal"]
        for i in sorted(set(keys) - gone):
            frame = r.reveal(states[i], setup, dealt, vectors)
            self.post(i, Step.REVEAL, reveal_hook(i, frame) if reveal_hook else frame)

    def plain_sum(self) -> np.ndarray:
        return sum_residues([self.inputs[i] for i in sorted(self.alive)], BITS)

    def verify(self):
        return verify_secure_round(self.swarm.reader, 1, self.store, bits=BITS, dim=DIM, counted_members=1)


def test_members_are_bound_by_their_registrations(automine_chain, kit):
    game = SecureRound(kit, automine_chain, 4)
    assert game.members.addresses == tuple(a.address for a in game.swarm.accounts[:4])
    for i in range(4):
        probe = signing_key(kit, i).sign(b"probe")
        game.members.signing[i].verify(probe, b"probe")  # raises if not member i's libp2p key


def test_a_secure_round_on_chain_verifies_with_a_member_dropped_after_dealing(automine_chain, kit):
    game = SecureRound(kit, automine_chain, 5)  # t = 4
    game.play(drop_before={"mask": {4}})
    check = game.verify()
    assert check.failure is None, check.failure
    assert game.alive == {0, 1, 2, 3}
    np.testing.assert_array_equal(check.total, game.plain_sum())
    assert check.dropped == (game.members.addresses[4],) and check.faults == {}


@pytest.mark.parametrize("step", ["keys", "deal", "mask", "reveal"])
def test_a_third_of_the_members_gone_at_any_step_and_the_round_verifies(automine_chain, kit, step):
    game = SecureRound(kit, automine_chain, 6)  # t = 4: two of six may go, whichever step they leave at
    game.play(drop_before={step: {1, 4}})
    check = game.verify()
    assert check.failure is None, check.failure
    assert game.alive == ({0, 2, 3, 5} if step != "reveal" else set(range(6)))
    np.testing.assert_array_equal(check.total, game.plain_sum())
    assert check.faults == {}


def test_verify_names_a_wrong_share_and_a_frame_the_archive_changed(automine_chain, kit):
    game = SecureRound(kit, automine_chain, 6)  # t = 4: five reveal, one lies, four good shares remain
    liar = 2

    def forge(i: int, frame: bytes) -> bytes:
        if i != liar:
            return frame
        setup = game.setup
        opened = m.read_reveal(m.open_frame(frame, m.Kind.REVEAL, setup.session, setup.signing))
        forged = [o._replace(y=(o.y + 1) % PRIME) if o.dealer == 0 else o for o in opened]
        return m.reveal_message(setup.session, liar, forged, signing_key(kit, liar))

    game.play(drop_before={"mask": {5}}, reveal_hook=forge)
    check = game.verify()
    assert check.failure is None, check.failure
    np.testing.assert_array_equal(check.total, game.plain_sum())
    liar_address = game.members.addresses[liar]
    assert set(check.faults) == {liar_address} and "does not match its commitment" in check.faults[liar_address]

    # an archive whose REVEAL frame of member 1 is not the one whose digest the chain holds
    digest = chain_steps(game.swarm.reader, 1, game.members).digests[Step.REVEAL][1]
    game.store.blobs[digest.hex()] = game.store.blobs[digest.hex()][:-1] + b"\0"
    check = game.verify()
    assert "REVEAL digest" in check.faults[game.members.addresses[1]]


def test_post_frame_is_taken_only_in_its_steps_window(automine_chain, kit):
    swarm = kit.Swarm(automine_chain, 3, **WINDOWS)
    swarm.register(2)
    member, outsider = swarm.peers[0], swarm.peers[2]
    with pytest.raises(NotRegistered):
        outsider.post_frame(1, Step.KEYS, kit.digest("k"))
    with pytest.raises(InvalidStep):
        member.post_frame(1, Step.MASKED, kit.digest("m"))  # the masked vector's digest is the commit
    with pytest.raises(StepWindowClosed):
        member.post_frame(1, Step.DEALING, kit.digest("d"))  # KEYS window still running
    with pytest.raises(StepWindowClosed):
        member.post_frame(1, Step.REVEAL, kit.digest("r"))  # the round is open
    member.post_frame(1, Step.KEYS, kit.digest("k0"))
    member.post_frame(1, Step.KEYS, kit.digest("k1"))  # taken, but only the first counts
    info, p = swarm.reader.round_info(1), swarm.params
    swarm.pass_window(info.opened_block + p["commit_window"] // 4, info.opened_at + p["commit_window_seconds"] // 4)
    with pytest.raises(StepWindowClosed):
        member.post_frame(1, Step.KEYS, kit.digest("late"))
    member.post_frame(1, Step.DEALING, kit.digest("d0"))
    members = round_members(swarm.reader, 1)
    steps = chain_steps(swarm.reader, 1, members)
    assert steps.digests[Step.KEYS] == {0: kit.digest("k0")} and steps.digests[Step.DEALING] == {0: kit.digest("d0")}
    assert "KEYS" in steps.repeated[0]
    swarm.pass_window(info.opened_block + p["commit_window"] // 2, info.opened_at + p["commit_window_seconds"] // 2)
    with pytest.raises(StepWindowClosed):
        member.post_frame(1, Step.DEALING, kit.digest("late"))
