"""A secure-aggregation round's steps on a real Anvil: postFrame's windows, each step's set read back from
the chain (node.chain.secure_steps), the members' Ed25519 keys bound by their registrations (less the
disallowed), and `verify_secure_round` recomputing the sum from the chain's digests and an archive of
frames, with a third of the members gone at any step, naming a member whose share or frame does not fit,
reading no blob past its step's bound, and reporting a round it cannot check; the contract's step
windows probed against `secure_windows.WINDOWS`; `complain` in its window with the frame on chain,
bounded by the registrations made, a non-member's frame never decoded, and verify settling the chain's
complaints as the members do. A member (`SecureMember.play`, in-process: the blobs move between stores,
the chain is real) sits the round out, never raising, when it lacks a KEYS or DEALING blob the chain
names, when its round cannot be set up, and when a chain read fails; it reveals before it fetches a
MASKED frame of U3 it lacks (from its acknowledgers), and reveals when its own acknowledgment was
refused."""

from __future__ import annotations

import contextlib
import functools
import hashlib

import numpy as np
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from eth_account import Account

from mechanisms.secagg import messages as m
from mechanisms.secagg import round as r
from mechanisms.secagg.complaints import complain, settle
from mechanisms.secagg.masks import session_id
from mechanisms.secagg.member import sum_residues
from mechanisms.secagg.shamir import PRIME
from mechanisms.secagg.unmask import survivors
from node.chain.client import LedgerClient
from node.chain.errors import (
    AlreadyPosted,
    DuplicateDigest,
    InvalidComplaint,
    InvalidStep,
    MalformedBitmap,
    NotRegistered,
    NotSecureAggregation,
    RoundNotOpen,
    StepWindowClosed,
)
from node.chain.secure_steps import (
    BadRound,
    RoundMembers,
    ack_bitmap,
    agreed,
    chain_complaints,
    chain_steps,
    first_complaints,
    read_ack,
    round_members,
    round_session,
    round_setup,
    settled_block,
)
from node.peer.secure import SecureMember, SecureSettings
from node.protocol.secure_windows import WINDOWS as STEP_WINDOWS
from node.protocol.secure_windows import Step, window_end
from node.verify import verify_secure_round
from p2p import peer_id_from_bytes
from p2p.errors import BlobNotFound
from p2p.store import MemoryBlobStore

BITS, DIM = 32, 64
WINDOWS = dict(
    min_peers=3,
    commit_window=60,
    commit_window_seconds=120,
    attest_window=40,
    attest_window_seconds=80,
    secure_aggregation=True,
)


async def given(residues):
    """A member's residues, ready at once (what `SecureMember.play` awaits when it masks)."""
    return residues


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

    def read(self, digest: str, offset: int, length: int) -> bytes | None:
        blob = self.blobs.get(digest)
        if blob is None:
            return None
        part = blob[offset : offset + length]
        self.longest_read = max(getattr(self, "longest_read", 0), len(part))
        return part


def signing_key(kit, i: int) -> Ed25519PrivateKey:
    """Member i's frame-signing key: its libp2p identity's own Ed25519 key."""
    return Ed25519PrivateKey.from_private_bytes(kit.identity(i).to_bytes())


@contextlib.contextmanager
def decoded_complaints(reader: LedgerClient):
    """The senders of the Complained logs `reader` decodes meanwhile (its codec, watched)."""
    senders: list[str] = []
    decode = reader._events.decode

    def watched(name, logs):
        events = decode(name, logs)
        senders.extend(e["args"]["peer"] for e in events if name == "Complained")
        return events

    reader._events.decode = watched
    try:
        yield senders
    finally:
        del reader._events.decode


