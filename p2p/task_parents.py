"""The parent lookup of py-libp2p 0.8.1's service manager, by a table instead of a walk.

Every task a py-libp2p service starts (`TrioManager.run_task`) is filed under the task that started
it, which `TrioManager._find_parent_task` finds by walking every task the manager runs (a recursive
generator over its whole task tree) until one runs in the current trio task. Pubsub starts a task
per gossip RPC it reads (`Pubsub.continuously_read_stream` -> `run_task(push_msg)`), so each RPC
read costs a walk over all the peer's streams' tasks: in a 16-peer swarm's round profile (py-spy,
GIL holder) the walk was 4% of a peer's CPU, a quarter of all of pubsub's reading (docs/P2P.md,
"Protocol CPU per round").

`install()` keeps a table from each trio task to the `FunctionTask` running in it (filled where
py-libp2p sets `FunctionTask.trio_task`, which it does once, first thing in `FunctionTask.run`; weak
keys, so a finished task leaves it) and answers `_find_parent_task` from it. The answer is the walk's:
the task found counts only if the walk would reach it, i.e. each task on its way up is still among
its parent's children and the top one is among the manager's root tasks; otherwise None (a new root
task), as the walk says. The library is not edited: two class attributes are replaced."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import trio
from libp2p.tools.anyio_service import trio_manager as _manager
from libp2p.tools.anyio_service import trio_tasks as _tasks

_BY_TRIO_TASK: weakref.WeakKeyDictionary[trio.lowlevel.Task, Any] = weakref.WeakKeyDictionary()
_trio_task_property: property = _tasks.FunctionTask.__dict__["trio_task"]  # py-libp2p's, before install()
_set_by_py_libp2p: Callable[[Any, trio.lowlevel.Task], None] = _trio_task_property.fset  # type: ignore[assignment]


def _set_trio_task(self: Any, value: trio.lowlevel.Task) -> None:
    _set_by_py_libp2p(self, value)  # py-libp2p's setter: refuses a second one
    _BY_TRIO_TASK[value] = self


def find_parent_task(self: Any, trio_task: trio.lowlevel.Task) -> Any:
    """`TrioManager._find_parent_task`: the FunctionTask of this manager running in `trio_task`, or None."""
    task = _BY_TRIO_TASK.get(trio_task)
    if task is None:
        return None
    node = task
    while node.parent is not None:
        if node not in node.parent.children:  # no longer in the tree: the walk would not reach it
            return None
        node = node.parent
    return task if node in self._root_tasks else None


def install() -> None:
    """Point py-libp2p's TrioManager and FunctionTask at the table (idempotent)."""
    if _tasks.FunctionTask.__dict__["trio_task"].fset is not _set_trio_task:
        _tasks.FunctionTask.trio_task = _trio_task_property.setter(_set_trio_task)  # type: ignore[method-assign, assignment]
    _manager.TrioManager._find_parent_task = find_parent_task  # type: ignore[method-assign]
