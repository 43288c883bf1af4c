"""Registrations bound to libp2p keys (docs/LEDGER.md, "Registration").

A registration carries a signature by the libp2p private key of the peer id it names over

    b"swarm-ledger/register/v1" || chain id (32 bytes, big-endian) || ledger address (20 bytes)
                                || registering eth address (20 bytes)

The contract cannot check it (libp2p keys are Ed25519, secp256k1 or RSA, not Ethereum's keys):
it is emitted in the `Registered` event and checked here, against the public key embedded in the
peer id (identity multihash: Ed25519 and secp256k1; an RSA peer id is a hash of its key and never
verifies). A peer id resolves to the FIRST registration, in chain order, whose signature verifies
(`resolve`): a squatter who registers someone else's peer id cannot sign for it, so its
registration is ignored everywhere and does not block the owner's. Whether a commit's committer
owns its peer id is the rulebook's to decide (`node.rules.PeerIdOwners`), for every peer and
`swarm verify` alike; these are its primitives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from web3 import Web3

if TYPE_CHECKING:  # libp2p is imported where a key is read: `swarm verify` and `swarm simulate`
    from libp2p.crypto.keys import PrivateKey  # must not load libp2p and trio just by importing

REGISTRATION_DOMAIN = b"swarm-ledger/register/v1"
MAX_SIGNATURE_BYTES = 128  # the contract's bound (InvalidSignature)


@dataclass(frozen=True)
class Registration:
    """One `Registered` event: who registered which peer id with which signature, and where."""

    address: str
    peer_id: bytes
    signature: bytes
    block_number: int = 0
    log_index: int = 0


def registration_message(chain_id: int, ledger: str, address: str) -> bytes:
    """The exact bytes a registration's signature covers."""
    if not 0 <= chain_id < 2**256:
        raise ValueError(f"chain id out of range: {chain_id}")
    return (
        REGISTRATION_DOMAIN
        + chain_id.to_bytes(32, "big")
        + bytes(Web3.to_bytes(hexstr=Web3.to_checksum_address(ledger)))
        + bytes(Web3.to_bytes(hexstr=Web3.to_checksum_address(address)))
    )


def sign_registration(private_key: PrivateKey, chain_id: int, ledger: str, address: str) -> bytes:
    """The signature `address` registers with, by the libp2p key of its peer id."""
    return private_key.sign(registration_message(chain_id, ledger, address))


def signature_verifies(peer_id: bytes, signature: bytes, chain_id: int, ledger: str, address: str) -> bool:
    """Whether `signature` is the signature of `peer_id`'s own key over the registration message of
    (chain_id, ledger, address). Never raises: anything malformed is False."""
    from libp2p.peer.id import ID  # here, not at the top: see the imports

    try:
        if not signature or len(signature) > MAX_SIGNATURE_BYTES:
            return False
        key = ID(bytes(peer_id)).extract_public_key()
        # the key must re-encode to exactly these bytes: no second spelling of one peer id
        if key is None or ID.from_pubkey(key).to_bytes() != bytes(peer_id):
            return False
        return bool(key.verify(registration_message(chain_id, ledger, address), bytes(signature)))
    except Exception:
        return False


def resolve(registrations: Iterable[Registration], chain_id: int, ledger: str) -> dict[bytes, Registration]:
    """peer id -> the first registration (in the order given: chain order) whose signature
    verifies. Registrations that do not verify are left out; so are later verifying ones of a
    peer id already resolved (the key's holder registered a second address: the first counts)."""
    owners: dict[bytes, Registration] = {}
    for reg in registrations:
        if reg.peer_id in owners:
            continue
        if signature_verifies(reg.peer_id, reg.signature, chain_id, ledger, reg.address):
            owners[reg.peer_id] = reg
    return owners