class SecureRound:
    """n registered members playing round 1 through the ledger, each step's digest on chain."""

    def __init__(self, kit, chain, n: int) -> None:
        self.kit, self.n = kit, n
        self.swarm = kit.Swarm(chain, n + 1, **WINDOWS)
        self.swarm.register(n)
        self.store = Store()
        self.members = round_members(self.swarm.reader, 1)
        self.setup = r.RoundSetup.for_members(
            round_session(self.swarm.reader, 1), self.members.signing, BITS, DIM, counted_members=1
        )
        rng = np.random.default_rng(7)
        self.inputs = {i: rng.integers(0, 2**BITS, DIM, dtype=np.int64) for i in range(n)}
        self.info = self.swarm.reader.round_info(1)

    def post(self, i: int, step: Step, raw: bytes) -> None:
        self.swarm.peers[i].post_frame(1, step, self.store.put(raw))

    def pass_step(self, step: Step) -> None:
        """Mine (and move the clock) past `step`'s window."""
        info, p = self.swarm.reader.round_info(1), self.swarm.params
        if STEP_WINDOWS[step].closed:
            since, blocks, seconds = (info.closed_block, info.closed_at), p["attest_window"], p["attest_window_seconds"]
        else:
            since, blocks, seconds = (info.opened_block, info.opened_at), p["commit_window"], p["commit_window_seconds"]
        self.swarm.pass_window(*window_end(step, since, blocks, seconds))

    def acknowledge(self, step: Step, senders: set[int], ackers: set[int], served=None) -> frozenset[int]:
        """Each of `ackers` acknowledges the frames of `senders` it was served (served[s]: the only
        members that got s's frame), the window passed: the chain's set."""
        for i in sorted(ackers):
            held = {s for s in senders if served is None or s not in served or i in served[s]}
            self.swarm.peers[i].acknowledge(1, step, ack_bitmap(held, self.n))
        self.pass_step(Step(step + 4))
        self.steps = chain_steps(self.swarm.reader, 1, self.members)
        return agreed(self.steps, step, self.setup.threshold)

    def play(
        self,
        *,
        drop_before: dict[str, set[int]] | None = None,
        reveal_hook=None,
        served: dict[int, set[int]] | None = None,
        served_step: Step = Step.MASKED,
        commit_order=None,
        seal_hook=None,
        false_complainer: int | None = None,
        outsider_complaint: bool = False,
    ) -> None:
        """drop_before["keys" | "keys_ack" | "deal" | "deal_ack" | "mask" | "ack" | "reveal"]: the
        members that send nothing from that step on; served[s]: the only members that got member
        s's frame of `served_step` (it served nobody else); commit_order(i, digest): commits
        member i's MASKED digest (default: i commits it); seal_hook(i, sealed): the SEALED frames
        dealer i puts in its bundle; `false_complainer` complains against dealer 0 besides its
        true complaints; `outsider_complaint`: the spare account registers after the KEYS window
        (no member of the round) and complains with a frame at the contract's bound. Holders
        complain on chain against the dealers whose shares fail, and everyone masks against U2
        as `settle` leaves it (`self.complaints`, `self.complaint_faults`)."""
        steps = ("keys", "keys_ack", "deal", "deal_ack", "mask", "ack", "reveal")
        drops = {step: set() for step in steps} | (drop_before or {})

        def only(step: Step) -> dict[int, set[int]] | None:
            return served if step is served_step else None

        setup, reader, gone = self.setup, self.swarm.reader, set(drops["keys"])
        states = {}
        for i in set(range(self.n)) - gone:
            states[i], frame = r.start(setup, i, signing_key(self.kit, i))
            self.post(i, Step.KEYS, frame)
        self.pass_step(Step.KEYS)
        posted = chain_steps(reader, 1, self.members).digests[Step.KEYS]
        gone |= drops["keys_ack"]
        self.u1 = self.acknowledge(Step.KEYS, set(posted), set(range(self.n)) - gone, only(Step.KEYS))
        keys, faults = r.key_set(setup, {i: self.store.get(posted[i].hex()) for i in self.u1})
        assert faults == {} and set(keys) == self.u1
        gone |= drops["deal"]
        for i in set(keys) - gone:
            dealing, sealed = r.deal(states[i], setup, keys)
            self.post(i, Step.DEALING, m.dealing_bundle(dealing, seal_hook(i, sealed) if seal_hook else sealed))
        self.pass_step(Step.DEALING)
        posted = chain_steps(reader, 1, self.members).digests[Step.DEALING]
        gone |= drops["deal_ack"]
        self.u2 = self.acknowledge(Step.DEALING, set(posted), set(range(self.n)) - gone, only(Step.DEALING))
        bundles = {i: m.split_bundle(self.store.get(posted[i].hex()), i) for i in self.u2}
        dealt, _ = r.dealt_set(setup, keys, {i: dealing for i, (dealing, _) in bundles.items()})
        sealed_by = {d: sealed for d, (_, sealed) in bundles.items()}
        for i in sorted(set(keys) - gone):
            bad = r.receive(states[i], setup, keys, dealt, sealed_by)
            if i == false_complainer:
                revealed = {d: states[i].pair_keys[d] for d in {*bad, 0}}
                self.swarm.peers[i].complain(
                    1, m.complaint_message(setup.session, i, revealed, signing_key(self.kit, i))
                )
            elif bad:
                self.swarm.peers[i].complain(1, complain(states[i], setup, bad))
        if outsider_complaint:
            outsider = self.swarm.peers[self.n]
            self.kit.register_signed(outsider, self.kit.identity(self.n))
            outsider.complain(1, b"\x5a" * m.max_complaint_bytes(self.n + 1))
        self.pass_step(Step.COMPLAINT)
        self.complaints = chain_complaints(reader, 1, self.members, at=reader.block_number())
        dealt, self.complaint_faults = settle(setup, keys, dealt, self.complaints, sealed_by)
        gone |= drops["mask"]
        for i in sorted(set(dealt) - gone):
            masked = r.masked_vector(states[i], setup, keys, dealt, self.inputs[i])
            if commit_order is None:
                self.swarm.peers[i].commit(1, self.store.put(masked), 10, 1_000_000, self.kit.MECHANISM)
            else:
                commit_order(i, self.store.put(masked))
        self.swarm.pass_commit_window(1)
        self.swarm.peers[0].close_round(1)
        posted = chain_steps(reader, 1, self.members).digests[Step.MASKED]
        masked_frames = {i: self.store.get(d.hex()) for i, d in posted.items()}
        vectors, self.masked_faults = survivors(setup, dealt, masked_frames)
        gone |= drops["ack"]
        self.alive = set(self.acknowledge(Step.MASKED, set(vectors), set(keys) - gone, only(Step.MASKED)) & set(dealt))
        gone |= drops["reveal"]
        for i in sorted(set(keys) - gone):
            frame = r.reveal(states[i], setup, dealt, self.alive)
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


@pytest.mark.parametrize("step", ["keys", "keys_ack", "deal", "deal_ack", "mask", "ack", "reveal"])
def test_a_third_of_the_members_gone_at_any_step_and_the_round_verifies(automine_chain, kit, step):
    game = SecureRound(kit, automine_chain, 6)  # t = 4: two of six may go, whichever step they leave at
    game.play(drop_before={step: {1, 4}})
    check = game.verify()
    assert check.failure is None, check.failure
    assert game.u1 == ({0, 2, 3, 5} if step == "keys" else set(range(6)))  # four acknowledgers are t
    assert game.u2 == ({0, 2, 3, 5} if step in ("keys", "keys_ack", "deal") else set(range(6)))
    assert game.alive == ({0, 2, 3, 5} if step not in ("ack", "reveal") else set(range(6)))
    np.testing.assert_array_equal(check.total, game.plain_sum())
    assert check.faults == {}


@pytest.mark.parametrize("served", [{0, 1, 2}, {0, 1, 2, 3}])
def test_a_masked_frame_committed_then_served_to_some_members_only_splits_no_set(automine_chain, kit, served):
    """Member 5 commits its MASKED digest and serves the frame to `served` only (itself gone):
    with fewer than t = 4 holders it is out of U3 for everyone (its mask key revealed, never its
    seed), with t it is in U3 for everyone (members lacking it reveal its seed all the same, and
    fetch it from its acknowledgers). Either way the round unmasks and verifies."""
    game = SecureRound(kit, automine_chain, 6)
    withholder = 5
    game.play(served={withholder: served}, drop_before={"ack": {withholder}})
    in_u3 = len(served) >= game.setup.threshold
    assert game.alive == (set(range(6)) if in_u3 else set(range(5)))
    assert set(game.steps.holders(Step.MASKED, withholder)) == served
    if not in_u3:  # the archive holds no copy of a frame fewer than t members acknowledged
        del game.store.blobs[game.steps.digests[Step.MASKED][withholder].hex()]
    check = game.verify()
    assert check.failure is None, check.failure
    np.testing.assert_array_equal(check.total, game.plain_sum())
    assert check.faults == {}
    assert check.dropped == (() if in_u3 else (game.members.addresses[withholder],))


