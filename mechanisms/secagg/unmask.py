"""The aggregate of a round from its archive, by anyone: a member unmasking what it received, or
`swarm verify` re-checking a finalized round. The same function for both, so they agree.

The archive holds, per step, the frames whose digests the chain admitted in that step's window:
KEYS (U1), DEALING (U2), MASKED (U3) and REVEAL frames. `verify_round` re-derives each set from
them (a frame that does not open, or does not fit the round, is named in `faults` and its sender
leaves the set), checks every revealed share against its dealer's signed commitment (a share that
does not match is left out and its revealer named; so is a share of the wrong secret: the mask
key of a survivor or the self-mask seed of a dropped member), rebuilds each survivor's self-mask
seed and each dropped member's mask key from t good shares (Lagrange coefficients computed once
per set of points), checks them against the seed digest and public key the member published, and
unmasks the sum. Only a dealer whose good shares do not rebuild its secret, or a member with
fewer than t good shares, stops the round (`RoundFailed` names it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from . import masks
from . import messages as m
from .masks import Ints, MaskKey
from .round import PublicKeys, RoundSetup, dealt_set, key_set, seed_digest
from .shamir import interpolate_secret, lagrange_at_zero


@dataclass(frozen=True)
class RoundArchive:
    """A round's frames by sender, as the chain's windows fixed them. The caller checks each
    frame against its digest on chain first: a frame changed after the members acted on it (a
    DEALING they masked with, a MASKED vector they revealed a seed for) is named or stops the
    round, but the sum cannot tell it from the real one."""

    keys: Mapping[int, bytes]
    dealings: Mapping[int, bytes]
    masked: Mapping[int, bytes]
    reveals: Mapping[int, bytes]


@dataclass(frozen=True)
class RoundResult:
    total: Ints  # the sum of the survivors' residues mod 2^bits
    survivors: tuple[int, ...]  # whose vectors are in the sum
    dropped: tuple[int, ...]  # members of U2 whose vectors are not (their masks restored)
    faults: Mapping[int, str]  # member -> what of theirs did not fit (left out, the round went on)


class RoundFailed(ValueError):
    def __init__(self, member: int | None, reason: str) -> None:
        super().__init__(f"member {member}: {reason}" if member is not None else reason)
        self.member = member


def survivors(
    setup: RoundSetup, dealt: Mapping[int, m.Dealing], frames: Mapping[int, bytes]
) -> tuple[dict[int, Ints], dict[int, str]]:
    """U3: the members of U2 whose MASKED frame opens with the round's bits and dimension (what
    each member computes before revealing, and the verifier after)."""
    vectors: dict[int, Ints] = {}
    faults: dict[int, str] = {}
    for member, raw in sorted(frames.items()):
        try:
            if member not in dealt:
                raise m.BadMessage(member, "masked vector without a dealing in U2")
            if len(raw) != m.masked_frame_size(setup.bits, setup.dim):
                raise m.BadMessage(member, "MASKED frame has the wrong size for the round's bits and dimension")
            frame = m.open_frame(raw, m.Kind.MASKED, setup.session, setup.signing)
            if frame.sender != member:
                raise m.BadMessage(member, "MASKED frame of another member")
            vectors[member] = m.read_masked(frame, setup.bits, setup.dim)
        except m.BadMessage as exc:
            faults[member] = str(exc)
    return vectors, faults


def good_openings(
    setup: RoundSetup,
    dealt: Mapping[int, m.Dealing],
    alive: set[int],
    frames: Mapping[int, bytes],
    faults: dict[int, str],
) -> dict[int, list[m.Opening]]:
    """Dealer -> the revealed shares that match its commitments and are of the secret the round
    needs from it (the self-mask seed if it survived, else the mask key); every other revealed
    share is left out and its revealer named in `faults`."""
    found: dict[int, list[m.Opening]] = {dealer: [] for dealer in dealt}
    for revealer, raw in sorted(frames.items()):
        try:
            frame = m.open_frame(raw, m.Kind.REVEAL, setup.session, setup.signing)
            if frame.sender != revealer:
                raise m.BadMessage(revealer, "REVEAL frame of another member")
            openings = m.read_reveal(frame)
        except m.BadMessage as exc:
            _name(faults, revealer, str(exc))
            continue
        bad = []
        for o in openings:
            needed = m.Secret.SELF_SEED if o.dealer in alive else m.Secret.MASK_KEY
            dealing = dealt.get(o.dealer)
            if dealing is None or o.secret is not needed:
                bad.append(f"revealed the {o.secret.name} of member {o.dealer}, which the round does not need")
            elif o.commitment(setup.session) != dealing.commitment(revealer, o.secret):
                bad.append(f"share of member {o.dealer}'s {o.secret.name} does not match its commitment")
            else:
                found[o.dealer].append(o)
        if bad:
            _name(faults, revealer, "; ".join(bad))
    return found


def _name(faults: dict[int, str], member: int, reason: str) -> None:
    faults[member] = f"{faults[member]}; {reason}" if member in faults else reason


def verify_round(setup: RoundSetup, archive: RoundArchive) -> RoundResult:
    """The round's aggregate recomputed from its archive, with the members whose frames or shares
    did not fit named in `faults` (see the module docstring); RoundFailed if it cannot be."""
    keys, faults = key_set(setup, archive.keys)
    dealt, dealing_faults = dealt_set(setup, keys, archive.dealings)
    vectors, masked_faults = survivors(setup, dealt, archive.masked)
    return unmask_round(setup, keys, dealt, vectors, archive.reveals, faults | dealing_faults | masked_faults)


def unmask_round(
    setup: RoundSetup,
    keys: Mapping[int, PublicKeys],
    dealt: Mapping[int, m.Dealing],
    vectors: Mapping[int, Ints],
    reveals: Mapping[int, bytes],
    faults: Mapping[int, str],
) -> RoundResult:
    """The sum from U1's keys, U2's dealings and U3's vectors (as `key_set`, `dealt_set` and
    `survivors` gave them: what a member already holds when the reveals arrive) and the REVEAL
    frames; `faults` so far, to which the revealers of bad shares are added."""
    if not vectors:
        raise RoundFailed(None, "no masked vector survived")
    named = dict(faults)
    alive = set(vectors)
    openings = good_openings(setup, dealt, alive, reveals, named)
    self_seeds: dict[int, bytes] = {}
    dropped_keys: dict[int, MaskKey] = {}
    coefficients: dict[tuple[int, ...], list[int]] = {}
    for dealer, found in sorted(openings.items()):
        secret = rebuild(setup, dealer, found, coefficients)
        if dealer in alive:
            if seed_digest(setup, secret) != dealt[dealer].seed_digest:
                raise RoundFailed(dealer, "its shares, each as committed, do not rebuild its self-mask seed")
            self_seeds[dealer] = secret
        else:
            key = MaskKey(secret)
            if not masks.check_key_matches(key, keys[dealer].mask):
                raise RoundFailed(dealer, "its shares, each as committed, do not rebuild its mask key")
            dropped_keys[dealer] = key
    publics = {v: keys[v].mask for v in dealt}
    total = masks.unmask(vectors, self_seeds, dropped_keys, publics, setup.session, setup.bits)
    return RoundResult(total, tuple(sorted(alive)), tuple(sorted(dropped_keys)), named)


def rebuild(
    setup: RoundSetup, dealer: int, found: list[m.Opening], coefficients: dict[tuple[int, ...], list[int]]
) -> bytes:
    """The dealer's secret from the first t good shares by holder (coefficients cached per set of points)."""
    if len(found) < setup.threshold:
        raise RoundFailed(dealer, f"{len(found)} good shares revealed, {setup.threshold} needed")
    used = sorted(found, key=lambda o: o.holder)[: setup.threshold]
    points = tuple(o.holder + 1 for o in used)
    if points not in coefficients:
        coefficients[points] = lagrange_at_zero(points)
    try:
        return interpolate_secret(coefficients[points], [o.y for o in used])
    except ValueError:
        raise RoundFailed(dealer, "its shares, each as committed, do not rebuild a 32-byte secret") from None
