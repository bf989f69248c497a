"""The plugin's cost when unused: a plain one-test project, run with the plugin
installed versus with it disabled (`-p no:evalreplay`), side by side.

    python benchmarks/startup.py [--runs N] [--own-runs M]

Goal: the plugin's run within 1.05x of the run without it. The plugin's share
(a few ms of a ~0.4 s session) is far below the run-to-run noise of one
child's CPU on a shared machine, so two measurements:

- pairs: N interleaved pairs (which side goes first alternates), each child's
  own CPU time (user + system, from `os.wait4`); the verdict is the median of
  the pairs' ratios, printed with their quartiles and the ratio of the medians.
- own: M children run the session in-process with every hook the plugin
  registers timed (thread CPU), with pluggy's registration of its objects
  and the import of its entry point module;
  that sum over the session's CPU less it is the plugin's cost measured
  directly, free of the pairs' noise (printed as the RESULT line's `own`).

Children get scale_harness's environment: a private bytecode cache, so
neither side compiles its modules on every run (as in a normal install, even
where PYTHONDONTWRITEBYTECODE is set). Exits 1 when the goal is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import report
from scale_harness import PYTEST, run_child

GOAL = 1.05
PLUGINS = ("evalreplay", "evalreplay-session", "evalreplay-xdist")  # the names the plugin registers under

# The session in-process, with the plugin's own CPU counted: its entry point's
# import, the two hooks pluggy calls at registration (wrapped with their own
# signatures before pytest loads the module), and every hook implementation of
# the plugin's objects once registered (HookImpl.function, called positionally).
_OWN = """
import functools, inspect, resource, sys, time

import orjson
import pytest

PLUGINS = set(sys.argv[1].split(","))
spent = {}


def add(name, since):
    spent[name] = spent.get(name, 0.0) + time.thread_time() - since


start = time.thread_time()
import pytest_evalreplay.plugin.hooks as hooks
add("import", start)


def timed(name, fn):
    if inspect.isgeneratorfunction(fn):  # a hook wrapper: each step of it timed

        def step(*args):
            start = time.thread_time()
            try:
                gen = fn(*args)
                value = next(gen)
            finally:
                add(name, start)
            sent = yield value
            start = time.thread_time()
            try:
                gen.send(sent)
            except StopIteration as stop:
                return stop.value
            finally:
                add(name, start)

        return step

    def call(*args):
        start = time.thread_time()
        try:
            return fn(*args)
        finally:
            add(name, start)

    return call


# The two hooks pluggy calls at registration, wrapped before pytest loads the
# module (functools.wraps keeps each one's signature, which pluggy reads).
for hook in ("pytest_addhooks", "pytest_addoption"):
    setattr(hooks, hook, functools.wraps(getattr(hooks, hook))(timed(hook, getattr(hooks, hook))))
TIMED = {hooks.pytest_addhooks, hooks.pytest_addoption}


def timed_register(real):
    # pluggy's registration of the plugin's objects, less the hooks it calls (timed on their own)

    def register(plugin, name=None):
        if name not in PLUGINS:
            return real(plugin, name)
        start, inside = time.thread_time(), sum(spent.values())
        try:
            return real(plugin, name)
        finally:
            elapsed = time.thread_time() - start - (sum(spent.values()) - inside)
            spent["register"] = spent.get("register", 0.0) + elapsed

    return register


class Timer:
    def pytest_plugin_registered(self, plugin, plugin_name, manager):
        if plugin is self:  # registered first: every later registration goes through the wrapper
            manager.register = timed_register(manager.register)
        if plugin_name not in PLUGINS:
            return
        for name, caller in vars(manager.hook).items():
            for impl in getattr(caller, "get_hookimpls", list)():
                if impl.plugin is plugin and impl.function not in TIMED:
                    impl.function = timed(name, impl.function)
                    TIMED.add(impl.function)


