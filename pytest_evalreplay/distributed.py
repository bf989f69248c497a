"""pytest-xdist scheduling: keep each task's items on one worker.

The first item of a task to run generates the batch for all of the task's
items, so splitting a task across workers would generate it twice. Under
`-n N` (xdist's `load` mode) the plugin swaps in a scheduler that sends each
task whole to one worker and spreads every other test one by one, as `load`
does. Tasks still run in parallel with each other.
"""

from __future__ import annotations

import re
from typing import Any

from xdist.scheduler import LoadScopeScheduling

# <file>::<task>::<instance>[s<stage>-r<rollout>] and <file>::<task>::gate: the
# scope is <file>::<task>, so a task's gate runs on the worker that ran the task.
_EVAL_ITEM = re.compile(r"^(?P<scope>.+::[A-Za-z0-9_.-]+)::(?:[^:]+\[s\d+-r\d+\]|gate)$")


def scope_of(nodeid: str) -> str:
    match = _EVAL_ITEM.match(nodeid)
    return match.group("scope") if match else nodeid


class TaskScheduling(LoadScopeScheduling):
    """`load` scheduling, except that an eval task's items travel together."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def make_scheduler(config: Any, log: Any) -> TaskScheduling | None:
    if config.getvalue("dist") != "load":
        return None  # loadscope and loadgroup keep tasks together already; an explicit choice stands
    return TaskScheduling(config, log)