@pytest.mark.parametrize("step", [Step.KEYS, Step.DEALING])
@pytest.mark.parametrize("served", [{0, 1, 2}, {0, 1, 2, 3}])
def test_a_keys_or_dealing_blob_served_to_some_members_only_splits_no_set(automine_chain, kit, step, served):
    """Member 5 posts its KEYS (or DEALING) digest and serves the blob to `served` only: held by
    fewer than t = 4 it is out of U1 (U2) for everyone, and the archive needs no copy of it; held
    by t it is in for everyone (a member lacking it would fetch it from its acknowledgers)."""
    game = SecureRound(kit, automine_chain, 6)
    sender = 5
    game.play(served={sender: served}, served_step=step, drop_before={"mask": {sender}})
    chosen = game.u1 if step is Step.KEYS else game.u2
    assert (sender in chosen) == (len(served) >= game.setup.threshold)
    assert set(game.steps.holders(step, sender)) == served
    if sender not in chosen:
        del game.store.blobs[game.steps.digests[step][sender].hex()]
    check = game.verify()
    assert check.failure is None, check.failure
    assert game.alive == set(range(5))
    np.testing.assert_array_equal(check.total, game.plain_sum())
    assert check.faults == {}


def test_a_copied_masked_digest_committed_first_does_not_push_its_sender_out(automine_chain, kit):
    """Member 1 front-runs member 0: it commits 0's MASKED digest before 0 does. The ledger of a
    secure swarm takes both commits; the frame names and is signed by 0, so every member finds
    that 1's commit holds no frame of its own, nobody acknowledges it, and 0 is in the sum."""
    game = SecureRound(kit, automine_chain, 5)  # t = 4
    copier, victim = 1, 0
    digests: dict[int, bytes] = {}

    def commit(i: int, digest: bytes) -> None:
        digests[i] = digest
        if i == copier:
            return
        if i == victim:  # the copy lands first, as a front-runner's with a higher fee would
            game.swarm.peers[copier].commit(1, digest, 10, 1_000_000, kit.MECHANISM)
        game.swarm.peers[i].commit(1, digest, 10, 1_000_000, kit.MECHANISM)

    game.play(commit_order=commit)
    assert game.steps.digests[Step.MASKED][copier] == game.steps.digests[Step.MASKED][victim] == digests[victim]
    assert "another member" in game.masked_faults[copier]
    assert victim in game.alive and copier not in game.alive
    check = game.verify()
    assert check.failure is None, check.failure
    np.testing.assert_array_equal(check.total, game.plain_sum())
    copier_address = game.members.addresses[copier]
    assert "another member" in check.faults[copier_address] and copier_address in check.dropped


def test_sets_are_read_confirmations_deep(automine_chain, kit):
    """A posting in the last blocks, which a reorganisation takes back, is in no set a member
    reading `confirmations` deep acts on: the set it saw is the one the chain keeps."""
    game = SecureRound(kit, automine_chain, 4)
    deep = LedgerClient(game.swarm.w3, game.swarm.address, confirmations=2)
    kept = kit.digest("kept")
    game.swarm.peers[0].post_frame(1, Step.KEYS, kept)
    game.swarm.anvil.mine(2)
    snapshot = game.swarm.anvil.rpc("evm_snapshot", [])
    game.swarm.peers[1].post_frame(1, Step.KEYS, kit.digest("reorged"))  # in the head block only
    at_head = chain_steps(game.swarm.reader, 1, game.members).digests[Step.KEYS]
    seen = chain_steps(deep, 1, game.members).digests[Step.KEYS]
    assert at_head == {0: kept, 1: kit.digest("reorged")} and seen == {0: kept}
    game.swarm.anvil.rpc("evm_revert", [snapshot])  # the reorganisation
    game.swarm.anvil.mine(3)
    assert chain_steps(game.swarm.reader, 1, game.members).digests[Step.KEYS] == seen

    # a window is over for a member once it has passed at the block 2 deep, whichever head it is given
    def block(number):
        b = game.swarm.w3.eth.get_block(number)
        return b["number"], b["timestamp"]

    latest = block("latest")
    deep_block = block(latest[0] - 2)
    for head in (latest, deep_block):
        assert settled_block(deep, head, deep_block[0], deep_block[1]) == deep_block[0]
        assert settled_block(deep, head, deep_block[0] + 1, deep_block[1]) is None  # its last block is later
        assert settled_block(deep, head, deep_block[0], deep_block[1] + 1) is None  # and so is its last second


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
    changed = game.store.blobs[digest.hex()]
    game.store.blobs[digest.hex()] = changed[:-1] + bytes([changed[-1] ^ 1])  # another last byte, whatever it was
    check = game.verify()
    assert "REVEAL digest" in check.faults[game.members.addresses[1]]


