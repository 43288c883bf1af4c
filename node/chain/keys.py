"""The node's Ethereum account: never from the command line.

Order: the SWARM_PRIVATE_KEY environment variable if set; else an encrypted eth-account keystore
file (scrypt, Web3 Secret Storage v3), unlocked with SWARM_KEYSTORE_PASSWORD or a prompt, and
created (mode 0600) on first use when `create=True`. A keystore readable by group or others is
refused (AccountLoadError naming `chmod 600`). Where the keystore lives is the caller's choice
(`--keystore PATH`): `swarm node` defaults to `<workdir>/eth-keystore.json`, `swarm deploy` to
`~/.swarm/keystore.json` (DEFAULT_KEYSTORE). A newly created account has no funds: `on_create`
lets the caller print its address so the user knows what to fund.
"""

from __future__ import annotations

import getpass
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

PRIVATE_KEY_ENV = "SWARM_PRIVATE_KEY"
PASSWORD_ENV = "SWARM_KEYSTORE_PASSWORD"
DEFAULT_KEYSTORE = Path.home() / ".swarm" / "keystore.json"


class AccountLoadError(Exception):
    """The account could not be loaded (no key, bad password, unreadable keystore)."""


def _password(confirm: bool) -> str:
    password = os.environ.get(PASSWORD_ENV)
    if password is not None:
        return password
    try:
        first = getpass.getpass("keystore password: ")
        if confirm and getpass.getpass("repeat password: ") != first:
            raise AccountLoadError("the two passwords differ")
    except EOFError:
        raise AccountLoadError(f"no password: set {PASSWORD_ENV} or run on a terminal") from None
    return first


def _check_private(path: Path) -> None:
    """Refuse a keystore that grants any permission to group or others (st_mode & 0o077)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise AccountLoadError(f"keystore {path} is unreadable: {exc}") from None
    if mode & 0o077:
        kind = "readable" if mode & 0o044 else "accessible"
        raise AccountLoadError(f"key file {path} is {kind} by others (mode {mode:04o}): run chmod 600 {path}")


def load_account(
    keystore_path: str | os.PathLike[str] | None = None,
    *,
    create: bool = False,
    on_create: Callable[[LocalAccount, Path], None] | None = None,
) -> LocalAccount:
    """The node's account.

    keystore_path defaults to ~/.swarm/keystore.json. With create=True a missing keystore is
    created with a fresh random key; `on_create(account, path)` is then called so the caller can
    print the new address (never the key).
    """

    key = os.environ.get(PRIVATE_KEY_ENV)
    if key:
        try:
            return Account.from_key(key.strip())
        except Exception as exc:
            raise AccountLoadError(f"{PRIVATE_KEY_ENV} is not a valid private key ({type(exc).__name__})") from None
    path = Path(keystore_path) if keystore_path else DEFAULT_KEYSTORE
    if not path.exists():
        if not create:
            raise AccountLoadError(f"no key: set {PRIVATE_KEY_ENV} or create the keystore {path} first")
        account = create_keystore(path, _password(confirm=True))
        if on_create is not None:
            on_create(account, path)
        return account
    _check_private(path)
    try:
        encrypted = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AccountLoadError(f"keystore {path} is unreadable: {exc}") from None
    try:
        return Account.from_key(Account.decrypt(encrypted, _password(confirm=False)))
    except ValueError:
        raise AccountLoadError(f"wrong password for keystore {path} (or the file is corrupt)") from None


def create_keystore(path: str | os.PathLike[str], password: str) -> LocalAccount:
    """Write a new random account to an encrypted keystore file with mode 0600; return it."""

    if not password:
        raise AccountLoadError("the keystore password must not be empty")
    path = Path(path)
    if path.exists():
        raise AccountLoadError(f"keystore {path} already exists: refusing to overwrite a key")
    account = Account.create()
    encrypted = Account.encrypt(account.key, password)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # O_EXCL + 0600 at creation: the file is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(encrypted, handle)
    return account
