"""One member's secure-aggregation round over libp2p and the chain (docs/SECAGG.md "The protocol").

Each step's blob is published as model blobs are (put in the store, announced, served by the
libp2p host to whoever asks for it by digest) and its digest posted on chain inside the step's
window (`LedgerClient.post_frame`; the MASKED frame's digest is the member's commit). Once a
window has passed, the step's set is the chain's (`node.chain.secure_steps.chain_steps`): every
member fetches the blobs the chain names from their senders, each within its step's size bound
and checked against its digest before anything parses it, and goes on with
`mechanisms.secagg.round` on exactly those frames.

- R0: the KEYS frame, under the member's index among the registrations (stable: they only append).
- KEYS window passed: the round's members are final (`round_members`); the KEYS frames the chain
  names fetched, and the ones that open acknowledged on chain (`acknowledge`: a bitmap of their
  senders). That window passed: U1 is the senders at least t members acknowledged
  (`secure_steps.agreed`), the same for every member whatever it fetched itself; a frame of U1
  this member lacks is fetched from its acknowledgers (they hold it); deal, and publish the
  dealing bundle (the DEALING frame and every holder's SEALED frame: `messages.dealing_bundle`).
- DEALING window passed: the bundles fetched, the sound ones acknowledged; that window passed:
  U2 the same way, what of it is lacking fetched from its acknowledgers; open the shares sealed
  for this member, and complain on chain (`complain`, in the complaint window) against the dealers
  whose shares do not open or match.
- Complaint window passed: the chain's complaints settled (`complaints.settle`, what `swarm
  verify` runs too) on the bundles of U2: a dealer a complaint holds against leaves U2, a false
  complainer is named; the MASKED frame against that U2, committed (`commit`, the caller's: it
  records the privacy spend) then announced.
- Round closed: the committed MASKED frames fetched, and the ones that open acknowledged.
- MASKED acknowledgment window passed: U3, the same way; the REVEAL frame for exactly that U3,
  posted at once; then a frame of U3 this member lacks, fetched from the members that
  acknowledged it within what is left of the REVEAL window (only its own unmasking needs it).
- REVEAL window passed: the sum (`unmask.unmask_round`, what `swarm verify` recomputes).

Each window is where `node.protocol.secure_windows` lays it out, as the ledger does. Every set is
read at one block `chain.confirmations` below the head at which the step's window has passed
(`secure_steps.settled_block`), so every member acts on the same sets.

A member that misses a window (late, or its frame refused) sits the rest of the round out (but one
whose acknowledgment is refused goes on: each set is the others' count too, and its shares are
needed); so does one that cannot get a KEYS or DEALING blob of U1 or U2 even from its
acknowledgers (going on with a smaller set than the others would split U1 or U2 and get honest
dealers named), one whose index moved during the KEYS window (an earlier member disallowed),
and one whose round cannot be played (members the round setup refuses, a chain read or anything
else failing): `play` ends with the reason in `SecureOutcome.sat_out`, never with an exception.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mechanisms.secagg import messages as m
from mechanisms.secagg import round as sr
from mechanisms.secagg.complaints import complain, settle
from mechanisms.secagg.masks import Ints
from mechanisms.secagg.shamir import PRIME
from mechanisms.secagg.unmask import RoundResult, survivors, unmask_round
from node.chain.client import LedgerClient
from node.chain.records import RoundInfo, RoundState, SwarmParams
from node.chain.secure_steps import (
    BadRound,
    RoundMembers,
    ack_bitmap,
    agreed,
    chain_complaints,
    chain_steps,
    checked_blob,
    disallowed_at,
    members_from,
    round_members,
    round_session,
    round_setup,
    settled_block,
    step_bound,
)
from node.peer.fetching import REQUEST_SHARE, BlobUnavailable, Holders, fetch_from_holders
from node.peer.ports import HostPort, OffLoop, StorePort
from node.protocol.secure_windows import ACKNOWLEDGED, WINDOWS, Step, window_end
from p2p import peer_id_from_bytes

log = logging.getLogger("swarm.peer")


# this member's residues, awaited when it masks (the caller computes them meanwhile)
Residues = Callable[[], Awaitable[Ints]]

# a block's (number, timestamp): the chain's latest, or the one `chain.confirmations` below it
# that the ledger client reads at (`secure_steps.settled_block` takes the lower of the two)
Head = Callable[[], tuple[int, int]]


@dataclass(frozen=True)
class SecureSettings:
    bits: int
    dim: int
    counted_members: int  # the policy's h (`SecAggPolicy.counted_members`)
    fetch_timeout: float = 30.0
    poll: float = 0.25  # seconds between two looks at the chain's head while a window runs
    fault: str | None = None


@dataclass
class SecureOutcome:
    """What one member saw of a round: the sum (None if it could not get one) and why not."""

    result: RoundResult | None = None
    sat_out: str | None = None  # the step this member stopped at, and why
    faults: dict[int, str] = field(default_factory=dict)  # members named on the way


class _Fetched(NamedTuple):
    """A step's blobs this member has (sender -> blob), and the senders whose blob the chain names
    but nobody served it."""

    got: dict[int, bytes]
    lacking: set[int]


class _SitOut(Exception):
    """This member stops at a step of the round; the message says which and why."""


@dataclass
class _Round:
    """What one member holds of a round as it goes."""

    r: int
    params: SwarmParams
    info: RoundInfo
    out: SecureOutcome
    state: sr.MemberState
    members: RoundMembers
    setup: sr.RoundSetup
    keys: dict[int, sr.PublicKeys] = field(default_factory=dict)
    dealt: dict[int, m.Dealing] = field(default_factory=dict)
    closed: tuple[int, int] = (0, 0)  # the round's closing block and timestamp
    vectors: dict[int, Ints] = field(default_factory=dict)  # the MASKED frames we hold that open


class SecureMember:
    def __init__(
        self,
        ledger: LedgerClient,
        host: HostPort,
        store: StorePort,
        signing_key: Ed25519PrivateKey,
        settings: SecureSettings,
        *,
        call: OffLoop,
        head: Head,
    ) -> None:
        if ledger.account is None:
            raise ValueError("a member needs a ledger client with an account")
        self.ledger, self.host, self.store, self.key, self.s = ledger, host, store, signing_key, settings
        self.call, self.head = call, head
        self.address = ledger.account.address

    async def play(self, r: int, residues: Residues, commit: Callable[[bytes], Awaitable[None]]) -> SecureOutcome:
        """Round r with this member's residues (mod 2^bits), awaited only when it masks: the
        caller trains while the KEYS and DEALING steps run, so their windows need not cover the
        training; `commit(digest)` commits the MASKED frame's digest on chain."""
        out = SecureOutcome()
        step = "R0"
        try:
            played = await self._keys(r, out)
            step = "R1"
            await self._deal(played)
            step = "R2"
            await self._mask(played, await residues(), commit)
            step = "R3"
            await self._reveal_and_unmask(played)
        except _SitOut as exc:
            out.sat_out = str(exc)
        except Exception as exc:  # a chain read, the host, a frame we cannot build: the round, not the process, ends
            out.sat_out = f"{step}: {type(exc).__name__}: {exc}"
            log.warning("round %d: sitting out: %s", r, out.sat_out)
        return out

    async def _keys(self, r: int, out: SecureOutcome) -> _Round:
        """R0: our KEYS frame; then, once the KEYS window passed, the members, the KEYS frames we
        hold acknowledged, and once that window passed, U1 (fetching what of it we lack)."""
        params = await self.call(self.ledger.params)
        info = await self.call(self.ledger.round_info, r)
        session = await self.call(round_session, self.ledger, r)
        known = await self.call(self._members_now)
        me = known.index_of(self.address)
        if me is None:
            raise _SitOut("R0: not registered with an Ed25519 peer id (or disallowed)")
        if me >= m.MAX_MEMBERS:
            raise _SitOut(f"R0: our index {me} is beyond what a frame can address ({m.MAX_MEMBERS})")
        members_known = min(len(known.addresses), m.MAX_MEMBERS)
        state, keys_frame = sr.start_session(session, me, self.key, members=members_known)
        await self._publish(r, Step.KEYS, keys_frame)
        at = await self._until_settled(*_window_end(Step.KEYS, params, info))
        members = await self.call(round_members, self.ledger, r)
        if members.index_of(self.address) != me:
            raise _SitOut(f"R1: our index is {members.index_of(self.address)} for the round, our KEYS frame says {me}")
        try:
            setup = round_setup(session, members, self.s.bits, self.s.dim, counted_members=self.s.counted_members)
        except BadRound as exc:
            raise _SitOut(f"R1: {exc}") from None
        p = _Round(r, params, info, out, state, members, setup)
        held = await self._fetch_step(p, Step.KEYS, at)
        sound, _ = sr.key_set(setup, held)
        frames = await self._agreed_frames(p, Step.KEYS, held, set(sound), _window_end(Step.DEALING, params, info)[1])
        p.keys, out.faults = sr.key_set(setup, frames)
        if me not in p.keys:
            raise _SitOut("R1: our KEYS frame is not in U1")
        return p

    async def _deal(self, p: _Round) -> None:
        """R1: our dealing bundle; then, once the DEALING window passed, the bundles we hold
        acknowledged, and once that window passed, U2 (fetching what of it we lack) and our shares,
        complaining against the dealers whose shares do not open or match; once the complaint
        window passed, U2 as the chain's complaints leave it (`complaints.settle`, as verify)."""
        try:
            dealing, sealed = sr.deal(p.state, p.setup, p.keys)
        except sr.RoundFailed as exc:
            raise _SitOut(f"R1: {exc}") from None
        if self.s.fault == "secagg-bad-seal":
            sealed = _bad_seals(p.setup, p.state.index, sealed, self.key)
        await self._publish(p.r, Step.DEALING, m.dealing_bundle(dealing, sealed))
        at = await self._until_settled(*_window_end(Step.DEALING, p.params, p.info))
        held = await self._fetch_step(p, Step.DEALING, at)
        sound, _ = sr.dealt_set(p.setup, p.keys, m.split_bundles(held)[0])
        complaint_ends = _window_end(Step.COMPLAINT, p.params, p.info)[1]
        bundles = await self._agreed_frames(p, Step.DEALING, held, set(sound), complaint_ends)
        dealings, dealt_sealed, faults = m.split_bundles(bundles)
        p.dealt, dealing_faults = sr.dealt_set(p.setup, p.keys, dealings)
        sealed_badly = sr.receive(p.state, p.setup, p.keys, p.dealt, dealt_sealed)
        p.out.faults |= faults | dealing_faults | sealed_badly
        await self._complain(p, sorted(sealed_badly))
        at = await self._until_settled(*_window_end(Step.COMPLAINT, p.params, p.info))
        complaints = await self.call(chain_complaints, self.ledger, p.r, p.members, at=at)
        settled, named = settle(p.setup, p.keys, p.dealt, complaints, dealt_sealed)
        p.out.faults |= named
        if self.s.fault != "secagg-bad-seal":  # that dealer masks against the U2 it dealt to, as if none held
            p.dealt = settled
        if p.state.index not in p.dealt:
            raise _SitOut("R2: our dealing is not in U2")

    async def _complain(self, p: _Round, against: list[int]) -> None:
        """Our COMPLAINT against the dealers of U2 whose shares for us did not open or match, on
        chain in the complaint window (none if there are none); a refusal only logs: the others
        settle without it, and we lack those dealers' shares either way."""
        frame = None
        if against:
            frame = complain(p.state, p.setup, against)
        if self.s.fault == "secagg-false-complaint":
            frame = _false_complaint(p.setup, p.state, against, self.key)
        if frame is None:
            return
        try:
            await self.call(self.ledger.complain, p.r, frame)
        except Exception as exc:
            log.warning("round %d: complaint against members %s refused, going on: %s", p.r, against, exc)

    async def _agreed_frames(
        self, p: _Round, step: Step, held: dict[int, bytes], sound: set[int], fetch_ends: int
    ) -> dict[int, bytes]:
        """Acknowledge the `sound` frames of `step` we hold; once that acknowledgment window passed,
        the blobs of the step's set (`secure_steps.agreed`: the senders t members acknowledged),
        those we lack fetched from their acknowledgers (they hold them) until `fetch_ends` (chain
        time, half the time left); we sit out if one still lacks (a set of our own would split
        U1 or U2). A refused acknowledgment only logs: the set is the others' count too."""
        bitmap = ack_bitmap(sound, len(p.members.addresses))
        try:
            await self.call(self.ledger.acknowledge, p.r, step, bitmap)
        except Exception as exc:
            log.warning("round %d: %s acknowledgment refused, going on: %s", p.r, step.name, exc)
        at = await self._until_settled(*_window_end(ACKNOWLEDGED[step], p.params, p.info, p.closed))
        steps = await self.call(chain_steps, self.ledger, p.r, p.members, at=at)
        members_set = agreed(steps, step, p.setup.threshold)
        frames = {i: raw for i, raw in held.items() if i in members_set}
        lacking = members_set - set(frames)
        if lacking:
            holders = {i: steps.holders(step, i) for i in lacking}
            digests = {i: steps.digests[step][i] for i in lacking}
            timeout = await self._time_left(fetch_ends, share=0.5)
            fetched = await self._fetch(p.r, step, p.members, digests, holders, timeout=timeout)
            if fetched.lacking:
                raise _SitOut(
                    f"{step.name}: no blob matching the digest on chain of members {sorted(fetched.lacking)}, "
                    "acknowledged by t members"
                )
            frames |= fetched.got
        return frames

    async def _mask(self, p: _Round, residues: Ints, commit: Callable[[bytes], Awaitable[None]]) -> None:
        """R2: our MASKED frame, committed then announced; then, once the round closed, the
        MASKED frames we can fetch, acknowledged on chain."""
        try:
            masked = sr.masked_vector(p.state, p.setup, p.keys, p.dealt, residues)
        except sr.RoundFailed as exc:
            raise _SitOut(f"R2: {exc}") from None
        if self.s.fault == "secagg-bad-masked":
            masked = _short_masked(p.setup, p.state.index, masked, self.key)
        if self.s.fault == "secagg-withhold-masked":
            await commit(m.frame_digest(masked))  # committed, never stored: nobody can fetch it from us
            raise _SitOut("R2: withholding our MASKED frame (testing fault)")
        digest = bytes.fromhex(self.store.put(masked))
        try:
            await commit(digest)
        except Exception as exc:
            raise _SitOut(f"R2: commit refused: {exc}") from None
        await self.host.announce_blob(digest.hex())
        p.closed, at = await self._until_closed(p.r)
        # the frames must come before the ACK window ends: what is not here by then is not acknowledged
        fetched = await self._fetch_step(p, Step.MASKED, at)
        p.vectors, faults = survivors(p.setup, p.dealt, fetched)
        _name(p.out.faults, faults)
        if p.state.index not in p.vectors:  # never for a member that follows the protocol: say what it saw
            log.warning(
                "round %d: our own MASKED frame is not among the %d we acknowledge (fetched %s at block %d: %s)",
                p.r,
                len(p.vectors),
                sorted(fetched),
                at,
                faults,
            )
        try:
            await self.call(
                self.ledger.acknowledge, p.r, Step.MASKED, ack_bitmap(set(p.vectors), len(p.members.addresses))
            )
        except Exception as exc:  # late, or refused: U3 is the others' count, and our shares are still needed
            log.warning("round %d: acknowledgment refused, revealing all the same: %s", p.r, exc)

    async def _reveal_and_unmask(self, p: _Round) -> None:
        """Once the ACK window passed, U3 from the chain and our REVEAL frame for it, posted at
        once (it needs no MASKED frame); then the frames of U3 we lack, from their acknowledgers,
        for what is left of the REVEAL window; once that window passed, the sum."""
        at = await self._until_settled(*_window_end(Step.MASKED_ACK, p.params, p.info, p.closed))
        steps = await self.call(chain_steps, self.ledger, p.r, p.members, at=at)
        u3 = agreed(steps, Step.MASKED, p.setup.threshold) & set(p.dealt)
        if self.s.fault == "secagg-bad-seal":
            raise _SitOut("R3: withholding our REVEAL (testing fault)")
        try:
            reveal = sr.reveal(p.state, p.setup, p.dealt, u3)
        except sr.RevealRefused as exc:
            raise _SitOut(f"R3: {exc}") from None
        if self.s.fault == "secagg-wrong-share":
            reveal = _forged_reveal(p.setup, p.state.index, reveal, self.key)
        await self._publish(p.r, Step.REVEAL, reveal)
        reveal_end = _window_end(Step.REVEAL, p.params, p.info, p.closed)
        lacking = u3 - set(p.vectors)
        if lacking:  # frames t members hold and we do not: from them, while the REVEAL window runs
            holders = {i: steps.holders(Step.MASKED, i) for i in lacking}
            digests = {i: steps.digests[Step.MASKED][i] for i in lacking}
            timeout = await self._time_left(reveal_end[1], share=1.0)
            got = (await self._fetch(p.r, Step.MASKED, p.members, digests, holders, timeout=timeout)).got
            vectors, faults = survivors(p.setup, p.dealt, got)
            p.vectors |= vectors
            _name(p.out.faults, faults)
        at = await self._until_settled(*reveal_end)
        posted = (await self.call(chain_steps, self.ledger, p.r, p.members, at=at)).digests[Step.REVEAL]
        reveals = (await self._fetch(p.r, Step.REVEAL, p.members, posted, {})).got
        absent = sorted(u3 - set(p.vectors))
        if absent:
            raise _SitOut(
                f"unmask: no MASKED frame that opens of members {absent} of U3 (revealed for them all the same)"
            )
        vectors = {i: vector for i, vector in p.vectors.items() if i in u3}
        try:
            p.out.result = unmask_round(p.setup, p.keys, p.dealt, vectors, reveals, p.out.faults)
            p.out.faults = dict(p.out.result.faults)
        except sr.RoundFailed as exc:
            p.out.faults |= exc.faults
            raise _SitOut(f"unmask: {exc}") from None

    async def _time_left(self, ends_at: int, *, share: float) -> float:
        """`share` of the seconds left until chain time `ends_at` (at least one, at most the fetch
        timeout): what a fetch may take so that what follows it still fits its window."""
        now = (await self.call(self.head))[1]
        return max(1.0, min(self.s.fetch_timeout, (ends_at - now) * share))

    def _members_now(self) -> RoundMembers:
        registrations = self.ledger.registrations()
        return members_from(registrations, self.ledger.chain_id(), self.ledger.address, disallowed_at(self.ledger))

    async def _publish(self, r: int, step: Step, raw: bytes) -> None:
        """Store and announce `raw`, then post its digest (_SitOut if the chain refuses it)."""
        digest = self.store.put(raw)
        await self.host.announce_blob(digest)
        try:
            await self.call(self.ledger.post_frame, r, step, bytes.fromhex(digest))
        except Exception as exc:
            raise _SitOut(f"{step.name}: digest refused: {exc}") from None

    async def _until_settled(self, last_block: int, ends_at: int) -> int:
        """Until a window (its last block and its last second) has passed at the block the sets
        are read at, `chain.confirmations` below the head (`settled_block`): that block."""
        while True:
            head = await self.call(self.head)
            at = await self.call(settled_block, self.ledger, head, last_block, ends_at)
            if at is not None:
                return at
            await trio.sleep(self.s.poll)

    async def _until_closed(self, r: int) -> tuple[tuple[int, int], int]:
        """Until round r is closed (its MASKED set final) at the block the client reads at: its
        closing block and timestamp, and that block. A view that shows the round closed in a
        block after `at` was answered from a later state than asked for (Anvil answers a call at
        its head from the block it is mining): the sets read at `at` still show the round open,
        with no MASKED digest in them, so it is read again once the client reads at the close."""
        while True:
            at = await self.call(self.ledger.block_number)
            info = await self.call(self.ledger.round_info, r, block=at)
            if info.state is not RoundState.OPEN and info.closed_block <= at:
                return (info.closed_block, info.closed_at), at
            await trio.sleep(self.s.poll)

    async def _fetch_step(self, p: _Round, step: Step, at: int) -> dict[int, bytes]:
        """Sender -> its blob for `step`, of every digest the chain holds at block `at`, fetched
        until half the time left in the step's acknowledgment window: what is not here by then is
        not acknowledged."""
        digests: Mapping[int, bytes] = (await self.call(chain_steps, self.ledger, p.r, p.members, at=at)).digests[step]
        ends_at = _window_end(ACKNOWLEDGED[step], p.params, p.info, p.closed)[1]
        timeout = await self._time_left(ends_at, share=0.5)
        return (await self._fetch(p.r, step, p.members, digests, {}, timeout=timeout)).got

    async def _fetch(
        self,
        r: int,
        step: Step,
        members: RoundMembers,
        digests: Mapping[int, bytes],
        holders: Mapping[int, list[int]],
        *,
        timeout: float | None = None,
    ) -> _Fetched:
        """Sender -> its blob of `digests`: from our store, or fetched from the sender, the members
        in `holders[sender]` and anyone announcing it, within the step's bound, checked against
        the digest. The senders whose blob did not come in time are `lacking`."""
        bound = step_bound(step, self.s.bits, self.s.dim)
        timeout = self.s.fetch_timeout if timeout is None else timeout
        got: dict[int, bytes] = {}

        async def one(sender: int, digest: bytes) -> None:
            digest_hex = digest.hex()
            raw = self.store.get(digest_hex)
            if raw is None:
                known = [peer_id_from_bytes(members.peer_ids[i]) for i in [sender, *holders.get(sender, [])]]

                async def obtain(wanted: str, providers: list[str], timeout: float) -> bytes:
                    return await self.host.fetch(wanted, providers=providers, max_size=bound, timeout=timeout)

                try:
                    raw = await fetch_from_holders(
                        obtain,
                        digest_hex,
                        Holders(f"round {r}: {step.name} blob of member {sender}"),
                        lambda: [*known, *self.host.providers(digest_hex)],
                        deadline=trio.current_time() + timeout,
                        request_timeout=timeout * REQUEST_SHARE,
                    )
                except BlobUnavailable as exc:
                    log.warning("%s", exc)
                    return
            checked = checked_blob(raw, digest, bound)
            if checked is not None:
                got[sender] = checked

        async with trio.open_nursery() as nursery:
            for sender, digest in sorted(digests.items()):
                nursery.start_soon(one, sender, digest)
        return _Fetched(got, set(digests) - set(got))


