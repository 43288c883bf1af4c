"""Catching up: how a peer comes to hold a finalized model it did not compute itself (it just
started, followed the round, or its own aggregate lost): rebuilt from the round's blobs when it
holds them all, else fetched from the peers that hold it (around those that lie or say nothing:
node/peer/fetching.py), and always checked against the finalized digest on chain.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import torch
import trio

from node.chain.records import Commitment, RoundInfo
from node.peer.fetching import REQUEST_SHARE, BlobUnavailable, Holders, Obtain, fetch_from_holders, shuffled
from node.peer.ports import HostPort, LedgerPort, OffLoop, StorePort
from node.protocol import aggregate, wire
from node.protocol.blob import sha256
from node.protocol.settings import PeerSettings
from node.protocol.wire import decode_bitmap
from p2p import peer_id_from_bytes

log = logging.getLogger("swarm.peer")

# A model fetch asks holders for up to this many fetch_timeouts; a silent holder costs REQUEST_SHARE
# of one (node/peer/fetching.py), a sixth of the deadline.
FETCH_DEADLINE = 3.0


class ModelUnavailable(RuntimeError):
    """No holder served a finalized model before the fetch's deadline."""


class CatchUp:
    """The finalized models of a swarm, for the peer `address`."""

    def __init__(
        self,
        *,
        ledger: LedgerPort,
        host: HostPort,
        store: StorePort,
        address: str,
        call: OffLoop,
        obtain: Obtain,
        update_reader: Callable[[list[Commitment]], Awaitable[Callable[[bytes], torch.Tensor]]],
        settings: PeerSettings,
        genesis_vector: torch.Tensor,
        order: Callable[[list[str]], list[str]] = shuffled,
    ) -> None:
        self.ledger = ledger
        self.host = host
        self.store = store
        self.address = address
        self._call = call  # the peer's `chain`: ledger reads, and the aggregation of a rebuild
        self._obtain = obtain
        # what decodes a round's update blobs, checked as the agreement step checks them
        self._update_reader = update_reader
        self.shared = settings.shared
        self.genesis_vector = genesis_vector
        self.num_params = genesis_vector.numel()
        self.fetch_timeout = settings.fetch_timeout
        self._order = order  # of the holders asked (random; a test pins it)

    async def latest_global(self) -> torch.Tensor:
        """The model of the last finalized round (genesis if none): from our store, else from
        any peer, checked against the finalized digest on chain."""
        last, _ = await self._call(self.ledger.last_finalized)
        return await self.fetch_model(last) if last > 0 else self.genesis_vector.clone()

    async def finalized_digest(self, r: int) -> bytes:
        digest = await self._call(self.ledger.finalized_digest, r)
        if digest is None:
            raise RuntimeError(f"round {r} is not finalized: it has no model digest on chain")
        return bytes(digest)

    async def finalized_set(self, r: int, info: RoundInfo) -> list[bool]:
        """The inclusion bitmap the majority of a finalized round attested (its finalized digest, most votes)."""
        attestations = await self._call(self.ledger.attestations, r)
        winning = [a for a in attestations if a.aggregate_digest == info.finalized_digest]
        if not winning:
            return []
        return decode_bitmap(max(winning, key=lambda a: a.votes).included, info.participant_count)

    async def fetch_model(self, r: int, finalized: bytes | None = None) -> torch.Tensor:
        """The finalized model of round r, checked against its digest on chain (`finalized`: as
        the caller read it, with the round's state; else read here); ModelUnavailable if no holder
        served it in time. Its holders are the round's participants (each computed it) and
        whoever announced it since (a peer that just started may not have heard any announcement
        yet, but the participants are on chain)."""
        digest = (finalized or await self.finalized_digest(r)).hex()
        participants = await self._call(self.ledger.participants, r)
        raw_ids = await self._call(lambda: [self.ledger.peer_id_of(a) for a in participants if a != self.address])
        holders = [peer_id_from_bytes(raw) for raw in raw_ids]
        what = f"round {r}: the finalized model {digest[:16]}"
        try:
            data = await fetch_from_holders(
                self._obtain,
                digest,
                Holders(what, order=self._order),
                lambda: holders + [p for p in self.host.providers(digest) if p not in holders],
                deadline=trio.current_time() + FETCH_DEADLINE * self.fetch_timeout,
                request_timeout=REQUEST_SHARE * self.fetch_timeout,
            )
        except BlobUnavailable as exc:
            raise ModelUnavailable(str(exc)) from exc
        if self.shared.global_step is None:
            vector, _ = wire.read_vector(data, self.num_params, kind="model")
        else:  # secure aggregation: the model and the global step's velocity (node.peer.secure_round)
            vector, _, _ = wire.read_model_state(data, self.num_params)
        await self.host.announce_blob(digest, later=True)  # batched: its fetchers know the participants anyway
        return vector

    async def rebuild_model(self, r: int, previous: torch.Tensor, included: list[bool]) -> None:
        """Round r finalized before this peer saw it close, so it computed no aggregate: compute
        it now from the winning set if every included blob is already here (prefetched while the
        round was open), and store it if it is the finalized model. The faster peers that hold the
        model may be gone by now (after the last round they serve on only within `linger_max`,
        node/peer/linger.py); the blobs are not. Anything short of the exact finalized digest
        leaves the fetch to do it."""
        try:
            digest = await self.finalized_digest(r)
            commitments = await self._call(self.ledger.commitments, r)
            if self.store.has(digest.hex()) or not any(included) or len(included) != len(commitments):
                return
            chosen = [c for c, inc in zip(commitments, included) if inc]
            blobs = [self.store.get(bytes(c.digest).hex()) for c in chosen]
            if any(b is None for b in blobs):
                return
            read = await self._update_reader(commitments)
            vectors = [read(b) for b in blobs if b is not None]
            weights = [int(c.num_samples) for c in chosen]
            vector = await self._call(aggregate.next_global, self.shared, previous, vectors, weights)
        except Exception as exc:  # a chain read that failed, a blob we would not take: the fetch decides
            log.warning("round %d: the finalized model could not be rebuilt here: %s", r, exc)
            return
        data = wire.model_blob(vector, r)
        if sha256(data) == digest:
            self.store.put(data)
        else:  # e.g. our previous model is not the round's base: fetch it instead
            log.info("round %d: a local rebuild is not the finalized model: fetching it", r)