def test_each_posting_is_taken_only_in_its_steps_window(automine_chain, kit):
    """KEYS, its acknowledgments, DEALING, its acknowledgments (eighths of the commit window), the
    MASKED acknowledgments and REVEAL (quarters of the attestation window): each refused before
    its window and after it, and a repeat refused; each set counted by t."""
    swarm = kit.Swarm(automine_chain, 3, **WINDOWS)
    swarm.register(2)
    member, outsider = swarm.peers[0], swarm.peers[2]
    with pytest.raises(NotRegistered):
        outsider.post_frame(1, Step.KEYS, kit.digest("k"))
    kit.register_signed(outsider, kit.identity(2))  # a member from here on: three commit (the quorum)
    with pytest.raises(InvalidStep):
        member.post_frame(1, Step.MASKED, kit.digest("m"))  # the masked vector's digest is the commit
    with pytest.raises(InvalidStep):
        member.acknowledge(1, Step.REVEAL, b"\x01")  # nothing acknowledges the reveals
    game = SecureRound.__new__(SecureRound)  # its window arithmetic only
    game.swarm = swarm
    order = [Step.KEYS, Step.KEYS_ACK, Step.DEALING, Step.DEALING_ACK]

    def post(step: Step, who=member, tag="") -> None:
        if step in (Step.KEYS, Step.DEALING):
            who.post_frame(1, step, kit.digest(f"{step.name}{tag}"))
        else:
            who.acknowledge(1, step - 4, ack_bitmap({0, 1}, 3))

    for k, step in enumerate(order):
        for later in order[k + 1 :]:
            with pytest.raises(StepWindowClosed, match=f"step {int(later)}'s window has not begun"):
                post(later)
        with pytest.raises(StepWindowClosed):  # the round is open: REVEAL and the MASKED acknowledgments wait
            post(Step.MASKED_ACK) if k % 2 else member.post_frame(1, Step.REVEAL, kit.digest("r"))
        post(step)
        with pytest.raises(AlreadyPosted):  # one posting per member and step: no stream of them to re-read
            post(step, tag="again")
        post(step, swarm.peers[1])
        game.pass_step(step)
        with pytest.raises(StepWindowClosed, match=rf"step {int(step)}'s window is over \(it lasted through block"):
            post(step, outsider)
    members = round_members(swarm.reader, 1)
    steps = chain_steps(swarm.reader, 1, members)
    assert steps.digests[Step.KEYS] == {0: kit.digest("KEYS"), 1: kit.digest("KEYS")}
    assert steps.acks[Step.KEYS] == steps.acks[Step.DEALING] == {0: frozenset({0, 1}), 1: frozenset({0, 1})}
    assert agreed(steps, Step.KEYS, 2) == agreed(steps, Step.DEALING, 2) == {0, 1}
    assert agreed(steps, Step.KEYS, 3) == set()  # two acknowledgers, t = 3: nobody
    for i in range(3):
        swarm.peers[i].commit(1, kit.digest(f"masked{i}"), 10, 1_000_000, kit.MECHANISM)
    swarm.pass_commit_window(1)
    member.close_round(1)
    with pytest.raises(RoundNotOpen):  # KEYS, DEALING and their acknowledgments: their phase is over
        post(Step.DEALING_ACK, outsider)
    with pytest.raises(StepWindowClosed, match="not begun"):
        member.post_frame(1, Step.REVEAL, kit.digest("r"))  # the ACK window runs first
    with pytest.raises(MalformedBitmap, match="bitmap of 513 bytes, expected 512 .* an acknowledgment's: at most"):
        member.acknowledge(1, Step.MASKED, bytes(513))  # more members than a frame can address
    member.acknowledge(1, Step.MASKED, ack_bitmap({0, 1}, 3))
    with pytest.raises(AlreadyPosted):
        member.acknowledge(1, Step.MASKED, ack_bitmap({0}, 3))
    swarm.peers[1].acknowledge(1, Step.MASKED, b"\x0f")  # a bit past the last member: not a bitmap over the members
    game.pass_step(Step.MASKED_ACK)
    with pytest.raises(StepWindowClosed):
        member.acknowledge(1, Step.MASKED, b"\x03")
    member.post_frame(1, Step.REVEAL, kit.digest("r0"))
    with pytest.raises(AlreadyPosted):
        member.post_frame(1, Step.REVEAL, kit.digest("r1"))
    steps = chain_steps(swarm.reader, 1, members)
    assert steps.acks[Step.MASKED] == {0: frozenset({0, 1})} and "not a bitmap" in steps.repeated[1]
    assert steps.digests[Step.REVEAL] == {0: kit.digest("r0")}
    assert agreed(steps, Step.MASKED, 1) == {0, 1} and agreed(steps, Step.MASKED, 2) == set()
    game.pass_step(Step.REVEAL)
    with pytest.raises(StepWindowClosed, match="is over"):
        outsider.post_frame(1, Step.REVEAL, kit.digest("late"))


def test_the_contracts_step_windows_are_secure_windows(automine_chain, kit):
    """`SwarmLedger._stepWindow` against `secure_windows.WINDOWS`, probed: every step's posting
    tried in the last block of each eighth of both phases and in the block after it (each try
    taken back), taken exactly where WINDOWS puts the step. Eighths of 8 blocks; the phases'
    seconds passed at once, so the blocks decide (the seconds are cut by the same eighths)."""
    eighth = 8
    windows = WINDOWS | dict(min_peers=2, commit_window=8 * eighth, attest_window=8 * eighth)
    swarm = kit.Swarm(automine_chain, 2, **(windows | dict(commit_window_seconds=8, attest_window_seconds=8)))
    swarm.register(2)

    def post(step: Step) -> None:
        member = LedgerClient(swarm.w3, swarm.address, swarm.accounts[0], tx_timeout=30)  # its nonce afresh
        if step in (Step.KEYS, Step.DEALING, Step.REVEAL):
            member.post_frame(1, step, kit.digest(step.name))
        elif step is Step.COMPLAINT:
            member.complain(1, b"complaint")
        else:
            member.acknowledge(1, step - 4, b"\x03")

    def taken(since: int, offsets: list[int]) -> dict[tuple[Step, int], bool]:
        """(step, offset) -> whether the chain takes the posting in block since + offset."""
        seen = {}
        for offset in offsets:
            swarm.mine_to(since + offset)
            for step in STEP_WINDOWS:
                snapshot = swarm.anvil.rpc("evm_snapshot", [])
                latest = swarm.w3.eth.get_block("latest")["timestamp"]  # the try's block: the seconds passed
                swarm.anvil.rpc("evm_setNextBlockTimestamp", [latest + 100])
                try:
                    post(step)
                    seen[step, offset] = True
                except (StepWindowClosed, RoundNotOpen):
                    seen[step, offset] = False
                swarm.anvil.rpc("evm_revert", [snapshot])
        return seen

    def expected(closed: bool, offsets: list[int]) -> dict[tuple[Step, int], bool]:
        return {
            (step, k): w.closed == closed and eighth * w.start < k <= eighth * w.through
            for step, w in STEP_WINDOWS.items()
            for k in offsets
        }

    info = swarm.reader.round_info(1)
    offsets = [
        k for e in range(9) for k in (eighth * e, eighth * e + 1) if k > swarm.anvil.block_number() - info.opened_block
    ]
    assert len(offsets) >= 16 and taken(info.opened_block, offsets) == expected(False, offsets)
    swarm.commit_all(1, 2)
    swarm.mine_to(info.opened_block + 8 * eighth + 1)
    swarm.peers[0].close_round(1)
    closed = swarm.reader.round_info(1).closed_block
    offsets = [k for e in range(9) for k in (eighth * e, eighth * e + 1) if k > 0]
    assert taken(closed, offsets) == expected(True, offsets)


