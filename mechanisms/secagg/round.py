"""A member's steps in one secure-aggregation round, as pure functions over signed frames
(`messages`); no transport. The sets of each step are inputs: on a swarm the chain's windows fix
them (which frames' digests were posted in time), so every member and any auditor see the same.

- R0 `start`: fresh X25519 mask and share-encryption keys, one fresh X25519 pair key per member
  of the round (the key that member seals its shares for this one to) and a self-mask seed; the
  KEYS frame, signed with the member's Ed25519 key (the one bound to its registration). U1: the
  members whose KEYS frame opens, among which every frame covers every other (`key_set`).
- R1 `deal`: Shamir shares (threshold t) of the self-mask seed b_u and of the mask private key to
  every member of U1 (itself included), each encrypted to its holder (SEALED), and a public
  DEALING with a salted hash commitment to every share and the digest of b_u. U2: the dealers of
  U1 whose DEALING opens and commits to every member of U1 (`dealt_set`); `receive` opens what
  was sealed for this member and checks each share against its commitment; a member that was
  sealed bad shares complains (`complaints`), and a complaint that holds drops its dealer from U2
  before anyone masks.
- R2 `masked_vector`: the residues (`member.encode`) under the self-mask and one pairwise mask per
  other member of U2 (`masks.mask`). U3: the members of U2 whose MASKED frame opens and has the
  round's bits and dimension (`unmask.survivors`).
- R3 `reveal`: for each member of U2, the share of b_v if v is in U3, of its mask key otherwise;
  never both for one member: a second call that would reveal the other secret is refused, and so
  is any reveal when U3 is below `RoundSetup.min_survivors` (`deal` and `masked_vector` stop the
  round the same way when U1 or U2 is: U3 is a subset of both).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from . import masks
from . import messages as m
from .masks import Ints, MaskKey
from .shamir import split, threshold_for

DROPOUT_TOLERANCE = 1 / 3  # t leaves room for this share of the members with keys bound to drop


@dataclass(frozen=True)
class RoundSetup:
    """What every participant of a round agrees on before it starts: the session (swarm and
    round), the members' Ed25519 keys (index -> key, bound on chain to their registrations),
    the threshold t, the vectors' bits and dimension, and the fewest masked vectors the sum may
    hold (`min_survivors`, at least t): below it no member reveals and no sum is unmasked (a sum
    of one or two vectors would be those members' inputs, and a sum of fewer than the policy's
    counted members carries less noise than the accounting assumes)."""

    session: bytes
    signing: Mapping[int, Ed25519PublicKey]
    threshold: int
    bits: int
    dim: int
    min_survivors: int

    def __post_init__(self) -> None:
        if not 1 <= self.threshold <= self.min_survivors <= len(self.signing):
            raise ValueError(
                f"need 1 <= threshold ({self.threshold}) <= min_survivors ({self.min_survivors}) "
                f"<= members ({len(self.signing)})"
            )

    @classmethod
    def for_members(
        cls, session: bytes, signing: Mapping[int, Ed25519PublicKey], bits: int, dim: int, *, counted_members: int
    ) -> RoundSetup:
        """t = n - floor(n / 3) (and a majority), n the members with keys bound for the round
        (everyone registered, not U1); min_survivors = max(t, counted_members), the latter the
        policy's h (`SecAggPolicy.counted_members`: the members whose noise the guarantee counts on)."""
        threshold = threshold_for(len(signing), DROPOUT_TOLERANCE)
        return cls(session, signing, threshold, bits, dim, max(threshold, counted_members))


@dataclass(frozen=True)
class PublicKeys:
    mask: bytes
    cipher: bytes  # what the member seals its shares with, as a dealer
    pairs: tuple[bytes, ...]  # pairs[d]: what dealer d seals the member's shares to


@dataclass
class MemberState:
    """A member's secrets for one round (never sent) and what it was dealt and revealed."""

    index: int
    signing_key: Ed25519PrivateKey
    mask_key: MaskKey
    cipher_key: MaskKey
    self_seed: bytes
    pair_keys: tuple[bytes, ...]  # pair_keys[d]: the private key dealer d seals our shares to
    held: dict[int, tuple[m.Opening, m.Opening]] = field(default_factory=dict)  # dealer -> its two shares for us
    revealed: dict[int, m.Secret] = field(default_factory=dict)  # dealer -> which of its secrets we revealed


class RevealRefused(ValueError):
    """A reveal that would give out both secrets of one member, shares of a non-member, or
    seeds of fewer survivors than the round's minimum."""


