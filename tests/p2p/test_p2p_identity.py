"""Persistent, encrypted Ed25519 identity; a restarted peer keeps its peer id."""

from __future__ import annotations

import json
import stat

import pytest

from p2p import IdentityError, peer_id_from_bytes, peer_id_to_bytes
from p2p.host import open_host
from p2p.identity import load_or_create_identity
from p2p.store import MemoryBlobStore

pytestmark = pytest.mark.anyio


async def test_restarted_peer_keeps_its_identity(tmp_path, config):
    key_file = tmp_path / "p2p.key"
    first = load_or_create_identity(key_file, b"correct horse")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert first.private_key.to_bytes().hex() not in key_file.read_text()  # stored encrypted
    async with open_host(config(key_pair=first), MemoryBlobStore()) as host:
        peer_id, peer_id_bytes = host.peer_id, host.peer_id_bytes
    again = load_or_create_identity(key_file, b"correct horse")
    async with open_host(config(key_pair=again), MemoryBlobStore()) as host:
        assert host.peer_id == peer_id and host.peer_id_bytes == peer_id_bytes
    assert peer_id_from_bytes(peer_id_bytes) == peer_id and peer_id_to_bytes(peer_id) == peer_id_bytes


def test_wrong_password_and_bad_files_fail_clearly(tmp_path):
    key_file = tmp_path / "p2p.key"
    load_or_create_identity(key_file, b"right")
    with pytest.raises(IdentityError, match="wrong password"):
        load_or_create_identity(key_file, b"wrong")
    with pytest.raises(ValueError, match="password"):
        load_or_create_identity(tmp_path / "other.key", b"")
    record = json.loads(key_file.read_text())
    tampered = bytearray.fromhex(record["ciphertext"])
    tampered[0] ^= 1
    record["ciphertext"] = tampered.hex()
    key_file.write_text(json.dumps(record))
    with pytest.raises(IdentityError):
        load_or_create_identity(key_file, b"right")
