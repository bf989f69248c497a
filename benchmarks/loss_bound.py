"""What a SIGKILL costs, and what writing every answer before its
connection sends the next costs: the plugin's openai provider against a
local OpenAI-compatible server (tests/http_stub.py, in this process,
127.0.0.1 only), at concurrency 8, today's code side by side with a baseline
commit (by default 2e18c93, where a connection went on to its next request
while its answer still waited to be journaled), run from a `git worktree`
through PYTHONPATH.

    python benchmarks/loss_bound.py            # 3 kills at 1,000 of 2,000, 3 throughput pairs
    python benchmarks/loss_bound.py --quick    # 1 kill at 200 of 400, 1 pair
    python benchmarks/loss_bound.py --quick --no-throughput   # the kill only (run_all.py)

1. Loss bound: a task of 2,000 instances; the server answers each after
   0.05-0.35 s (a steady stream, about 40 answers a second at concurrency
   8); the run is SIGKILLed once the server has answered 1,000 of them,
   then `--resume` runs. Re-asked: the requests the resumed run sends for
   prompts the server had answered before the kill. Goal (issue #34): the
   median over the kills no more than lm-eval's per-answer cache loses
   (`--use_cache`, median 3 at the same point, as the issue measured it),
   and never more than the concurrency.
2. Throughput: an uninterrupted run of 2,000 instances against an instant
   server, old and new runs interleaved. Goal: new throughput >= 0.95x the
   baseline's (medians; CPU time of the pytest process, wall time shown too).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from http_stub import Staggered, StubServer  # noqa: E402
from results import report  # noqa: E402

BASELINE = "2e18c93"
CONCURRENCY = 8
LM_EVAL_MEDIAN = 3  # answers lm-eval --use_cache asks again after the same kill (issue #34)
THROUGHPUT_GOAL = 0.95
LOSS_N = 2_000
QUICK_N = 400
THROUGHPUT_N = 2_000
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]

EVALS = """
from pytest_evalreplay import EvalTask
t = EvalTask("t", [{{"id": f"q{{n:05d}}"}} for n in range({n})], prompt="Q {{id}}",
             scorer=lambda text, i: float(text.startswith("Q")), sampling={{"max_tokens": 8}})
