"""Write one benchmark's section into docs/BENCHMARKS.md without touching the others.

Each benchmark owns the text between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`;
sections are kept in the order they were first written.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"
HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by its script (`python scripts/bench_*.py`); figures are ratios "
    "against a baseline measured in the same run, so they compare across machines.\n"
)


def machine_line() -> str:
    import torch

    return (
        f"{_dt.date.today().isoformat()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"
    )


def write_section(name: str, markdown: str, doc: Path = DOC) -> Path:
    """Replace (or append) the section NAME with `markdown`, atomically."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{markdown.rstrip()}\n{end}"
    text = doc.read_text() if doc.exists() else HEADER
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    tmp = doc.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, doc)
    return doc


def table(headers: list[str], rows: list[list[object]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
