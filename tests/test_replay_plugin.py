"""Replay through the plugin: --evalreplay-predictions rescores collected tasks,
and the `replay_provider` fixture serves hand-written tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pytest_evalreplay import Request
from pytest_evalreplay.storage.runschema import request_row_of

EVALS = """
from pytest_evalreplay import EvalTask

qa = EvalTask("qa", [{"id": "a", "q": "1+1", "answer": "2"}, {"id": "b", "q": "2+2", "answer": "4"},
                     {"id": "c", "q": "3+3", "answer": "6"}, {"id": "d", "q": "4+4", "answer": "8"}],
              prompt="What is {q}?", system_prompt="Reply with a number.",
              scorer="exact_match", target="answer", strip_reasoning=True)
"""

QUESTIONS = {"a": "1+1", "b": "2+2", "c": "3+3", "d": "4+4"}


def write_saved_run(directory: Path, answers: dict[str, str], model: str = "saved-model") -> Path:
    """A run dir as an earlier run of EVALS would have left it."""
    directory.mkdir()
    requests, predictions = [], []
    for iid, answer in answers.items():
        request = Request(
            task="qa",
            instance_id=iid,
            context=f"What is {QUESTIONS[iid]}?",
            system_prompt="Reply with a number.",
        )
        requests.append(request_row_of(request))
        generation = {
            "text": answer,
            "original_text": f"<think>hmm</think>{answer}",
            "finish_reason": "stop",
            "prompt_tokens": 9,
            "completion_tokens": 4,
        }
        predictions.append({"instance_id": iid, "model": model, "generations": [generation], "scores": {}})
    for name, rows in (("qa-requests.jsonl", requests), ("qa-predictions.jsonl", predictions)):
        (directory / name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return directory


def metrics_doc(path: Path) -> dict[str, Any]:
    return orjson.loads((path / "qa-metrics.json").read_bytes())


def test_a_collected_task_is_rescored_from_saved_predictions(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_evals=EVALS)
    write_saved_run(pytester.path / "saved", {"a": "2", "b": "4", "c": "7", "d": "8"})
    result = pytester.runpytest(
        "--evalreplay-predictions=saved", "--evalreplay-output=out", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(deselected=4)
    result.stdout.fnmatch_lines(["*qa: 4 instances, 4 items, 0 failed*exact_match=0.75*"])
    doc = metrics_doc(pytester.path / "out")
    assert doc["metrics"] == {"exact_match": 0.75}
    assert doc["model"] == "saved-model"
    # the replayed run dir can itself be replayed, and gives the same metrics
    again = pytester.runpytest(
        "--evalreplay-predictions=out", "--evalreplay-output=again", "-p", "no:cacheprovider"
    )
    again.assert_outcomes(deselected=4)
    assert metrics_doc(pytester.path / "again")["metrics"] == {"exact_match": 0.75}


def test_instances_missing_from_the_saved_run_fail_instead_of_scoring_zero(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_evals=EVALS)
    write_saved_run(pytester.path / "saved", {"a": "2", "b": "5", "c": "6"})
    result = pytester.runpytest(
        "--evalreplay-predictions=saved", "--evalreplay-output=out", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(deselected=3, failed=1)
    result.stdout.fnmatch_lines(["*no saved generation matches this prompt (task qa, instance d)*"])
    doc = metrics_doc(pytester.path / "out")
    assert doc["metrics"] == {"exact_match": pytest.approx(2 / 3)}
    assert doc["num_failed"] == 1


def test_a_replay_is_handled_like_a_resume_what_the_saved_run_answers_is_deselected(
    pytester: pytest.Pytester,
) -> None:
    # The saved run answers a, b and c at collection: rescored and deselected
    # as --resume's reused items are; d, which it cannot answer, runs and fails.
    pytester.makepyfile(test_evals=EVALS)
    write_saved_run(pytester.path / "saved", {"a": "2", "b": "4", "c": "7"})
    args = ["--evalreplay-predictions=saved", "-p", "no:cacheprovider"]
    result = pytester.runpytest(*args, "--evalreplay-output=out")
    result.assert_outcomes(failed=1, deselected=3)
    result.stdout.fnmatch_lines(
        [
            "evalreplay: 1 task, 1 to run, 3 replayed from the saved run (deselected)",
            "qa: 4 instances, 4 items, 1 failed | 3 replayed, 0 reused | exact_match=0.6667 *"
            "| tokens: 27 prompt + 12 completion replayed",
        ]
    )
    doc = metrics_doc(pytester.path / "out")
    assert (doc["num_failed"], doc["session"]["generated"], doc["session"]["replayed"]) == (1, 3, True)
    # --evalreplay-report-reused reports them skipped instead, as under --resume
    shown = pytester.runpytest(*args, "--evalreplay-output=shown", "--evalreplay-report-reused")
    shown.assert_outcomes(failed=1, skipped=3)
    shown.stdout.fnmatch_lines(
        ["evalreplay: 1 task, 1 to run, 3 replayed from the saved run (reported skipped)"]
    )
    assert metrics_doc(pytester.path / "shown")["metrics"] == doc["metrics"]


COUNTING = """
import collections
from pathlib import Path

