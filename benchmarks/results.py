"""The one machine-readable line a benchmark prints per measured row, so that
run_all.py can gather every row into one table without parsing prose.

Convention: besides its human-readable lines, a script prints, for each row of
the issue's table it measures, one line

    RESULT {"row": "items-20k", "baseline": "8.54 s / 144 MiB", "ours": "9.66 s / 206 MiB",
            "ratio": "1.13x / 1.43x", "goal": "1.1x / 1.25x", "met": false}

(one JSON object after `RESULT `, on one line). `row` is the row's key (the
keys run_all.py expects are in its ROWS); `baseline`, `ours`, `ratio` and
`goal` are shown as given (strings or numbers); `met` is a bool. Any further
key (e.g. `"floor"`: the least the work requires, where a goal is missed for a
measured reason) is shown in a note under the table.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

PREFIX = "RESULT "


def result_line(row: str, baseline: Any, ours: Any, ratio: Any, goal: Any, met: bool, **extra: Any) -> str:
    """The RESULT line of one row (see the module's docstring)."""
    fields = {"row": row, "baseline": baseline, "ours": ours, "ratio": ratio, "goal": goal, "met": met}
    return PREFIX + json.dumps({**fields, **extra}, ensure_ascii=False)


def label(items: int) -> str:
    """2000 -> "2k": a size as the issue's rows name it (in row keys)."""
    return f"{items / 1000:g}k" if items >= 1000 else str(items)


def report(row: str, baseline: Any, ours: Any, ratio: Any, goal: Any, met: bool, **extra: Any) -> None:
    """Print the RESULT line of one row, flushed (run_all.py reads it as it comes)."""
    print(result_line(row, baseline, ours, ratio, goal, met, **extra), flush=True)


def parse(lines: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The rows of the RESULT lines among `lines`, by key (a later line for the
    same key wins); a line that is not one well-formed RESULT object is skipped."""
    rows: dict[str, dict[str, Any]] = {}
    for line in lines:
        if not line.startswith(PREFIX):
            continue
        try:
            row = json.loads(line[len(PREFIX) :])
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("row"), str) and isinstance(row.get("met"), bool):
            rows[row["row"]] = row
    return rows