def test_a_complaint_frames_bound_is_its_layout_for_the_registrations_made():
    """`max_complaint_bytes(n)`: the frame naming n dealers, the size `complaint_message` writes,
    up to what a frame can address (`max_frame_bytes`): the contract's bound, 111 + 34 n."""
    key = Ed25519PrivateKey.generate()
    for n in (0, 1, 2, 5, 37, 1000):
        revealed = {d: bytes([d % 256]) * 32 for d in range(n)}
        assert len(m.complaint_message(bytes(32), 0, revealed, key)) == m.max_complaint_bytes(n) == 111 + 34 * n
    assert m.max_complaint_bytes(m.MAX_MEMBERS) == m.max_complaint_bytes(10**6) == m.max_frame_bytes(m.Kind.COMPLAINT)


def test_a_complaint_is_taken_on_chain_itself_only_in_its_window(automine_chain, kit):
    """`complain(round, frame)`: the COMPLAINT frame itself in the event, between the DEALING
    acknowledgments and the commits; refused before its window and after it, repeated, empty or
    over the largest COMPLAINT frame among the registrations made so far, or from an address that
    is not registered. The reader keeps the first frame of each member of the round: a complaint
    from an address registered after the KEYS window (no member of the round) is dropped before
    it is decoded."""
    swarm = kit.Swarm(automine_chain, 4, **WINDOWS)
    swarm.register(2)
    game = SecureRound.__new__(SecureRound)  # its window arithmetic only
    game.swarm = swarm
    member, other, late = swarm.peers[0], swarm.peers[1], swarm.peers[2]
    with pytest.raises(NotRegistered):
        late.complain(1, b"complaint")
    for step in (Step.KEYS, Step.KEYS_ACK, Step.DEALING):
        game.pass_step(step)
        with pytest.raises(StepWindowClosed, match="step 7's window has not begun"):
            member.complain(1, b"early")
    kit.register_signed(late, kit.identity(2))  # registered after the KEYS window: no member of round 1
    game.pass_step(Step.DEALING_ACK)
    bound = m.max_complaint_bytes(3)  # three registrations: 213 bytes, not the 139,375 of 4,096
    with pytest.raises(InvalidComplaint, match=f"{bound + 1} bytes .* 1 to {bound}"):
        member.complain(1, b"\xa5" * (bound + 1))
    with pytest.raises(InvalidComplaint, match="of 0 bytes"):
        member.complain(1, b"")
    largest = bytes(range(256))[:bound]
    member.complain(1, largest)  # at the bound
    with pytest.raises(AlreadyPosted):
        member.complain(1, b"again")
    kit.register_signed(swarm.peers[3], kit.identity(3))  # a fourth registration raises it by one entry
    outsiders = b"\x5a" * m.max_complaint_bytes(4)
    late.complain(1, outsiders)
    game.pass_step(Step.COMPLAINT)
    with pytest.raises(StepWindowClosed, match="step 7's window is over"):
        other.complain(1, b"late")
    everyone = [member.account.address, late.account.address]
    events = swarm.reader.complaints(1, 0, swarm.reader.block_number(), senders=everyone, max_frame=len(outsiders))
    assert [(e["args"]["peer"], e["args"]["frame"]) for e in events] == [
        (member.account.address, largest),
        (late.account.address, outsiders),
    ]
    members = round_members(swarm.reader, 1)
    at = swarm.reader.block_number()
    with decoded_complaints(swarm.reader) as decoded:
        assert len(members.addresses) == 2 and chain_complaints(swarm.reader, 1, members, at=at) == {0: largest}
    assert decoded == [member.account.address]  # the outsider's frame was never decoded
    # a log over the bound (no ledger emits one: a lying endpoint) is dropped: once decoded if its
    # data is within the bound's 32-byte words, else before it is decoded
    assert swarm.reader.complaints(1, 0, at, senders=everyone, max_frame=len(outsiders) - 1) == events[:1]
    with decoded_complaints(swarm.reader) as decoded:
        within = swarm.reader.complaints(1, 0, at, senders=everyone, max_frame=len(outsiders) - 32)
    assert within == events[:1] and decoded == [member.account.address]


def test_the_complaint_reader_keeps_the_first_frame_of_each_member():
    key = Ed25519PrivateKey.generate().public_key()
    addresses = tuple(Account.create().address for _ in range(3))
    members = RoundMembers(addresses[:2], (b"", b""), {0: key, 1: key})

    def event(address: str, frame: bytes) -> dict:
        return {"args": {"peer": address, "frame": frame}}

    events = [event(addresses[1], b"first"), event(addresses[2], b"outsider"), event(addresses[1], b"second")]
    events += [event(addresses[0], b"x" * 11), event(addresses[0], b"within")]
    assert first_complaints(events, members, bound=10) == {1: b"first", 0: b"within"}


def test_only_a_swarm_deployed_for_secure_aggregation_takes_postings(automine_chain, kit):
    swarm = kit.Swarm(automine_chain, 2, **(WINDOWS | {"secure_aggregation": False}))
    swarm.register(2)
    with pytest.raises(NotSecureAggregation):
        swarm.peers[0].post_frame(1, Step.KEYS, kit.digest("k"))
    with pytest.raises(NotSecureAggregation):
        swarm.peers[0].complain(1, b"complaint")
    swarm.peers[0].commit(1, kit.digest("u"), 10, 1_000_000, kit.MECHANISM)
    with pytest.raises(DuplicateDigest):  # outside secure aggregation a copied update is still refused
        swarm.peers[1].commit(1, kit.digest("u"), 10, 1_000_000, kit.MECHANISM)
    assert not swarm.reader.params().secure_aggregation


def test_an_acknowledgment_is_a_bitmap_over_the_members():
    assert read_ack(ack_bitmap({0, 8, 9}, 10), 10) == {0, 8, 9}
    assert read_ack(b"\x01", 10) is None  # too short
    assert read_ack(b"\x01\x04", 10) is None  # member 10 of 10
    assert read_ack(b"\xff", 8) == frozenset(range(8))


def test_the_session_binds_the_chain_and_the_ledger(automine_chain, kit):
    one = kit.Swarm(automine_chain, 1, **WINDOWS)
    two = kit.Swarm(automine_chain, 1, **WINDOWS)  # the same genesis, another deployment
    assert round_session(one.reader, 1) != round_session(two.reader, 1)
    ledger = bytes.fromhex(one.address[2:])
    assert round_session(one.reader, 1) == session_id(kit.GENESIS, 1, chain_id=one.w3.eth.chain_id, ledger=ledger)
    assert session_id(kit.GENESIS, 1, chain_id=1, ledger=ledger) != session_id(
        kit.GENESIS, 1, chain_id=2, ledger=ledger
    )


