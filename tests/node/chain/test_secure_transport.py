"""Secure-aggregation rounds played by members with real libp2p hosts on 127.0.0.1 over a real
Anvil that builds a block every second (node.peer.secure): every frame published and fetched as
blobs, every digest posted in its step's window. One member posting its KEYS digest and dying
before it served the frame: out of U1 for everyone, the round goes on without it. One member
committing its MASKED digest and then serving nobody the frame (nor doing anything after), one
dealer sealing garbage to two holders and withholding its REVEAL (it masks and commits anyway),
one complaining against honest dealers. The acknowledgments on chain leave the withheld frame out
of U3 for everyone, the complaints on chain the bad dealer out of U2; every other member gets the
sum of the survivors' inputs and names the bad dealer and the false complainer; `swarm verify`'s
check agrees from the members' stores and the chain alone. (A wrong share is named over the chain
in test_secure_steps.py: with two members revealing nothing here, t = 4 revealers are all there
are, and one wrong share would leave its dealer's secret short.)"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from libp2p.crypto.ed25519 import create_new_key_pair

from mechanisms.secagg.member import sum_residues
from mechanisms.secagg.round import start_session
from node.chain.errors import LedgerError
from node.chain.records import RoundState
from node.chain.secure_steps import agreed, chain_complaints, chain_steps, round_members, round_session
from node.peer.secure import SecureMember, SecureSettings
from node.protocol.secure_windows import Step
from node.verify import ArchiveStores, verify_secure_round
from p2p.host import HostConfig, open_host
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio
N, BITS, DIM = 6, 32, 300  # t = 4
WITHHOLDER, BAD_SEAL, FALSE_COMPLAINER = 5, 2, 3


async def given(residues):
    """A member's residues, ready at once (what `SecureMember.play` awaits when it masks)."""
    return residues


@pytest.fixture
def anyio_backend():
    return "trio"


async def off(fn, *args, **kwargs):
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def host_config(i: int) -> HostConfig:
    seed = hashlib.sha256(b"libp2p key %d" % i).digest()  # the conftest's identity(i): the registered key
    return HostConfig(
        key_pair=create_new_key_pair(seed),
        topic="secure-test",
        connect_timeout=15.0,  # a loaded machine: setting up six hosts at once
        reconnect_interval=0.3,
        hello_interval=1.0,
        gossip_heartbeat=0.3,
        announce_delay=0.0,
        announce_max_delay=0.0,
    )


async def play_over_libp2p(testnet_chain, kit, n: int, faults: dict[int, str], windows: dict, dies_after_keys=()):
    """n members with real libp2p hosts play round 1 (`faults`: member -> its `--fault`); the
    members in `dies_after_keys` post their KEYS frame's digest and close their host at once,
    before anyone could fetch the frame. The swarm, each member's outcome, the stores, the inputs."""
    rng = np.random.default_rng(3)
    inputs = {i: rng.integers(0, 2**BITS, DIM, dtype=np.int64) for i in range(n)}
    stores = [MemoryBlobStore() for _ in range(n)]
    outcomes: dict[int, object] = {}
    deployed: list = []  # the swarm, once the hosts are up: round 1's KEYS window starts at deployment
    everyone_done = trio.Event()

    def head() -> tuple[int, int]:
        block = deployed[0].w3.eth.get_block("latest")
        return block["number"], block["timestamp"]

    async def member(i: int, ready: trio.Event, bootstrap: list[str], task_status=trio.TASK_STATUS_IGNORED):
        async with open_host(host_config(i), stores[i]) as host:
            for addr in bootstrap:
                await host.connect(addr)
            task_status.started(host.addrs[0])
            await ready.wait()
            swarm = deployed[0]
            key = Ed25519PrivateKey.from_private_bytes(kit.identity(i).to_bytes())
            if i in dies_after_keys:  # its KEYS digest on chain, the frame never served: the host goes
                session = await off(round_session, swarm.peers[i], 1)
                _, frame = start_session(session, i, key, members=n)
                await off(swarm.peers[i].post_frame, 1, Step.KEYS, hashlib.sha256(frame).digest())
                outcomes[i] = None
                return
            settings = SecureSettings(BITS, DIM, counted_members=1, fetch_timeout=20.0, fault=faults.get(i))
            secure = SecureMember(swarm.peers[i], host, stores[i], key, settings, call=off, head=head)

            async def commit(digest: bytes) -> None:
                await off(swarm.peers[i].commit, 1, digest, 10, 1_000_000, kit.MECHANISM)

            outcomes[i] = await secure.play(1, functools.partial(given, inputs[i]), commit)
            if len(outcomes) == n:
                everyone_done.set()
            await everyone_done.wait()  # keep serving this member's blobs until every other member has them

    async def close_when_due() -> None:  # until closed, or every member done (members that sat out never commit)
        while not everyone_done.is_set() and (await off(deployed[0].reader.round_info, 1)).state is RoundState.OPEN:
            try:
                await off(deployed[0].peers[0].close_round, 1)
            except LedgerError:  # CommitWindowOpen until the window has passed
                await trio.sleep(0.5)

    with trio.fail_after(600):  # the windows take 150 s of blocks at most; the rest is a loaded machine's slack
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            addrs = [await nursery.start(member, 0, ready, [])]
            for i in range(1, n):
                addrs.append(await nursery.start(member, i, ready, list(addrs)))
            swarm = await off(kit.Swarm, testnet_chain, n, secure_aggregation=True, **windows)
            deployed.append(swarm)
            # inside round 1's KEYS window (an eighth of the commit window)
            async with trio.open_nursery() as registering:
                for i in range(n):
                    registering.start_soon(off, kit.register_signed, swarm.peers[i], kit.identity(i))
            ready.set()
            nursery.start_soon(close_when_due)
    return swarm, outcomes, stores, inputs


