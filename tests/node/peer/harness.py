"""A swarm of fakes for the round tests: real `Peer`s (tiny logreg model, real wire blobs, real
aggregation) on a FakeChain and a FakeNetwork, in trio's virtual time.

Everything runs in one trio loop under `MockClock(autojump_threshold=0)`: the clock jumps to the
next deadline as soon as every task waits, so a 10 s fetch timeout costs no wall time and event
orders are set by the times the tests choose. The peers' blocking calls run inline (`inline`)
instead of in worker threads, so no wait escapes the mock clock.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import trio
import trio.testing

from node.learning.models import init_model
from node.peer.peer import Peer
from node.protocol import aggregate, wire
from node.protocol.blob import flatten, sha256
from node.protocol.policy import expected_micro
from node.protocol.settings import PeerSettings, PrivacyPolicy, SharedSettings
from p2p.store import MemoryBlobStore
from tests.node.peer.fakes import FakeChain, FakeHost, FakeLedger, FakeNetwork

SHARED = SharedSettings(
    model="logreg",
    dataset="breast-cancer",
    input_shape=(30,),
    num_classes=2,
    share="weights",
    aggregation="fedavg",
    trim_ratio=0.1,
    krum_f=1,
    seed=0,
    privacy=PrivacyPolicy({"name": "pnpm", "epsilon": 1.0}),
)
MECHANISM = dict(SHARED.privacy.mechanism)
FETCH_TIMEOUT = 10.0  # seconds of trio time


def settings(**overrides: Any) -> PeerSettings:
    base: dict[str, Any] = dict(
        shared=SHARED,
        epochs=1,
        batch_size=16,
        lr=0.1,
        lr_decay=1.0,
        momentum=0.0,
        rounds=1,
        fetch_timeout=FETCH_TIMEOUT,
        poll_interval=0.1,
        chain_timeout=600.0,
        linger=0.0,
        linger_max=0.0,
    )
    return PeerSettings(**(base | overrides))


def genesis_vector() -> torch.Tensor:
    return _genesis_vector().clone()


@functools.cache
def _genesis_vector() -> torch.Tensor:
    model = init_model(SHARED.model, input_shape=SHARED.input_shape, num_classes=SHARED.num_classes, seed=SHARED.seed)
    return flatten(model)[0]


def genesis_digest() -> bytes:
    return sha256(wire.genesis_blob(genesis_vector(), SHARED.to_dict()))


def tiny_data(seed: int, n: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """A linearly separable toy set of `SHARED`'s shape."""
    x = torch.randn(n, *SHARED.input_shape, generator=torch.Generator().manual_seed(seed))
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).long()


def update_vector(seed: int) -> torch.Tensor:
    noise = torch.randn(genesis_vector().numel(), generator=torch.Generator().manual_seed(1000 + seed))
    return (genesis_vector() + 0.05 * noise).to(torch.float32)


def member_address(i: int) -> str:
    """The account of a FakeSwarm's member i."""
    return f"0x{0xA11CE0 + i:040x}"


def update_blob(seed: int, r: int = 1, committer: str | None = None) -> bytes:
    """A real update blob, as member `seed` (or `committer`) would publish it in round r after
    training and perturbing."""
    return wire.update_blob(update_vector(seed), r, wire.canonical(MECHANISM), committer or member_address(seed))


def model_digest(r: int, previous: torch.Tensor, blobs: list[bytes], samples: list[int]) -> bytes:
    """What an honest peer attests for these blobs (in ledger order): sha256 of the model blob."""
    vectors = [wire.read_vector(b, previous.numel(), kind="update")[0] for b in blobs]
    return sha256(wire.model_blob(aggregate.next_global(SHARED, previous, vectors, samples), r))


async def inline(fn: Callable[[], Any]) -> Any:
    """The peers' `run_sync`: the call runs in the loop, after a checkpoint (as a thread hop has)."""
    await trio.lowlevel.checkpoint()
    return fn()


