"""The files a run leaves: metrics as JSON Lines (one JSON object per line, each line flushed
and fsynced when written, so a crash or Ctrl-C loses no finished record) and JSON documents
replaced atomically (a reader never sees half a status or summary file)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class MetricsWriter:
    """Append records to a JSONL file. Use as a context manager, or call `close()`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        if self._file.closed:
            raise ValueError(f"metrics file {self.path} is closed")
        # allow_nan=False: NaN/inf are not JSON; a record holding one is a bug to surface now.
        line = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a metrics file. A last line cut short by a crash is ignored; a bad line
    anywhere else is an error naming its line number."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):  # unterminated final line: a write interrupted mid-way
                break
            raise ValueError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
    return records


def write_json_atomic(path: Path, obj: object) -> None:
    """Write `obj` as JSON to `path` through a temporary file and a rename: all or nothing."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