def test_members_leave_out_the_addresses_disallowed_by_the_end_of_the_keys_window(automine_chain, kit):
    allowlist = [Account.from_key(k).address for k in automine_chain.private_keys[:5]]
    # a KEYS window (an eighth of the commit window) of 15 blocks: the registrations and allowlist changes fit in it
    swarm = kit.Swarm(automine_chain, 5, **(WINDOWS | {"commit_window": 120}), allowlist=allowlist)
    swarm.register(5)
    addresses = [a.address for a in swarm.accounts]
    swarm.deployer.disallow(addresses[1])
    swarm.deployer.disallow(addresses[2])
    swarm.deployer.allow([addresses[2]])  # re-allowed inside the window: a member again
    info, p = swarm.reader.round_info(1), swarm.params
    swarm.pass_window(
        *window_end(Step.KEYS, (info.opened_block, info.opened_at), p["commit_window"], p["commit_window_seconds"])
    )
    swarm.deployer.disallow(addresses[4])  # after the KEYS window: still a member of round 1
    assert round_members(swarm.reader, 1).addresses == (addresses[0], addresses[2], addresses[3], addresses[4])
    assert swarm.reader.registered_count() == 3  # what closeRound counts now (1 and 4 out)


def bad_seals(dealer: int, holders: set[int], setup: r.RoundSetup, kit):
    """A seal_hook: `dealer`'s SEALED frames for `holders`, their ciphertext altered, re-signed."""

    def hook(i: int, sealed: dict[int, bytes]) -> dict[int, bytes]:
        if i != dealer:
            return sealed
        bad = dict(sealed)
        for h in holders:
            payload = bytearray(m.open_frame(sealed[h], m.Kind.SEALED, setup.session, setup.signing).payload)
            payload[2 + m.NONCE_BYTES] ^= 0xFF
            bad[h] = m.seal_frame(m.Kind.SEALED, setup.session, dealer, bytes(payload), signing_key(kit, dealer))
        return bad

    return hook


def test_verify_settles_the_complaints_on_chain_as_the_members_do(automine_chain, kit):
    """Dealer 5 of six seals garbage to holders 0 and 1 and withholds its REVEAL; member 4 also
    complains against honest dealer 0. The complaints on chain drop dealer 5 from U2 for every
    member, and `verify_secure_round` recomputes the sum of the five others from the chain's
    complaints and the archive's bundles, naming dealer 5 and complainer 4 as the members did."""
    game = SecureRound(kit, automine_chain, 6)  # t = 4
    with decoded_complaints(game.swarm.reader) as decoded:
        game.play(
            seal_hook=bad_seals(5, {0, 1}, game.setup, kit),
            false_complainer=4,
            drop_before={"reveal": {5}},
            outsider_complaint=True,
        )
        check = game.verify()
    assert set(game.complaints) == {0, 1, 4} and game.alive == {0, 1, 2, 3, 4}
    # the members' read and verify's each decoded the three members' frames, never the outsider's
    assert sorted(decoded) == sorted(2 * [game.members.addresses[i] for i in (0, 1, 4)])
    assert "the complaint of member 0 holds" in game.complaint_faults[5]
    assert "complained against member 0" in game.complaint_faults[4]
    assert check.failure is None, check.failure
    np.testing.assert_array_equal(check.total, game.plain_sum())
    addresses = game.members.addresses
    assert check.faults == {addresses[i]: game.complaint_faults[i] for i in (4, 5)}
    assert check.dropped == ()


def test_verify_reads_no_archive_blob_past_its_steps_bound(automine_chain, kit):
    game = SecureRound(kit, automine_chain, 4)  # t = 3
    game.play()
    digest = chain_steps(game.swarm.reader, 1, game.members).digests[Step.REVEAL][1]
    game.store.blobs[digest.hex()] = bytes(64 << 20)  # a big blob where member 1's REVEAL frame should be
    check = game.verify()
    assert check.failure is None, check.failure
    np.testing.assert_array_equal(check.total, game.plain_sum())
    assert "REVEAL digest" in check.faults[game.members.addresses[1]]
    assert game.store.longest_read <= m.max_bundle_bytes() + 1  # the largest step bound, plus one byte


def test_verify_reports_a_round_its_members_cannot_make(automine_chain, kit):
    game = SecureRound(kit, automine_chain, 3)
    check = verify_secure_round(game.swarm.reader, 1, game.store, bits=BITS, dim=DIM, counted_members=4)
    assert check.total is None and "no round of 3 members" in (check.failure or "")


def test_round_setup_refuses_more_members_than_a_frame_addresses(kit):
    key = signing_key(kit, 0).public_key()
    n = m.MAX_MEMBERS + 1
    members = RoundMembers(tuple(f"0x{i:040x}" for i in range(n)), (b"",) * n, {i: key for i in range(n)})
    with pytest.raises(BadRound, match="more than a frame can address"):
        round_setup(session_id(kit.GENESIS, 1, chain_id=1, ledger=bytes(20)), members, BITS, DIM, counted_members=1)


class StoreTransport:
    """The host of an in-process member: announces nothing, fetches from the test's store, and
    serves nobody the digests in `withheld` (a sender that serves some members only)."""

    def __init__(self, store: Store, peer_id: bytes) -> None:
        self.store, self.peer_id_bytes, self.withheld = store, peer_id, set()
        self.served_by: dict[str, set[str]] = {}  # a withheld digest -> the peers (base58) that do serve it
        self.on_withheld = lambda digest: None  # told of every ask for a withheld digest
        self.bytes_served = self.bytes_fetched = 0

    async def announce_blob(self, digest: str, *, later: bool = False) -> None:
        return None

    def providers(self, digest: str) -> list[str]:
        return []

    async def fetch(self, digest, *, providers=None, max_size=None, timeout=60.0) -> bytes:
        blob = self.store.get(digest)
        if digest in self.withheld:
            self.on_withheld(digest)
            if not set(providers or ()) & self.served_by.get(digest, set()):
                raise BlobNotFound(digest)
        if blob is None:
            raise BlobNotFound(digest)
        return blob


