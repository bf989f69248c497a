"""Harness CPU per request of `EvalTask.from_lm_eval` vs lm-evaluation-harness's
own run of the same task (`lm_eval --model local-completions`), both against
one instant OpenAI-compatible stub (tests/http_stub.py, in this process, so
its CPU is not counted), in child processes.

    python benchmarks/lm_eval_overhead.py             # 200 and 1,000 documents, 3 rounds
    python benchmarks/lm_eval_overhead.py --quick     # 100 and 400 documents, 1 round
    python benchmarks/lm_eval_overhead.py --runs 5    # steadier medians
    python benchmarks/lm_eval_overhead.py --task tiny_ppl   # loglikelihood_rolling

The task is tests/lm_eval_tasks.py's `arith`: generate_until, two few-shot
examples, two regex filters, exact_match; or with `--task tiny_ppl` its
loglikelihood_rolling task (texts of 3-30 words, a context of 8 tokens, so
most texts are cut into several windows: lm-eval asks one echo per window
and the server's tokenizer once per text, ours one echo per text after
the same tokenizer call). Each round runs both harnesses at
both sizes, in alternating order; the CPU per request is the slope between
the sizes (user + system of the child), so each harness's start-up (lm-eval
imports and indexes its tasks for seconds) drops out; the start-up is
reported beside it. Goal (issue #32): lm-eval's CPU per request at least 2x
ours. Needs lm-eval[api] installed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from http_stub import StubServer  # noqa: E402
from lm_eval_tasks import lm_eval_command, lm_eval_env, write_arith, write_tiny_ppl  # noqa: E402

GOAL = 2.0
PLUGIN = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
MODULE = 'from pytest_evalreplay import EvalTask\n{0} = EvalTask.from_lm_eval("{0}", include_path="tasks/")\n'
CONTEXT = 8  # tiny_ppl's model context (the stub's max_model_len, lm-eval's max_length)


def child_cpu(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    """The child's user + system CPU seconds; exits with its output if it fails."""
    with tempfile.TemporaryFile() as log:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        proc.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            log.seek(0)
            raise SystemExit(
                f"{' '.join(cmd[:6])} ... exited {proc.returncode}:\n{log.read().decode()[-4000:]}"
            )
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def env_for(project: Path) -> dict[str, str]:
    env = lm_eval_env(project / "hf")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an editable install recompiles every run otherwise
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_ours(project: Path, stub: StubServer, n: int, task: str) -> float:
    out = project / f"run-{time.monotonic_ns()}"
    cmd = [
        *PLUGIN,
        "test_lm.py",
        "--evalreplay-provider=openai",
        "--evalreplay-model=stub-model",
        f"--evalreplay-base-url={stub.url}",
        f"--evalreplay-output={out}",
    ]
    before = stub.answered
    cpu = child_cpu(cmd, project, env_for(project))
    assert stub.answered - before == n, (stub.answered - before, n)  # one answer per document
    return cpu


def run_theirs(project: Path, stub: StubServer, n: int, task: str) -> float:
    out = project / f"lm-eval-out-{time.monotonic_ns()}"
    before = stub.answered
    extra = f",max_length={CONTEXT}" if task == "tiny_ppl" else ""
    command = lm_eval_command(task, project / "tasks", out, stub.url, extra=extra)
    cpu = child_cpu(command, project, env_for(project))
    asked = stub.answered - before
    assert asked == n if task == "arith" else asked >= n, (asked, n)  # rolling: one answer per window
    return cpu


def project_of(tmp: Path, n: int, task: str) -> Path:
    project = tmp / f"p{n}"
    if task == "arith":
        write_arith(project / "tasks", n=n)
    else:
        write_tiny_ppl(project / "tasks", n=n, words=(3, 30))
    (project / "test_lm.py").write_text(MODULE.format(task), encoding="utf-8")
    return project


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 and 400 documents, 1 round")
    parser.add_argument("--sizes", type=int, nargs=2, default=None, metavar=("SMALL", "LARGE"))
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--task", choices=("arith", "tiny_ppl"), default="arith")
    args = parser.parse_args(argv)
    small, large = args.sizes or ((100, 400) if args.quick else (200, 1000))
    runs = args.runs or (1 if args.quick else 3)
    slopes: dict[str, list[float]] = {"ours": [], "lm-eval": []}
    starts: dict[str, list[float]] = {"ours": [], "lm-eval": []}
    with tempfile.TemporaryDirectory() as tmp_name, StubServer("stub-model") as stub:
        tmp = Path(tmp_name)
        if args.task == "tiny_ppl":
            stub.bos, stub.eos, stub.max_model_len = True, "</s>", CONTEXT
        projects = {n: project_of(tmp, n, args.task) for n in (small, large)}
        sides = {"ours": run_ours, "lm-eval": run_theirs}
        for run in sides.values():  # warm the file and bytecode caches
            run(projects[small], stub, small, args.task)
        for r in range(runs):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            cpu: dict[tuple[str, int], float] = {}
            for n in (small, large) if r % 2 == 0 else (large, small):
                for side in order:
                    cpu[side, n] = sides[side](projects[n], stub, n, args.task)
            for side in sides:
                slope = (cpu[side, large] - cpu[side, small]) / (large - small)
                slopes[side].append(slope)
                starts[side].append(cpu[side, small] - slope * small)
            print(
                f"round {r + 1}: ours {cpu['ours', small]:.2f} / {cpu['ours', large]:.2f} s, "
                f"lm-eval {cpu['lm-eval', small]:.2f} / {cpu['lm-eval', large]:.2f} s CPU "
                f"({small} / {large} documents)",
                flush=True,
            )
    ours, theirs = statistics.median(slopes["ours"]), statistics.median(slopes["lm-eval"])
    ratio = theirs / ours
    per_round = ", ".join(f"{t / o:.2f}x" for o, t in zip(slopes["ours"], slopes["lm-eval"], strict=True))
    print(
        f"{args.task}: CPU per request (median of {runs}): from_lm_eval {ours * 1e3:.2f} ms, "
        f"lm_eval {theirs * 1e3:.2f} ms -> lm-eval/ours {ratio:.2f}x (rounds: {per_round})"
    )
    print(
        f"start-up CPU (intercept): from_lm_eval {statistics.median(starts['ours']):.2f} s, "
        f"lm_eval {statistics.median(starts['lm-eval']):.2f} s"
    )
    met = ratio >= GOAL
    print(f"goal: at least {GOAL:.1f}x faster per request -> {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