code = pytest.main(sys.argv[2:], plugins=[Timer()])
usage = resource.getrusage(resource.RUSAGE_SELF)
with open("own.json", "wb") as out:
    out.write(orjson.dumps({"code": int(code), "spent": spent, "cpu": usage.ru_utime + usage.ru_stime}))
"""


def pairs(project: Path, runs: int) -> tuple[list[float], list[float]]:
    """CPU seconds of each run with the plugin and without, interleaved."""
    with_plugin: list[float] = []
    without: list[float] = []
    for n in range(runs):  # which goes first alternates: drifts hit both alike
        for disabled in (False, True) if n % 2 == 0 else (True, False):
            m = run_child(project, [*PYTEST, *(["-p", "no:evalreplay"] if disabled else [])])
            (without if disabled else with_plugin).append(m.cpu)
    return with_plugin, without


def own_cost(project: Path, runs: int) -> list[tuple[float, float, dict[str, float]]]:
    """(the plugin's own CPU, the session's CPU, by part) of each in-process run."""
    script = project.parent / "own_session.py"
    script.write_text(_OWN)
    out: list[tuple[float, float, dict[str, float]]] = []
    for _ in range(runs):
        run_child(project, [sys.executable, str(script), ",".join(PLUGINS), *PYTEST[3:]])
        doc = orjson.loads((project / "own.json").read_bytes())
        if doc["code"] != 0 or "pytest_configure" not in doc["spent"]:
            raise SystemExit(f"the in-process session did not run the plugin: {doc}")
        out.append((sum(doc["spent"].values()), doc["cpu"], doc["spent"]))
    return out


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="interleaved pairs (default 21)")
    parser.add_argument("--own-runs", type=int, default=9, help="in-process runs for `own` (default 9)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
        run_child(project, PYTEST)  # warm the file cache and the bytecode
        run_child(project, [*PYTEST, "-p", "no:evalreplay"])
        with_plugin, without = pairs(project, args.runs)
        own = own_cost(project, args.own_runs)
    ratios = [a / b for a, b in zip(with_plugin, without, strict=True)]
    ratio = statistics.median(ratios)
    lo, hi = quartiles(ratios)
    cpu_with, cpu_without = statistics.median(with_plugin), statistics.median(without)
    own_s = statistics.median(o for o, _, _ in own)
    session_s = statistics.median(c for _, c, _ in own)
    own_ratio = statistics.median(c / (c - o) for o, c, _ in own)
    parts = {name: statistics.median(p.get(name, 0.0) for _, _, p in own) for name in own[0][2]}
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:4]
    print(f"one-test project: {args.runs} interleaved pairs, CPU time of each child")
    print(
        f"  pairs: plugin {cpu_with:.3f} s, -p no:evalreplay {cpu_without:.3f} s (medians); "
        f"pair ratios median {ratio:.3f}x, quartiles {lo:.3f}-{hi:.3f}x, "
        f"range {min(ratios):.3f}-{max(ratios):.3f}x; ratio of medians {cpu_with / cpu_without:.3f}x"
    )
    print(
        f"  own  : the plugin's hooks, registration and entry point import {own_s * 1000:.1f} ms "
        f"of a {session_s:.3f} s "
        f"session (median of {args.own_runs} in-process runs) -> {own_ratio:.3f}x; largest: "
        + ", ".join(f"{name} {value * 1000:.1f} ms" for name, value in top)
    )
    ok = ratio <= GOAL
    print(f"  goal: CPU <= {GOAL}x (median pair ratio) -> {'met' if ok else 'MISSED'}")
    report(
        "startup",
        f"{cpu_without:.3f} s",
        f"{cpu_with:.3f} s",
        f"{ratio:.3f}x",
        f"{GOAL}x",
        ok,
        quartiles=f"{lo:.3f}-{hi:.3f}x",
        own=f"{own_ratio:.3f}x ({own_s * 1000:.1f} ms of {session_s:.3f} s, measured in-process)",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
