"""Every rule and every custom error of SwarmLedger, on a real Anvil (automine)."""

from __future__ import annotations

import hashlib
import json

import pytest

from node.chain import client, decoder, errors, records, sender
from node.chain.pipelined import load_pipelined_artifact
from node.chain.records import RoundState
from node.protocol.wire import encode_bitmap

# The same constants as conftest.py (which importlib mode cannot import).
MECHANISM = json.dumps({"name": "pnpm", "epsilon": 1.0}, separators=(",", ":")).encode()
GENESIS = hashlib.sha256(b"genesis model").digest()


def digest(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


AGG = digest("aggregate")
OTHER = digest("other aggregate")


def test_every_custom_error_has_a_python_exception():
    abis = (client.load_artifact()["abi"], load_pipelined_artifact()["abi"])
    names = {item["name"] for abi in abis for item in abi if item["type"] == "error"}
    assert names == set(errors.REFUSALS), names ^ set(errors.REFUSALS)
    assert all(issubclass(cls, errors.LedgerError) for cls in errors.REFUSALS.values())


def test_constructor_rejects_bad_params(automine_chain, kit):
    swarm = kit.Swarm(automine_chain, 1)
    artifact = client.load_artifact()
    factory = swarm.w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
    tx = sender.TransactionSender(swarm.w3, swarm.accounts[0], decoder.RevertDecoder(artifact["abi"]), 30)
    seconds = (60, 60, False)  # commitWindowSeconds, attestWindowSeconds, secureAggregation
    with pytest.raises(errors.InvalidParams, match="minPeers"):
        tx.send(factory.constructor((0, 5, 5, 10, 0, 0, 0, 0, 0, *seconds), GENESIS, []), "deploy")
    with pytest.raises(errors.InvalidParams, match="genesisDigest"):
        tx.send(factory.constructor((1, 5, 5, 10, 0, 0, 0, 0, 0, *seconds), bytes(32), []), "deploy")
    with pytest.raises(errors.InvalidParams, match="epsStepMicro"):  # one release would pass the cap
        tx.send(factory.constructor((1, 5, 5, 10, 0, 11, 0, 0, 0, *seconds), GENESIS, []), "deploy")
    for record_cap, record_delta in ((10, 0), (0, 10**13), (10, 10**18)):  # a record cap needs a delta in (0, 1)
        with pytest.raises(errors.InvalidParams, match="recordDeltaE18"):
            settings = (1, 5, 5, 10, 0, 0, record_cap, record_delta, 0, *seconds)
            tx.send(factory.constructor(settings, GENESIS, []), "deploy")
    for name, wrong_seconds in (("commitWindowSeconds", (0, 60)), ("attestWindowSeconds", (60, 0))):
        with pytest.raises(errors.InvalidParams, match=name):  # blocks alone: a window anyone can stuff
            tx.send(factory.constructor((1, 5, 5, 10, 0, 0, 0, 0, 0, *wrong_seconds, False), GENESIS, []), "deploy")
    base = dict(
        min_peers=1,
        commit_window=1,
        attest_window=1,
        commit_window_seconds=1,
        attest_window_seconds=1,
        eps_cap_micro=1,
        delta=0.0,
        genesis_digest=GENESIS,
    )
    for wrong, match in (
        ({"min_peers": 0}, "min_peers"),
        ({"commit_window_seconds": 0}, "commit_window_seconds"),
        ({"attest_window_seconds": 2**32}, "attest_window_seconds"),
        ({"max_samples": -1}, "max_samples"),
        (
            {"max_samples": 2**32},
            "max_samples",
        ),
    ):  # the client checks before sending
        with pytest.raises(ValueError, match=match):
            client.LedgerClient.deploy(swarm.w3, swarm.accounts[0], **(base | wrong))


def test_registration_rules(make_swarm, kit):
    swarm = make_swarm(4)
    a, b, c, d = swarm.peers
    key_a = kit.identity(0)
    kit.register_signed(a, key_a)
    pid_a = kit.peer_id_of_key(key_a)
    assert swarm.reader.peer_id_of(a.account.address) == pid_a
    assert swarm.reader.address_of_peer_id(pid_a) == a.account.address
    with pytest.raises(errors.AlreadyRegistered):
        a.register(b"peer-a2", b"")
    b.register(pid_a, b"\x01" * 64)  # not unique on chain: a squatter may name it, without a valid signature
    assert swarm.reader.address_of_peer_id(pid_a) == a.account.address  # it still resolves to its key's holder
    with pytest.raises(errors.InvalidPeerId):
        c.register(b"", b"")
    with pytest.raises(errors.InvalidPeerId):
        c.register(b"x" * 129, b"")
    with pytest.raises(errors.InvalidSignature) as long:
        c.register(b"x" * 10, b"s" * 129)
    assert long.value.fields["length"] == 129
    c.register(b"x" * 128, b"s" * 128)
    assert swarm.reader.address_of_peer_id(b"x" * 128) is None  # no key inside: never verifies
    assert [p for p, _ in swarm.reader.registered_peers()] == [a.account.address, b.account.address, c.account.address]
    regs = swarm.reader.registrations()
    assert [r.signature for r in regs[1:]] == [b"\x01" * 64, b"s" * 128]
    assert not swarm.reader.is_registered(d.account.address)


def test_allowlist(make_swarm):
    swarm = make_swarm(4, allowlist=None)
    with pytest.raises(errors.InvalidParams, match="allowlist"):  # an open swarm has no list to manage
        swarm.deployer.allow([swarm.accounts[1].address])
    accounts = swarm.accounts
    swarm = make_swarm(4, allowlist=[accounts[0].address, accounts[1].address], min_peers=1)
    deployer, allowed, late, stranger = swarm.peers
    with pytest.raises(errors.NotAllowed):
        late.register(b"late", b"")
    with pytest.raises(errors.NotDeployer):
        allowed.allow([late.account.address])
    deployer.allow([late.account.address])
    late.register(b"late", b"")
    allowed.register(b"allowed", b"")
    with pytest.raises(errors.NotDeployer):
        stranger.disallow(allowed.account.address)
    deployer.disallow(late.account.address)
    with pytest.raises(errors.NotAllowed):  # removed from the list: can no longer commit
        late.commit(1, digest("x"), 10, 1, MECHANISM)
    allowed.commit(1, digest("y"), 10, 1, MECHANISM)


def test_commit_rules(make_swarm):
    swarm = make_swarm(3, eps_cap_micro=2_000_000)
    a, b, c = swarm.peers
    with pytest.raises(errors.NotRegistered):
        a.commit(1, digest("a"), 10, 1, MECHANISM)
    swarm.register(2)
    with pytest.raises(errors.WrongRound):
        a.commit(2, digest("a"), 10, 1, MECHANISM)
    with pytest.raises(errors.InvalidDigest):
        a.commit(1, bytes(32), 10, 1, MECHANISM)
    with pytest.raises(errors.InvalidNumSamples):
        a.commit(1, digest("a"), 0, 1, MECHANISM)
    with pytest.raises(errors.EpsOverCap) as over:  # the cap
        a.commit(1, digest("a"), 10, 2_000_001, MECHANISM)
    assert over.value.fields == {"givenMicro": 2_000_001, "capMicro": 2_000_000}
    a.commit(1, digest("a"), 10, 2_000_000, MECHANISM)  # exactly the cap is allowed
    with pytest.raises(errors.AlreadyCommitted):
        a.commit(1, digest("a2"), 10, 2_000_000, MECHANISM)
    b.commit(1, digest("b"), 20, 1_500_000, MECHANISM)
    assert swarm.reader.eps_spent(a.account.address) == 2_000_000
    swarm.pass_commit_window(1)
    c.register(b"peer-c", b"")
    with pytest.raises(errors.CommitWindowClosed):  # window over and quorum reached, not yet closed
        c.commit(1, digest("c"), 10, 1, MECHANISM)
    a.close_round(1)
    with pytest.raises(errors.CommitWindowClosed):
        c.commit(1, digest("c"), 10, 1, MECHANISM)
    # Round 2: eps may not decrease, and the cap binds the cumulative value.
    b.attest(1, AGG, encode_bitmap([True, True]))
    a.attest(1, AGG, encode_bitmap([True, True]))
    assert swarm.reader.current_round() == 2
    with pytest.raises(errors.EpsDecreasing) as dec:
        b.commit(2, digest("b2"), 20, 1_400_000, MECHANISM)
    assert dec.value.fields == {"previousMicro": 1_500_000, "givenMicro": 1_400_000}
    with pytest.raises(errors.EpsOverCap):
        a.commit(2, digest("a2"), 10, 2_000_001, MECHANISM)
    b.commit(2, digest("b2"), 20, 1_500_000, MECHANISM)  # equal is not decreasing


def test_policy_rules(make_swarm):
    """A local mechanism spends a constant step: each commit records exactly previous + step.
    The record-level eps may not decrease nor pass its own cap, and is 0 without DP-SGD."""
    swarm = make_swarm(3, eps_cap_micro=3_000, eps_step_micro=1_000, record_eps_cap_micro=5_000_000, record_delta=1e-5)
    a, b, c = swarm.peers
    swarm.register(3)
    params = swarm.reader.params()
    assert (params.eps_step_micro, params.record_eps_cap_micro, params.record_delta) == (1_000, 5_000_000, 1e-5)
    for wrong in (0, 999, 1_001, 2_000):  # less, more, or a fresh address claiming to start at 0
        with pytest.raises(errors.EpsNotPolicy) as refused:
            a.commit(1, digest("a"), 10, wrong, MECHANISM, 1)
        assert refused.value.fields == {"expectedMicro": 1_000, "givenMicro": wrong}
    with pytest.raises(errors.RecordEpsOverCap) as over:
        a.commit(1, digest("a"), 10, 1_000, MECHANISM, 5_000_001)
    assert over.value.fields == {"givenMicro": 5_000_001, "capMicro": 5_000_000}
    a.commit(1, digest("a"), 10, 1_000, MECHANISM, 2_000_000)
    b.commit(1, digest("b"), 10, 1_000, MECHANISM, 2_000_000)
    c.commit(1, digest("c"), 10, 1_000, MECHANISM, 2_000_000)
    assert swarm.reader.record_eps_spent(a.account.address) == 2_000_000
    assert [x.record_eps_micro for x in swarm.reader.commitments(1)] == [2_000_000] * 3
    a.close_round(1)  # every registered peer committed
    for peer in (a, b):
        peer.attest(1, AGG, encode_bitmap([True, True, True]))
    with pytest.raises(errors.EpsNotPolicy):  # the same eps again: the round's release is not free
        a.commit(2, digest("a2"), 10, 1_000, MECHANISM, 3_000_000)
    with pytest.raises(errors.RecordEpsDecreasing) as dec:
        a.commit(2, digest("a2"), 10, 2_000, MECHANISM, 1_999_999)
    assert dec.value.fields == {"previousMicro": 2_000_000, "givenMicro": 1_999_999}
    a.commit(2, digest("a2"), 10, 2_000, MECHANISM, 3_000_000)
    history = swarm.reader.commit_history(a.account.address)
    assert [(h.round, h.eps_micro, h.record_eps_micro) for h in history] == [
        (1, 1_000, 2_000_000),
        (2, 2_000, 3_000_000),
    ]
    # without DP-SGD in the policy (record cap 0), any record-level eps is refused
    plain = make_swarm(2, eps_cap_micro=3_000, eps_step_micro=1_000)
    plain.register(1)
    with pytest.raises(errors.RecordEpsOverCap):
        plain.peers[0].commit(1, digest("p"), 10, 1_000, MECHANISM, 1)


def test_quorum_not_met_extends_the_window(make_swarm):
    swarm = make_swarm(3, min_peers=3, commit_window=5)
    swarm.register(3)
    a, b, c = swarm.peers
    with pytest.raises(errors.CommitWindowOpen):
        a.close_round(1)
    a.commit(1, digest("a"), 10, 1, MECHANISM)
    b.commit(1, digest("b"), 10, 1, MECHANISM)
    swarm.pass_commit_window(1)
    with pytest.raises(errors.QuorumNotMet) as quorum:
        a.close_round(1)
    assert quorum.value.fields == {"round": 1, "committed": 2, "minPeers": 3}
    swarm.anvil.mine(10)
    c.commit(1, digest("c"), 10, 1, MECHANISM)  # long after the nominal window: it extended
    c.close_round(1)
    info = swarm.reader.round_info(1)
    assert (info.state, info.participant_count) == (RoundState.CLOSED, 3)
    with pytest.raises(errors.RoundNotOpen):
        a.close_round(1)
    with pytest.raises(errors.WrongRound):
        a.close_round(2)


def _closed_round(make_swarm, n: int, **params):
    swarm = make_swarm(n, min_peers=n, **params)
    swarm.register(n)
    swarm.commit_all(1, n)
    swarm.pass_commit_window(1)
    swarm.peers[0].close_round(1)
    return swarm


def test_attestation_rules(make_swarm):
    swarm = make_swarm(4, min_peers=3)
    swarm.register(4)
    a, b, c, outsider = swarm.peers
    swarm.commit_all(1, 3)
    with pytest.raises(errors.RoundNotClosed):
        a.attest(1, AGG, encode_bitmap([True] * 3))
    swarm.pass_commit_window(1)
    a.close_round(1)
    with pytest.raises(errors.NotParticipant):
        outsider.attest(1, AGG, encode_bitmap([True] * 3))
    with pytest.raises(errors.WrongRound):
        a.attest(2, AGG, encode_bitmap([True] * 3))
    with pytest.raises(errors.MalformedBitmap):  # 3 participants: one byte, not two
        a.attest(1, AGG, b"\x07\x00")
    with pytest.raises(errors.MalformedBitmap):  # bit 3 set: no participant 3
        a.attest(1, AGG, b"\x0f")
    with pytest.raises(errors.InvalidDigest):
        a.attest(1, bytes(32), b"\x07")
    a.attest(1, AGG, b"\x07")
    with pytest.raises(errors.AlreadyAttested):
        a.attest(1, AGG, b"\x07")


def test_minority_does_not_finalize_majority_does_and_bitmaps_do_not_mix(make_swarm):
    swarm = _closed_round(make_swarm, 5)
    p = swarm.peers
    all_in = encode_bitmap([True] * 5)
    without_last = encode_bitmap([True] * 4 + [False])
    p[0].attest(1, AGG, all_in)
    p[1].attest(1, AGG, without_last)  # same digest, other bitmap: a separate vote
    p[2].attest(1, OTHER, all_in)
    p[3].attest(1, AGG, without_last)
    assert swarm.reader.votes_for(1, AGG, all_in) == 1
    assert swarm.reader.votes_for(1, AGG, without_last) == 2
    # 3 of 5 attested AGG, but not on one bitmap: no strict majority, still closed.
    assert swarm.reader.round_info(1).state is RoundState.CLOSED
    assert swarm.reader.finalized_digest(1) is None
    p[4].attest(1, AGG, without_last)  # 3 of 5 on (AGG, without_last): majority
    info = swarm.reader.round_info(1)
    assert info.state is RoundState.FINALIZED and info.finalized_digest == AGG
    assert swarm.reader.finalized_digest(1) == AGG
    assert swarm.reader.last_finalized() == (1, AGG)
    assert swarm.reader.current_round() == 2
    assert swarm.reader.round_info(2).opened_block == info.ended_block
    dissent = [(a.peer, a.aggregate_digest, a.included) for a in swarm.reader.attestations(1)]
    assert dissent[2] == (p[2].account.address, OTHER, all_in)
    with pytest.raises(errors.RoundNotClosed):  # late attestation of a finalized round
        p[2].attest(1, OTHER, without_last)


def test_even_split_is_not_a_majority(make_swarm):
    swarm = _closed_round(make_swarm, 4)
    p = swarm.peers
    p[0].attest(1, AGG, b"\x0f")
    p[1].attest(1, AGG, b"\x0f")  # 2 of 4 is not a strict majority
    assert swarm.reader.round_info(1).state is RoundState.CLOSED
    p[2].attest(1, AGG, b"\x0f")
    assert swarm.reader.round_info(1).state is RoundState.FINALIZED


def test_abort_after_window_opens_next_round_from_last_finalized(make_swarm):
    swarm = _closed_round(make_swarm, 3, attest_window=6)
    p = swarm.peers
    p[0].attest(1, AGG, b"\x07")  # one of three: participants stop attesting
    with pytest.raises(errors.AbortTooEarly) as early:
        p[1].abort_round(1)
    info = swarm.reader.round_info(1)
    assert early.value.fields["lastBlock"] == info.closed_block + 6
    assert early.value.fields["endsAt"] == info.closed_at + swarm.params["attest_window_seconds"]
    swarm.pass_attest_window(1)
    p[1].abort_round(1)
    info = swarm.reader.round_info(1)
    assert info.state is RoundState.ABORTED and info.finalized_digest is None
    assert swarm.reader.current_round() == 2
    assert swarm.reader.last_finalized() == (0, GENESIS)  # round 2 starts from genesis
    assert swarm.reader.eps_spent(p[2].account.address) == 1_000_000  # eps stays spent
    with pytest.raises(errors.RoundNotClosed):
        p[1].abort_round(1)  # already aborted
    with pytest.raises(errors.RoundNotClosed):
        p[1].abort_round(2)  # open, not closed
    with pytest.raises(errors.WrongRound):
        p[1].abort_round(3)
    # Round 2 finalizes; it cannot be aborted afterwards.
    swarm.commit_all(2, 3, eps_micro=2_000_000)
    swarm.pass_commit_window(2)
    p[0].close_round(2)
    p[0].attest(2, AGG, b"\x07")
    p[1].attest(2, AGG, b"\x07")
    with pytest.raises(errors.RoundAlreadyFinalized):
        p[2].abort_round(2)
    assert swarm.reader.last_finalized() == (2, AGG)
    assert [c.peer for c in swarm.reader.commitments(1)] == [x.account.address for x in p]


def test_read_only_client_cannot_send(make_swarm):
    swarm = make_swarm(1)
    with pytest.raises(errors.LedgerError, match="read-only"):
        swarm.reader.register(b"me", b"")


def test_round_closes_early_once_every_registered_peer_committed(make_swarm):
    swarm = make_swarm(3, min_peers=2, commit_window=50)
    swarm.register(3)
    a, b, c = swarm.peers
    assert a.registered_count() == 3
    a.commit(1, digest("a"), 10, 1, MECHANISM)
    b.commit(1, digest("b"), 10, 1, MECHANISM)
    with pytest.raises(errors.CommitWindowOpen):  # quorum met, but c may still commit
        a.close_round(1)
    c.commit(1, digest("c"), 10, 1, MECHANISM)
    a.close_round(1)  # nobody left to wait for
    assert a.round_info(1).state is records.RoundState.CLOSED


def test_duplicate_digest_is_refused_within_a_round(make_swarm):
    swarm = make_swarm(3, min_peers=2)
    swarm.register(3)
    a, b, c = swarm.peers
    a.commit(1, digest("a"), 10, 1, MECHANISM)
    with pytest.raises(errors.DuplicateDigest) as copied:  # b republishes a's update as its own
        b.commit(1, digest("a"), 10, 1, MECHANISM)
    assert copied.value.fields == {"round": 1, "digest": digest("a").hex()}
    b.commit(1, digest("b"), 10, 1, MECHANISM)
    c.commit(1, digest("c"), 10, 1, MECHANISM)
    assert [x.digest for x in swarm.reader.commitments(1)] == [digest("a"), digest("b"), digest("c")]
    assert swarm.reader.participants(1) == [p.account.address for p in swarm.peers]
    assert swarm.reader.commitment_of(1, b.account.address).digest == digest("b")
    with pytest.raises(errors.NotParticipant):
        swarm.reader.commitment_of(1, "0x" + "11" * 20)


def test_num_samples_is_capped_by_the_deployment(make_swarm):
    swarm = make_swarm(2, max_samples=1_000)
    swarm.register(2)
    a, b = swarm.peers
    assert swarm.reader.params().max_samples == 1_000
    with pytest.raises(errors.NumSamplesOverCap) as over:
        a.commit(1, digest("a"), 1_001, 1, MECHANISM)
    assert over.value.fields == {"numSamples": 1_001, "maxSamples": 1_000}
    with pytest.raises(errors.InvalidNumSamples):
        a.commit(1, digest("a"), 0, 1, MECHANISM)
    a.commit(1, digest("a"), 1_000, 1, MECHANISM)  # exactly the cap is allowed
    # 0 at deployment (the default) means the field's limit, 2^32 - 1
    plain = make_swarm(1)
    plain.register(1)
    assert plain.reader.params().max_samples == 2**32 - 1
    with pytest.raises(errors.NumSamplesOverCap):
        plain.peers[0].commit(1, digest("p"), 2**32, 1, MECHANISM)
    plain.peers[0].commit(1, digest("p"), 2**32 - 1, 1, MECHANISM)


def test_disallowed_peer_is_not_awaited_and_allow_restores_it(make_swarm):
    """Early close waits only for peers that can still commit: a removed peer neither counts as
    registered nor (if it committed in the live round) as committed; `allow` restores both."""
    probe = make_swarm(4)
    members = [acc.address for acc in probe.accounts]
    swarm = make_swarm(4, allowlist=members, min_peers=2, commit_window=200)
    a, b, c, d = swarm.peers
    swarm.register(4)
    assert a.registered_count() == 4
    a.disallow(d.account.address)
    assert a.registered_count() == 3
    with pytest.raises(errors.NotAllowed):
        d.commit(1, digest("d"), 10, 1, MECHANISM)
    a.commit(1, digest("a"), 10, 1, MECHANISM)
    b.commit(1, digest("b"), 10, 1, MECHANISM)
    a.disallow(b.account.address)  # b committed, then was removed: it is not counted either way
    assert a.registered_count() == 2
    with pytest.raises(errors.CommitWindowOpen):  # a of {a, c} committed: c is awaited
        a.close_round(1)
    a.allow([b.account.address, d.account.address])  # both restored: b's commit counts, d is awaited
    assert a.registered_count() == 4
    c.commit(1, digest("c"), 10, 1, MECHANISM)
    with pytest.raises(errors.CommitWindowOpen):  # a, b, c of 4: d is awaited again
        a.close_round(1)
    a.disallow(d.account.address)
    a.close_round(1)  # a, b, c committed; nobody else can: closes before the window ends
    info = swarm.reader.round_info(1)
    assert info.state is RoundState.CLOSED and info.participant_count == 3
    assert info.closed_block <= info.opened_block + 200
    a.disallow(b.account.address)
    with pytest.raises(errors.NotAllowed):  # a removed participant no longer votes
        b.attest(1, AGG, b"\x07")
    a.attest(1, AGG, b"\x07")
    c.attest(1, AGG, b"\x07")  # 2 of 3 participants
    assert swarm.reader.round_info(1).state is RoundState.FINALIZED