async def test_a_member_that_posts_its_keys_digest_then_dies_is_left_out_of_u1(testnet_chain, kit):
    """Member 3 of four posts its KEYS frame's digest and dies before anyone fetched the frame:
    nobody acknowledges it, so it is in no U1, and the three others (t = 3) deal, mask and
    unmask without it; `swarm verify` agrees, with nothing named."""
    n = 4
    windows = dict(min_peers=3, commit_window=96, commit_window_seconds=96, attest_window=64, attest_window_seconds=64)
    swarm, outcomes, stores, inputs = await play_over_libp2p(testnet_chain, kit, n, {}, windows, dies_after_keys={3})
    members = round_members(swarm.reader, 1)
    index = {i: members.index_of(swarm.accounts[i].address) for i in range(n)}  # registrations raced
    steps = chain_steps(swarm.reader, 1, members)
    assert index[3] in steps.digests[Step.KEYS] and index[3] not in agreed(steps, Step.KEYS, 3)
    expected = sum_residues([inputs[i] for i in range(3)], BITS)
    for i in range(3):
        out = outcomes[i]
        assert out.result is not None, (i, out.sat_out)
        np.testing.assert_array_equal(out.result.total, expected)
        assert out.result.survivors == tuple(sorted(index[j] for j in range(3)))
    check = verify_secure_round(swarm.reader, 1, ArchiveStores(stores), bits=BITS, dim=DIM, counted_members=1)
    assert check.failure is None, check.failure
    np.testing.assert_array_equal(check.total, expected)
    assert check.faults == {}


async def test_a_secure_round_over_libp2p_and_the_chain(testnet_chain, kit):
    # every member commits, so the round closes early, once the last commit is in; the attestation
    # window's first quarter is the MASKED acknowledgments' window, its second the REVEAL window
    # (256 blocks: round 1's KEYS window, an eighth, must hold six hosts coming up on a loaded CI machine;
    # with 192 one CI run's withholder missed it)
    windows = dict(
        min_peers=N - 1, commit_window=256, commit_window_seconds=256, attest_window=120, attest_window_seconds=120
    )
    faults = {
        BAD_SEAL: "secagg-bad-seal",
        FALSE_COMPLAINER: "secagg-false-complaint",
        WITHHOLDER: "secagg-withhold-masked",
    }
    swarm, outcomes, stores, inputs = await play_over_libp2p(testnet_chain, kit, N, faults, windows)
    members = round_members(swarm.reader, 1)
    index = {i: members.index_of(swarm.accounts[i].address) for i in range(N)}  # registrations raced
    survivors = [i for i in range(N) if i not in (WITHHOLDER, BAD_SEAL)]
    expected = sum_residues([inputs[i] for i in survivors], BITS)
    assert "withholding our MASKED" in (outcomes[WITHHOLDER].sat_out or "")
    assert "withholding our REVEAL" in (outcomes[BAD_SEAL].sat_out or "")
    steps = chain_steps(swarm.reader, 1, members)
    masked = steps.digests[Step.MASKED]
    assert index[WITHHOLDER] in masked and not any(s.has(masked[index[WITHHOLDER]].hex()) for s in stores)
    assert index[BAD_SEAL] in masked and index[BAD_SEAL] not in agreed(steps, Step.MASKED, 4)  # masked anyway
    complaints = chain_complaints(swarm.reader, 1, members, at=swarm.reader.block_number())
    assert index[BAD_SEAL] not in complaints and index[FALSE_COMPLAINER] in complaints
    for i in survivors:
        out = outcomes[i]
        assert out.result is not None, (i, out.sat_out)
        np.testing.assert_array_equal(out.result.total, expected)
        assert out.result.survivors == tuple(sorted(index[j] for j in survivors))
        assert "do not decrypt" in out.faults[index[BAD_SEAL]] and "holds" in out.faults[index[BAD_SEAL]]
        assert "complained against member" in out.faults[index[FALSE_COMPLAINER]]

    check = verify_secure_round(swarm.reader, 1, ArchiveStores(stores), bits=BITS, dim=DIM, counted_members=1)
    assert check.failure is None, check.failure
    np.testing.assert_array_equal(check.total, expected)
    named = {swarm.accounts[i].address: i for i in (BAD_SEAL, FALSE_COMPLAINER)}
    assert set(check.faults) == set(named)
    assert "holds" in check.faults[swarm.accounts[BAD_SEAL].address]  # out of U2: no secret of it needed
    assert "complained against member" in check.faults[swarm.accounts[FALSE_COMPLAINER].address]
    # the withholder committed and served nobody its frame: in no U3, its mask key rebuilt
    assert set(check.dropped) == {swarm.accounts[WITHHOLDER].address}
