"""Compile contracts/SwarmLedger.sol into the committed artifact
node/chain/artifacts/SwarmLedger.json (package data, so an installed wheel deploys without the source tree).

    python scripts/compile_contracts.py           # write the artifact
    python scripts/compile_contracts.py --check   # exit 1 if the committed artifact is stale
    python scripts/compile_contracts.py --contract PipelinedLedger   # contracts/PipelinedLedger.sol, the
                                                  # one-transaction-per-round prototype (docs/LEDGER.md)

Compiler: a native `solc` 0.8.28 on PATH or installed by py-solc-x if there is one, else the
pinned npm solcjs (node_modules/.bin/solcjs) through scripts/solcjs_wrapper.sh, which drops the
">>> ..." lines solcjs prints before its JSON (they break py-solc-x's JSON parsing). Both produce the same bytecode:
the version, optimizer settings and EVM version are pinned here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = "SwarmLedger"
SOURCE = ROOT / "contracts" / f"{CONTRACT}.sol"
ARTIFACT = ROOT / "node" / "chain" / "artifacts" / f"{CONTRACT}.json"  # package data of node.chain
SOLC_VERSION = "0.8.28"
# Many runs: the contract is deployed once per swarm and called every round by every peer.
SETTINGS = {
    "optimizer": {"enabled": True, "runs": 10000},
    # shanghai, not cancun: Ganache and other maintained local chains stop at shanghai (no MCOPY)
    "evmVersion": "shanghai",
    "viaIR": True,
    "outputSelection": {
        "*": {
            "*": [
                "abi",
                "evm.bytecode.object",
                "evm.deployedBytecode.object",
                "evm.deployedBytecode.immutableReferences",
            ],
            "": ["ast"],  # only to name the immutables (AST ids) in immutableReferences
        }
    },
}


def find_compiler() -> tuple[Path, str]:
    """Return (binary, kind): a native solc of the pinned version if available, else solcjs."""
    import solcx

    for candidate in [shutil.which("solc"), *(_solcx_installed(solcx))]:
        if candidate and _version_of(solcx, candidate) == SOLC_VERSION:
            return Path(candidate), "native"
    solcjs = ROOT / "node_modules" / ".bin" / "solcjs"
    if not solcjs.exists():
        raise RuntimeError(
            f"no solc {SOLC_VERSION} found: install it (py-solc-x or PATH) or run `npm ci` "
            f"for the pinned solcjs ({solcjs} is missing)"
        )
    return ROOT / "scripts" / "solcjs_wrapper.sh", "solcjs"


def _solcx_installed(solcx) -> list[str]:
    try:
        return [str(solcx.get_executable(v)) for v in solcx.get_installed_solc_versions()]
    except Exception:  # py-solc-x keeps no installs: nothing to offer
        return []


def _version_of(solcx, binary: str) -> str | None:
    try:
        return str(solcx.wrapper.get_solc_version(binary))
    except Exception:
        return None


def compile_artifact(name: str = CONTRACT) -> dict:
    """Compile contracts/<name>.sol and return the artifact dict of contract `name` (not written)."""
    import solcx

    binary, kind = find_compiler()
    path = ROOT / "contracts" / f"{name}.sol"
    source = path.read_text()
    out = solcx.compile_standard(
        {"language": "Solidity", "sources": {path.name: {"content": source}}, "settings": SETTINGS},
        solc_binary=binary,
    )
    errors = [e for e in out.get("errors", []) if e.get("severity") == "error"]
    if errors:
        raise RuntimeError("\n".join(e.get("formattedMessage", e["message"]) for e in errors))
    contract = out["contracts"][path.name][name]
    full_version = str(solcx.wrapper.get_solc_version(binary, with_commit_hash=True))
    return {
        "contractName": name,
        "sourcePath": str(path.relative_to(ROOT)),
        "sourceSha256": hashlib.sha256(source.encode()).hexdigest(),
        "compiler": {"version": full_version, "via": kind},
        "settings": {"optimizer": SETTINGS["optimizer"], "evmVersion": SETTINGS["evmVersion"]},
        "abi": contract["abi"],
        "bytecode": "0x" + contract["evm"]["bytecode"]["object"],
        "deployedBytecode": "0x" + contract["evm"]["deployedBytecode"]["object"],
        # where the runtime code holds each immutable (zeros in deployedBytecode): `swarm verify` masks them to
        # compare a deployment's code with this artifact, and reads them back against params()
        "immutableReferences": _named_immutables(
            contract["evm"]["deployedBytecode"].get("immutableReferences", {}), out["sources"][path.name]["ast"]
        ),
    }


def _named_immutables(references: dict[str, list[dict]], ast: dict) -> dict[str, list[dict[str, int]]]:
    """solc's immutableReferences (keyed by AST id) keyed by the variable's name instead, sorted."""
    names: dict[str, str] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("nodeType") == "VariableDeclaration" and node.get("mutability") == "immutable":
                names[str(node["id"])] = node["name"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(ast)
    return {
        names[ast_id]: sorted(({"start": r["start"], "length": r["length"]} for r in refs), key=lambda r: r["start"])
        for ast_id, refs in sorted(references.items(), key=lambda item: names[item[0]])
    }


def same_build(a: dict, b: dict) -> bool:
    """Artifacts match on everything but how the compiler was reached (native or solcjs)."""

    def strip(d: dict) -> dict:
        return {k: v for k, v in d.items() if k != "compiler"} | {"version": d["compiler"]["version"]}

    return strip(a) == strip(b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed artifact is stale")
    parser.add_argument("--contract", default=CONTRACT, help="contracts/<CONTRACT>.sol (default SwarmLedger)")
    args = parser.parse_args(argv)
    fresh = compile_artifact(args.contract)
    artifact = ARTIFACT.with_name(f"{args.contract}.json")
    if args.check:
        committed = json.loads(artifact.read_text()) if artifact.exists() else None
        if committed is None or not same_build(committed, fresh):
            print(f"{artifact.relative_to(ROOT)} is stale: run python scripts/compile_contracts.py", file=sys.stderr)
            return 1
        print(f"{artifact.relative_to(ROOT)} is up to date")
        return 0
    artifact.parent.mkdir(parents=True, exist_ok=True)
    artifact.write_text(json.dumps(fresh, indent=1) + "\n")
    print(
        f"wrote {artifact.relative_to(ROOT)} (solc {fresh['compiler']['version']} via {fresh['compiler']['via']}, "
        f"{(len(fresh['deployedBytecode']) - 2) // 2} bytes deployed)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
