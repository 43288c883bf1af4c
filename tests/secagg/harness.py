"""One secure-aggregation round played in-process by every member's own steps
(mechanisms.secagg.round, complaints), with members dropping at chosen steps and hooks for
faulty ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mechanisms.secagg import complaints as c
from mechanisms.secagg import messages as m
from mechanisms.secagg import round as r
from mechanisms.secagg.masks import session_id
from mechanisms.secagg.member import sum_residues
from mechanisms.secagg.unmask import RoundArchive, survivors

BITS = 32
DIM = 500
Hook = Callable[[int, bytes], bytes]
# (the dealer's state, holder, the holder's keys, its SEALED frame) -> what the dealer sends
SealedHook = Callable[[r.MemberState, int, r.PublicKeys, bytes], bytes]
# (the member's state, its COMPLAINT or None) -> what it sends
ComplaintHook = Callable[[r.MemberState, bytes | None], bytes | None]


@dataclass
class Swarm:
    """n members with Ed25519 keys bound for the round, and what each step published. With
    the policy's counted members h at 1 (the default) the round needs t masked vectors."""

    n: int
    bits: int = BITS
    counted_members: int = 1
    signing: list[Ed25519PrivateKey] = field(init=False)
    setup: r.RoundSetup = field(init=False)

    def __post_init__(self) -> None:
        self.signing = [Ed25519PrivateKey.generate() for _ in range(self.n)]
        publics = {i: k.public_key() for i, k in enumerate(self.signing)}
        self.setup = r.RoundSetup.for_members(
            session_id(b"genesis", 5, chain_id=1, ledger=bytes(20)),
            publics,
            self.bits,
            DIM,
            counted_members=self.counted_members,
        )


@dataclass
class Played:
    swarm: Swarm
    states: dict[int, r.MemberState]
    inputs: dict[int, np.ndarray]
    archive: RoundArchive
    dealt: frozenset[int]
    alive: frozenset[int]


def play(
    swarm: Swarm,
    *,
    drop_before: dict[str, set[int]] | None = None,
    masked_hook: Hook | None = None,
    reveal_hook: Hook | None = None,
    sealed_hook: SealedHook | None = None,
    complaint_hook: ComplaintHook | None = None,
    seed: int = 0,
) -> Played:
    """One round; drop_before["keys" | "deal" | "mask" | "reveal"] = the members that send
    nothing from that step on. Hooks rewrite a dealer's SEALED frames, a member's COMPLAINT (None:
    none), MASKED or REVEAL frame (a faulty member). A member that was sealed bad shares
    complains, and every member masks against U2 as the complaints leave it."""
    drops = {"keys": set(), "deal": set(), "mask": set(), "reveal": set(), **(drop_before or {})}
    gone: set[int] = set()
    n, setup = swarm.n, swarm.setup
    rng = np.random.default_rng(seed)
    inputs = {i: rng.integers(0, 2**setup.bits, DIM, dtype=np.int64) for i in range(n)}

    gone |= drops["keys"]
    states, key_frames = {}, {}
    for i in range(n):
        if i not in gone:
            states[i], key_frames[i] = r.start(setup, i, swarm.signing[i])
    keys, _ = r.key_set(setup, key_frames)

    gone |= drops["deal"]
    dealing_frames, bundles = {}, {}
    for i in keys:
        if i not in gone:
            dealing_frames[i], sealed = r.deal(states[i], setup, keys)
            if sealed_hook:
                sealed = {h: sealed_hook(states[i], h, keys[h], frame) for h, frame in sealed.items()}
            bundles[i] = sealed
    candidates, _ = r.dealt_set(setup, keys, dealing_frames)
    complaint_frames = {}
    for i in keys:
        if i not in gone:
            bad = r.receive(states[i], setup, keys, candidates, bundles)
            frame = c.complain(states[i], setup, bad) if bad else None
            frame = complaint_hook(states[i], frame) if complaint_hook else frame
            if frame is not None:
                complaint_frames[i] = frame
    dealt, _ = c.settle(setup, keys, candidates, complaint_frames, bundles)

    gone |= drops["mask"]
    masked_frames = {}
    for i in dealt:
        if i not in gone:
            frame = r.masked_vector(states[i], setup, keys, dealt, inputs[i])
            masked_frames[i] = masked_hook(i, frame) if masked_hook else frame
    vectors, _ = survivors(setup, dealt, masked_frames)

    gone |= drops["reveal"]
    reveal_frames = {}
    for i in keys:
        if i not in gone:
            frame = r.reveal(states[i], setup, dealt, vectors)
            reveal_frames[i] = reveal_hook(i, frame) if reveal_hook else frame
    dealt_bundles = {i: m.dealing_bundle(dealing_frames[i], sealed) for i, sealed in bundles.items()}
    archive = RoundArchive(key_frames, dealt_bundles, masked_frames, reveal_frames, complaint_frames)
    return Played(swarm, states, inputs, archive, frozenset(dealt), frozenset(vectors))


def plain_sum(played: Played) -> np.ndarray:
    return sum_residues([played.inputs[i] for i in sorted(played.alive)], played.swarm.setup.bits)
