"""What the scale benchmarks share: throwaway projects (an eval suite with an
instant provider, and bare pytest's parametrized twin) and one way to run
pytest on them as a child process, measuring that child alone.

Each child's CPU time is the delta of `getrusage(RUSAGE_CHILDREN)` around it
(user + system, of the child and of whatever it reaped, e.g. xdist workers),
which the load of a shared machine disturbs less than wall time; its peak RSS
is `ru_maxrss` of that one child (from `os.wait4`). Children get a private
bytecode cache (`PYTHONPYCACHEPREFIX`), so runs compile nothing after the
warm-up even where the environment sets PYTHONDONTWRITEBYTECODE, as in a
normal install.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
BARE = ["-p", "no:evalreplay"]
PYCACHE = Path(tempfile.gettempdir()) / "evalreplay-bench-pycache"

CONFTEST = '''
from pytest_evalreplay import Generation


class Instant:
    """Answers at once: one short Generation per requested rollout."""

    kind = "instant"
    model = "instant-1"

    def generate(self, requests):
        return [[Generation(text="ok", finish_reason="stop") for _ in r.rollouts] for r in requests]


def pytest_evalreplay_make_provider(config, kind):
    return Instant() if kind == "instant" else None
'''

_BUSY = '''
import time

BUSY = {busy!r}


def busy():
    """Spend BUSY seconds of this thread's CPU time (load stretches the wall time, not the work)."""
    end = time.thread_time() + BUSY
    while time.thread_time() < end:
        pass
'''

_EVAL_HEAD = """
from pytest_evalreplay import EvalTask


def trivial(text, instance):
    {body}
    return float(int(instance["id"][1:]) % 2)

"""

_TASK = (
    'task{t} = EvalTask("task{t}", [{{"id": f"q{{i}}"}} for i in range({n})], '
    'prompt="Question {{id}}", scorer=trivial)\n'
)

_BARE = """
import pytest


@pytest.mark.parametrize("i", range({n}))
def test_noop(i):
    {body}
"""


@dataclass(frozen=True)
class Measure:
    cpu: float  # seconds, user + system
    wall: float  # seconds
    maxrss_mib: float  # peak resident set of the child
    output: str


_SERVED = """

class Served(Instant):
    \"\"\"A served model: {wait!r} s of wall time per request (the server's, not this process's CPU).\"\"\"

    def generate(self, requests):
        import time

        time.sleep({wait!r} * len(requests))
        return super().generate(requests)


def pytest_evalreplay_make_provider(config, kind):
    return {{"instant": Instant, "served": Served}}.get(kind, lambda: None)()
"""


def eval_project(root: Path, items: int, tasks: int = 1, busy_ms: float = 0.0, wait_ms: float = 0.0) -> Path:
    """A project of `tasks` EvalTasks with `items` items in all (one rollout per
    instance), the instant provider in its conftest; a scorer that returns 0 or 1
    (by instance, so the metric's interval is computed as in a real eval), after
    `busy_ms` ms of CPU when asked. With `wait_ms`, also the provider kind
    `served`: the instant one after `wait_ms` ms of wall time per request."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "conftest.py").write_text(CONFTEST + (_SERVED.format(wait=wait_ms / 1000) if wait_ms else ""))
    source = (_BUSY.format(busy=busy_ms / 1000) if busy_ms else "") + _EVAL_HEAD.format(
        body="busy()" if busy_ms else "pass"
    )
    per_task = [items // tasks + (1 if t < items % tasks else 0) for t in range(tasks)]
    source += "".join(_TASK.format(t=t, n=n) for t, n in enumerate(per_task))
    (root / "test_evals.py").write_text(source)
    return root


def bare_project(root: Path, items: int, busy_ms: float = 0.0) -> Path:
    """Bare pytest's twin: one test parametrized `items` times (no conftest)."""
    root.mkdir(parents=True, exist_ok=True)
    source = (_BUSY.format(busy=busy_ms / 1000) if busy_ms else "") + _BARE.format(
        n=items, body="busy()" if busy_ms else "pass"
    )
    (root / "test_bare.py").write_text(source)
    return root


def eval_args(output: Path) -> list[str]:
    return ["--evalreplay-provider=instant", f"--evalreplay-output={output}"]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def run_pytest(
    project: Path, args: Sequence[str], expect: Sequence[int] = (0,), env: dict[str, str] | None = None
) -> Measure:
    """Run `python -m pytest -q -p no:cacheprovider -p no:randomly ARGS` in
    `project`; raise SystemExit with its output if it exits otherwise than `expect`."""
    return run_child(project, [*PYTEST, *args], expect, env)


def run_child(
    project: Path, argv: Sequence[str], expect: Sequence[int] = (0,), env: dict[str, str] | None = None
) -> Measure:
    """Run `argv` in `project` (with `env` added to the children's environment),
    measured as `run_pytest` measures pytest."""
    with tempfile.TemporaryFile() as log:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=project, stdout=log, stderr=subprocess.STDOUT, env={**child_env(), **(env or {})}
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read().decode(errors="replace")
    if proc.returncode not in expect:
        raise SystemExit(f"{' '.join(argv)} in {project} exited {proc.returncode}:\n{output[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measure(cpu=cpu, wall=wall, maxrss_mib=usage.ru_maxrss / 1024, output=output)


def expect_in(measure: Measure, text: str) -> None:
    """Check that a run did what the benchmark meant it to (generated, reused...)."""
    if text not in measure.output:
        raise SystemExit(f"expected {text!r} in the output of a run:\n{measure.output[-4000:]}")


def warm_up(tmp: Path, xdist: bool = False) -> None:
    """Fill the bytecode cache and the file cache: a tiny run of each kind."""
    project = eval_project(tmp / "warm-eval", 8, tasks=2)
    bare = bare_project(tmp / "warm-bare", 8)
    extra = [["-n", "2"]] if xdist else []
    for more in [[], *extra]:
        run_pytest(project, [*eval_args(tmp / "warm-out"), *more])
        run_pytest(bare, [*BARE, *more])


@dataclass(frozen=True)
class Compared:
    """Medians of paired runs (a: the subject, b: its baseline) and their ratios."""

    a: list[Measure]
    b: list[Measure]

    def median(self, side: str, field: str) -> float:
        return statistics.median(getattr(m, field) for m in getattr(self, side))

    def ratio(self, field: str) -> float:
        return self.median("a", field) / self.median("b", field)

    def pair_range(self, field: str) -> tuple[float, float]:
        ratios = [getattr(x, field) / getattr(y, field) for x, y in zip(self.a, self.b, strict=True)]
        return min(ratios), max(ratios)

    def line(self, field: str, label: str, unit: str, a_name: str, b_name: str) -> str:
        lo, hi = self.pair_range(field)
        spread = f" (pairs {lo:.2f}-{hi:.2f})" if len(self.a) > 1 else ""
        return (
            f"  {label:<9}: {a_name} {self.median('a', field):8.2f} {unit}, {b_name} "
            f"{self.median('b', field):8.2f} {unit} -> {self.ratio(field):.3f}x{spread}"
        )


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"
