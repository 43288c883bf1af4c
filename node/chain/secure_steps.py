"""A secure-aggregation round as the chain fixes it (docs/SECAGG.md "The protocol"): the round's
members with the Ed25519 keys their registrations bind, each step's set (the frames whose digests
the chain took in the step's window), and the archive of those frames fetched and checked against
the digests. The same functions for a member and for `swarm verify`, so they see the same sets.

- Members: every registration whose signature verifies (`registration.resolve`) up to the last
  block of the round's KEYS window (`round_members`), in chain order, less the addresses the
  deployer had removed from the allowlist as of that block (the contract's `closeRound` does not
  count them either); member i is the i-th. Its
  signing key is the Ed25519 key its libp2p peer id embeds (the key that signed the
  registration): a peer id of another key type binds no signing key and is no member.
- Steps: KEYS, DEALING and REVEAL digests from `postFrame` (FramePosted events; the contract took
  each only inside its step's window, once per member), MASKED digests from the round's commits,
  and each member's acknowledgments (`acknowledge`: per step, the bitmap of the KEYS, DEALING or
  MASKED frames it holds, on chain itself). U1, U2 and U3 are the senders at least t members
  acknowledged (`agreed`): a function of the chain alone, so no sender that serves its frame to
  some members only, and no acknowledger, can give two members two sets. The COMPLAINT frames
  (`complain`, Complained events) are on chain themselves, read apart (`chain_complaints`, once
  the complaint window passed: only where they are judged): `complaints.settle` judges them on
  the dealers' bundles, for members and verify alike.
- Every set is read at one pinned block (`chain_steps(at=...)`), `chain.confirmations` below the
  head (`settled_block`), at which the step's window has passed: every member acts on the same sets,
  and a reorganisation shallower than that changes none of them.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from web3 import Web3

from mechanisms.secagg import messages as m
from mechanisms.secagg.masks import session_id
from mechanisms.secagg.round import RoundSetup
from mechanisms.secagg.unmask import RoundArchive
from node.chain.client import LedgerClient
from node.chain.registration import Registration, resolve
from node.protocol import wire
from node.protocol.secure_windows import ACKNOWLEDGED, Step, window_end


@dataclass(frozen=True)
class RoundMembers:
    """Index -> address, libp2p peer id and Ed25519 key of a secure round's members."""

    addresses: tuple[str, ...]
    peer_ids: tuple[bytes, ...]
    signing: Mapping[int, Ed25519PublicKey]

    def index_of(self, address: str) -> int | None:
        return self._index.get(Web3.to_checksum_address(address))

    @functools.cached_property
    def _index(self) -> dict[str, int]:  # asked once per chain event: a lookup, not a scan of every member
        return {address: i for i, address in enumerate(self.addresses)}


@dataclass(frozen=True)
class ChainSteps:
    """Per step, member index -> the digest the chain holds for its frame."""

    digests: Mapping[Step, Mapping[int, bytes]]
    repeated: Mapping[int, str] = field(default_factory=dict)  # member -> what of its postings was ignored
    # per acknowledged step (KEYS, DEALING, MASKED): acknowledger -> the senders whose frames it holds
    acks: Mapping[Step, Mapping[int, frozenset[int]]] = field(default_factory=dict)

    def holders(self, step: Step, sender: int) -> list[int]:
        """The members that acknowledged holding `sender`'s frame of `step`."""
        return [i for i, senders in self.acks.get(step, {}).items() if sender in senders]


def ack_bitmap(senders: frozenset[int] | set[int], n: int) -> bytes:
    """The acknowledgment of the frames of `senders` among n members, in the inclusion bitmaps'
    layout (`wire.encode_bitmap`: ceil(n / 8) bytes, member i bit i % 8 of byte i // 8)."""
    if any(not 0 <= i < n for i in senders):
        raise ValueError(f"members {sorted(i for i in senders if not 0 <= i < n)} are not among {n}")
    return wire.encode_bitmap([i in senders for i in range(n)])


def read_ack(raw: bytes, n: int) -> frozenset[int] | None:
    """The senders an acknowledgment names, or None if it is not ceil(n / 8) bytes with no bit
    past member n - 1."""
    if len(raw) != (n + 7) // 8 or (n % 8 and raw[-1] >> (n % 8)):
        return None
    return frozenset(i for i, acknowledged in enumerate(wire.decode_bitmap(raw, n)) if acknowledged)


