"""The plugin as pytest users meet it: collection, selection, batching, the run
dir, failures, JUnit XML. Each test builds a small project with `pytester`."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import orjson
import pytest

pytestmark = pytest.mark.filterwarnings("error")

# A provider that answers each prompt with its instance id and logs every call
# (one JSON line per generate() call: the requested (instance, rollouts)).
CONFTEST = """
import os, orjson
from pytest_evalreplay import Generation, GenerationError

class Counting:
    kind = "counting"
    model = "counting-1"
    batch_size = None

    def generate(self, requests):
        with open(os.environ["CALL_LOG"], "ab") as fh:
            fh.write(orjson.dumps([[r.instance_id, list(r.rollouts)] for r in requests]) + b"\\n")
        out = []
        for r in requests:
            if r.instance_id.startswith("bad"):
                out.append(GenerationError("server said no", retryable=False))
            else:
                out.append([Generation(text="answer " + r.instance_id, finish_reason="stop",
                                       prompt_tokens=3, completion_tokens=2) for _ in r.rollouts])
        return out

class Streaming(Counting):
    kind = "streaming"

    def generate_stream(self, requests):
        yield from enumerate(self.generate(requests))

def pytest_evalreplay_make_provider(config, kind):
    return {"counting": Counting, "streaming": Streaming}.get(kind, lambda: None)()
"""

EVALS = """
from pytest_evalreplay import EvalTask

def right_for_even(text, instance):
    return int(instance["n"]) % 2 == 0

qa = EvalTask("qa", [{{"id": f"q{{i:04d}}", "n": i}} for i in range({n})],
              prompt="Question {{id}}", scorer=right_for_even, num_samples={samples})
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    log = pytester.path / "calls.jsonl"
    monkeypatch.setenv("CALL_LOG", str(log))
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = counting\n")

    def make(n: int = 4, samples: int = 1, source: str | None = None) -> None:
        pytester.makepyfile(test_evals=source or EVALS.format(n=n, samples=samples))

    make.calls = lambda: (
        [orjson.loads(line) for line in log.read_bytes().splitlines()] if log.exists() else []
    )
    make.out = pytester.path / "run"
    return make


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--evalreplay-output=run", *args)


def test_node_ids_are_stable_and_readable(pytester, project):
    project(n=2, samples=2)
    result = run(pytester, "--collect-only", "-q")
    assert result.ret == 0
    ids = [line for line in result.outlines if "::" in line]
    assert ids == [
        "test_evals.py::qa::q0000[s1-r0]",
        "test_evals.py::qa::q0000[s1-r1]",
        "test_evals.py::qa::q0001[s1-r0]",
        "test_evals.py::qa::q0001[s1-r1]",
    ]
    assert project.calls() == [], "--collect-only must not generate"


def test_all_items_of_a_task_are_generated_in_one_call(pytester, project):
    project(n=5, samples=2)
    result = run(pytester)
    result.assert_outcomes(passed=10)
    calls = project.calls()
    assert len(calls) == 1
    assert sorted(calls[0]) == [[f"q{i:04d}", [0, 1]] for i in range(5)]
    result.stdout.fnmatch_lines(
        ["qa: 5 instances, 10 items, 0 failed | 10 generated, 0 reused | right_for_even=0.6000 [[]*"]
    )


@pytest.mark.parametrize("batch", [1, 3, 7])
def test_batch_size_bounds_the_number_of_provider_calls(pytester, project, batch):
    project(n=7)
    run(pytester, f"--evalreplay-batch-size={batch}").assert_outcomes(passed=7)
    calls = project.calls()
    assert len(calls) <= math.ceil(7 / batch)
    assert sorted(i for call in calls for i, _ in call) == [f"q{i:04d}" for i in range(7)]


def test_k_selects_one_item_and_generates_for_it_alone(pytester, project):
    project(n=6, samples=2)
    result = run(pytester, "-k", "q0003 and r1")
    result.assert_outcomes(passed=1, deselected=11)
    assert project.calls() == [[["q0003", [1]]]]


