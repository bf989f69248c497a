"""The merge writes the run dir from the merged journals alone when no task
needs the suite's code (`rundir/direct.py`): the same files, byte for byte,
as the suite's run over the merged dir writes (and, less what the writing
session did, as one process writes); where a gate, an agent, an EloEval,
--rescore, a report or an unscored rollout needs the suite, it runs it as
before and says why."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from test_shard_plugin import merge, run_dir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SUITE = ("--", "-p", "no:randomly")
DIRECT = "wrote the run dir from the merged journals"

PASSK = """
from pytest_evalreplay import EvalTask

t = EvalTask(
    "t",
    [{"id": f"q{i}", "gold": "yes"} for i in range(10)],
    prompt="{id}",
    scorer=lambda text, inst: text.endswith(inst["id"][-1]),
    num_samples=4,
    metrics=["pass@2"],
    strip_reasoning=True,
)
"""

CONFTEST = """
from pytest_evalreplay import Generation

class Echo:
    kind, model, batch_size = "echo", "m1", None

    def generate(self, requests):
        return [[Generation(text=f"<think>hm</think> {r.instance_id[-1]}{n}") for n in r.rollouts]
                for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Echo() if kind == "echo" else None
"""


def examples(p: pytest.Pytester, *keep: str) -> None:
    """The example suite in pytester's dir, with only the test modules `keep`,
    the multiple-choice task's gate taken out."""
    for item in EXAMPLES.iterdir():
        if item.name in ("saved_run", "__pycache__", "README.md") or (
            item.name.startswith("test_") and item.name not in keep
        ):
            continue
        target = p.path / item.name
        shutil.copytree(item, target) if item.is_dir() else shutil.copy(item, target)
    mc = p.path / "test_multiple_choice.py"
    if mc.exists():
        mc.write_text(mc.read_text().replace('gate=Gate("acc", min=0.5),', ""))


def shards(p: pytest.Pytester, n: int = 3, *args: str) -> list[str]:
    for k in range(1, n + 1):
        result = p.runpytest(
            "-p", "no:randomly", f"--evalreplay-output=s{k}", f"--evalreplay-shard={k}/{n}", *args
        )
        assert result.ret == 0, result.stdout.str()
    return [f"s{k}" for k in range(1, n + 1)]


def files(path: Path) -> dict[str, bytes]:
    """Every file of a merged dir, byte for byte, but the run id of the session that wrote it."""
    out = {}
    for f in sorted(path.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            data = f.read_bytes()
            if f.name.endswith("-metrics.json"):
                data = data.replace(orjson.loads(data)["session"]["run"].encode(), b"RUN")
            out[f.name] = data
    return out


def forget_suite() -> None:
    """The suite's modules the merge's own pytest run imported in this process."""
    for name in [m for m in sys.modules if m.startswith(("test_evals", "test_multiple_choice", "conftest"))]:
        sys.modules.pop(name, None)


def test_the_example_suite_merges_without_a_pytest_run(pytester: pytest.Pytester) -> None:
    examples(pytester, "test_evals.py", "test_multiple_choice.py")
    assert pytester.runpytest("-p", "no:randomly", "--evalreplay-output=single").ret == 0
    dirs = shards(pytester)
    code, out, err = merge(pytester, "direct", *dirs, suite=SUITE)
    assert code == 0, err
    assert DIRECT in out and "passed" not in out
    assert "arithmetic: 24 items, 0 failed, 0 missing" in out
    # The suite's run over the same shards (a report asked for makes the merge run it).
    forget_suite()
    code, out, err = merge(pytester, "suite", *dirs, suite=(*SUITE, "--evalreplay-report=r.md"))
    assert code == 0, err
    assert DIRECT not in out and "a pytest run, as the arguments after -- are not the shards'" in out
    assert files(pytester.path / "direct") == files(pytester.path / "suite")
    tasks = ["arithmetic", "capitals", "capitals_bpb", "capitals_mc"]
    assert orjson.loads((pytester.path / "direct" / "manifest.json").read_bytes())["tasks"] == tasks
    assert run_dir(pytester.path / "direct") == run_dir(pytester.path / "single")


def test_pass_at_k_and_the_reasoning_strip_are_written_as_the_suite_writes_them(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=PASSK)
    args = ("--evalreplay-provider=echo",)
    assert pytester.runpytest("-p", "no:randomly", "--evalreplay-output=single", *args).ret == 0
    dirs = shards(pytester, 2, *args)
    code, out, err = merge(pytester, "direct", *dirs, suite=SUITE)
    assert code == 0 and DIRECT in out, out + err
    forget_suite()
    code, out, err = merge(pytester, "suite", *dirs, suite=(*SUITE, "--evalreplay-report=r.md"))
    assert code == 0 and DIRECT not in out, out + err
    assert files(pytester.path / "direct") == files(pytester.path / "suite")
    doc = orjson.loads((pytester.path / "direct" / "t-metrics.json").read_bytes())
    assert set(doc["metrics"]) == {"score", "pass@2"}
    row = orjson.loads((pytester.path / "direct" / "t-predictions.jsonl").read_bytes().splitlines()[0])
    assert row["generations"][0]["text"] == "00" and row["generations"][0]["original_text"].startswith(
        "<think>"
    )
    assert run_dir(pytester.path / "direct") == run_dir(pytester.path / "single")


@pytest.mark.parametrize(
    ("keep", "why"),
    [
        (
            ("test_evals.py", "test_agent.py"),
            "task 'calculator': an agent task's transcripts are written by the suite",
        ),
        (("test_evals.py", "test_elo.py"), "task 'quiz_elo': an EloEval is rated by the suite"),
        (("test_multiple_choice.py",), None),
    ],
)
def test_a_task_that_needs_its_code_runs_the_suite_and_says_why(
    pytester: pytest.Pytester, keep: tuple[str, ...], why: str | None
) -> None:
    examples(pytester, *keep)
    if why is None:  # the multiple-choice task with its gate
        shutil.copy(EXAMPLES / "test_multiple_choice.py", pytester.path)
        why = "task 'capitals_mc': its gate is judged by the suite"
    dirs = shards(pytester, 2)
    code, out, err = merge(pytester, "merged", *dirs, suite=SUITE)
    forget_suite()
    assert code == 0, err
    assert DIRECT not in out and f"(a pytest run, as {why})" in out


def test_a_rollout_generated_and_never_scored_is_scored_by_the_suite(pytester: pytest.Pytester) -> None:
    examples(pytester, "test_evals.py")
    assert pytester.runpytest("-p", "no:randomly", "--evalreplay-output=single").ret == 0
    dirs = shards(pytester, 2)
    journal = pytester.path / "s1" / "capitals-journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    last_score = max(i for i, line in enumerate(lines) if b'"type":"score"' in line)
    journal.write_bytes(b"".join(lines[:last_score] + lines[last_score + 1 :]))  # killed before it scored
    code, out, err = merge(pytester, "merged", *dirs, suite=SUITE)
    forget_suite()
    assert code == 0, err
    assert "(a pytest run, as task 'capitals': 1 rollouts were generated and never scored)" in out
    assert run_dir(pytester.path / "merged") == run_dir(pytester.path / "single")


def test_a_missing_shard_is_left_missing_by_the_direct_write(pytester: pytest.Pytester) -> None:
    examples(pytester, "test_evals.py")
    shards(pytester, 3)
    code, out, err = merge(pytester, "direct", "s1", "s3", "--allow-missing", suite=SUITE)
    assert code == 0 and DIRECT in out and "shard 2/3 is missing" in out, out + err
    report = (*SUITE, "--evalreplay-report=r.md")
    code, out, err = merge(pytester, "suite", "s1", "s3", "--allow-missing", suite=report)
    forget_suite()
    assert code == 0 and DIRECT not in out, out + err
    assert files(pytester.path / "direct") == files(pytester.path / "suite")
    doc = orjson.loads((pytester.path / "direct" / "arithmetic-metrics.json").read_bytes())
    assert doc["complete"] is False and doc["num_missing"] > 0


def test_shards_that_strip_reasoning_differently_are_refused(pytester: pytest.Pytester) -> None:
    examples(pytester, "test_evals.py")
    shards(pytester, 2)
    evals = pytester.path / "test_evals.py"
    evals.write_text(evals.read_text().replace("strip_reasoning=True", "strip_reasoning=False"))
    shutil.rmtree(pytester.path / "s2")
    result = pytester.runpytest("-p", "no:randomly", "--evalreplay-output=s2", "--evalreplay-shard=2/2")
    assert result.ret == 0
    code, _, err = merge(pytester, "merged", "s1", "s2", suite=SUITE)
    assert code == 2 and "run dir configuration (instance order, strip_reasoning, pass@k, gate)" in err
    assert not (pytester.path / "merged").exists()


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (
            lambda doc: [doc.pop("max_attempts"), doc["tasks"]["capitals"].pop("rundir")],
            "written by an older",
        ),
        (lambda doc: doc["tasks"]["capitals"]["rundir"]["order"].pop(), "does not match its requests"),
        (lambda doc: doc["tasks"]["capitals"]["rundir"].update(order="x"), "does not match its requests"),
        (lambda doc: doc.update(max_attempts="3"), "were edited (max_attempts, finish)"),
    ],
)
def test_a_marker_of_an_older_version_or_edited_runs_the_suite(
    pytester: pytest.Pytester, edit: Callable[[dict], object], why: str
) -> None:
    examples(pytester, "test_evals.py")
    assert pytester.runpytest("-p", "no:randomly", "--evalreplay-output=single").ret == 0
    dirs = shards(pytester, 2)
    for d in dirs:
        marker = pytester.path / d / "evalreplay-shard.json"
        doc = orjson.loads(marker.read_bytes())
        edit(doc)
        marker.write_bytes(orjson.dumps(doc))
    code, out, err = merge(pytester, "merged", *dirs, suite=SUITE)
    forget_suite()
    assert code == 0, err
    assert DIRECT not in out and why in out, out
    assert run_dir(pytester.path / "merged") == run_dir(pytester.path / "single")


def test_shards_that_wrote_a_report_leave_it_to_the_suites_run(pytester: pytest.Pytester) -> None:
    examples(pytester, "test_evals.py")
    dirs = shards(pytester, 2, "--evalreplay-report=shard.md")
    code, out, err = merge(pytester, "merged", *dirs, suite=("--", "-p", "no:randomly", "-qq"))
    forget_suite()
    assert code == 0, err
    assert DIRECT not in out and "the shards' sessions wrote --evalreplay-report at their end" in out


@pytest.mark.slow
def test_the_merge_vs_read_benchmark_runs_small() -> None:
    import subprocess

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "shards.py"
    args = ["--merge-vs-read", "--vs-rollouts", "300", "--pairs", "1"]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "merge of 3 shards (903 journal rows)" in proc.stdout and "goal <= 3x peak RSS:" in proc.stdout
