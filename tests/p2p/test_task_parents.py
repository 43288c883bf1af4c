"""py-libp2p's task-parent lookup by table (p2p/task_parents.py) answers what its walk over the
task tree answers: for tasks at several depths of two services (each asked of both managers) and
for a trio task that no service runs."""

from __future__ import annotations

from typing import Any

import trio
from libp2p.tools.anyio_service import Service, background_trio_service
from libp2p.tools.anyio_service.trio_tasks import FunctionTask

import p2p.host  # noqa: F401  (installs the table)
from p2p import task_parents


def walked(manager: Any, trio_task: trio.lowlevel.Task) -> Any:
    """py-libp2p's own `_find_parent_task`: the walk over every task of the manager."""
    return next(
        (t for t in FunctionTask.iterate_tasks(*manager._root_tasks) if t.has_trio_task and t.trio_task is trio_task),
        None,
    )


class Nested(Service):
    """Tasks that start tasks, three deep; each records what both lookups say in it, for each manager."""

    def __init__(self) -> None:
        self.others: list[Any] = []  # the other services' managers: a task of ours is none of theirs
        self.answers: list[tuple[Any, Any]] = []
        self.wired = trio.Event()  # `others` is set
        self.release = trio.Event()

    async def run(self) -> None:
        self.manager.run_task(self.level, 0)
        await self.release.wait()

    async def level(self, depth: int) -> None:
        if depth < 3:
            for _ in range(2):
                self.manager.run_task(self.level, depth + 1)
        await self.wired.wait()
        self.record()
        await self.release.wait()

    def record(self) -> None:
        current = trio.lowlevel.current_task()
        for manager in (self.manager, *self.others):
            self.answers.append((manager._find_parent_task(current), walked(manager, current)))


def test_the_table_answers_what_the_walk_answers():
    assert FunctionTask.__dict__["trio_task"].fset is task_parents._set_trio_task  # installed

    async def main():
        first, second = Nested(), Nested()
        async with background_trio_service(first), background_trio_service(second):
            first.others, second.others = [second.manager], [first.manager]
            first.wired.set()
            second.wired.set()
            with trio.fail_after(10):
                while len(first.answers) < 2 * 15 or len(second.answers) < 2 * 15:
                    await trio.sleep(0.01)
            outside = trio.lowlevel.current_task()  # a trio task no service runs
            for service in (first, second):
                assert service.manager._find_parent_task(outside) is walked(service.manager, outside) is None
                service.release.set()
        for service in (first, second):
            found = [table for table, walk in service.answers if table is not None]
            assert all(table is walk for table, walk in service.answers)
            assert len(found) == 15  # each of the 15 tasks found by its own manager only
            assert len({id(t) for t in found}) == 15

    trio.run(main)