"""


@dataclass(frozen=True)
class Code:
    """One version of the plugin: its name and the PYTHONPATH that selects it."""

    name: str
    pythonpath: str | None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
        if self.pythonpath is not None:
            env["PYTHONPATH"] = self.pythonpath
        return env

    def check(self) -> None:
        """Fail early when PYTHONPATH does not select this version."""
        where = subprocess.run(
            [sys.executable, "-c", "import pytest_evalreplay; print(pytest_evalreplay.__file__)"],
            env=self.env(),
            cwd=tempfile.gettempdir(),  # as the runs, not from this checkout
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        want = Path(self.pythonpath or ROOT) / "pytest_evalreplay" / "__init__.py"
        if Path(where) != want:
            raise SystemExit(f"{self.name}: imports {where}, expected {want}")


def quiet(stub: StubServer) -> StubServer:
    """The killed run's connections reset in the server's threads: no traceback for each."""
    assert stub._server is not None
    stub._server.handle_error = lambda request, address: None  # type: ignore[method-assign]
    return stub


def command(url: str, *args: str) -> list[str]:
    return [
        *PYTEST,
        "--evalreplay-provider=openai",
        f"--evalreplay-base-url={url}",
        "--evalreplay-model=stub-model",
        "--evalreplay-output=out",
        f"--evalreplay-concurrency={CONCURRENCY}",
        *args,
    ]


def project(root: Path, n: int) -> Path:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    (root / "test_evals.py").write_text(EVALS.format(n=n))
    return root


def journaled(root: Path) -> int:
    import orjson

    path = root / "out" / "t-journal.jsonl"
    lines = path.read_bytes().split(b"\n")[:-1] if path.exists() else []
    rows = [orjson.loads(line) for line in lines if line.strip()]
    return len({r["instance_id"] for r in rows if r.get("type") == "gen"})


def reasked_after_kill(code: Code, root: Path, n: int, kill_at: int) -> tuple[int, int]:
    """(answered before the kill, asked again by --resume) for one kill."""
    project(root, n)
    with StubServer("stub-model") as stub:
        quiet(stub)
        stub.default = Staggered(low=0.05, high=0.35)
        proc = subprocess.Popen(
            command(stub.url), cwd=root, env=code.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            reached = stub.wait_until(lambda s: s.answered >= kill_at or proc.poll() is not None, 120)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
        if not reached or proc.returncode != -signal.SIGKILL:
            raise SystemExit(f"{code.name}: the run ended before the kill at {kill_at}")
        if not stub.settle():  # the killed run's last requests, read late, are not the resume's
            raise SystemExit(f"{code.name}: the stub still had the killed run's requests after a minute")
        before = set(stub.prompts("answered"))
        mark = len(stub.events)
        result = subprocess.run(
            command(stub.url, "--resume"),
            cwd=root,
            env=code.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise SystemExit(f"{code.name}: --resume exited {result.returncode}:\n{result.stdout[-3000:]}")
        with stub._cond:
            asked = [e["prompt"] for e in stub.events[mark:] if e["event"] == "received"]
    if journaled(root) != n:
        raise SystemExit(f"{code.name}: the resumed journal holds {journaled(root)} of {n} instances")
    return len(before), sum(1 for p in asked if p in before)


@dataclass(frozen=True)
class Measure:
    cpu: float  # seconds, user + system of the pytest process
    wall: float


def timed_run(code: Code, root: Path, url: str) -> Measure:
    project(root, THROUGHPUT_N)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        command(url), cwd=root, env=code.env(), capture_output=True, text=True, timeout=300
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0 or journaled(root) != THROUGHPUT_N:
        raise SystemExit(f"{code.name}: run exited {result.returncode}:\n{result.stdout[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measure(cpu=cpu, wall=wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 kill at 200 of 400, 1 throughput pair")
    parser.add_argument("--runs", type=int, default=None, help="throughput pairs (default 3)")
    parser.add_argument("--kills", type=int, default=None, help="kills per side (default 3)")
    parser.add_argument("--baseline", default=BASELINE, help="the commit to compare with")
    parser.add_argument(
        "--no-throughput", action="store_true", help="the kills only (run_all.py's row), no throughput pairs"
    )
    args = parser.parse_args(argv)
    runs = 0 if args.no_throughput else args.runs or (1 if args.quick else 3)
    n = QUICK_N if args.quick else LOSS_N
    kills = [n // 2] * (args.kills or (1 if args.quick else 3))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evalreplay-loss-") as name:
        tmp = Path(name)
        worktree = tmp / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(worktree), args.baseline],
            check=True,
        )
        try:
            new, old = Code("new", str(ROOT)), Code(f"old ({args.baseline})", str(worktree))
            for code in (new, old):
                code.check()
            loss: dict[str, list[tuple[int, int, int]]] = {new.name: [], old.name: []}
            for k in kills:
                for code in (new, old):
                    answered, reasked = reasked_after_kill(code, tmp / "loss", n, k)
                    loss[code.name].append((k, answered, reasked))
            times: dict[str, list[Measure]] = {new.name: [], old.name: []}
            if runs:
                with StubServer("stub-model") as stub:
                    timed_run(new, tmp / "warm", stub.url)  # fills the bytecode and file caches
                    timed_run(old, tmp / "warm", stub.url)
                    for i in range(runs):
                        for code in (new, old) if i % 2 == 0 else (old, new):
                            times[code.name].append(timed_run(code, tmp / "tp", stub.url))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False
            )

    print(f"loss bound: {n:,} instances, concurrency {CONCURRENCY}, SIGKILL after K answers, then --resume")
    print(f"  {'code':<14} {'K':>4} {'answered':>9} {'re-asked':>9}")
    for code_name, rows in loss.items():
        for k, answered, reasked in rows:
            print(f"  {code_name:<14} {k:>4} {answered:>9} {reasked:>9}")
    for code_name, rows in loss.items():
        reasked = [r for _, _, r in rows]
        print(f"  {code_name:<14} re-asked median {statistics.median(reasked):g}, max {max(reasked)}")
    new_reasked = [r for _, _, r in loss[new.name]]
    loss_ok = statistics.median(new_reasked) <= LM_EVAL_MEDIAN and max(new_reasked) <= CONCURRENCY
    print(
        f"  goal: median re-asked <= lm-eval --use_cache's ({LM_EVAL_MEDIAN}), max <= concurrency "
        f"({CONCURRENCY}) -> {'met' if loss_ok else 'MISSED'}"
    )
    report(
        "kill-reasked",
        f"{LM_EVAL_MEDIAN} (lm-eval --use_cache)",
        f"median {statistics.median(new_reasked):g} of {new_reasked}",
        "",
        f"<= {LM_EVAL_MEDIAN}",
        loss_ok,
        at=f"{n:,} instances, concurrency {CONCURRENCY}",
    )
    if not runs:
        print(f"benchmark took {time.perf_counter() - started:.0f} s")
        return 0 if loss_ok else 1

    med = {
        c: (statistics.median(m.cpu for m in ms), statistics.median(m.wall for m in ms))
        for c, ms in times.items()
    }
    print(
        f"throughput: {THROUGHPUT_N:,} instances, instant server, median of {runs} run(s) each, interleaved"
    )
    for code_name, (cpu, wall) in med.items():
        print(
            f"  {code_name:<14} CPU {cpu:6.2f} s ({cpu / THROUGHPUT_N * 1000:.2f} ms/sample), "
            f"wall {wall:6.2f} s ({THROUGHPUT_N / wall:,.0f} samples/s)"
        )
    cpu_ratio = med[old.name][0] / med[new.name][0]
    wall_ratio = med[old.name][1] / med[new.name][1]
    pairs = [o.cpu / n.cpu for n, o in zip(times[new.name], times[old.name], strict=True)]
    tp_ok = cpu_ratio >= THROUGHPUT_GOAL
    print(
        f"  new throughput / old: CPU {cpu_ratio:.3f}x (pairs {min(pairs):.2f}-{max(pairs):.2f}), "
        f"wall {wall_ratio:.3f}x; "
        f"goal CPU >= {THROUGHPUT_GOAL}x -> {'met' if tp_ok else 'MISSED'}"
    )
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if loss_ok and tp_ok else 1


if __name__ == "__main__":
    sys.exit(main())
