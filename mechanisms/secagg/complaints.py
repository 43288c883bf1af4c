"""Complaints against dealers that seal bad shares: a step between the DEALING window and the
masking (the masks depend on U2), with no transport, as the other steps (`round`).

A holder whose SEALED frame from a dealer of U2 does not open or does not match the dealer's
commitments (`round.receive` names the dealer) cannot reveal for it, and a dealer that did so to
floor(n/3) holders and withheld its own reveal would leave t - 1 good shares of its secrets:
every member's unmasking would fail naming nobody. So the holder complains: its COMPLAINT frame
reveals, per such dealer, its private key of that (holder, dealer) pair, whose public half its
signed KEYS frame holds (`round.start`: one key per dealer). `settle` checks every complaint the
same way for everyone: the revealed key against that public key, then the dealer's signed SEALED
frame for the holder, from the dealer's bundle, opened under the key it gives and checked against
the dealer's commitments (`round.open_sealed`, the holder's own check). A complaint that holds
drops the dealer from U2 and names it; one that does not names the complainer and changes
nothing else.

What a revealed key exposes: the shares that one dealer sealed to that one holder in that round.
The key is a fresh X25519 key used for nothing but that pair: the seal key is HKDF of its
agreement with the dealer's share-encryption key, bound to the session, dealer and holder; the
holder's other pairs use independent keys, and its own share-encryption key (what it seals with
as a dealer) and mask key are other keys again. The dealer proven at fault is out of U2, so its
secrets no longer matter. A false complaint against a dealer of U2 makes public one share of
each of that dealer's two secrets, the shares it sealed to the complainer: with t - 1 colluders'
shares they rebuild both, and so the dealer's input from its masked vector. A malicious holder
could publish its shares anyway; an honest one must never complain falsely, so it complains only
on the dealer's bundle as the chain fixed it, never for lack of a bundle (`round.receive`
refuses to judge a dealer whose bundle it was not given).

Cost: `settle` stops judging a complainer at its first entry that does not hold (that names it)
and skips entries against a dealer already dropped, so every member and the verifier make at
most one expensive check (an X25519 base point multiplication, then an agreement and a
decryption) per complainer plus one per dropped dealer, not one per entry.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import NamedTuple

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from . import messages as m
from .round import MemberState, PublicKeys, RoundFailed, RoundSetup, open_sealed, public_of


def complain(state: MemberState, setup: RoundSetup, against: Collection[int]) -> bytes:
    """The COMPLAINT frame against the dealers `against` (those `round.receive` named): this
    member's private key of each pair. Refused for a dealer whose shares it holds: a complaint
    against it would not hold, and would publish the shares for nothing."""
    held = sorted(set(against) & set(state.held))
    if held:
        raise ValueError(f"the shares of members {held} opened and matched: no complaint against them")
    revealed = {dealer: state.pair_keys[dealer] for dealer in against}
    return m.complaint_message(setup.session, state.index, revealed, state.signing_key)


def settle(
    setup: RoundSetup,
    keys: Mapping[int, PublicKeys],
    dealings: Mapping[int, m.Dealing],
    complaints: Mapping[int, bytes],
    sealed: Mapping[int, Mapping[int, bytes]],
) -> tuple[dict[int, m.Dealing], dict[int, str]]:
    """U2 after the complaints, and the members they name: each dealer a complaint holds against
    (left out of U2; the text names the first complainer it holds for) and each complainer with a
    frame that does not open or an entry that does not hold (its first: the entries after it, and
    those against a dealer already dropped, are not judged, module docstring "Cost"). `keys` and
    `dealings`: U1 and U2 as `round.key_set` and `round.dealt_set` gave them; `complaints`:
    complainer -> its COMPLAINT frame, as the chain admitted them; `sealed`: dealer -> holder ->
    SEALED frame, from the dealer's bundle as the chain's digest fixed it
    (`messages.split_bundles`), for every dealer a judged entry names (RoundFailed, naming nobody,
    if one is missing: the outcome cannot be judged without it). Every member and the verifier
    call this with the same inputs and get the same U2 and the same names."""
    upheld: dict[int, tuple[int, str]] = {}  # dealer -> the first complainer against it that holds, why
    faults: dict[int, str] = {}
    for complainer, raw in sorted(complaints.items()):
        try:
            frame = m.open_frame(raw, m.Kind.COMPLAINT, setup.session, setup.signing)
            if frame.sender != complainer:
                raise m.BadMessage(complainer, "COMPLAINT frame of another member")
            if complainer not in keys:
                raise m.BadMessage(complainer, "complains without keys in U1")
            revealed = m.read_complaint(frame, max_dealers=len(dealings))
        except m.BadMessage as exc:
            faults[complainer] = str(exc)
            continue
        for dealer, private in sorted(revealed.items()):
            if dealer in upheld:  # out of U2 already: judging this entry changes nothing
                continue
            verdict = _judge(setup, keys, dealings, sealed, complainer, dealer, private)
            if not verdict.holds:  # one false entry names the complainer: the rest need no judging
                faults[complainer] = verdict.text
                break
            upheld[dealer] = (complainer, verdict.text)
    for dealer, (complainer, text) in sorted(upheld.items()):
        held = f"{text}; the complaint of member {complainer} holds"
        faults[dealer] = f"{faults[dealer]}; {held}" if dealer in faults else held
    return {d: dealing for d, dealing in dealings.items() if d not in upheld}, faults


class _Verdict(NamedTuple):
    holds: bool
    text: str


def _judge(
    setup: RoundSetup,
    keys: Mapping[int, PublicKeys],
    dealings: Mapping[int, m.Dealing],
    sealed: Mapping[int, Mapping[int, bytes]],
    holder: int,
    dealer: int,
    private: bytes,
) -> _Verdict:
    """Whether `holder`'s complaint against `dealer`, revealing `private`, holds."""
    dealing = dealings.get(dealer)
    if dealing is None:
        return _Verdict(False, f"complains against member {dealer}, not a dealer of U2")
    if public_of(private) != keys[holder].pairs[dealer]:
        return _Verdict(False, f"revealed a key that is not its KEYS frame's key for member {dealer}'s shares")
    bundle = sealed.get(dealer)
    if bundle is None:
        raise RoundFailed(None, f"member {holder} complains against member {dealer}, whose SEALED frames are not here")
    try:
        open_sealed(setup, keys, dealing, holder, X25519PrivateKey.from_private_bytes(private), bundle.get(holder))
    except m.BadMessage as exc:
        return _Verdict(True, str(exc))
    return _Verdict(False, f"complained against member {dealer}, whose shares for it open and match its commitments")
