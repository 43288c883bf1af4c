"""The aggregate of a round from its archive, by anyone: a member unmasking what it received, or
`swarm verify` re-checking a finalized round. The same function for both, so they agree.

The archive holds, per step, the frames whose digests (`messages.frame_digest`) the chain admitted
in that step's window: KEYS (U1), dealing bundles (U2: each dealer's DEALING frame and SEALED
frames, which complaints are judged on), COMPLAINT, MASKED (U3) and REVEAL frames. `verify_round`
re-derives each set from them (a bundle that does not split, or a frame that does not open or
does not fit the round, is named in `faults` and its sender leaves
the set; a dealer a complaint holds against is named and leaves U2, `complaints.settle`), checks
every revealed share against its dealer's signed commitment (a share that does not match is left
out and its revealer named; so is a share of the wrong secret: the mask key of a survivor or the
self-mask seed of a dropped member; a REVEAL with more openings than U2 has dealers is left out
whole), rebuilds each survivor's self-mask seed and each dropped member's mask key from all its
good shares, checks them against the seed digest and public key the member published, and
unmasks the sum.

The round stops (`RoundFailed`, carrying every fault named so far) when U2 (before or after the
complaints) or U3 has fewer than
`RoundSetup.min_survivors` members (naming the sender of a KEYS frame that does not open although
t dealers dealt to it: the archive is not what the members saw), when a member's secret has fewer
than t good shares (naming nobody: who withheld or forged a share is in `faults`), or when a
dealer's good shares do not rebuild its secret or rebuild one that does not match its seed digest
or public key (naming that dealer: it committed to shares that do not lie on one polynomial).

Cost: the Lagrange coefficients at zero are computed once, for the points of every revealer; a
secret some revealers gave no good share of gets them adjusted for the missing points
(`shamir.lagrange_without`, O(t) per missing point), so revealers that each leave out different
dealers cannot force a fresh O(t^2) set per dealer.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from . import masks
from . import messages as m
from .complaints import settle
from .masks import Ints, MaskKey
from .round import PublicKeys, RoundFailed, RoundSetup, dealt_set, key_set, seed_digest
from .shamir import interpolate_secret, lagrange_at_zero, lagrange_without


@dataclass(frozen=True)
class RoundArchive:
    """A round's frames by sender, as the chain's windows fixed them. The caller checks each
    frame against its digest on chain first (`digests`, `messages.frame_digest`): a frame its
    sender re-signed after the members acted on it may open and fit, and then the sum is wrong
    with nobody named (a changed KEYS frame, for one), or the round stops."""

    keys: Mapping[int, bytes]
    # dealer -> its dealing bundle (`messages.dealing_bundle`: the DEALING frame, then its SEALED
    # frames), whose digest the chain holds: a complaint is judged on the SEALED frames in it
    dealings: Mapping[int, bytes]
    masked: Mapping[int, bytes]
    reveals: Mapping[int, bytes]
    complaints: Mapping[int, bytes] = field(default_factory=dict)  # complainer -> its COMPLAINT frame

    def digests(self) -> dict[str, dict[int, bytes]]:
        """Per step, sender -> the digest of its frame or bundle: what must equal the chain's. It
        covers every byte `verify_round` judges: the SEALED frames a complaint is judged on are
        split from the dealer's bundle here, never taken from elsewhere."""
        steps = {
            "keys": self.keys,
            "dealings": self.dealings,
            "complaints": self.complaints,
            "masked": self.masked,
            "reveals": self.reveals,
        }
        return {step: {i: m.frame_digest(raw) for i, raw in frames.items()} for step, frames in steps.items()}


@dataclass(frozen=True)
class RoundResult:
    total: Ints  # the sum of the survivors' residues mod 2^bits
    survivors: tuple[int, ...]  # whose vectors are in the sum
    dropped: tuple[int, ...]  # members of U2 whose vectors are not (their masks restored)
    faults: Mapping[int, str]  # member -> what of theirs did not fit (left out, the round went on)


MAX_FAULT_CHARS = 400  # a member's fault text: a hostile frame cannot make it grow without bound
_LISTED = 3  # reasons (or members) spelled out in one fault text


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
            openings = m.read_reveal(frame, max_openings=len(dealt))
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
            _name(faults, revealer, _listed(bad, "bad shares"))
    return found


def _listed(items: list[str], what: str) -> str:
    more = f"; and {len(items) - _LISTED} more {what}" if len(items) > _LISTED else ""
    return "; ".join(items[:_LISTED]) + more


def _name(faults: dict[int, str], member: int, reason: str) -> None:
    text = f"{faults[member]}; {reason}" if member in faults else reason
    faults[member] = text if len(text) <= MAX_FAULT_CHARS else text[: MAX_FAULT_CHARS - 3] + "..."


