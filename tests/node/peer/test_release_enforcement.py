"""Peers leave out a fetched update that the swarm's mechanism cannot output, with the rule
`swarm verify` applies (`release.check_release`, i.e. `Mechanism.release_violation`), so peers and
verify agree; and they never leave out an honest release.

The forged blobs below are well-formed update blobs whose every value is far inside the
fixed-point bound (2^20) that `wire.read_vector` enforces: before this rule, every peer
aggregated them. A hostile member serves one: the real peers leave it out alike and finalize
without it. Honest releases come from the real peer path (`Peer._train_and_perturb`: local
training, then the mechanism as `node.derive` configures it from a config) for every mechanism
that can perturb model values, sharing weights and updates."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import trio

import mechanisms
from mechanisms.randomness import seeded_generator
from node.chain.records import RoundState
from node.config import load_config
from node.derive import mechanism_params
from node.peer.peer import Peer, RoundOutcome
from node.protocol import aggregate, release, wire
from node.protocol.aggregate import VALUE_BOUND
from node.protocol.blob import BlobError, sha256
from node.protocol.settings import PrivacyPolicy, SharedSettings
from tests.node.peer.harness import (
    SHARED,
    FakeSwarm,
    genesis_vector,
    member_address,
    run_virtual,
    samples_of,
    update_vector,
)

T, F = True, False
D = genesis_vector().numel()
DUCHI = PrivacyPolicy(mechanisms.get("duchi", epsilon=1.0, clip=True).params())
SAMPLED = PrivacyPolicy(mechanisms.get("sampled", base="pm", epsilon=10.0, clip=True).params())  # k = 4 of d


def swarm_settings(privacy: PrivacyPolicy, share: str = "weights") -> SharedSettings:
    return dataclasses.replace(SHARED, share=share, privacy=privacy)


def genuine(privacy: PrivacyPolicy, seed: int) -> torch.Tensor:
    """A real release of the policy's mechanism (of a scripted member's weights)."""
    mech = mechanisms.from_params(dict(privacy.mechanism))
    return mech.perturb(update_vector(seed), generator=seeded_generator(seed)).to(torch.float32)


def one_moved(privacy: PrivacyPolicy, seed: int) -> torch.Tensor:
    vector = genuine(privacy, seed)
    vector[5] = 0.5  # inside (-B, B): a value Duchi never outputs
    return vector


FORGERIES: dict[str, Callable[[PrivacyPolicy, int], torch.Tensor]] = {
    "scaled": lambda privacy, seed: genuine(privacy, seed) * 1.01,  # the genuine release, 1% larger
    "raw": lambda privacy, seed: update_vector(seed),  # the unperturbed weights, no noise at all
    "one-moved": one_moved,
}


def blob(privacy: PrivacyPolicy, vector: torch.Tensor, member: int, r: int = 1) -> bytes:
    return wire.update_blob(vector, r, wire.canonical(dict(privacy.mechanism)), member_address(member))


def forged_blob(privacy: PrivacyPolicy, forgery: str, seed: int) -> bytes:
    """A well-formed update blob inside the value bound that the mechanism cannot have output."""
    data = blob(privacy, FORGERIES[forgery](privacy, seed), seed)
    vector, _ = wire.read_vector(data, D, kind="update")  # the decoding and the value bound let it through
    assert float(vector.abs().max()) < VALUE_BOUND
    return data


def model_digest(shared: SharedSettings, blobs: list[bytes], samples: list[int]) -> bytes:
    vectors = [wire.read_vector(b, D, kind="update")[0] for b in blobs]
    return sha256(wire.model_blob(aggregate.next_global(shared, genesis_vector(), vectors, samples), 1))


def deploy(swarm: FakeSwarm, shared: SharedSettings) -> None:
    """The fake chain's genesis is the one of `shared` (whose privacy policy the peers then hold)."""
    genesis = sha256(wire.genesis_blob(genesis_vector(), shared.to_dict()))
    swarm.chain.params = dataclasses.replace(swarm.chain.params, genesis_digest=genesis)


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_release_outside_the_output_set_is_left_out_and_named(forgery):
    shared = swarm_settings(DUCHI)
    honest = [blob(DUCHI, genuine(DUCHI, 0), 0), blob(DUCHI, genuine(DUCHI, 1), 1)]

    async def main():
        swarm = FakeSwarm(3)
        swarm.register(0, 1, 2)
        for i, data in enumerate([*honest, forged_blob(DUCHI, forgery, 2)]):
            swarm.commit(i, data, privacy=DUCHI)
        swarm.members[0].ledger.close_round(1)
        peer = swarm.peer(0, shared=shared)

        agreement = await peer._agreement(1)
        included = await agreement.run()

        assert included == [T, T, F]  # left out, as a malformed blob is
        assert agreement.blobs.malformed == [F, F, T] and agreement.blobs.vectors[2] is None
        why = agreement.blobs.left_out[2]
        assert agreement.blobs.left_out[:2] == [None, None]
        hostile = swarm.members[2]
        for part in ("round 1:", "participant 2", hostile.address, hostile.peer_id, "is malformed, left out"):
            assert part in why, (part, why)
        assert "not a possible output of the swarm's mechanism Duchi(epsilon=1.0, clip=True)" in why, why
        assert "duchi(eps 1)'s output set" in why, why
        digest = await peer._aggregate(1, genesis_vector(), agreement.commitments, agreement.blobs.vectors, included)
        assert digest == model_digest(shared, honest, [samples_of(0), samples_of(1)])

    run_virtual(main)