def test_k_matches_task_instance_stage_and_rollout(pytester, project):
    project(n=3, samples=2)
    assert run(pytester, "-k", "qa and s1 and r0", "--collect-only", "-q").ret == 0
    result = run(pytester, "-k", "r0", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*3/6 tests collected (3 deselected)*"])


def test_marker_selects_eval_items(pytester, project):
    project(n=2)
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    run(pytester, "-m", "evalreplay").assert_outcomes(passed=2, deselected=1)
    run(pytester, "-m", "not evalreplay").assert_outcomes(passed=1, deselected=2)


def test_run_dir_has_the_contract_layout(pytester, project):
    project(n=3, samples=2)
    run(pytester).assert_outcomes(passed=6)
    out = project.out
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["format"] == "evalreplay/1"
    assert manifest["model"] == "counting-1"
    assert manifest["tasks"] == ["qa"]
    requests = [orjson.loads(x) for x in (out / "qa-requests.jsonl").read_bytes().splitlines()]
    assert [r["instance_id"] for r in requests] == ["q0000", "q0001", "q0002"]
    assert requests[0] == {
        "instance_id": "q0000",
        "request_type": "generate",
        "context": "Question q0000",
        "system_prompt": None,
        "num_samples": 2,
        "sampling": {},
    }
    preds = [orjson.loads(x) for x in (out / "qa-predictions.jsonl").read_bytes().splitlines()]
    assert [p["instance_id"] for p in preds] == ["q0000", "q0001", "q0002"]
    assert preds[1]["model"] == "counting-1"
    assert (
        preds[1]["generations"]
        == [{"text": "answer q0001", "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 2}] * 2
    )
    assert preds[1]["scores"] == {"right_for_even": 0.0}
    metrics = orjson.loads((out / "qa-metrics.json").read_bytes())
    assert metrics["task"] == "qa"
    assert metrics["model"] == "counting-1"
    assert metrics["metrics"] == {"right_for_even": pytest.approx(2 / 3)}
    assert (metrics["num_instances"], metrics["num_items"], metrics["num_failed"]) == (3, 6, 0)


@pytest.mark.parametrize("name", ["../escape", "a/b", "sp ace", "", ".."])
def test_bad_task_name_is_a_collection_error(pytester, project, name):
    project(
        source=f"from pytest_evalreplay import EvalTask\n"
        f"t = EvalTask({name!r}, [{{'id': 'a'}}], prompt='x', scorer='contains')\n"
    )
    result = run(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*invalid task name*letters, digits*"])
    assert not (pytester.path.parent / "escape-predictions.jsonl").exists()
    assert not list(pytester.path.rglob("*-predictions.jsonl"))


def test_a_scorer_that_raises_fails_that_item_only(pytester, project):
    project(
        source="""
from pytest_evalreplay import EvalTask

def picky(text, instance):
    if instance["id"] == "q2":
        raise ValueError("cannot parse this one")
    return 1.0

t = EvalTask("picky", [{"id": f"q{i}"} for i in range(4)], prompt="{id}", scorer=picky)
"""
    )
    result = run(pytester)
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*picky q2[[]s1-r0[]]: scorer raised ValueError: cannot parse this one*"])
    metrics = orjson.loads((project.out / "picky-metrics.json").read_bytes())
    assert metrics["metrics"] == {"picky": 1.0}
    assert metrics["failed"] == ["q2[s1-r0]"]
    journal = [orjson.loads(x) for x in (project.out / "picky-journal.jsonl").read_bytes().splitlines()]
    assert [r["error"] for r in journal if r["type"] == "score" and "error" in r] == [
        "scorer raised ValueError: cannot parse this one"
    ]


def test_generation_error_fails_the_item_and_is_not_scored_zero(pytester, project):
    project(
        source="""
from pytest_evalreplay import EvalTask
t = EvalTask("mixed", [{"id": "ok1"}, {"id": "bad1"}, {"id": "ok2"}], prompt="{id}",
             scorer=lambda text, inst: 1.0)
"""
    )
    result = run(pytester)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*mixed bad1[[]s1-r0[]]: server said no*", "*mixed: 3 instances, 3 items, 1 failed*score=1.0000*"]
    )
    metrics = orjson.loads((project.out / "mixed-metrics.json").read_bytes())
    assert metrics["metrics"] == {"score": 1.0}
    assert metrics["failed"] == ["bad1[s1-r0]"]


def test_exitfirst_stops_after_the_first_failure(pytester, project):
    project(
        source="""
from pytest_evalreplay import EvalTask
t = EvalTask("x", [{"id": "a"}, {"id": "bad"}, {"id": "c"}], prompt="{id}", scorer=lambda t, i: 1)
"""
    )
    run(pytester, "-x").assert_outcomes(passed=1, failed=1)


def test_last_failed_reruns_only_failures(pytester, project):
    project(
        source="""
from pytest_evalreplay import EvalTask
t = EvalTask("x", [{"id": "a"}, {"id": "bad"}, {"id": "c"}], prompt="{id}", scorer=lambda t, i: 1)
"""
    )
    run(pytester).assert_outcomes(passed=2, failed=1)
    result = run(pytester, "--lf")
    result.assert_outcomes(failed=1, deselected=2)
    assert project.calls()[-1] == [["bad", [0]]]


def test_junit_xml_carries_scores_and_finish_reason(pytester, project):
    project(n=2)
    run(pytester, "--junitxml=out.xml").assert_outcomes(passed=2)
    root = ET.parse(pytester.path / "out.xml").getroot()
    cases = root.findall(".//testcase")
    assert [c.get("name") for c in cases] == ["q0000[s1-r0]", "q0001[s1-r0]"]
    props = {p.get("name"): p.get("value") for p in cases[0].findall(".//property")}
    assert props["score.right_for_even"] == "1.0"
    assert props["finish_reason"] == "stop"
    assert props["evalreplay.task"] == "qa"


def test_no_provider_is_a_usage_error_naming_the_options(pytester, project):
    project(n=1)
    pytester.makeini("[pytest]\n")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--evalreplay-provider*--evalreplay-predictions*"])


def test_unknown_provider_kind_lists_the_built_ins(pytester, project):
    project(n=1)
    result = run(pytester, "--evalreplay-provider=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown provider kind 'nope'*openai*replay*vllm*"])


def test_markdown_report(pytester, project):
    project(n=2)
    run(pytester, "--evalreplay-report=report.md").assert_outcomes(passed=2)
    text = (pytester.path / "report.md").read_text()
    assert "| qa | 2 | 0 | 0 | 2 | 0 | right_for_even=0.5000 [0.0000, 1.0000] |" in text


def test_progress_lines_appear_in_a_log_and_not_under_q(pytester, project):
    project(n=2)
    pytester.makeini("[pytest]\nevalreplay_provider = counting\nevalreplay_progress_interval = 0\n")
    result = run(pytester)
    result.stdout.fnmatch_lines(
        [
            "evalreplay: qa: 1/2 requests (1/2 samples), 0 failed, * elapsed, ETA *",
            "evalreplay: qa: 2/2 requests (2/2 samples), 0 failed, * elapsed",
        ]
    )
    result = run(pytester, "-q")
    assert "requests (" not in result.stdout.str()


def test_the_progress_line_shows_a_running_value_of_the_first_metric(pytester, project):
    """The line shows the task's first metric over what is scored so far:
    here the first chunk's item, while the second chunk generates."""
    project(n=2)
    pytester.makeini("[pytest]\nevalreplay_provider = counting\nevalreplay_progress_interval = 0\n")
    result = run(pytester, "--evalreplay-batch-size=1")
    result.stdout.fnmatch_lines(
        [
            "evalreplay: qa: 1/1 requests (1/1 samples), 0 failed, * elapsed",
            "evalreplay: qa: 1/1 requests (1/1 samples), 0 failed, right_for_even=*, * elapsed",
        ]
    )


def test_a_streamed_answer_is_scored_as_it_arrives_and_the_line_shows_the_metric(pytester, project):
    """One process and a streaming provider: each answer is scored the moment
    its row is written, so the running metric moves during the one chunk."""
    project(n=4)
    pytester.makeini("[pytest]\nevalreplay_provider = streaming\nevalreplay_progress_interval = 0\n")
    result = run(pytester)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "evalreplay: qa: 1/4 requests (1/4 samples), 0 failed, right_for_even=1.000, * elapsed, ETA *",
            "evalreplay: qa: 2/4 requests (2/4 samples), 0 failed, right_for_even=0.500, * elapsed, ETA *",
            "evalreplay: qa: 3/4 requests (3/4 samples), 0 failed, right_for_even=0.667, * elapsed, ETA *",
        ]
    )
    rows = [
        orjson.loads(line) for line in (pytester.path / "run" / "qa-journal.jsonl").read_bytes().splitlines()
    ]
    kinds = [row["type"] for row in rows if row["type"] in ("gen", "score")]
    assert kinds == ["gen", "score"] * 4  # each score written after its answer, once


