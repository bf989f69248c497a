"""`Gate`: the bound a task's gate item checks (numbers/gates.py decides it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytest_evalreplay.model import EvalReplayError, is_real


@dataclass(frozen=True)
class Gate:
    """Fail the task's gate item when `metric` is below `min`, or has dropped
    more than `max_drop` below the baseline with significance `alpha`."""

    metric: str
    min: float | None = None
    max_drop: float | None = None
    alpha: float = 0.05

    def __post_init__(self) -> None:
        __tracebackhide__ = True  # a bad argument is reported at the user's Gate(...) line
        if not isinstance(self.metric, str) or not self.metric:
            raise EvalReplayError("Gate(metric=...) must name a metric, e.g. Gate('exact_match', min=0.6)")
        for name in ("min", "max_drop", "alpha"):
            value = getattr(self, name)
            if value is None and name != "alpha":
                continue
            if not is_real(value) or not math.isfinite(value):
                raise EvalReplayError(f"Gate({name}={value!r}) must be a finite number")
        if not 0 < self.alpha < 0.5:
            raise EvalReplayError(
                f"Gate(alpha={self.alpha!r}) must be between 0 and 0.5: "
                "the level of a one-sided test, e.g. 0.05"
            )
        if self.max_drop is not None and self.max_drop < 0:
            raise EvalReplayError(f"Gate(max_drop={self.max_drop!r}) must be >= 0")
        if self.min is None and self.max_drop is None:
            raise EvalReplayError(
                f"Gate({self.metric!r}) has no bound: give min=... (fail below it), max_drop=... "
                "(fail on a significant drop from the baseline) or both; to gate on failed items "
                "alone, give a min no score is below, e.g. min=0 for scores in [0, 1]"
            )