def test_the_same_release_is_included_when_it_is_genuine():
    """The control: the very same swarm, the third blob a genuine release: nothing is left out."""

    async def main():
        swarm = FakeSwarm(3)
        swarm.register(0, 1, 2)
        for i in range(3):
            swarm.commit(i, blob(DUCHI, genuine(DUCHI, i), i), privacy=DUCHI)
        swarm.members[0].ledger.close_round(1)
        agreement = await swarm.peer(0, shared=swarm_settings(DUCHI))._agreement(1)
        assert await agreement.run() == [T, T, T]
        assert agreement.blobs.left_out == [None, None, None]

    run_virtual(main)


@pytest.mark.parametrize(
    "privacy, forgery, share",
    [(DUCHI, "scaled", "weights"), (DUCHI, "one-moved", "update"), (SAMPLED, "raw", "update")],
    ids=["duchi-scaled-weights", "duchi-one-moved-update", "sampled-raw-update"],
)
def test_three_real_peers_finalize_without_the_impossible_release(privacy, forgery, share):
    """A fourth member commits (with the policy's mechanism and eps, so nothing on chain gives it
    away) a blob its mechanism cannot output; three real peers train, perturb, commit, leave it out
    alike, attest the same (digest, bitmap), and the round finalizes on their three releases."""
    shared = swarm_settings(privacy, share)

    async def main():
        swarm = FakeSwarm(4)
        deploy(swarm, shared)
        swarm.register(3)
        swarm.commit(3, forged_blob(privacy, forgery, 3), privacy=privacy)
        peers = [swarm.peer(i, shared=shared) for i in range(3)]
        outcomes: list[RoundOutcome] = []

        async def one(p: Peer) -> None:
            outcomes.extend(await p.run())

        async with trio.open_nursery() as nursery:
            for p in peers:
                nursery.start_soon(one, p)

        info = swarm.members[0].ledger.round_info(1)
        assert info.state is RoundState.FINALIZED
        commitments = swarm.members[0].ledger.commitments(1)
        flags = [c.peer != swarm.members[3].address for c in commitments]
        assert flags.count(False) == 1
        stores = {m.address: m.store for m in swarm.members}
        kept = [(stores[c.peer].get(c.digest.hex()), c.num_samples) for c, f in zip(commitments, flags) if f]
        assert info.finalized_digest == model_digest(shared, [b for b, _ in kept], [n for _, n in kept])
        assert len(outcomes) == 3
        assert all(o.state == "finalized" and o.included == flags for o in outcomes)

    run_virtual(main)


# Every mechanism that can perturb model values. ("rr" releases categories 0..k-1: its perturb
# refuses real-valued weights and updates, so a swarm of it has no release to check.)
HONEST = [name for name in mechanisms.MECHANISMS if name != "rr"]


@pytest.mark.parametrize("share", ["weights", "update"])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 10.0])
@pytest.mark.parametrize("name", HONEST)
def test_honest_releases_of_every_mechanism_are_never_refused(name, epsilon, share):
    """Three real peers release under the mechanism as a config sets it up (node.derive: clip for
    the [-1, 1] mechanisms, the sampling's base, the Gaussian's clip norm and delta), through the
    peer's own path (training, then perturbation with the OS noise): every peer's agreement keeps
    all three. eps 0.5 runs HM's two-point branch, eps 10 samples k = 4 coordinates."""
    overrides = [f"privacy.mechanism={name}", f"privacy.perturb={share}", f"privacy.epsilon={epsilon}"]
    config = load_config(None, overrides)
    if name == "gaussian" and share == "weights":  # the config refuses it: no such swarm exists
        with pytest.raises(ValueError, match="privacy.perturb = update"):
            mechanism_params(config)
        return
    privacy = PrivacyPolicy(mechanism_params(config))
    shared = swarm_settings(privacy, share)
    mech = mechanisms.from_params(dict(privacy.mechanism))
    checks = not type(mech).release_check.startswith("nothing")

    async def main():
        swarm = FakeSwarm(3)
        swarm.register(0, 1, 2)
        peers = [swarm.peer(i, shared=shared) for i in range(3)]
        for i, p in enumerate(peers):
            vector, num_samples = p._train_and_perturb(1, genesis_vector())
            swarm.commit(i, blob(privacy, vector, i), num_samples=num_samples, privacy=privacy)
            if checks:  # the check has teeth here: one value past the output set is refused
                forged = vector.clone()
                forged[0] = 1000.0
                with pytest.raises(BlobError, match="not a possible output"):
                    release.check_release(forged, mech)
        swarm.members[0].ledger.close_round(1)
        for p in peers:
            agreement = await p._agreement(1)
            assert await agreement.run() == [T, T, T]
            assert agreement.blobs.left_out == [None, None, None]

    run_virtual(main)


def test_read_update_is_read_vector_plus_the_release_check():
    vector = genuine(DUCHI, 0)
    mech = mechanisms.from_params(dict(DUCHI.mechanism))
    assert torch.equal(release.read_update(blob(DUCHI, vector, 0), D, mech), vector)
    forged = blob(DUCHI, vector * 1.01, 0)
    with pytest.raises(release.ReleaseError) as caught:
        release.read_update(forged, D, mech)
    assert isinstance(caught.value, BlobError)  # so every caller leaves it out like a malformed blob
    assert torch.equal(release.read_update(forged, D, None), vector * 1.01)  # no mechanism: nothing to check
    assert release.swarm_mechanism(swarm_settings(DUCHI)) == mech
    assert release.swarm_mechanism(swarm_settings(PrivacyPolicy())) is None
