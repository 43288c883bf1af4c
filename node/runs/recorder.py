"""What `swarm simulate` records of each round: without a ledger only the model digest
(`DigestOnly`); with `--ledger` the whole round on a real Anvil (`ChainRecorder`), exactly as
`swarm up` would, so `swarm verify --run OUT` re-checks a simulated run."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from node.chain.client import LedgerClient
from node.chain.records import RoundState
from node.chain.registration import sign_registration
from node.protocol import policy, wire
from node.protocol.blob import sha256
from node.runs.chainrun import LedgerTerms, RunChain

if TYPE_CHECKING:
    from libp2p.crypto.keys import PrivateKey


def simulated_identity(name: str) -> PrivateKey:
    """The libp2p key of a simulated peer (no host): Ed25519 from a seed unique per name, so its
    registration is signed like a real peer's (node.chain.registration). libp2p is imported here:
    `swarm simulate` without a ledger must not load it (tests/node/test_layers.py)."""
    from libp2p.crypto.ed25519 import create_new_key_pair

    return create_new_key_pair(hashlib.sha256(name.encode()).digest()).private_key


def simulated_peer_id(name: str) -> bytes:
    """The libp2p peer id of `simulated_identity(name)` (identity multihash of its public key)."""
    from libp2p.peer.id import ID

    return ID.from_pubkey(simulated_identity(name).get_public_key()).to_bytes()


class DigestOnly:
    """Without a ledger: nothing to record but the model digest each round (the sha256 of the
    model blob, what participants would attest), which makes reproducibility checkable."""

    def start(self, sim: Any) -> None:
        pass

    def round(
        self,
        sim: Any,
        r: int,
        chosen: list[int],
        vectors: list[torch.Tensor],
        weights: list[int],
        global_vector: torch.Tensor,
    ) -> str:
        return sha256(wire.model_blob(global_vector, r)).hex()

    def finish(self, sim: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def info(self) -> dict | None:
        return None


WINDOW_SECONDS = 1  # the recorded ledger's windows in seconds: the recorder moves its chain's clock past them


class ChainRecorder:
    """Records a simulated run on a real Anvil exactly as `swarm up` would: one funded account
    per simulated peer (registered when first sampled), per round each participant's update blob
    committed from its own account (digest, samples, cumulative eps, mechanism JSON), the round
    closed, and every participant attesting the aggregate's digest with the all-included bitmap.
    The run folder (run.json, chain/state.json, archive/) comes from `RunChain`, as for `swarm up`.

    The contract's windows last blocks and seconds, and Anvil mines one block per transaction:
    `window` (blocks) must fit every registration and commit of a round, and before closing the
    recorder moves its own chain's clock past the window's WINDOW_SECONDS (a simulation has no
    one to wait for) and mines empty blocks up to the window's end."""

    def __init__(self, out: Path, *, window: int) -> None:
        self.out = Path(out)
        self.window = window
        self.chain: RunChain | None = None
        self.gas: dict[str, int] = {}
        self.clients: dict[int, LedgerClient] = {}

    def start(self, sim: Any) -> None:
        c = sim.config
        genesis = wire.genesis_blob(sim.genesis_vector, sim.settings.shared.to_dict())
        # The caps are exactly what `rounds` contributions spend: no simulated peer can reach past them.
        self.privacy = sim.settings.shared.privacy
        step = policy.eps_step_micro(sim.mechanism_params, sim.num_params)
        smallest = min(len(peer.y) for peer in sim.peers)
        cap, record_cap = policy.expected_micro(self.privacy, sim.num_params, [smallest] * c.swarm.rounds)
        dp = self.privacy.dp_sgd
        terms = LedgerTerms(
            min_peers=1,
            commit_window=self.window,
            attest_window=self.window,
            commit_window_seconds=WINDOW_SECONDS,
            attest_window_seconds=WINDOW_SECONDS,
            eps_cap_micro=max(cap, 1),
            delta=c.privacy.delta,
            max_samples=sim.settings.shared.max_samples,  # the genesis's: the largest shard unless set
            eps_step_micro=step,
            record_eps_cap_micro=record_cap,
            record_delta=dp.delta if dp is not None else 0.0,
        )
        self.chain = RunChain(self.out, genesis, terms, peers=len(sim.peers))
        if not isinstance(self.chain.ledger, LedgerClient):  # RunChain deploys a SwarmLedger unless told otherwise
            raise TypeError("swarm simulate --ledger records on a SwarmLedger")
        self.ledger = self.chain.ledger
        self.identities = [simulated_identity(peer.name) for peer in sim.peers]
        self.peer_ids = [simulated_peer_id(peer.name) for peer in sim.peers]
        self.mechanism_json = wire.canonical(sim.mechanism_params)
        self.run_info = self.chain.write_run_info(
            simulated=True,
            peers=[
                {"index": i, "address": self.chain.peer_account(i).address, "peer_id": pid.hex()}
                for i, pid in enumerate(self.peer_ids)
            ],
            config=c.to_dict(),
            fraction=sim.fraction,
            noise=sim.noise_label,
        )

    def _client(self, i: int) -> LedgerClient:
        assert self.chain is not None
        if i not in self.clients:
            client = LedgerClient(self.chain.w3, self.ledger.address, self.chain.peer_account(i))
            account = self.chain.peer_account(i).address
            signature = sign_registration(self.identities[i], client.chain_id(), client.address, account)
            self._add_gas("register", client.register(self.peer_ids[i], signature))
            self.clients[i] = client
        return self.clients[i]

    def _add_gas(self, what: str, receipt: Any) -> None:
        self.gas[what] = self.gas.get(what, 0) + int(receipt["gasUsed"])

    def round(
        self,
        sim: Any,
        r: int,
        chosen: list[int],
        vectors: list[torch.Tensor],
        weights: list[int],
        global_vector: torch.Tensor,
    ) -> str:
        assert self.chain is not None
        if self.ledger.current_round() != r:
            raise RuntimeError(f"ledger is in round {self.ledger.current_round()}, the simulation in round {r}")
        for i, vector, samples in zip(chosen, vectors, weights):
            committer = self.chain.peer_account(i).address
            digest = self.chain.archive.put(wire.update_blob(vector, r, self.mechanism_json, committer))
            counts = [len(sim.peers[i].y)] * sim.peers[i].commits  # this commit included
            eps_micro, record_micro = policy.expected_micro(self.privacy, sim.num_params, counts)
            receipt = self._client(i).commit(
                r, bytes.fromhex(digest), samples, eps_micro, self.mechanism_json.encode(), record_micro
            )
            self._add_gas("commit", receipt)
        last_block = self.ledger.round_info(r).opened_block + self.window
        # One past the window's last block, WINDOW_SECONDS later on the chain's clock (at least one
        # block carries it): the close must already hold when it is estimated.
        self.chain.anvil.rpc("evm_increaseTime", [WINDOW_SECONDS])
        self.chain.anvil.mine(max(1, last_block + 1 - self.ledger.block_number()))
        self._add_gas("close", self.ledger.close_round(r))
        digest = self.chain.archive.put(wire.model_blob(global_vector, r))
        included = wire.encode_bitmap([True] * len(chosen))
        for i in chosen:
            if self.ledger.round_info(r).state is RoundState.FINALIZED:
                break  # a strict majority already attested: the rest would be refused
            self._add_gas("attest", self._client(i).attest(r, bytes.fromhex(digest), included))
        if self.ledger.finalized_digest(r) != bytes.fromhex(digest):
            raise RuntimeError(f"round {r} did not finalize with the simulated aggregate {digest[:16]}...")
        self.chain.save_state()
        return digest

    def finish(self, sim: Any) -> None:
        if self.chain is not None:
            self.chain.save_state()

    def close(self) -> None:
        if self.chain is not None:
            self.chain.close()
            self.chain = None

    def info(self) -> dict:
        return {
            "ledger": self.run_info["ledger"],
            "chain_id": self.run_info["chain_id"],
            "gas": dict(self.gas),
            "verify_command": f"swarm verify --run {self.out}",
        }