def _name(faults: dict[int, str], more: Mapping[int, str]) -> None:
    """Add `more` to the members named so far, a member's later fault after its earlier one (a
    dealer a complaint convicted that masked anyway is named for both)."""
    for member, reason in more.items():
        faults[member] = f"{faults[member]}; {reason}" if member in faults else reason


def _window_end(step: Step, params: SwarmParams, info: RoundInfo, closed: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """The last block and the end (chain time) of `step`'s window in round `info` (a step of the
    closed round: from `closed`, its closing block and time)."""
    if WINDOWS[step].closed:
        return window_end(step, closed, params.attest_window, params.attest_window_seconds)
    return window_end(step, (info.opened_block, info.opened_at), params.commit_window, params.commit_window_seconds)


def _short_masked(setup: sr.RoundSetup, me: int, frame: bytes, key: Ed25519PrivateKey) -> bytes:
    """`--fault secagg-bad-masked`: our MASKED frame one coordinate short, signed by us."""
    y = m.read_masked(m.open_frame(frame, m.Kind.MASKED, setup.session, setup.signing), setup.bits, setup.dim)
    return m.masked_message(setup.session, me, y[:-1], setup.bits, key)


def _bad_seals(setup: sr.RoundSetup, me: int, sealed: dict[int, bytes], key: Ed25519PrivateKey) -> dict[int, bytes]:
    """`--fault secagg-bad-seal`: garbage sealed to floor(n/3) holders, the lowest indices other
    than ours (their ciphertext's first byte flipped, signed by us: it opens, and does not decrypt)."""
    victims = [h for h in sorted(sealed) if h != me][: len(setup.signing) // 3]
    bad = dict(sealed)
    for h in victims:
        frame = m.open_frame(sealed[h], m.Kind.SEALED, setup.session, setup.signing)
        payload = bytearray(frame.payload)
        payload[2 + m.NONCE_BYTES] ^= 0xFF  # past the holder's index and the nonce: the ciphertext
        bad[h] = m.seal_frame(m.Kind.SEALED, setup.session, me, bytes(payload), key)
    return bad


def _false_complaint(
    setup: sr.RoundSetup, state: sr.MemberState, against: list[int], key: Ed25519PrivateKey
) -> bytes | None:
    """`--fault secagg-false-complaint`: our COMPLAINT against `against` and also against every
    other dealer whose shares for us opened and matched (their pair keys revealed): whichever of
    them `settle` judges first names us."""
    honest = [d for d in state.held if d != state.index]
    if not honest:
        return None
    revealed = {d: state.pair_keys[d] for d in [*against, *honest]}
    return m.complaint_message(setup.session, state.index, revealed, key)


def _forged_reveal(setup: sr.RoundSetup, me: int, frame: bytes, key: Ed25519PrivateKey) -> bytes:
    """`--fault secagg-wrong-share`: our share of the lowest dealer's secret moved by one."""
    opened = m.read_reveal(m.open_frame(frame, m.Kind.REVEAL, setup.session, setup.signing))
    first = min((o.dealer for o in opened), default=None)
    forged = [o._replace(y=(o.y + 1) % PRIME) if o.dealer == first else o for o in opened]
    return m.reveal_message(setup.session, me, forged, key)