def verify_round(setup: RoundSetup, archive: RoundArchive, agreed: Collection[int] | None = None) -> RoundResult:
    """The round's aggregate recomputed from its archive, with the members whose frames or shares
    did not fit named in `faults` (see the module docstring); RoundFailed if it cannot be.
    `agreed`: U3 as the transport fixed it (over the chain: the MASKED frames t members
    acknowledged), else the members whose MASKED frame here opens; a member of `agreed` whose
    frame does not open here stops the round (the members revealed its seed)."""
    keys, faults = key_set(setup, archive.keys)
    dealing_frames, sealed, unsplit = m.split_bundles(archive.dealings)
    dealt, dealing_faults = dealt_set(setup, keys, dealing_frames)
    faults |= unsplit | dealing_faults
    if len(dealt) < setup.min_survivors:
        reason = f"U2 has {len(dealt)} dealers, the round needs at least {setup.min_survivors}"
        suspect = _dealt_to_without_keys(setup, keys, faults, dealing_frames)
        if suspect is not None:
            reason += (
                f": at least t dealers dealt to member {suspect}, whose KEYS frame here does not open"
                " (it is not the frame the members saw: check the archive against the digests on chain)"
            )
        raise RoundFailed(suspect, reason, faults)
    dealt, complaint_faults = settle(setup, keys, dealt, archive.complaints, sealed)  # U2 came from the bundles
    for member, reason in complaint_faults.items():
        _name(faults, member, reason)
    if len(dealt) < setup.min_survivors:
        raise RoundFailed(
            None,
            f"U2 has {len(dealt)} dealers once complaints are settled, the round needs {setup.min_survivors}",
            faults,
        )
    vectors, masked_faults = survivors(setup, dealt, archive.masked)
    for member, reason in masked_faults.items():
        _name(faults, member, reason)
    if agreed is not None:  # within U2, as the members take it
        absent = sorted(set(agreed) & set(dealt) - set(vectors))
        if absent:
            raise RoundFailed(None, f"members {absent} are in U3, but no MASKED frame of theirs here opens", faults)
        vectors = {i: vector for i, vector in vectors.items() if i in agreed}
    return unmask_round(setup, keys, dealt, vectors, archive.reveals, faults)


def _dealt_to_without_keys(
    setup: RoundSetup, keys: Mapping[int, PublicKeys], faults: Mapping[int, str], frames: Mapping[int, bytes]
) -> int | None:
    """The member whose KEYS frame the archive rejects although t dealers dealt to it, if exactly
    one: its frame is not the one the members saw (the archive does not match the chain)."""
    counts: dict[int, int] = {}
    for dealer, raw in frames.items():
        try:
            dealing = m.read_dealing(m.open_frame(raw, m.Kind.DEALING, setup.session, setup.signing))
        except m.BadMessage:
            continue
        if dealing.dealer == dealer and dealer in keys:
            for holder in set(dealing.commitments) - set(keys):
                counts[holder] = counts.get(holder, 0) + 1
    suspects = [h for h, c in counts.items() if h in faults and c >= setup.threshold]
    return suspects[0] if len(suspects) == 1 else None


def unmask_round(
    setup: RoundSetup,
    keys: Mapping[int, PublicKeys],
    dealt: Mapping[int, m.Dealing],
    vectors: Mapping[int, Ints],
    reveals: Mapping[int, bytes],
    faults: Mapping[int, str],
) -> RoundResult:
    """The sum from U1's keys, U2's dealings and U3's vectors (as `key_set`, `dealt_set` then
    `complaints.settle`, and `survivors` gave them: what a member already holds when the reveals
    arrive; a dealer a complaint held against is not in U2, and nobody masked against it) and the
    REVEAL frames; `faults` so far, to which the revealers of bad shares are added."""
    named = dict(faults)
    alive = set(vectors)
    if len(alive) < setup.min_survivors:
        raise RoundFailed(
            None, f"{len(alive)} masked vectors survived, the round needs at least {setup.min_survivors}", named
        )
    openings = good_openings(setup, dealt, alive, reveals, named)
    short = [
        f"member {dealer}: {len(found)} good shares revealed, {setup.threshold} needed"
        for dealer, found in sorted(openings.items())
        if len(found) < setup.threshold
    ]
    if short:
        raise RoundFailed(None, _listed(short, "members short of shares"), named)
    secrets = rebuild(setup, openings, named)
    self_seeds: dict[int, bytes] = {}
    dropped_keys: dict[int, MaskKey] = {}
    for dealer, secret in sorted(secrets.items()):
        if dealer in alive:
            if seed_digest(setup, secret) != dealt[dealer].seed_digest:
                raise RoundFailed(dealer, "its shares, each as committed, do not rebuild its self-mask seed", named)
            self_seeds[dealer] = secret
        else:
            key = MaskKey(secret)
            if not masks.check_key_matches(key, keys[dealer].mask):
                raise RoundFailed(dealer, "its shares, each as committed, do not rebuild its mask key", named)
            dropped_keys[dealer] = key
    publics = {v: keys[v].mask for v in dealt}
    total = masks.unmask(vectors, self_seeds, dropped_keys, publics, setup.session, setup.bits)
    return RoundResult(total, tuple(sorted(alive)), tuple(sorted(dropped_keys)), named)


def rebuild(setup: RoundSetup, openings: Mapping[int, list[m.Opening]], named: Mapping[int, str]) -> dict[int, bytes]:
    """Each dealer's secret from all its good shares (at least t each, checked by the caller):
    the coefficients of every revealer's point computed once, adjusted per set of missing points."""
    points = sorted({o.holder + 1 for found in openings.values() for o in found})
    base = lagrange_at_zero(points)
    coefficients: dict[tuple[int, ...], list[int]] = {}
    secrets: dict[int, bytes] = {}
    for dealer, found in sorted(openings.items()):
        used = sorted(found, key=lambda o: o.holder)
        have = {o.holder + 1 for o in used}
        missing = tuple(x for x in points if x not in have)
        if missing not in coefficients:
            coefficients[missing] = lagrange_without(points, base, missing) if missing else base
        try:
            secrets[dealer] = interpolate_secret(coefficients[missing], [o.y for o in used])
        except ValueError:
            raise RoundFailed(dealer, "its shares, each as committed, do not rebuild a 32-byte secret", named) from None
    return secrets