async def off(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


async def others_open(game: SecureRound, me: int, mine, until, *, withhold=None, host=None, served_by=()):
    """The members other than `me` play KEYS and DEALING with their acknowledgments (each of them
    holds every frame), each window passed once `me` acted in it or stopped (`until` returns
    then). `withhold`: the step whose blob of member 0 nobody serves `me`, except, once that
    step's acknowledgments are in, the members in `served_by` (acknowledgers). Their states,
    U1's keys, U2's dealings and the bundles."""
    reader, setup, others = game.swarm.reader, game.setup, [i for i in range(game.n) if i != me]

    def synced() -> None:
        game.store.blobs |= {d: mine.get(d) for d in mine.digests()}

    def steps():
        return chain_steps(reader, 1, game.members)

    def post(i: int, step: Step, raw: bytes) -> None:
        if i == 0 and step is withhold:
            host.withheld.add(hashlib.sha256(raw).hexdigest())
            host.served_by[hashlib.sha256(raw).hexdigest()] = set()
        game.post(i, step, raw)

    async def acknowledged(step: Step) -> dict[int, bytes]:
        posted = steps().digests[step]
        for i in others:
            game.swarm.peers[i].acknowledge(1, step, ack_bitmap(set(posted), game.n))
        for digest in host.withheld if host else ():
            host.served_by[digest] = {peer_id_from_bytes(game.members.peer_ids[i]) for i in served_by}
        await until(lambda: me in steps().acks[step])
        await off(game.pass_step, Step(step + 4))
        chosen = agreed(steps(), step, setup.threshold)
        return {i: game.store.get(posted[i].hex()) for i in chosen}

    states = {}
    for i in others:
        states[i], frame = r.start(setup, i, signing_key(game.kit, i))
        post(i, Step.KEYS, frame)
    await until(lambda: me in steps().digests[Step.KEYS])
    synced()
    await off(game.pass_step, Step.KEYS)
    keys, _ = r.key_set(setup, await acknowledged(Step.KEYS))
    for i in others:
        post(i, Step.DEALING, m.dealing_bundle(*r.deal(states[i], setup, keys)))
    await until(lambda: me in steps().digests[Step.DEALING])
    synced()
    await off(game.pass_step, Step.DEALING)
    bundles = {i: m.split_bundle(raw, i) for i, raw in (await acknowledged(Step.DEALING)).items()}
    dealt, _ = r.dealt_set(setup, keys, {i: dealing for i, (dealing, _) in bundles.items()})
    await off(game.pass_step, Step.COMPLAINT)  # nobody complains: every dealer here is honest
    return states, keys, dealt, bundles


class Stop(Exception):
    """The test's commit: the member got as far as its MASKED frame."""


def play_member(game: SecureRound, me: int, *, counted_members=1, withhold=None, served_by=(), call=off):
    """Member `me` plays round 1 with SecureMember through KEYS and DEALING (`others_open`), its
    commit stopping it (`Stop`, so `sat_out` starts with "R2: commit refused"); `withhold`: the
    step whose blob of member 0 nobody serves `me` (but the acknowledgers in `served_by` once
    the step's acknowledgments are in). The member's outcome."""
    swarm = game.swarm
    host = StoreTransport(game.store, game.members.peer_ids[me])
    mine = MemoryBlobStore()
    settings = SecureSettings(BITS, DIM, counted_members, fetch_timeout=1.0, poll=0.05)
    member = SecureMember(
        swarm.peers[me], host, mine, signing_key(game.kit, me), settings, call=call, head=head_of(swarm)
    )
    done = trio.Event()

    async def until(done_yet) -> None:
        while not done.is_set() and not await off(done_yet):
            await trio.sleep(0.05)

    async def commit(digest: bytes) -> None:
        raise Stop("the member reached its commit")

    async def main():
        with trio.fail_after(120):  # the windows pass when the test mines, not by waiting
            async with trio.open_nursery() as nursery:
                if call is off:
                    nursery.start_soon(
                        functools.partial(
                            others_open, game, me, mine, until, withhold=withhold, host=host, served_by=served_by
                        )
                    )
                try:
                    return await member.play(1, functools.partial(given, game.inputs[me]), commit)
                finally:
                    done.set()

    return trio.run(main)


def head_of(swarm):
    def head() -> tuple[int, int]:
        block = swarm.w3.eth.get_block("latest")
        return block["number"], block["timestamp"]

    return head


@pytest.mark.parametrize("step", [Step.KEYS, Step.DEALING])
@pytest.mark.parametrize("served", [False, True])
def test_a_member_lacking_a_blob_of_u1_or_u2_fetches_it_from_its_acknowledgers_or_sits_out(
    automine_chain, kit, step, served
):
    """Member 3 never gets member 0's KEYS (DEALING) blob, which the other three acknowledged (it
    is in U1, U2 for everyone). Served by its acknowledgers 1 and 2 (not its sender) once the
    acknowledgment window passed, member 3 goes on to its commit; served by nobody, it sits out."""
    game = SecureRound(kit, automine_chain, 4)  # t = 3
    out = play_member(game, 3, withhold=step, served_by={1, 2} if served else set())
    steps = chain_steps(game.swarm.reader, 1, game.members)
    assert 3 in steps.digests[step] and 0 not in steps.acks[step][3]  # it posted its own, lacking 0's
    assert 0 in agreed(steps, step, game.setup.threshold)
    assert out.result is None and out.sat_out is not None
    if served:
        assert out.sat_out.startswith("R2: commit refused: the member reached its commit"), out.sat_out
    else:
        assert out.sat_out.startswith(f"{step.name}: no blob") and "[0]" in out.sat_out


def test_a_member_whose_round_cannot_be_set_up_sits_out(automine_chain, kit):
    game = SecureRound(kit, automine_chain, 4)
    out = play_member(game, 3, counted_members=5)
    assert out.result is None and out.sat_out is not None and out.sat_out.startswith("R1: no round of 4 members")


def test_a_member_whose_chain_read_fails_sits_out(automine_chain, kit):
    game = SecureRound(kit, automine_chain, 4)

    async def failing(fn, *args, **kwargs):
        if fn == game.swarm.peers[3].round_info:
            raise ConnectionError("the RPC endpoint went away")
        return await off(fn, *args, **kwargs)

    out = play_member(game, 3, call=failing)
    assert out.sat_out == "R0: ConnectionError: the RPC endpoint went away"


def play_through_reveal(game: SecureRound, me: int, *, withheld: int | None = None, served_by=(), late_ack=False):
    """Member `me` plays round 1 with SecureMember while the test plays the others through every
    step (all acknowledge every frame, so U3 is all five), each window passed once `me` acted in
    it (or stopped). `withheld`: the member whose MASKED frame nobody serves `me`, except, once
    the ACK window has passed, the members in `served_by` (its acknowledgers); `late_ack`: `me`
    sends its acknowledgment only once the ACK window has passed (refused). The outcome, and for
    each ask `me` made for the withheld frame after it acknowledged, whether its REVEAL was on
    chain by then."""
    swarm, reader, setup = game.swarm, game.swarm.reader, game.setup
    host = StoreTransport(game.store, game.members.peer_ids[me])
    mine = MemoryBlobStore()
    settings = SecureSettings(BITS, DIM, 1, fetch_timeout=1.0, poll=0.05)
    ack_passed, done = trio.Event(), trio.Event()
    asks_after_ack: list[bool] = []

    async def call(fn, *args, **kwargs):
        if late_ack and fn == swarm.peers[me].acknowledge and args[1] == Step.MASKED:
            await ack_passed.wait()
        return await off(fn, *args, **kwargs)

    member = SecureMember(
        swarm.peers[me], host, mine, signing_key(game.kit, me), settings, call=call, head=head_of(swarm)
    )
    others = [i for i in range(game.n) if i != me]

    def on_withheld(digest: str) -> None:
        steps = chain_steps(reader, 1, game.members)
        if me in steps.acks[Step.MASKED]:
            asks_after_ack.append(me in steps.digests[Step.REVEAL])

    host.on_withheld = on_withheld

    async def until(done_yet) -> None:
        while not done.is_set() and not await off(done_yet):
            await trio.sleep(0.05)

    def posted(step: Step) -> bool:
        return me in chain_steps(reader, 1, game.members).digests[step]

    async def others_play() -> None:
        states, keys, dealt, bundles = await others_open(game, me, mine, until)
        for i in others:
            assert r.receive(states[i], setup, keys, dealt, {d: sealed for d, (_, sealed) in bundles.items()}) == {}
            digest = game.store.put(r.masked_vector(states[i], setup, keys, dealt, game.inputs[i]))
            if i == withheld:
                host.withheld.add(digest.hex())
            swarm.peers[i].commit(1, digest, 10, 1_000_000, game.kit.MECHANISM)
        await until(lambda: any(c.peer == swarm.accounts[me].address for c in reader.commitments(1)))
        game.store.blobs |= {d: mine.get(d) for d in mine.digests()}
        await off(swarm.pass_commit_window, 1)
        await off(swarm.peers[0].close_round, 1)
        for i in others:
            swarm.peers[i].acknowledge(1, Step.MASKED, ack_bitmap(set(range(game.n)), game.n))
        if not late_ack:
            await until(lambda: me in chain_steps(reader, 1, game.members).acks[Step.MASKED])
        await off(game.pass_step, Step.MASKED_ACK)
        ack_passed.set()
        game.alive = set(agreed(chain_steps(reader, 1, game.members), Step.MASKED, setup.threshold))
        for digest in host.withheld:
            host.served_by[digest] = {peer_id_from_bytes(game.members.peer_ids[i]) for i in served_by}
        for i in others:
            game.post(i, Step.REVEAL, r.reveal(states[i], setup, dealt, game.alive))
        await until(lambda: posted(Step.REVEAL))
        await off(game.pass_step, Step.REVEAL)

    async def commit(digest: bytes) -> None:
        await off(swarm.peers[me].commit, 1, digest, 10, 1_000_000, game.kit.MECHANISM)

    async def main():
        with trio.fail_after(120):  # the windows pass when the test mines, not by waiting
            async with trio.open_nursery() as nursery:
                nursery.start_soon(others_play)
                try:
                    return await member.play(1, functools.partial(given, game.inputs[me]), commit)
                finally:
                    done.set()

    return trio.run(main), asks_after_ack


@pytest.mark.parametrize("served", [True, False])
def test_a_member_lacking_a_frame_of_u3_reveals_first_then_fetches_it_from_its_acknowledgers(
    automine_chain, kit, served
):
    """Member 3 never got member 4's MASKED frame, which the other four acknowledged (U3 is all
    five). It posts its REVEAL as soon as it reads U3 (its shares do not need the frame), and
    only then asks for the frame: served by members 0 to 2 (acknowledgers; not by its sender),
    it unmasks; served by nobody, it has revealed all the same and only cannot unmask itself."""
    game = SecureRound(kit, automine_chain, 5)  # t = 4
    out, asks = play_through_reveal(game, 3, withheld=4, served_by={0, 1, 2} if served else set())
    assert game.alive == set(range(5))
    assert asks and all(asks)  # every ask after the acknowledgment came once its REVEAL was on chain
    assert 3 in chain_steps(game.swarm.reader, 1, game.members).digests[Step.REVEAL]
    if served:
        assert out.sat_out is None and out.result is not None
        assert out.result.survivors == tuple(range(5))
        np.testing.assert_array_equal(out.result.total, game.plain_sum())
    else:
        assert out.result is None and out.sat_out is not None and "no MASKED frame" in out.sat_out


def test_a_member_whose_acknowledgment_is_refused_still_reveals(automine_chain, kit):
    """Member 3's acknowledgment lands after the ACK window (refused): U3 is the others' count,
    all five, and member 3's shares are needed, so it reveals and gets the sum."""
    game = SecureRound(kit, automine_chain, 5)
    out, _ = play_through_reveal(game, 3, late_ack=True)
    assert 3 not in chain_steps(game.swarm.reader, 1, game.members).acks[Step.MASKED]
    assert out.sat_out is None and out.result is not None
    np.testing.assert_array_equal(out.result.total, game.plain_sum())


def test_verify_reports_an_archive_lacking_a_dealing_bundle_naming_only_its_dealer(automine_chain, kit):
    """Member 4 dealt, then dropped: its pairwise masks are in every survivor's vector and every
    revealer revealed a share of its mask key. An archive without its dealing bundle cannot be
    checked; that is what verify says, naming member 4 only, not the revealers."""
    game = SecureRound(kit, automine_chain, 5)  # t = 4
    game.play(drop_before={"mask": {4}})
    del game.store.blobs[chain_steps(game.swarm.reader, 1, game.members).digests[Step.DEALING][4].hex()]
    check = game.verify()
    assert check.total is None and (check.failure or "").startswith("archive incomplete")
    assert f"member 4 ({game.members.addresses[4]})" in (check.failure or "")
    assert (
        set(check.faults) == {game.members.addresses[4]} and "DEALING digest" in check.faults[game.members.addresses[4]]
    )