def test_a_slow_scorer_is_left_to_the_items(pytester, project):
    """Answers that arrive while a slow scorer runs would wait unwritten in
    the provider's queue: after one answer over budget, scoring moves back
    to the items."""
    project(
        source=EVALS.format(n=4, samples=1).replace(
            "def right_for_even(text, instance):\n",
            "def right_for_even(text, instance):\n    import time; time.sleep(0.01)\n",
        )
    )
    pytester.makeini("[pytest]\nevalreplay_provider = streaming\n")
    run(pytester).assert_outcomes(passed=4)
    rows = [
        orjson.loads(line) for line in (pytester.path / "run" / "qa-journal.jsonl").read_bytes().splitlines()
    ]
    kinds = [row["type"] for row in rows if row["type"] in ("gen", "score")]
    assert kinds == ["gen", "score", "gen", "gen", "gen", "score", "score", "score"]


def test_default_output_is_under_the_cache_dir(pytester, project):
    project(n=1)
    pytester.runpytest().assert_outcomes(passed=1)
    assert (pytester.path / ".pytest_cache" / "d" / "evalreplay" / "qa-predictions.jsonl").exists()


def test_instances_from_jsonl_relative_to_the_module(pytester, project):
    suite = pytester.mkpydir("suite")
    (suite / "data").mkdir()
    (suite / "data" / "qs.jsonl").write_text('{"id": "a", "t": "x"}\n{"id": "b", "t": "y"}\n')
    (suite / "test_file.py").write_text(
        "from pytest_evalreplay import EvalTask\n"
        "t = EvalTask('file', 'data/qs.jsonl', prompt='{t}', scorer='contains', target='t')\n"
    )
    run(pytester).assert_outcomes(passed=2)


def test_malformed_instances_file_names_file_and_line(pytester, project):
    (pytester.path / "qs.jsonl").write_text('{"id": "a"}\n{"id": \n')
    project(
        source="from pytest_evalreplay import EvalTask\n"
        "t = EvalTask('f', 'qs.jsonl', prompt='x', scorer='contains')\n"
    )
    result = run(pytester)
    result.stdout.fnmatch_lines(["*qs.jsonl:2: not valid JSON*fix or delete that line*"])


@pytest.mark.slow  # pytest-xdist workers started
def test_xdist_workers_notes_and_numbers_reach_the_controller_summary(pytester, project):
    pytest.importorskip("xdist")
    project(n=4)
    run(pytester).assert_outcomes(passed=4)
    project(source=EVALS.format(n=4, samples=1).replace('prompt="Question', 'prompt="Q'))
    result = run(pytester, "-n", "2", "-p", "no:benchmark", "--resume")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        ["qa: 4 instances, 4 items, 0 failed | 4 generated, 0 reused, 4 regenerated (request changed)*"]
    )