import orjson

from pytest_evalreplay.journal import index

decoded = collections.Counter()
_generation = index.JournalIndex.generation


def counting(self, ref):
    decoded[ref.offset] += 1
    return _generation(self, ref)


index.JournalIndex.generation = counting


def pytest_unconfigure(config):
    index.JournalIndex.generation = _generation
    Path("decoded.json").write_bytes(orjson.dumps(sorted(decoded.values())))
"""


def test_a_replay_renders_each_prompt_once_and_decodes_each_row_twice_at_most(
    pytester: pytest.Pytester,
) -> None:
    # A prompt is rendered at collection for its digest, and that rendering is
    # what is sent; a journal row is decoded to score it and to write the run
    # dir (its saved sampling is noted from that same decode), never more.
    pytester.makeconftest(COUNTING)
    pytester.makepyfile(
        test_evals=EVALS.replace('prompt="What is {q}?"', "prompt=prompt").replace(
            "from pytest_evalreplay import EvalTask",
            "from pathlib import Path\n\nfrom pytest_evalreplay import EvalTask\n\n\n"
            "def prompt(instance):\n"
            "    with Path('renders.log').open('a') as f:\n"
            "        f.write(instance['id'] + '\\n')\n"
            "    return f\"What is {instance['q']}?\"\n",
        )
    )
    write_saved_run(pytester.path / "saved", {"a": "2", "b": "4", "c": "7", "d": "8"})
    # In a child process: the counting conftest patches the journal index class,
    # which an in-process run may hold a second copy of.
    result = pytester.runpytest_subprocess(
        "--evalreplay-predictions=saved", "--evalreplay-output=out", "-p", "no:cacheprovider"
    )
    assert result.ret == 0
    assert sorted((pytester.path / "renders.log").read_text().split()) == ["a", "b", "c", "d"]
    assert orjson.loads((pytester.path / "decoded.json").read_bytes()) == [2, 2, 2, 2]


def test_an_unreadable_saved_run_is_a_usage_error_naming_files(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_evals=EVALS)
    saved = write_saved_run(pytester.path / "saved", {"a": "2"})
    other = saved / "other-requests.jsonl"
    other.write_bytes(
        orjson.dumps(request_row_of(Request(task="other", instance_id="z", context="hi"))) + b"\n"
    )
    (saved / "other-predictions.jsonl").write_bytes(
        orjson.dumps(
            {"instance_id": "z", "model": "another-model", "generations": [{"text": "x"}], "scores": {}}
        )
        + b"\n"
    )
    result = pytester.runpytest(
        "--evalreplay-predictions=saved", "--evalreplay-output=out", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*holds predictions of 2 models*another-model*saved-model*"])


HAND_WRITTEN = """
from pytest_evalreplay import Request

def test_served(replay_provider):
    (gens,) = replay_provider.generate([Request(task="qa", instance_id="a", context="What is 1+1?",
                                                system_prompt="Reply with a number.")])
    assert [g.text for g in gens] == ["<think>hmm</think>2"]
    assert replay_provider.model == "saved-model"
