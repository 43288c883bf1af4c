"""The end-to-end swarms share one pytest-xdist group, so `./run test -n 2 --dist loadgroup` runs
them one at a time on one worker: two swarms of peer processes at once on a 2-core machine would
make each other's round windows the thing under test."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.xdist_group("e2e"))
