"""Signed peer records in pubsub RPCs are verified once per (host, peer, bytes), and a record that is
forged, altered or presented for another peer is still refused (p2p/pubsub_records.py)."""

from __future__ import annotations

import pytest
from libp2p.peer.id import ID
from libp2p.pubsub import gossipsub as gossipsub_module
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub.pb.rpc_pb2 import RPC

from p2p import pubsub_records
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio


async def test_record_verified_once_and_bad_records_refused(config, hosts, monkeypatch):
    # Opening a host installs the replacements in py-libp2p's pubsub modules.
    async with hosts([(config(), MemoryBlobStore(), None) for _ in range(3)]) as (sender, receiver, other):
        assert pubsub_module.maybe_consume_signed_record is pubsub_records.consume_sender_record_once
        assert gossipsub_module.maybe_consume_signed_record is pubsub_records.consume_sender_record_once
        assert gossipsub_module.env_to_send_in_RPC is pubsub_records.local_sender_record

        verified: list[bytes] = []
        library_check = pubsub_records.maybe_consume_signed_record

        def counting_check(msg, host, peer_id):
            verified.append(bytes(msg.senderRecord))
            return library_check(msg, host, peer_id)

        monkeypatch.setattr(pubsub_records, "maybe_consume_signed_record", counting_check)
        record, _ = pubsub_records.local_sender_record(sender.libp2p_host)
        assert pubsub_records.local_sender_record(sender.libp2p_host)[0] == record  # reused bytes
        sender_id = ID.from_base58(sender.peer_id)

        rpc = RPC(senderRecord=record)
        for _ in range(5):
            assert pubsub_records.consume_sender_record_once(rpc, receiver.libp2p_host, sender_id)
        assert len(verified) == 1, "the same record from the same peer is verified once per host"
        # Another host has its own peerstore: it verifies (and stores) the record itself.
        assert pubsub_records.consume_sender_record_once(rpc, other.libp2p_host, sender_id)
        assert len(verified) == 2

        # The same bytes presented as coming from another peer: refused, and not remembered.
        other_id = ID.from_base58(other.peer_id)
        assert not pubsub_records.consume_sender_record_once(rpc, receiver.libp2p_host, other_id)
        assert not pubsub_records.consume_sender_record_once(rpc, receiver.libp2p_host, other_id)
        # Altered bytes (last byte of the signature flipped): refused every time.
        forged = RPC(senderRecord=record[:-1] + bytes([record[-1] ^ 1]))
        assert not pubsub_records.consume_sender_record_once(forged, receiver.libp2p_host, sender_id)
        assert not pubsub_records.consume_sender_record_once(forged, receiver.libp2p_host, sender_id)
        assert len(verified) == 6
        # No record at all is accepted, as in py-libp2p.
        assert pubsub_records.consume_sender_record_once(RPC(), receiver.libp2p_host, sender_id)
