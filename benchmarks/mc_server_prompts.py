"""Prompts the server's model processes for a multiple-choice task through
the openai provider, against lm-evaluation-harness's `local-completions`
model on the same questions: both against one counting OpenAI-compatible
stub (tests/http_stub.py, in this process, 127.0.0.1 only).

    python benchmarks/mc_server_prompts.py             # 500 questions x 4 choices
    python benchmarks/mc_server_prompts.py --quick     # 100 questions x 4 choices

A prompt is one entry of a completions body's `prompt` (a text, or token
ids): what the model runs a forward pass over. `/tokenize` calls are
counted beside them (no forward pass; lm-eval's remote tokenizer makes them
too). Ours is run twice: against the stub as `vllm serve` is (with
`/tokenize`), and against one without it (each context echoed alone, as the
provider did before it asked `/tokenize`). Goal (issue #34): ours no more
than lm-eval's. lm-eval's side needs lm-eval[api]; without it only ours is
shown and the goal is not judged.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from http_stub import StubServer  # noqa: E402
from lm_eval_tasks import TINY_MC, WORDS, lm_eval_command, lm_eval_env  # noqa: E402
from results import report  # noqa: E402

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
MODULE = """
from pytest_evalreplay import EvalTask
mc = EvalTask("mc", "{data}", prompt="Question: {{question}}\\nAnswer:",
              choices="choices", target="gold")
"""


def write_questions(folder: Path, n: int) -> Path:
    """`n` questions of 4 one-word choices each, and lm-eval's YAML over them."""
    rows = [
        {"id": f"q{i}", "question": f"Which word {i}?", "choices": WORDS[i % 8 : i % 8 + 4], "gold": i % 4}
        for i in range(n)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / "mc.yaml").write_text(TINY_MC.format(test=data, name="mc"), encoding="utf-8")
    return data


def prompts_in(body: dict[str, Any]) -> int:
    """How many prompts one completions body asks the model to run."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def counted(stub: StubServer, run: Any) -> tuple[int, int, int]:
    """(prompts, completions calls, /tokenize calls) that `run()` made the stub serve."""
    calls, tokenized = len(stub.requests), stub.tokenized
    run()
    bodies = [body for path, _, body in stub.requests[calls:] if path.endswith("/completions")]
    return sum(prompts_in(b) for b in bodies), len(bodies), stub.tokenized - tokenized


def run_ours(project: Path, stub: StubServer) -> None:
    out = project / f"run-{time.monotonic_ns()}"
    cmd = [
        *PYTEST,
        "test_mc.py",
        "--evalreplay-provider=openai",
        "--evalreplay-model=stub-model",
        f"--evalreplay-base-url={stub.url}",
        f"--evalreplay-output={out}",
    ]
    env = lm_eval_env(project / "hf")
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"ours exited {done.returncode}:\n{done.stdout[-3000:]}")


def run_theirs(project: Path, stub: StubServer) -> None:
    cmd = lm_eval_command("mc", project / "tasks", project / "lm-eval-out", stub.url)
    done = subprocess.run(cmd, env=lm_eval_env(project / "hf"), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"lm_eval exited {done.returncode}:\n{done.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 questions")
    parser.add_argument("--questions", type=int, default=None, help="questions (default 500)")
    args = parser.parse_args(argv)
    n = args.questions or (100 if args.quick else 500)
    started = time.perf_counter()
    rows: list[tuple[str, tuple[int, int, int]]] = []
    with tempfile.TemporaryDirectory(prefix="evalreplay-mc-prompts-") as name:
        project = Path(name)
        data = write_questions(project / "tasks", n)
        (project / "test_mc.py").write_text(MODULE.format(data=data), encoding="utf-8")
        with StubServer("stub-model") as stub:
            rows.append(("ours", counted(stub, lambda: run_ours(project, stub))))
            stub.tokenize = False
            rows.append(("ours, no /tokenize", counted(stub, lambda: run_ours(project, stub))))
            stub.tokenize = True
            if find_spec("lm_eval") is not None:
                rows.append(("lm-eval", counted(stub, lambda: run_theirs(project, stub))))
    print(f"multiple choice through a server: {n:,} questions x 4 choices, prompts the model processes")
    print(f"  {'side':<20} {'prompts':>8} {'calls':>7} {'/tokenize':>10}")
    for side, (prompts, calls, tokenized) in rows:
        print(f"  {side:<20} {prompts:>8,} {calls:>7,} {tokenized:>10,}")
    found = dict(rows)
    ours = found["ours"][0]
    if "lm-eval" not in found:
        print("  lm-eval is not installed (pip install 'pytest-evalreplay[lm-eval]'): goal not judged")
        ok = True
    else:
        theirs = found["lm-eval"][0]
        ok = ours <= theirs
        print(
            f"  ours / lm-eval's: {ours / theirs:.3f}x; goal <= 1.0x (no prompt more than lm-eval sends) -> "
            f"{'met' if ok else 'MISSED'}"
        )
        report("mc-openai-prompts", f"{theirs:,} (lm-eval)", f"{ours:,}", f"{ours / theirs:.3f}x", "1.0x", ok)
    print(f"benchmark took {time.perf_counter() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