def run_virtual(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """trio.run under a mock clock that jumps whenever every task waits."""
    return trio.run(fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


@dataclass
class Member:
    """One registered account of the swarm: its ledger client, host and store."""

    index: int
    address: str
    ledger: FakeLedger
    host: FakeHost
    store: MemoryBlobStore

    @property
    def peer_id(self) -> str:
        return self.host.peer_id


@dataclass
class PhaseLog:
    """A Peer's on_status, recording (trio time, phase) so tests can time the phases."""

    entries: list[tuple[float, str]] = field(default_factory=list)

    def __call__(self, status: dict[str, Any]) -> None:
        self.entries.append((trio.current_time(), status["phase"]))

    def started(self, phase: str) -> float:
        return next(t for t, p in self.entries if p == phase)

    def duration(self, phase: str) -> float:
        """Trio seconds from entering `phase` to the next phase change."""
        for (t, p), (t_next, _) in zip(self.entries, self.entries[1:]):
            if p == phase:
                return t_next - t
        raise AssertionError(f"phase {phase} never ended: {self.entries}")


class FakeSwarm:
    """n accounts on one FakeChain and one FakeNetwork. Create it inside `run_virtual`."""

    def __init__(self, n: int, *, min_peers: int | None = None, **chain_options: Any) -> None:
        self.chain = FakeChain(genesis_digest=genesis_digest(), min_peers=min_peers or n, **chain_options)
        self.network = FakeNetwork()
        self.members = []
        for i in range(n):
            address = member_address(i)
            store = MemoryBlobStore()
            self.members.append(
                Member(i, address, FakeLedger(self.chain, address), self.network.join(b"peer-%d" % i, store), store)
            )

    def register(self, *indices: int) -> None:
        for i in indices:
            self.members[i].ledger.register(self.members[i].host.peer_id_bytes)

    def commit(
        self,
        i: int,
        data: bytes,
        *,
        r: int = 1,
        num_samples: int | None = None,
        privacy: PrivacyPolicy = SHARED.privacy,
    ) -> str:
        """Member i publishes `data` (into its own store only) and commits its digest, recording
        what `privacy` (the swarm's policy: SHARED's unless a test deploys another) spends."""
        member = self.members[i]
        digest = member.store.put(data)
        num_samples = num_samples or samples_of(i)
        counts = [c.num_samples for c in member.ledger.commit_history(member.address)] + [num_samples]
        eps, record = expected_micro(privacy, genesis_vector().numel(), counts)  # what the policy spends
        mechanism = wire.canonical(dict(privacy.mechanism)).encode()
        member.ledger.commit(r, bytes.fromhex(digest), num_samples, eps, mechanism, record)
        return digest

    def peer(self, i: int, *, on_status: PhaseLog | None = None, **overrides: Any) -> Peer:
        """A real Peer for member i, wired to the fakes."""
        member = self.members[i]
        return Peer(
            settings(**overrides),
            ledger=member.ledger,
            host=member.host,
            store=member.store,
            train_xy=tiny_data(i),
            test_xy=tiny_data(100),
            on_status=on_status,
            run_sync=inline,
        )

    async def attest_at(self, t: float, i: int, digest: bytes, flags: list[bool], *, r: int = 1) -> None:
        """Member i attests (digest, flags) at trio time t (a scripted peer)."""
        await trio.sleep_until(t)
        self.members[i].ledger.attest_flags(r, digest, flags)


def samples_of(i: int) -> int:
    """The num_samples a scripted member commits with (unequal, so fedavg weights matter)."""
    return 100 + 10 * i


def closed_round(n: int, blobs: list[bytes] | None = None) -> tuple[FakeSwarm, list[bytes], list[str]]:
    """n registered members, each committed blobs[i] (held in its own store only); round 1 closed."""
    swarm = FakeSwarm(n)
    swarm.register(*range(n))
    blobs = blobs or [update_blob(i) for i in range(n)]
    digests = [swarm.commit(i, data) for i, data in enumerate(blobs)]
    swarm.members[0].ledger.close_round(1)
    return swarm, blobs, digests


def digest_of(blobs: list[bytes], flags: list[bool]) -> bytes:
    """The model digest of round 1 over the flagged blobs of scripted members (samples_of weights)."""
    chosen = [i for i, f in enumerate(flags) if f]
    return model_digest(1, genesis_vector(), [blobs[i] for i in chosen], [samples_of(i) for i in chosen])