def agreed(steps: ChainSteps, step: Step, threshold: int) -> frozenset[int]:
    """A step's set as the chain fixes it (U1 for KEYS, U2 for DEALING, U3 for MASKED): the
    members with a digest of `step` on chain whose frame at least `threshold` (t) members
    acknowledged. At most t - 1 colluders cannot put in a frame no honest member holds (that
    one serves it, so every member can have it), and what every member reads is the same
    bitmaps, so the same set."""
    counts: dict[int, int] = {}
    for senders in steps.acks.get(step, {}).values():
        for sender in senders:
            counts[sender] = counts.get(sender, 0) + 1
    posted = steps.digests[step]
    return frozenset(i for i, count in counts.items() if count >= threshold and i in posted)


def signing_key(peer_id: bytes) -> Ed25519PublicKey | None:
    """The Ed25519 key a libp2p peer id embeds, or None (another key type, or malformed)."""
    from libp2p.crypto.keys import KeyType  # here: importing this module must not load libp2p
    from libp2p.peer.id import ID

    try:
        key = ID(bytes(peer_id)).extract_public_key()
        if key is None or key.get_type() != KeyType.Ed25519:
            return None
        return Ed25519PublicKey.from_public_bytes(key.to_bytes())
    except Exception:
        return None


def members_from(
    registrations: list[Registration], chain_id: int, ledger: str, disallowed: frozenset[str] = frozenset()
) -> RoundMembers:
    """The verified registrations with an Ed25519 peer id, in chain order, less the (checksummed)
    addresses in `disallowed`."""
    owners = sorted(resolve(registrations, chain_id, ledger).values(), key=lambda r: (r.block_number, r.log_index))
    addresses: list[str] = []
    peer_ids: list[bytes] = []
    signing: dict[int, Ed25519PublicKey] = {}
    for registration in owners:
        key = signing_key(registration.peer_id)
        address = Web3.to_checksum_address(registration.address)
        if key is None or address in addresses or address in disallowed:
            continue
        signing[len(addresses)] = key
        addresses.append(address)
        peer_ids.append(bytes(registration.peer_id))
    return RoundMembers(tuple(addresses), tuple(peer_ids), signing)


def disallowed_at(ledger: LedgerClient, block: int | None = None) -> frozenset[str]:
    """The addresses removed from the allowlist as of `block` (default: the latest) and not
    allowed again by then: each account's last AllowlistChanged event up to it says."""
    state: dict[str, bool] = {}
    for account, allowed in ledger.allowlist_changes(to_block=block):
        state[Web3.to_checksum_address(account)] = allowed
    return frozenset(account for account, allowed in state.items() if not allowed)


def round_members(ledger: LedgerClient, round: int) -> RoundMembers:
    """The members of `round`: verified registrations, in chain order, up to the last block of its
    KEYS window by blocks (`secure_windows.WINDOWS`, as the contract divides), less the
    addresses disallowed as of that block. The KEYS window has not passed before that block, so
    the set is final when dealing may begin. Registrations only append, so a member's index moves
    only if an earlier member is disallowed during the KEYS window (its KEYS frame, signed under
    the old index, then names it: it sits the round out)."""
    info, params = ledger.round_info(round), ledger.params()
    last, _ = window_end(Step.KEYS, (info.opened_block, info.opened_at), params.commit_window, 0)
    registrations = ledger.registrations(to_block=last)
    return members_from(registrations, ledger.chain_id(), ledger.address, disallowed_at(ledger, last))


def round_session(ledger: LedgerClient, round: int) -> bytes:
    """The session of secure `round` on this ledger: its genesis, chain and address bound in."""
    genesis = bytes(ledger.params().genesis_digest)
    return session_id(genesis, round, chain_id=ledger.chain_id(), ledger=bytes.fromhex(ledger.address[2:]))


class BadRound(ValueError):
    """The chain's members make no round: more than a frame can address, or fewer than the
    policy's counted members."""


