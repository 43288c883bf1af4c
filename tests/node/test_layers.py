"""The dependency direction of docs/NODE.md, checked on the source: each subpackage imports only
the layers below it, nothing imports `node` from `mechanisms` or `p2p`, and only `node/cli/`
imports inside functions (for a fast `swarm --help`; `mechanisms` and `p2p` may break an
import cycle of their own that way)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What each part of the tree may import from the project (besides itself). Lower layers first.
BELOW_PEER = {
    "mechanisms",
    "p2p",
    "node.protocol",
    "node.learning",
    "node.chain",
    "node.rules",
    "node.derive",
    "node.config",
    "node.runfiles",
}
ALLOWED: dict[str, set[str]] = {
    "node": set(),  # the package's docstring only
    "mechanisms": set(),
    "p2p": set(),
    "node.runfiles": set(),
    "node.protocol": {"mechanisms"},
    "node.learning": {"mechanisms", "node.protocol"},
    "node.chain": {"mechanisms", "node.protocol"},
    "node.rules": {"mechanisms", "node.protocol", "node.chain"},  # the rulebook: peers and verify apply it
    "node.config": {"mechanisms", "node.protocol", "node.learning"},
    "node.derive": {"mechanisms", "node.protocol", "node.learning", "node.config"},
    "node.verify": {"mechanisms", "node.protocol", "node.chain", "node.rules"},
    "node.verify_pipelined": {"mechanisms", "node.protocol", "node.chain", "node.rules", "node.verify"},
    "node.peer": BELOW_PEER,
    "node.runs": BELOW_PEER | {"node.peer"},
    "node.dashboard": {"node.chain", "node.runfiles", "node.runs"},  # reads run folders; round_rows from runs
    "node.cli": {"mechanisms", "p2p", "node"},
}
PROJECT = ("mechanisms", "p2p", "node")


def _unit(module: str) -> str:
    """The ALLOWED key a module belongs to (the longest matching prefix)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in ALLOWED:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} is in no layer of ALLOWED: add it")


def _modules() -> list[tuple[str, Path]]:
    found = []
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append((".".join(parts), path))
    return found


def _imports(path: Path, module: str) -> list[tuple[str, bool]]:
    """(imported project module, whether the import sits inside a function) of one file."""
    tree = ast.parse(path.read_text(), str(path))
    nested: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nested.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[: -node.level] if path.name != "__init__.py" else module.split(".")
                if path.name == "__init__.py" and node.level > 1:
                    base = base[: -(node.level - 1)]
                names = [".".join([*base, node.module] if node.module else base)]
            else:
                names = [node.module or ""]
                names += [f"{node.module}.{a.name}" for a in node.names]  # `from node import x`
        else:
            continue
        for name in names:
            if name.split(".")[0] in PROJECT:
                found.append((name, id(node) in nested))
    return found


MODULES = _modules()


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_down_and_are_at_module_top(module, path):
    unit = _unit(module)
    for name, in_function in _imports(path, module):
        if name.split(".")[0] == "node" and name.count(".") == 0:
            continue  # `from node import x` is judged by its `node.x` entry
        try:
            target = _unit(name)
        except AssertionError:
            continue  # `from node.x import SomeClass`: the module entry `node.x` is judged
        assert target == unit or target in ALLOWED[unit] or (unit == "node.cli" and target.startswith("node")), (
            f"{module} imports {name} ({target}), which {unit} may not depend on"
        )
        if module.startswith("node"):
            assert not in_function or unit == "node.cli", f"{module} imports {name} inside a function"


def test_every_module_is_checked():
    assert len(MODULES) > 40 and {_unit(m) for m, _ in MODULES} == set(ALLOWED)


def test_simulation_and_verify_do_not_load_the_peer_runtime():
    """`swarm simulate` and `swarm verify` share the round code but not the network: importing them
    must not pull in trio, libp2p or the peer's state machine (a fresh interpreter, so earlier
    tests' imports cannot hide it)."""
    import subprocess
    import sys

    probe = (
        "import sys, node.runs.simulate, node.verify; "
        "print(sorted(m for m in ('trio', 'libp2p', 'node.peer.peer', 'node.peer.runner') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
