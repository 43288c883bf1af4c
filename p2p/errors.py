"""Errors raised by the p2p layer. Every one is a `P2PError`, so a caller can catch the family."""

from __future__ import annotations


class P2PError(Exception):
    """Base class of every error the p2p layer raises on purpose."""


class IdentityError(P2PError):
    """The key file cannot be read: wrong password, corrupted or foreign file."""


class BlobNotFound(P2PError):
    """No provider served the blob (none known, all refused, all vanished)."""


class BlobNotHeld(BlobNotFound):
    """Every holder asked answered that it does not hold the blob (NOT_FOUND): none was silent, none
    refused or lied. A committer answers so between its commit and storing its blob, so a caller
    may take it as "not yet" rather than as a failure to serve."""


class DigestMismatch(P2PError):
    """No holder served bytes that hash to the digest asked for, and some holder served or declared
    (piece hashes) other bytes; nothing was stored."""


class BlobTooLarge(P2PError):
    """The blob is larger than the size limit of the request."""


class FetchTimeout(P2PError):
    """The whole fetch did not finish within its deadline."""