class RoundFailed(ValueError):
    """The round cannot go on or be unmasked. `member` names the one member proven at fault
    (None when the failure proves nobody's); `faults` holds every member named on the way."""

    def __init__(self, member: int | None, reason: str, faults: Mapping[int, str] | None = None) -> None:
        super().__init__(f"member {member}: {reason}" if member is not None else reason)
        self.member = member
        self.faults: Mapping[int, str] = dict(faults or {})


def check_enough(setup: RoundSetup, count: int, what: str) -> None:
    """RoundFailed when fewer than `setup.min_survivors` members are left in a set: the masked
    vectors that could follow are a subset of it."""
    if count < setup.min_survivors:
        raise RoundFailed(None, f"{what} has {count} members, the round needs at least {setup.min_survivors}")


def seed_digest(setup: RoundSetup, seed: bytes) -> bytes:
    return hashlib.sha256(b"secagg self seed" + setup.session + seed).digest()


# ----------------------------------------------------------------------------------------- R0


def start(setup: RoundSetup, index: int, signing_key: Ed25519PrivateKey) -> tuple[MemberState, bytes]:
    return start_session(setup.session, index, signing_key, members=max(setup.signing) + 1)


def start_session(
    session: bytes, index: int, signing_key: Ed25519PrivateKey, *, members: int
) -> tuple[MemberState, bytes]:
    """R0 before the round's member set is final (on a swarm, members may still register while
    the KEYS window runs): the KEYS frame has a pair key for each of the indices 0..members-1,
    the members the caller knows of (one registered later is left out of U1: `key_set`)."""
    if not index < members <= m.MAX_MEMBERS:
        raise ValueError(f"a KEYS frame covers its sender and at most {m.MAX_MEMBERS} members")
    secrets = os.urandom(m.KEY_BYTES * members)  # any 32 bytes are an X25519 private key
    pair_keys = tuple(secrets[at : at + m.KEY_BYTES] for at in range(0, len(secrets), m.KEY_BYTES))
    state = MemberState(index, signing_key, MaskKey.generate(), MaskKey.generate(), masks.new_self_seed(), pair_keys)
    pair_publics = [public_of(private) for private in pair_keys]
    frame = m.keys_message(session, index, state.mask_key.public, state.cipher_key.public, pair_publics, signing_key)
    return state, frame


