"""The plugin's own run dir replays whole: each task is served from its own
files, even when two tasks (or an EloEval's pool and a task) share a prompt;
foreign layouts keep the prompt-only rule."""

from __future__ import annotations

import orjson
import pytest

CONFTEST = """
from pytest_evalreplay import Generation

class PerTask:
    kind, model, batch_size = "pertask", "m-1", None

    def generate(self, requests):
        return [[Generation(text=f"{r.task} says {r.instance_id}") for _ in r.rollouts] for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return PerTask() if kind == "pertask" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask

INSTANCES = [{"id": "a", "q": "x"}, {"id": "b", "q": "y"}]

def says(task):
    return lambda text, instance: float(text.startswith(task + " says"))

first = EvalTask("first", INSTANCES, prompt="Q: {q}", scorer=says("first"))
second = EvalTask("second", INSTANCES, prompt="Q: {q}", scorer=says("second"))
"""


def test_two_tasks_sharing_a_prompt_replay_each_from_its_own_files(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    made = pytester.runpytest(
        "--evalreplay-provider=pertask", "--evalreplay-output=run", "-p", "no:cacheprovider"
    )
    made.assert_outcomes(passed=4)
    replayed = pytester.runpytest(
        "--evalreplay-predictions=run", "--evalreplay-output=again", "-p", "no:cacheprovider"
    )
    replayed.assert_outcomes(deselected=4)
    for task in ("first", "second"):
        doc = orjson.loads((pytester.path / "again" / f"{task}-metrics.json").read_bytes())
        assert doc["metrics"] == {"<lambda>": 1.0} or list(doc["metrics"].values()) == [1.0]
        saved = (pytester.path / "run" / f"{task}-predictions.jsonl").read_bytes()
        assert (pytester.path / "again" / f"{task}-predictions.jsonl").read_bytes() == saved


def test_a_task_the_run_dir_does_not_name_keeps_the_prompt_only_rule(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    pytester.runpytest("--evalreplay-provider=pertask", "--evalreplay-output=run", "-p", "no:cacheprovider")
    # A task of another name, with the same prompts: no file of its own, and two
    # saves of each prompt that disagree: replay cannot tell which to serve.
    pytester.makepyfile(test_evals=EVALS.replace('"second"', '"third"').replace("first = ", "# "))
    result = pytester.runpytest(
        "--evalreplay-predictions=run", "--evalreplay-output=again", "-p", "no:cacheprovider", "-k", "third"
    )
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*saved 2 times with different generations*"])


ELO = """
from pytest_evalreplay import EloEval, EvalTask, Reference, Stage

INSTANCES = [{"id": "a", "q": "x"}, {"id": "b", "q": "y"}]

plain = EvalTask("plain", INSTANCES, prompt="Q: {q}", scorer=lambda text, instance: float("plain" in text))
pool = EvalTask("pool", INSTANCES, prompt="Q: {q}")

def judge(instance, candidate, reference):
    return 1.0 if candidate.startswith("duel says") else 0.0

duel = EloEval("duel", pool=pool, references={"ref": Reference(1000, "ref-predictions.jsonl")},
               stages=[Stage()], judge=judge, seed=1)
"""


def test_an_elo_pool_sharing_a_tasks_prompt_replays_from_the_evals_own_files(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=ELO)
    rows = [(iid, q) for iid, q in (("a", "x"), ("b", "y"))]
    pytester.path.joinpath("ref-requests.jsonl").write_bytes(
        b"".join(
            orjson.dumps(
                {
                    "instance_id": i,
                    "request_type": "generate",
                    "context": f"Q: {q}",
                    "system_prompt": None,
                    "num_samples": 1,
                    "sampling": {},
                }
            )
            + b"\n"
            for i, q in rows
        )
    )
    pytester.path.joinpath("ref-predictions.jsonl").write_bytes(
        b"".join(orjson.dumps({"instance_id": i, "generations": [{"text": "ref"}]}) + b"\n" for i, _ in rows)
    )
    made = pytester.runpytest(
        "--evalreplay-provider=pertask", "--evalreplay-output=run", "-p", "no:cacheprovider"
    )
    made.assert_outcomes(passed=4)
    rating = orjson.loads((pytester.path / "run" / "duel-metrics.json").read_bytes())["elo"]["rating"]
    replayed = pytester.runpytest(
        "--evalreplay-predictions=run", "--evalreplay-output=again", "-p", "no:cacheprovider"
    )
    replayed.assert_outcomes(passed=2, deselected=2)
    again = orjson.loads((pytester.path / "again" / "duel-metrics.json").read_bytes())["elo"]["rating"]
    assert again == rating


@pytest.mark.parametrize("output", ["run/sub", "run/sub/deeper"])
def test_a_replay_never_writes_inside_the_run_it_replays(pytester: pytest.Pytester, output: str) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    pytester.runpytest("--evalreplay-provider=pertask", "--evalreplay-output=run", "-p", "no:cacheprovider")
    result = pytester.runpytest(
        "--evalreplay-predictions=run", f"--evalreplay-output={output}", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*is inside the saved run*would write into what it replays*"])
    assert not (pytester.path / "run" / "sub").exists()