"""


def test_the_replay_provider_fixture_serves_the_ini_path(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_hand=HAND_WRITTEN)
    write_saved_run(pytester.path / "saved", {"a": "2"})
    pytester.makeini("[pytest]\nevalreplay_predictions = saved\n")
    result = pytester.runpytest("--evalreplay-output=out", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_replay_provider_fixture_without_predictions_says_what_to_set(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_hand=HAND_WRITTEN)
    result = pytester.runpytest("--evalreplay-output=out", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["E *replay_provider*--evalreplay-predictions=PATH*evalreplay_predictions*"])


def test_a_limit_style_replay_is_judged_by_the_failure_budget(pytester: pytest.Pytester) -> None:
    # The saved run answered 3 of the task's 4 instances (an --limit 3 run): the
    # fourth fails and counts against the budget; it never lowers the score.
    pytester.makepyfile(
        test_evals=EVALS.replace(
            'target="answer",', 'target="answer", gate=Gate("exact_match", min=0),'
        ).replace("import EvalTask", "import EvalTask, Gate")
    )
    write_saved_run(pytester.path / "saved", {"a": "2", "b": "4", "c": "6"})
    args = ["--evalreplay-predictions=saved", "--evalreplay-output=out", "-p", "no:cacheprovider"]
    result = pytester.runpytest(*args)
    result.assert_outcomes(deselected=3, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*gate qa: FAIL exact_match=1.0000; min 0; 1/4 items failed (budget 0)*",
            "*1 of 4 items failed (25.0%), over the failure budget 0.0%*",
        ]
    )
    result = pytester.runpytest(*args, "--evalreplay-failure-budget=0.25")
    result.assert_outcomes(passed=1, deselected=3, failed=1)
    result.stdout.fnmatch_lines(["*gate qa: PASS exact_match=1.0000; min 0; 1/4 items failed (budget 0.25)*"])


DOCS_EXAMPLE = """
from pytest_evalreplay import GenerationError, Request

def test_refusals_are_rare(replay_provider):
    request = Request(task="chat", instance_id="x", context="Hi!", num_samples=4)
    (gens,) = replay_provider.generate([request])
    assert not isinstance(gens, GenerationError), gens.message
    assert sum("I can't" in g.text for g in gens) <= 1

def test_without_num_samples_the_count_differs(replay_provider):
    (result,) = replay_provider.generate([Request(task="chat", instance_id="x", context="Hi!")])
    assert isinstance(result, GenerationError)
    assert "saved sample count 4 differs from num_samples 1" in result.message

def test_rollouts_pick_samples(replay_provider):
    request = Request(task="chat", instance_id="x", context="Hi!", num_samples=4, rollouts=(3, 0))
    (gens,) = replay_provider.generate([request])
    assert [g.text for g in gens] == ["Hey.", "Hello!"]
"""


def test_the_docs_fixture_example_serves_a_save_of_several_samples(pytester: pytest.Pytester) -> None:
    saved = pytester.path / "saved"
    saved.mkdir()
    request = Request(task="chat", instance_id="x", context="Hi!", num_samples=4)
    texts = ["Hello!", "Hi there.", "I can't help with that.", "Hey."]
    (saved / "chat-requests.jsonl").write_bytes(orjson.dumps(request_row_of(request)) + b"\n")
    row = {"instance_id": "x", "model": "m", "generations": [{"text": t} for t in texts], "scores": {}}
    (saved / "chat-predictions.jsonl").write_bytes(orjson.dumps(row) + b"\n")
    pytester.makepyfile(test_hand=DOCS_EXAMPLE)
    result = pytester.runpytest(
        "--evalreplay-predictions=saved", "--evalreplay-output=out", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=3)


def test_a_saved_run_with_a_bad_field_is_a_usage_error_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_evals=EVALS)
    saved = write_saved_run(pytester.path / "saved", {"a": "2", "b": "4"})
    rows = (saved / "qa-requests.jsonl").read_bytes().splitlines()
    rows[1] = rows[1].replace(
        b'"system_prompt":"Reply with a number."', b'"system_prompt":["Reply with a number."]'
    )
    (saved / "qa-requests.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    result = pytester.runpytest(
        "--evalreplay-predictions=saved", "--evalreplay-output=out", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*qa-requests.jsonl:2: 'system_prompt' must be a string or null, got a list*"]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
