"""Blob stores: content addressing, range reads, and atomic writes that survive a crash."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import pytest

from p2p.store import DiskBlobStore, MemoryBlobStore


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_store_roundtrip(kind, tmp_path):
    store = MemoryBlobStore() if kind == "memory" else DiskBlobStore(tmp_path / "blobs")
    data = os.urandom(100_000)
    digest = store.put(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert store.has(digest) and store.get(digest) == data and store.size(digest) == len(data)
    assert store.read(digest, 10, 20) == data[10:30]
    assert store.put(data) == digest  # idempotent
    missing = "0" * 64
    assert not store.has(missing) and store.get(missing) is None and store.size(missing) is None
    with pytest.raises(ValueError, match="digest"):
        store.has("not-a-digest")


def test_disk_store_crash_mid_write_leaves_no_blob(tmp_path):
    """A child process really dies (os._exit) after writing the temporary file, before the rename."""
    directory = tmp_path / "blobs"
    child = textwrap.dedent(f"""
        import os, sys
        from p2p.store import DiskBlobStore
        store = DiskBlobStore({str(directory)!r})
        os.fsync = lambda fd: os._exit(9)   # die at the first fsync: data written, not yet renamed
        store.put(b"x" * 3_000_000)
    """)
    proc = subprocess.run([sys.executable, "-c", child], cwd=os.getcwd(), timeout=60)
    assert proc.returncode == 9
    digest = hashlib.sha256(b"x" * 3_000_000).hexdigest()
    store = DiskBlobStore(directory)
    assert not store.has(digest) and store.get(digest) is None
    assert store.digests() == []
    assert store.put(b"x" * 3_000_000) == digest and store.get(digest) == b"x" * 3_000_000
