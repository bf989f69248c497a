"""The plugin's cost when unused: a plain one-test project, run with the plugin
installed versus with it disabled (`-p no:evalreplay`), side by side.

    python benchmarks/startup.py [--runs N]

Goal: the plugin's run within 1.05x of the run without it. Reported as the
median ratio of CPU time (user + system of the pytest process, which the
load of a shared machine disturbs less than wall time), and of wall time.
Children get scale_harness's environment: a private bytecode cache, so
neither side compiles its modules on every run (as in a normal install, even
where PYTHONDONTWRITEBYTECODE is set);
also its RESULT line (benchmarks/results.py). Exits 1 when the goal is missed.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import report
from scale_harness import child_env

GOAL = 1.05


def run_once(project: Path, disabled: bool) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    if disabled:
        cmd += ["-p", "no:evalreplay"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=child_env())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"pytest failed:\n{result.stdout}\n{result.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
        run_once(project, False)  # warm the file cache and the bytecode
        run_once(project, True)
        with_plugin: list[tuple[float, float]] = []
        without: list[tuple[float, float]] = []
        for n in range(args.runs):  # interleaved, and which goes first alternates: drifts hit both alike
            for disabled in (False, True) if n % 2 == 0 else (True, False):
                (without if disabled else with_plugin).append(run_once(project, disabled))
    cpu_with = statistics.median(c for c, _ in with_plugin)
    cpu_without = statistics.median(c for c, _ in without)
    wall_with = statistics.median(w for _, w in with_plugin)
    wall_without = statistics.median(w for _, w in without)
    print(f"one-test project, median of {args.runs} runs each")
    print(
        f"  CPU time : plugin {cpu_with:.3f} s, -p no:evalreplay {cpu_without:.3f} s"
        f" -> {cpu_with / cpu_without:.3f}x"
    )
    print(
        f"  wall time: plugin {wall_with:.3f} s, -p no:evalreplay {wall_without:.3f} s"
        f" -> {wall_with / wall_without:.3f}x"
    )
    ok = cpu_with / cpu_without <= GOAL
    print(f"  goal: CPU <= {GOAL}x -> {'met' if ok else 'MISSED'}")
    report(
        "startup",
        f"{cpu_without:.3f} s",
        f"{cpu_with:.3f} s",
        f"{cpu_with / cpu_without:.3f}x",
        f"{GOAL}x",
        ok,
        wall=f"{wall_with / wall_without:.3f}x",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
