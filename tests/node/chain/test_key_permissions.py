"""Key files readable by others are refused (with the chmod that fixes it); created ones are 0600."""

from __future__ import annotations

import os
import re
import stat

import pytest

from node.chain import keys
from p2p import IdentityError
from p2p.identity import load_or_create_identity


@pytest.fixture
def open_umask():
    """A permissive umask (0000), so that only the explicit creation mode can make a file 0600."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _refusal(path, mode: str) -> str:
    return re.escape(f"key file {path} is readable by others (mode {mode}): run chmod 600 {path}")


def test_libp2p_key_file_is_created_0600_and_refused_when_readable_by_others(tmp_path, open_umask):
    key_file = tmp_path / "p2p.key"
    created = load_or_create_identity(key_file, b"correct horse")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert load_or_create_identity(key_file, b"correct horse").private_key.to_bytes() == (
        created.private_key.to_bytes()
    )
    key_file.chmod(0o644)
    with pytest.raises(IdentityError, match=_refusal(key_file, "0644")):
        load_or_create_identity(key_file, b"correct horse")
    key_file.chmod(0o640)  # group-readable is refused too
    with pytest.raises(IdentityError, match="chmod 600"):
        load_or_create_identity(key_file, b"correct horse")
    key_file.chmod(0o620)  # any group/other bit, not only read
    with pytest.raises(IdentityError, match=r"accessible by others \(mode 0620\): run chmod 600"):
        load_or_create_identity(key_file, b"correct horse")
    key_file.chmod(0o600)  # the advised fix works
    assert load_or_create_identity(key_file, b"correct horse").private_key.to_bytes() == (
        created.private_key.to_bytes()
    )
    key_file.chmod(0o400)  # owner-only read-only is fine
    assert load_or_create_identity(key_file, b"correct horse").private_key.to_bytes() == (
        created.private_key.to_bytes()
    )


def test_eth_keystore_is_created_0600_and_refused_when_readable_by_others(tmp_path, monkeypatch, open_umask):
    monkeypatch.delenv(keys.PRIVATE_KEY_ENV, raising=False)
    monkeypatch.setenv(keys.PASSWORD_ENV, "correct horse")
    path = tmp_path / "keystore.json"
    created = keys.load_account(path, create=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keys.load_account(path).address == created.address
    path.chmod(0o644)
    with pytest.raises(keys.AccountLoadError, match=_refusal(path, "0644")):
        keys.load_account(path)
    path.chmod(0o604)
    with pytest.raises(keys.AccountLoadError, match="chmod 600"):
        keys.load_account(path)
    path.chmod(0o600)
    assert keys.load_account(path).address == created.address
    other = tmp_path / "direct.json"
    assert keys.create_keystore(other, "pw").address
    assert stat.S_IMODE(other.stat().st_mode) == 0o600