def round_setup(session: bytes, members: RoundMembers, bits: int, dim: int, *, counted_members: int) -> RoundSetup:
    """`RoundSetup.for_members` of the round's members, BadRound where they make none."""
    if len(members.addresses) > m.MAX_MEMBERS:
        raise BadRound(f"{len(members.addresses)} members, more than a frame can address ({m.MAX_MEMBERS})")
    try:
        return RoundSetup.for_members(session, members.signing, bits, dim, counted_members=counted_members)
    except ValueError as exc:
        raise BadRound(f"no round of {len(members.addresses)} members: {exc}") from None


def settled_block(ledger: LedgerClient, head: tuple[int, int], last_block: int, ends_at: int) -> int | None:
    """The block sets are read at once a window (through `last_block` and until `ends_at`) has
    passed: the block the client reads at, `confirmations` below the chain's head, if the window
    has passed there (that block is past its last block and not before its last second: every
    later block is outside it, as the contract counts), else None. `head`: a block's number and
    timestamp, the latest or one already that deep (the lower of it and the client's is taken)."""
    number, timestamp = head
    pinned = min(number, ledger.block_number()) if ledger.confirmations else number
    if pinned < last_block:
        return None
    if pinned != number:
        timestamp = int(ledger.w3.eth.get_block(pinned)["timestamp"])
    return pinned if timestamp >= ends_at else None


def chain_steps(ledger: LedgerClient, round: int, members: RoundMembers, *, at: int | None = None) -> ChainSteps:
    """Each step's digests and the acknowledgments as the chain holds them at block `at` (default:
    the block the client reads at; a step whose window is still open there may gain more).
    Postings by addresses that are not members of the round are ignored; so is an acknowledgment
    that is not a bitmap over the round's members (its sender is named). The complaints are read
    apart (`chain_complaints`)."""
    at = ledger.block_number() if at is None else at
    info = ledger.round_info(round, block=at)
    to_block = min(info.ended_block or at, at)
    digests: dict[Step, dict[int, bytes]] = {step: {} for step in (Step.KEYS, Step.DEALING, Step.MASKED, Step.REVEAL)}
    repeated: dict[int, list[str]] = {}
    for event in ledger.frame_postings(round, info.opened_block, to_block):
        index = members.index_of(event["args"]["peer"])
        step = event["args"]["step"]
        if index is None or step not in (Step.KEYS, Step.DEALING, Step.REVEAL):
            continue
        posted = digests[Step(step)]
        if index in posted:
            repeated.setdefault(index, []).append(Step(step).name)
        else:
            posted[index] = bytes(event["args"]["digest"])
    named = {
        i: f"posted its {', '.join(steps)} digest more than once (the first counts)" for i, steps in repeated.items()
    }
    acks: dict[Step, dict[int, frozenset[int]]] = {step: {} for step in ACKNOWLEDGED}
    for event in ledger.acknowledgments(round, info.opened_block, to_block):
        index = members.index_of(event["args"]["peer"])
        step = event["args"]["step"]
        if index is None or step not in ACKNOWLEDGED or index in acks[Step(step)]:  # one per member: a guard
            continue
        senders = read_ack(bytes(event["args"]["fetched"]), len(members.addresses))
        if senders is None:
            named[index] = f"its {Step(step).name} acknowledgment is not a bitmap over the round's members (ignored)"
        else:
            acks[Step(step)][index] = senders
    if info.closed_block:
        for commitment in ledger.commitments(round):
            index = members.index_of(commitment.peer)
            if index is not None:
                digests[Step.MASKED][index] = commitment.digest
    return ChainSteps(digests, named, acks)


def chain_complaints(ledger: LedgerClient, round: int, members: RoundMembers, *, at: int) -> dict[int, bytes]:
    """Complainer -> its COMPLAINT frame as the chain holds them at block `at` (past the complaint
    window: the member's settle step and verify read them, nothing else): the first frame of each
    member (`first_complaints`). A Complained log of an address that is no member of the round is
    dropped by its indexed sender before it is decoded, one over the largest COMPLAINT frame by its
    size (`LedgerClient.complaints`)."""
    info = ledger.round_info(round, block=at)
    to_block = min(info.ended_block or at, at)
    bound = m.max_frame_bytes(m.Kind.COMPLAINT)
    complained = ledger.complaints(round, info.opened_block, to_block, senders=members.addresses, max_frame=bound)
    return first_complaints(complained, members, bound)