def public_of(private: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_set(setup: RoundSetup, frames: Mapping[int, bytes]) -> tuple[dict[int, PublicKeys], dict[int, str]]:
    """U1 from the KEYS frames of the members the chain admitted to R0; faults name the others.
    Of the frames that open (`opened_keys`), U1 keeps those `covering` picks (every member of U1
    has a pair key for every other); the ones it leaves out are not named: a member that signed
    before a later one registered covers too few indices, honestly."""
    keys, faults = opened_keys(setup, frames)
    return covering(keys), faults


def opened_keys(setup: RoundSetup, frames: Mapping[int, bytes]) -> tuple[dict[int, PublicKeys], dict[int, str]]:
    """The KEYS frames that open, are their sender's and hold no low-order point; faults name the
    others. (What a member can vouch for before U1 is fixed: which frame covers which is for
    `covering`, once the frames are agreed.)"""
    keys: dict[int, PublicKeys] = {}
    faults: dict[int, str] = {}
    for member, raw in sorted(frames.items()):
        try:
            frame = m.open_frame(raw, m.Kind.KEYS, setup.session, setup.signing)
            if frame.sender != member:
                raise m.BadMessage(member, "KEYS frame of another member")
            public = PublicKeys(*m.read_keys(frame))
            if any(key in LOW_ORDER for key in (public.mask, public.cipher, *public.pairs)):
                raise m.BadMessage(member, "KEYS holds a low-order X25519 point (every agreement with it fails)")
            keys[member] = public
        except m.BadMessage as exc:
            faults[member] = str(exc)
    return keys, faults


def covering(keys: Mapping[int, PublicKeys]) -> dict[int, PublicKeys]:
    """The members i <= c whose frames have pair keys past c (so that each covers every other),
    for the cutoff c among them that leaves the most members (of two such, the higher). Not the
    highest cutoff that leaves the round its minimum: members that lengthen their own frames could
    then push the cutoff past honest members that signed before later ones registered, and choose
    which honest group sits the round out. The price: k frames ending at one index, every other
    covering all, leave out the members above it when those are fewer than k (else only their
    senders); U1 is the largest the frames allow. Members registered after the others signed their
    frames sit the round out unless more frames cover them than leave them out."""
    if not keys:
        return {}
    top = max(keys)
    starts = [0] * (top + 2)  # how many frames cover each cutoff c, as a difference array
    for i, public in keys.items():
        if len(public.pairs) > i:
            starts[i] += 1
            starts[min(len(public.pairs), top + 1)] -= 1
    count, counts = 0, {}
    for c in range(top + 1):
        count += starts[c]
        if c in keys:
            counts[c] = count
    cutoff = max(counts, key=lambda c: (counts[c], c))
    return {i: public for i, public in keys.items() if i <= cutoff < len(public.pairs)}


_P = 2**255 - 19
_LOW_ORDER_U = (  # u of the points of order 1, 2, 4 and 8 on Curve25519 and its twist
    0,
    1,
    _P - 1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
)
# every 32-byte encoding of them (X25519 ignores bit 255 and reduces u mod p): a low-order point
# gives the all-zero secret with every private key, which `cryptography` refuses, so every
# agreement with it would fail; found by lookup, without an agreement each (a KEYS frame has a
# pair key per member; the test holds the list to `cryptography`'s refusals)
LOW_ORDER = frozenset(
    (v | top).to_bytes(32, "little") for u in _LOW_ORDER_U for v in (u, u + _P) if v < 2**255 for top in (0, 2**255)
)


# ----------------------------------------------------------------------------------------- R1


def deal(state: MemberState, setup: RoundSetup, keys: Mapping[int, PublicKeys]) -> tuple[bytes, dict[int, bytes]]:
    """The public DEALING frame and one SEALED frame per holder (every member of U1)."""
    if state.index not in keys:
        raise ValueError("a member deals only if its keys are in U1")
    check_enough(setup, len(keys), "U1")
    holders = sorted(keys)
    if holders[-1] >= m.MAX_MEMBERS:
        raise ValueError("member indices below 2^12")
    session, me = setup.session, state.index
    # the shares are f(holder + 1): split over points 1..max index + 1, keep U1's
    seed_shares = split(state.self_seed, setup.threshold, holders[-1] + 1)
    key_shares = split(state.mask_key.private, setup.threshold, holders[-1] + 1)
    commitments: dict[int, tuple[bytes, bytes]] = {}
    sealed: dict[int, bytes] = {}
    cipher = state.cipher_key.loaded()
    for h in holders:
        b = m.Opening(me, h, m.Secret.SELF_SEED, seed_shares[h].y, os.urandom(m.SALT_BYTES))
        s = m.Opening(me, h, m.Secret.MASK_KEY, key_shares[h].y, os.urandom(m.SALT_BYTES))
        commitments[h] = (b.commitment(session), s.commitment(session))
        sealed[h] = m.sealed_message(
            session, (b, s), cipher, keys[h].pairs[me], os.urandom(m.NONCE_BYTES), state.signing_key
        )
    dealing = m.dealing_message(session, me, seed_digest(setup, state.self_seed), commitments, state.signing_key)
    return dealing, sealed


def dealt_set(
    setup: RoundSetup, keys: Mapping[int, PublicKeys], frames: Mapping[int, bytes]
) -> tuple[dict[int, m.Dealing], dict[int, str]]:
    """U2 from the DEALING frames of the members the chain admitted to R1: each must be a member
    of U1, open, and commit to a share for every member of U1; faults name the others. The
    complaints (`complaints.settle`) may still drop some of these dealers before anyone masks."""
    dealings: dict[int, m.Dealing] = {}
    faults: dict[int, str] = {}
    for dealer, raw in sorted(frames.items()):
        try:
            if dealer not in keys:
                raise m.BadMessage(dealer, "dealt without keys in U1")
            dealing = m.read_dealing(m.open_frame(raw, m.Kind.DEALING, setup.session, setup.signing))
            if dealing.dealer != dealer:
                raise m.BadMessage(dealer, "DEALING frame of another member")
            if set(dealing.commitments) != set(keys):
                raise m.BadMessage(dealer, "DEALING does not commit to a share for every member of U1")
            dealings[dealer] = dealing
        except m.BadMessage as exc:
            faults[dealer] = str(exc)
    return dealings, faults


def receive(
    state: MemberState,
    setup: RoundSetup,
    keys: Mapping[int, PublicKeys],
    dealings: Mapping[int, m.Dealing],
    sealed: Mapping[int, Mapping[int, bytes]],
) -> dict[int, str]:
    """Open the shares each dealer of U2 sealed for this member and keep those that match the
    dealer's commitments; returns the dealers whose shares did not (no SEALED frame for this member
    in the dealer's bundle, undecryptable, or not what they committed to): this member cannot
    reveal for them, and complains against them (`complaints.complain`). `sealed`: dealer ->
    holder -> SEALED frame, from each dealer's bundle as the chain's digest fixed it
    (`messages.split_bundles`), what `complaints.settle` judges the complaint on. A dealer of U2
    whose bundle is not in it is not the dealer's fault (the caller lacks it; every member of the
    round holds it): RoundFailed naming nobody, as a complaint against it would be found false
    and its revealed key would make that dealer's shares for this member public."""
    if state.index not in keys:
        raise ValueError("a member is dealt shares only if its keys are in U1")
    absent = sorted(set(dealings) - set(sealed))
    if absent:
        raise RoundFailed(None, f"the dealing bundles of members {absent[:3]} of U2 are not here: no complaint")
    faults: dict[int, str] = {}
    for dealer in sorted(dealings):
        try:
            private = X25519PrivateKey.from_private_bytes(state.pair_keys[dealer])
            opened = open_sealed(setup, keys, dealings[dealer], state.index, private, sealed[dealer].get(state.index))
            state.held[dealer] = opened
        except m.BadMessage as exc:
            faults[dealer] = str(exc)
    return faults


def open_sealed(
    setup: RoundSetup,
    keys: Mapping[int, PublicKeys],
    dealing: m.Dealing,
    holder: int,
    pair_private: X25519PrivateKey,
    raw: bytes | None,
) -> tuple[m.Opening, m.Opening]:
    """The two shares the dealer of `dealing` sealed for `holder` (`raw`: the SEALED frame for it
    in the dealer's bundle, None if there is none), opened with the holder's private key of the
    pair and checked against the dealer's commitments; BadMessage naming the dealer otherwise.
    The holder's check at R1 and anyone's check of its complaint: one function, so that an
    honest holder's complaint always holds and one against an honest dealer never does."""
    dealer = dealing.dealer
    if raw is None:
        raise m.BadMessage(dealer, f"no SEALED shares for member {holder}")
    try:  # the dealer's bundle holds it: whatever member the frame claims, the dealer is at fault
        frame = m.open_frame(raw, m.Kind.SEALED, setup.session, setup.signing)
    except m.BadMessage as exc:
        raise m.BadMessage(dealer, f"its SEALED frame for member {holder} does not open ({exc})") from None
    if frame.sender != dealer:
        raise m.BadMessage(dealer, "SEALED frame of another member")
    b, s = m.read_sealed(frame, holder, pair_private, keys[dealer].cipher)
    for opening in (b, s):
        if opening.commitment(setup.session) != dealing.commitment(holder, opening.secret):
            raise m.BadMessage(dealer, f"{opening.secret.name} share does not match its commitment")
    return b, s


# ----------------------------------------------------------------------------------------- R2


def masked_vector(
    state: MemberState, setup: RoundSetup, keys: Mapping[int, PublicKeys], dealt: Collection[int], residues: Ints
) -> bytes:
    """The MASKED frame: `residues` (mod 2^bits) under the self-mask and the pairwise masks with
    every other member of U2 (`dealt`)."""
    if state.index not in dealt:
        raise ValueError("a member sends a masked vector only if its dealing is in U2")
    check_enough(setup, len(dealt), "U2")
    publics = {v: keys[v].mask for v in dealt}
    y = masks.mask(residues, state.index, state.mask_key, publics, state.self_seed, setup.session, setup.bits)
    return m.masked_message(setup.session, state.index, y, setup.bits, state.signing_key)


# ----------------------------------------------------------------------------------------- R3


def reveal(state: MemberState, setup: RoundSetup, dealt: Collection[int], survivors: Collection[int]) -> bytes:
    """The REVEAL frame: for each member of `dealt` (U2) whose shares this member holds, the share
    of its self-mask seed if it survived R2 (is in `survivors`, U3), else of its mask key. Refused
    if U3 is not within U2, or if this member already revealed the other secret of any member.
    Every member must pass the same U3 (over the chain: the MASKED frames t members acknowledged,
    docs/SECAGG.md): one member's U3 against another's would hand out a sender's mask key and its
    seed. Refused too when U3 has fewer than `setup.min_survivors`
    members: the seeds would unmask a sum of too few inputs."""
    survivors = set(survivors)
    if not survivors <= set(dealt):
        raise RevealRefused("survivors of R2 must be members of U2")
    if len(survivors) < setup.min_survivors:
        raise RevealRefused(f"{len(survivors)} masked vectors survived R2, the round needs {setup.min_survivors}")
    chosen: list[m.Opening] = []
    for dealer in sorted(set(dealt) & set(state.held)):
        secret = m.Secret.SELF_SEED if dealer in survivors else m.Secret.MASK_KEY
        if state.revealed.get(dealer, secret) is not secret:
            raise RevealRefused(f"already revealed member {dealer}'s {state.revealed[dealer].name}: never both")
        chosen.append(state.held[dealer][0 if secret is m.Secret.SELF_SEED else 1])
    for opening in chosen:
        state.revealed[opening.dealer] = opening.secret
    return m.reveal_message(setup.session, state.index, chosen, state.signing_key)
