"""Persistent Ed25519 libp2p identity in a password-encrypted key file.

File format (JSON, mode 0600): the 32-byte Ed25519 seed sealed with AES-256-GCM under a key derived
from the password by scrypt (RFC 7914; n=2**15, r=8, p=1 as recommended for interactive logins).
The associated data binds the ciphertext to this format, so a file from another tool does not decrypt.
A key file that grants any permission to group or others is refused (IdentityError naming chmod 600).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair

from .errors import IdentityError

FORMAT = "swarm-ledger/p2p-identity/v1"
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**15, 8, 1


def _derive_key(password: bytes, salt: bytes, n: int, r: int, p: int) -> bytes:
    return Scrypt(salt=salt, length=32, n=n, r=r, p=p).derive(password)


def _seal(seed: bytes, password: bytes) -> dict[str, object]:
    salt, nonce = os.urandom(16), os.urandom(12)
    key = _derive_key(password, salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P)
    ciphertext = AESGCM(key).encrypt(nonce, seed, FORMAT.encode())
    return {
        "format": FORMAT,
        "kdf": {"name": "scrypt", "salt": salt.hex(), "n": _SCRYPT_N, "r": _SCRYPT_R, "p": _SCRYPT_P},
        "cipher": {"name": "aes-256-gcm", "nonce": nonce.hex()},
        "ciphertext": ciphertext.hex(),
    }


def _open(record: dict[str, Any], password: bytes, path: Path) -> bytes:
    """The seed sealed in `record` (parsed JSON of unchecked shape: every field is validated here)."""
    try:
        if record["format"] != FORMAT:
            raise IdentityError(f"key file {path} has format {record['format']!r}, expected {FORMAT!r}")
        kdf, cipher = record["kdf"], record["cipher"]
        key = _derive_key(password, bytes.fromhex(kdf["salt"]), int(kdf["n"]), int(kdf["r"]), int(kdf["p"]))
        return AESGCM(key).decrypt(bytes.fromhex(cipher["nonce"]), bytes.fromhex(record["ciphertext"]), FORMAT.encode())
    except InvalidTag:
        raise IdentityError(
            f"cannot decrypt key file {path}: wrong password (SWARM_P2P_PASSWORD) or corrupted file"
        ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise IdentityError(f"key file {path} is malformed: {exc}") from None


def _write_new(path: Path, record: dict[str, object]) -> None:
    """Create the file with mode 0600 from the start (never world-readable, even briefly), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_private(path: Path) -> None:
    """Refuse a key file that grants any permission to group or others (st_mode & 0o077)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise IdentityError(f"key file {path} cannot be inspected: {exc}") from None
    if mode & 0o077:
        kind = "readable" if mode & 0o044 else "accessible"
        raise IdentityError(f"key file {path} is {kind} by others (mode {mode:04o}): run chmod 600 {path}")


def load_or_create_identity(path: str | os.PathLike[str], password: bytes | str) -> KeyPair:
    """Return the Ed25519 key pair stored at `path`, creating it (mode 0600) on first run.

    A str password is UTF-8 encoded. Raises ValueError for an empty password, IdentityError for a
    wrong password, a bad file, or a file readable by group or others (it must be mode 0600).
    """
    if isinstance(password, str):
        password = password.encode()
    if not password:
        raise ValueError("password must be non-empty (set SWARM_P2P_PASSWORD)")
    path = Path(path)
    if path.exists():
        _check_private(path)
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise IdentityError(f"key file {path} is not readable JSON: {exc}") from None
        seed = _open(record, password, path)
    else:
        seed = os.urandom(32)
        _write_new(path, _seal(seed, password))
    return create_new_key_pair(seed)
