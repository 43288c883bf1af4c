"""The installable wheel: what `pip wheel .` packs, and what the installed `swarm` finds on its own.

The wheel is built from a copy of the checkout (so the build never writes build/ or *.egg-info
into the working tree that other runs use) without network: --no-deps, and --no-build-isolation
with the project environment's setuptools. It is installed with --no-deps into a fresh venv that
sees this environment's third-party packages through a .pth file; every check runs from an empty
directory with that venv's python, and asserts the `node` it imports is the wheel's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = "node/chain/artifacts/SwarmLedger.json"
PACKAGES = (
    "mechanisms",
    "p2p",
    "node",
    "node/protocol",
    "node/learning",
    "node/chain",
    "node/peer",
    "node/runs",
    "node/dashboard",
    "node/cli",
)
SKIP_ANYWHERE = {".git", ".venv", "node_modules", "build", "dist", "__pycache__", ".hypothesis"}
SKIP_ANYWHERE |= {".mypy_cache", ".ruff_cache", ".pytest_cache"}


def _ignore(folder: str, names: list[str]) -> set[str]:
    """copytree filter: caches, environments, build outputs, and the top-level runs/ folder."""
    skipped = {n for n in names if n in SKIP_ANYWHERE or n.endswith(".egg-info")}
    skipped |= {n for n in names if (Path(folder) / n / "pyvenv.cfg").exists()}
    if Path(folder).resolve() == ROOT:
        skipped.add("runs")  # run folders; node/runs/ is a package and stays
    return skipped


def _run(cmd: list, *, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SWARM_ANVIL")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("source") / "swarm-ledger"
    shutil.copytree(ROOT, copy, ignore=_ignore, symlinks=True)
    return copy


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    cmd = [sys.executable, "-m", "pip", "wheel", source, "--no-deps", *isolation, "-w", out]
    built = _run(cmd, cwd=source, env=_clean_env(), timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheels = list(out.glob("swarm_ledger-*.whl"))
    assert len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; the project's third-party packages through a .pth."""
    home = tmp_path_factory.mktemp("wheelenv") / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", home], cwd=home.parent)
    assert made.returncode == 0, made.stderr
    python = home / "bin" / "python"
    installed = _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel],
        cwd=home.parent,
        env=_clean_env(),
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    # Only after installing: pip must never see (or touch) the project's own editable install.
    # A .pth line only appends the folder to sys.path: the editable finder's own .pth stays unread.
    where = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=home.parent)
    site = Path(where.stdout.strip())
    assert site.is_dir() and site.is_relative_to(home), where.stdout + where.stderr
    (site / "zz_project_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return home


@pytest.fixture
def empty(tmp_path) -> Path:
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


def _python(venv: Path, code: str, cwd: Path, *args: str, **env: str) -> dict:
    """Run code (with args) in the venv's python from cwd; it prints one JSON document as its last line."""
    done = _run([venv / "bin" / "python", "-c", textwrap.dedent(code), *args], cwd=cwd, env=_clean_env(**env))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_wheel_holds_every_package_and_the_artifact(wheel, source):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        packed_artifact = zf.read(ARTIFACT)
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names, f"subpackage {package} is not in the wheel"
    sources = {
        p.relative_to(source).as_posix() for pkg in ("mechanisms", "p2p", "node") for p in (source / pkg).rglob("*.py")
    }
    assert sources and sources <= names, f"modules missing from the wheel: {sorted(sources - names)}"
    assert "node/defaults.toml" in names
    static = {f"node/dashboard/static/{p.name}" for p in (ROOT / "node/dashboard/static").iterdir()}
    assert "node/dashboard/static/uplot.min.js" in static and static <= names, sorted(static - names)
    assert packed_artifact == (ROOT / ARTIFACT).read_bytes()
    assert not [n for n in names if n.split("/")[0] in ("tests", "scripts", "contracts", "docs", "examples")]
    assert not [n for n in names if "/tests/" in n or n.endswith((".pyc", ".sol"))]
    assert "swarm = node.cli:main" in entry_points


def test_installed_swarm_runs_from_anywhere(venv, empty):
    done = _run([venv / "bin" / "swarm", "--help"], cwd=empty, env=_clean_env())
    assert done.returncode == 0, done.stderr
    for command in ("up", "deploy", "node", "verify", "simulate", "ledger", "audit", "bench"):
        assert f"    {command} " in done.stdout, done.stdout
    bench = _run([venv / "bin" / "swarm", "bench", "mechanisms"], cwd=empty, env=_clean_env())
    assert bench.returncode == 2, bench.stdout + bench.stderr
    assert "source checkout" in bench.stderr and "git clone" in bench.stderr, bench.stderr
    assert "Traceback" not in bench.stderr


def test_installed_package_loads_and_deploys_its_artifact(venv, empty):
    found = _python(
        venv,
        """
        import json
        import node
        from eth_account import Account
        from eth_tester import EthereumTester
        from web3 import EthereumTesterProvider, Web3
        from node.chain import client

        artifact = client.load_artifact()
        w3 = Web3(EthereumTesterProvider(EthereumTester()))
        account = Account.from_key("0x" + "11" * 32)
        w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": account.address, "value": 10**20})
        ledger = client.LedgerClient.deploy(
            w3, account, min_peers=2, commit_window=5, attest_window=5,
            commit_window_seconds=60, attest_window_seconds=60, eps_cap_micro=7,
            delta=1e-5, genesis_digest=bytes.fromhex("ab" * 32),
        )
        print(json.dumps({
            "node": node.__file__,
            "functions": sorted(e["name"] for e in artifact["abi"] if e["type"] == "function"),
            "bytecode": artifact["bytecode"],
            "deployed": artifact["deployedBytecode"],
            "source_sha256": artifact["sourceSha256"],
            "code": w3.eth.get_code(ledger.address).hex(),
            "min_peers": ledger.params().min_peers,
        }))
        """,
        empty,
    )
    assert Path(found["node"]).resolve().is_relative_to(venv.resolve()), found["node"]
    assert {"register", "commit", "attest", "closeRound", "abortRound", "roundInfo"} <= set(found["functions"])
    for key in ("bytecode", "deployed"):
        assert found[key].startswith("0x") and len(found[key]) > 2000, found[key][:80]
        bytes.fromhex(found[key][2:])
    assert found["source_sha256"] == hashlib.sha256((ROOT / "contracts" / "SwarmLedger.sol").read_bytes()).hexdigest()
    code, deployed = found["code"].removeprefix("0x"), found["deployed"].removeprefix("0x")
    assert len(code) == len(deployed) and code[:200] == deployed[:200]  # the same runtime, immutables filled in
    assert found["min_peers"] == 2


def test_installed_find_anvil_explains_how_to_install(venv, empty, tmp_path):
    path = [str(venv / "bin")]
    path += [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "anvil").exists()]
    assert not [p for p in (empty, *empty.parents) if (p / "node_modules").exists()], "node_modules above tmp"
    stub = "#!/bin/sh\nexit 0\n"
    (tmp_path / "anvil-data").write_text(stub)
    (tmp_path / "anvil-data").chmod(0o644)
    (tmp_path / "anvil-runnable").write_text(stub)
    (tmp_path / "anvil-runnable").chmod(0o755)
    found = _python(
        venv,
        """
        import json, os, sys
        import node
        from node.chain.anvil import AnvilError, find_anvil

        def attempt(chosen):
            os.environ.pop("SWARM_ANVIL", None)
            if chosen:
                os.environ["SWARM_ANVIL"] = chosen
            try:
                return {"found": find_anvil()}
            except AnvilError as exc:
                return {"error": str(exc)}

        print(json.dumps({
            "node": node.__file__,
            "unset": attempt(None),
            "data": attempt(sys.argv[1] + "/anvil-data"),
            "absent": attempt(sys.argv[1] + "/anvil-absent"),
            "runnable": attempt(sys.argv[1] + "/anvil-runnable"),
        }))
        """,
        empty,
        str(tmp_path),
        PATH=os.pathsep.join(path),
    )
    assert Path(found["node"]).resolve().is_relative_to(venv.resolve()), found["node"]
    assert "found" not in found["unset"], found["unset"]
    message = found["unset"]["error"]
    assert "not found" in message and "npm install @foundry-rs/anvil" in message, message
    assert "SWARM_ANVIL" in message and "foundryup" in message, message
    for case in ("data", "absent"):
        assert "not an executable file" in found[case].get("error", ""), found[case]
    assert found["runnable"] == {"found": str(tmp_path / "anvil-runnable")}


def test_installed_swarm_up_without_anvil_says_how_to_install_it(venv, empty):
    """No anvil anywhere: `swarm up` and `swarm simulate --ledger` stop before any work with the
    install hint, exit status 2, no traceback, and no half-made run folder."""
    path = [str(venv / "bin")]
    path += [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "anvil").exists()]
    env = _clean_env(PATH=os.pathsep.join(path))
    for command in (
        ["up", "--peers", "2", "--rounds", "1"],
        ["simulate", "--quick", "--ledger", "--mechanism", "pnpm"],
    ):
        done = _run([venv / "bin" / "swarm", *command], cwd=empty, env=env)
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        assert "npm install @foundry-rs/anvil" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert list(empty.iterdir()) == [], list(empty.iterdir())