def first_complaints(events: list[dict[str, Any]], members: RoundMembers, bound: int) -> dict[int, bytes]:
    """Complainer -> its COMPLAINT frame, from the Complained events in chain order: the first
    per member of the round (the contract takes one; a guard), of at most `bound` bytes (what the
    contract takes). An address that is not a member's is ignored: its frame names no member."""
    complaints: dict[int, bytes] = {}
    for event in events:
        index = members.index_of(event["args"]["peer"])
        frame = bytes(event["args"]["frame"])
        if index is not None and index not in complaints and len(frame) <= bound:
            complaints[index] = frame
    return complaints


Fetch = Callable[[bytes, int], bytes | None]  # (digest, most bytes to take) -> the blob, or None


def step_bound(step: Step, bits: int, dim: int) -> int:
    """The most bytes a step's blob may have: a MASKED frame has one exact size."""
    if step is Step.MASKED:
        return m.masked_frame_size(bits, dim)
    if step is Step.DEALING:
        return m.max_bundle_bytes()
    return m.max_frame_bytes(m.Kind.KEYS if step is Step.KEYS else m.Kind.REVEAL)


def checked_blob(raw: bytes | None, digest: bytes, bound: int) -> bytes | None:
    """`raw` if it is within `bound` bytes and hashes to `digest` (never parsed here), else None."""
    if raw is None or len(raw) > bound or hashlib.sha256(raw).digest() != digest:
        return None
    return raw


class FetchedArchive(NamedTuple):
    """What `fetch_archive` got: the archive, the members named on the way (a blob that could not
    be had, a bundle that does not split), and per step the members whose blob could not be had."""

    archive: RoundArchive
    faults: dict[int, str]
    unfetched: dict[Step, frozenset[int]]


def fetch_archive(
    steps: ChainSteps,
    complaints: Mapping[int, bytes],
    fetch: Fetch,
    *,
    bits: int,
    dim: int,
    agreed: Mapping[Step, frozenset[int]],
) -> FetchedArchive:
    """The round's archive: every blob of the round's sets (`agreed`: U1, U2 and U3, see `agreed`),
    every REVEAL frame and every other committer's MASKED frame, each fetched and checked against
    its digest, each dealing bundle whole (`RoundArchive.dealings`, checked to split), and the
    COMPLAINT frames the chain holds itself (`complaints`, from `chain_complaints`). A
    KEYS or DEALING posting outside U1 or U2 is no part of the round (fewer than t members held
    it): not fetched. A member whose blob could not be had is named (and left out of that step's
    set); a MASKED blob only of a member of U3: that of another committer was held by fewer than
    t members, so its absence proves nothing. A bundle that does not split names its dealer, left
    out of U2 as the members left it out."""
    frames: dict[Step, dict[int, bytes]] = {step: {} for step in steps.digests}
    missing: dict[int, list[str]] = {}
    unsplit: dict[int, str] = {}
    unfetched: dict[Step, frozenset[int]] = {}
    for step, digests in steps.digests.items():
        bound = step_bound(step, bits, dim)
        lacking = set()
        for member, digest in sorted(digests.items()):
            if step in (Step.KEYS, Step.DEALING) and member not in agreed[step]:
                continue
            raw = checked_blob(fetch(digest, bound), digest, bound)
            if raw is None:
                lacking.add(member)
                if step is not Step.MASKED or member in agreed[step]:
                    missing.setdefault(member, []).append(step.name)
            elif step is Step.DEALING:
                try:
                    m.split_bundle(raw, member)
                    frames[step][member] = raw  # the bundle: `verify_round` judges complaints on it
                except m.BadMessage as exc:
                    unsplit[member] = str(exc)
            else:
                frames[step][member] = raw
        unfetched[step] = frozenset(lacking)
    archive = RoundArchive(
        frames[Step.KEYS], frames[Step.DEALING], frames[Step.MASKED], frames[Step.REVEAL], dict(complaints)
    )
    named = {i: f"no blob matching its {', '.join(s)} digest on chain" for i, s in missing.items()}
    for i, why in unsplit.items():
        named[i] = f"{named[i]}; {why}" if i in named else why
    return FetchedArchive(archive, named, unfetched)
