"""The shape the team keeps the source in, checked on the AST: no function in `node/`, `p2p/` or
`mechanisms/` runs past MAX_LINES lines, and no code in `node/` compares a round's state by its
name as a string (`RoundState` members are compared instead, so a renamed state fails loudly)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("node", "p2p", "mechanisms")
MAX_LINES = 80


def _trees(packages: tuple[str, ...]) -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(), str(path)))
        for package in packages
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def _qualified_functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method with its dotted name inside the module (Class.method, f.inner)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _span(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the `def` to the last line of the body; decorators are not counted."""
    assert function.end_lineno is not None
    return function.end_lineno - function.lineno + 1


def test_no_function_is_longer_than_the_limit() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{function.lineno} {name} ({_span(function)} lines)"
        for path, tree in _trees(PACKAGES)
        for name, function in _qualified_functions(tree)
        if _span(function) > MAX_LINES
    ]
    assert not offenders, f"functions over {MAX_LINES} lines:\n" + "\n".join(offenders)


def _is_state_name(node: ast.expr) -> bool:
    """`<anything>.state.name` (or `state.name`): a round state read by its name."""
    if not (isinstance(node, ast.Attribute) and node.attr == "name"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "state") or (
        isinstance(owner, ast.Name) and owner.id == "state"
    )


def _is_string(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_string(element) for element in node.elts)
    return False


def test_round_states_are_compared_as_members_not_strings() -> None:
    offenders = []
    for path, tree in _trees(("node",)):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            if any(_is_state_name(o) for o in operands) and any(_is_string(o) for o in operands):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not offenders, "compare with RoundState members, not names:\n" + "\n".join(offenders)


def test_the_checks_catch_what_they_are_for() -> None:
    """The two walks find a long function and a by-name comparison in a sample (so a broken walk
    cannot pass the real tree vacuously)."""
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    sample = ast.parse(f"class C:\n  def long(self):\n{long_body}\n\ndef short():\n    return 1\n")
    spans = {name: _span(f) for name, f in _qualified_functions(sample)}
    assert spans == {"C.long": MAX_LINES + 1, "short": 2}
    comparison = ast.parse('if info.state.name == "OPEN": pass').body[0]
    assert isinstance(comparison, ast.If) and isinstance(comparison.test, ast.Compare)
    assert _is_state_name(comparison.test.left) and _is_string(comparison.test.comparators[0])
    member = ast.parse("info.state == RoundState.OPEN").body[0]
    assert isinstance(member, ast.Expr) and isinstance(member.value, ast.Compare)
    assert not _is_state_name(member.value.left)
