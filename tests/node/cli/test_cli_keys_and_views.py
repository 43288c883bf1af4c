"""Keys and the views of a finished run: `swarm deploy` with a new, unfunded keystore prints its
address and fails in one line naming it and the amount (real Anvil); `swarm verify --archive`
reads several folders or workdirs; the live title of `swarm up` never passes the last round."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from node.chain.anvil import free_port, start_anvil
from node.cli import CLIError
from node.cli.verify import blob_folders
from node.runs.local import live_title
from node.verify import ArchiveStores
from p2p.store import DiskBlobStore, MemoryBlobStore


def test_deploy_with_a_new_keystore_names_the_address_to_fund(tmp_path):
    keystore = tmp_path / "deployer.json"
    env = {k: v for k, v in os.environ.items() if k != "SWARM_PRIVATE_KEY"} | {"SWARM_KEYSTORE_PASSWORD": "pw"}
    with start_anvil(accounts=1) as anvil:
        proc = subprocess.run(
            [sys.executable, "-m", "node.cli", "deploy", "--rpc-url", anvil.url, "--keystore", str(keystore)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 2, proc.stderr
    created = re.search(r"created keystore \S+ for address (0x[0-9a-fA-F]{40})", proc.stderr)
    assert created and keystore.exists(), proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith(
        f"swarm deploy: error: insufficient funds: account {created[1]} holds 0 ETH, deploy needs up to "
    ), error
    assert f"send ETH to {created[1]}" in error and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_deploy_to_an_unreachable_chain_is_one_line(tmp_path):
    env = dict(os.environ, SWARM_PRIVATE_KEY="0x" + "11" * 32)
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "node.cli", "deploy", "--rpc-url", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"swarm deploy: error: cannot reach the chain at {url} (Connection refused): start it or fix --rpc-url"
    )


def test_archive_stores_prefer_a_good_copy(tmp_path):
    good, missing = b"the blob", "00" * 32
    honest = MemoryBlobStore()
    digest = honest.put(good)
    # a tampered copy under the right name (<dir>/<2 hex>/<digest>) in the first folder, the honest one in the second
    tampered_dir = tmp_path / "a" / digest[:2]
    tampered_dir.mkdir(parents=True)
    (tampered_dir / digest).write_bytes(b"an altered blob")
    tampered = DiskBlobStore(tmp_path / "a")
    assert ArchiveStores([tampered, honest]).get(digest) == good
    assert ArchiveStores([tampered]).get(digest) == b"an altered blob"  # reported as altered, not as missing
    assert ArchiveStores([tampered, honest]).get(missing) is None


def test_archive_folders_accept_workdirs(tmp_path):
    workdir, plain = tmp_path / "node0", tmp_path / "archive"
    (workdir / "blobs").mkdir(parents=True)
    plain.mkdir()
    assert blob_folders([workdir, plain]) == [workdir / "blobs", plain]
    with pytest.raises(CLIError, match="does not exist"):
        blob_folders([tmp_path / "nowhere"])


def test_live_title_never_passes_the_last_round():
    ended = {1: "finalized", 2: "aborted", 3: "finalized"}
    title = live_title("0x" + "ab" * 20, 4, 3, ended)  # the ledger opened round 4 after the last one
    assert "round 3 of 3: 2 finalized, 1 aborted" in title and "done" in title
    running = live_title("0x" + "ab" * 20, 2, 3, {1: "finalized"})
    assert "round 2 of 3: 1 finalized, 0 aborted" in running and "done" not in running
