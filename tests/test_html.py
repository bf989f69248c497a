"""The HTML report without a browser: its data built from a run dir alone
(`report/html_data.py`), the page it renders into (`report/html.py`), the
`view` command, `--evalreplay-html` at a session's end and `compare
--fail-on-regression`. tests/test_html_browser.py opens the pages in Chromium."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import orjson
import pytest
from html_project import FAILED, WRONG, XSS, XSS_PROMPT, make_project, make_run

from pytest_evalreplay.__main__ import main
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.report.html import INSTALL, embedded_json, render
from pytest_evalreplay.report.html_data import build

# What renders a page needs jinja2 (the `html` extra); the data, the errors and compare do not.
renders = pytest.mark.skipif(
    importlib.util.find_spec("jinja2") is None,
    reason="renders the page: needs jinja2 (pip install '.[html]')",
)

SAVED = Path(__file__).resolve().parent.parent / "examples" / "saved_run"


def payload(page: str) -> dict:
    """The data a page embeds, read back as the page's script reads it."""
    match = re.search(r'<script type="application/json" id="evalreplay-data">(.*?)</script>', page, re.S)
    assert match is not None
    return orjson.loads(match.group(1))


# ---------------------------------------------------------------- the data


def test_the_data_holds_every_task_and_metric_of_the_example_run() -> None:
    data = build(SAVED)
    manifest = orjson.loads((SAVED / "manifest.json").read_bytes())
    assert [t["name"] for t in data["tasks"]] == sorted(manifest["tasks"])
    for task in data["tasks"]:
        doc = orjson.loads((SAVED / f"{task['name']}-metrics.json").read_bytes())
        assert {m["name"]: m["value"] for m in task["metrics"]} == doc["metrics"]
        assert {m["name"]: m["ci95"] for m in task["metrics"]} == doc["ci95"]
        lines = (SAVED / f"{task['name']}-predictions.jsonl").read_bytes().splitlines()
        assert len(task["samples"]) == len(lines)
    kinds = {t["name"]: t["kind"] for t in data["tasks"]}
    assert kinds == {
        "arithmetic": "task",
        "calculator": "agent",
        "capitals": "task",
        "capitals_bpb": "choices",
        "capitals_mc": "choices",
        "quiz_elo": "elo",
    }


def test_every_rollout_keeps_its_raw_and_stripped_text() -> None:
    arithmetic = next(t for t in build(SAVED)["tasks"] if t["name"] == "arithmetic")
    sample = arithmetic["samples"][0]
    assert sample["id"] == "arith-00" and sample["prompt"].startswith("Question: What is 22 + 6?")
    assert [g["r"] for g in sample["gens"]] == [0, 1]
    assert sample["gens"][0]["text"] == "The answer is 28."
    assert sample["gens"][0]["raw"] == "<think>22 + 6, carefully.</think>The answer is 28."
    assert sample["gens"][0]["scores"] == {"numeric_match": 1.0}


def test_an_agent_episode_keeps_its_tool_calls_and_each_turns_tokens() -> None:
    calculator = next(t for t in build(SAVED)["tasks"] if t["name"] == "calculator")
    episode = calculator["episodes"][0]
    calls = [c for m in episode["messages"] for c in m.get("tool_calls") or ()]
    assert [c["function"]["arguments"] for c in calls] == ['{"a":17,"op":"*","b":23}']
    assert episode["turns"] == [
        {"turn": 1, "at": 2, "finish": "tool_calls", "pt": 2, "ct": 8},
        {"turn": 2, "at": 4, "finish": "stop", "pt": 4, "ct": 4},
    ]
    assert episode["messages"][2]["role"] == "assistant"  # turn 1's reply, where "at" points


def test_an_elo_eval_has_its_stages_and_judged_pairs() -> None:
    quiz = next(t for t in build(SAVED)["tasks"] if t["name"] == "quiz_elo")
    doc = orjson.loads((SAVED / "quiz_elo-metrics.json").read_bytes())["elo"]
    assert [s["rating"] for s in quiz["elo"]["stages"]] == [s["rating"] for s in doc["stages"]]
    cells = sum(len(c) for c in doc["table"]["tasks"].values())
    assert len(quiz["elo"]["pairs"]) == cells
    assert {"task": "q-arith-00", "reference": "ref-800", "wtl": [1, 0, 0]} in quiz["elo"]["pairs"]


def test_multiple_choice_samples_have_their_choices_and_loglikelihoods() -> None:
    mc = next(t for t in build(SAVED)["tasks"] if t["name"] == "capitals_mc")
    france = next(s for s in mc["samples"] if s["id"] == "mc-france")
    assert france["choices"] == [" Lyon", " Paris", " Nice", " Marseille"]
    assert france["gens"][0]["ll"][1] == [-1.5, True]


def test_failed_rollouts_wrong_answers_and_gates_of_a_run(pytester: pytest.Pytester) -> None:
    run = make_run(pytester)
    data = build(run, gates={"flaky": (False, "FAIL right=0.5; 4/26 items failed (budget 0)")})
    (task,) = data["tasks"]
    failed = sorted(s["id"] for s in task["samples"] if s["failed"])
    assert failed == sorted(FAILED)
    assert all(s["gens"] == [] and s["failed"] == [0, 1] for s in task["samples"] if s["id"] in FAILED)
    wrong = sorted(s["id"] for s in task["samples"] if s["scores"].get("right", 1) < 1)
    assert wrong == sorted(WRONG)
    assert task["counts"]["failed"] == 4 and task["gate"] == {"passed": False, "verdict": ANY_FAIL}
    xss = next(s for s in task["samples"] if s["id"] == XSS)
    assert xss["prompt"] == XSS_PROMPT and xss["system"] == "Be brief."
    assert [p["name"] for p in task["curves"]["pass@k:right"]] == ["pass@1:right", "pass@2:right"]
    assert task["sampling"] == {"temperature": 0.5}


class _Fail(str):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith("FAIL ")

    __hash__ = str.__hash__


ANY_FAIL = _Fail("FAIL ...")


# ---------------------------------------------------------------- the page


def test_embedded_json_holds_no_raw_less_than_and_reads_back() -> None:
    data = {"text": "</script><script>alert(1)</script><!-- \u2028", "n": [1.5, None]}
    text = embedded_json(data)
    assert "<" not in text
    assert orjson.loads(text) == data


@renders
def test_a_prompt_holding_a_script_is_data_and_never_markup(pytester: pytest.Pytester) -> None:
    page = render(build(make_run(pytester)))
    assert "alert(1)" in page  # it is there, as data
    assert page.count("<script") == 2  # the data element and the page's own script, nothing else
    assert "<script>alert" not in page
    samples = payload(page)["tasks"][0]["samples"]
    assert next(s["prompt"] for s in samples if s["id"] == XSS) == XSS_PROMPT


@renders
def test_the_page_needs_no_network() -> None:
    page = render(build(SAVED))
    assert "default-src 'none'" in page  # the browser refuses any load the page could make
    outside = set(re.findall(r"""(?:src|href)\s*=\s*["']?([a-z]+:)""", page, re.I))
    assert outside == set()
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)  # the SVG namespace is a name


def test_without_jinja2_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jinja2", None)
    with pytest.raises(EvalReplayError, match=re.escape(INSTALL)):
        render(build(SAVED))


# ---------------------------------------------------------------- view


@renders
def test_view_writes_one_file_and_says_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "deep" / "report.html"
    assert main(["view", str(SAVED), "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert payload(out.read_text())["tasks"][0]["name"] == "arithmetic"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "nope", "nope: no such run dir; pass the run dir a run wrote"),
        (lambda p: p, "has no manifest.json, so it is not a pytest-evalreplay run dir"),
    ],
)
def test_view_of_what_is_not_a_run_dir_says_so(tmp_path, capsys, make, message) -> None:
    assert main(["view", str(make(tmp_path)), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m pytest_evalreplay view: error: ") and message in err


def test_view_to_a_directory_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(SAVED), "-o", str(tmp_path)]) == 2
    assert f"-o {tmp_path} is a directory; name a file such as report.html" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (b'{"instance_id": 3, "generations": []}', "'instance_id' must be a string"),
        (
            b'{"instance_id": "x", "generations": [], "doc": "2+2"}',
            "'doc' must be an object (the lm-eval document) or null, got a string ('2+2')",
        ),
    ],
)
def test_view_of_a_malformed_predictions_line_names_file_and_line(tmp_path, capsys, row, message) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAVED, run)
    with open(run / "capitals-predictions.jsonl", "ab") as fh:
        fh.write(row + b"\n")
    assert main(["view", str(run), "-o", str(tmp_path / "r.html")]) == 2
    assert f"capitals-predictions.jsonl:11: {message}" in capsys.readouterr().err


@renders
def test_view_compare_has_both_runs_every_rollout(pytester: pytest.Pytester, monkeypatch) -> None:
    base = make_run(pytester, out="base")
    monkeypatch.setenv("FLAKY_WRONG", "q00,q02")
    new = make_run(pytester, out="new")
    assert main(["view", str(new), "--compare", str(base), "-o", "cmp.html"]) == 0
    cmp = payload((pytester.path / "cmp.html").read_text())["compare"]
    (task,) = cmp["tasks"]
    regressed = [f for f in task["flips"] if f["new"] < f["base"]]
    assert {f["instance_id"] for f in regressed if f["metric"] == "right"} == {"q00", "q02"}
    first = regressed[0]
    assert first["base_rollouts"] == [f"right {first['instance_id']}"] * 2
    assert first["new_rollouts"] == ["wrong", "wrong"]


# ---------------------------------------------------------------- compare --fail-on-regression


def test_fail_on_regression_exits_1_on_a_significant_drop_only(pytester, monkeypatch, capsys) -> None:
    base = make_run(pytester, out="base")
    monkeypatch.setenv("FLAKY_WRONG", ",".join(f"q{i:02d}" for i in range(12)))
    new = make_run(pytester, out="new")
    capsys.readouterr()
    assert main(["compare", str(base), str(new)]) == 0
    assert main(["compare", str(base), str(new), "--fail-on-regression"]) == 1
    assert "regression: flaky right: paired t-test" in capsys.readouterr().out
    assert (
        main(["compare", str(base), str(new), "--fail-on-regression", "--gated", "flaky:pass@2:right"]) == 1
    )
    assert main(["compare", str(base), str(new), "--fail-on-regression", "--gated", "other:right"]) == 0
    assert main(["compare", str(base), str(base), "--fail-on-regression"]) == 0


# ---------------------------------------------------------------- --evalreplay-html


@renders
def test_the_session_writes_the_report_with_its_gates(pytester: pytest.Pytester) -> None:
    make_run(pytester, "--evalreplay-html=out/report.html")
    data = payload((pytester.path / "out" / "report.html").read_text())
    gate = data["tasks"][0]["gate"]
    assert gate["passed"] is False and gate["verdict"].startswith("FAIL")
    assert data["run_dir"] == str(pytester.path / "run")


def test_the_report_is_refused_on_the_output_dirs_own_files(pytester: pytest.Pytester) -> None:
    make_project(pytester)
    result = pytester.runpytest_inprocess(
        "--evalreplay-output=run", "--evalreplay-html=run/flaky-metrics.json"
    )
    result.stderr.fnmatch_lines(
        [
            "ERROR: --evalreplay-html */run/flaky-metrics.json is one of the output dir's own files (*/run): "
            "writing it would destroy saved results. Write it elsewhere, "
            "e.g. --evalreplay-html=*/flaky-metrics.json"
        ]
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert not (pytester.path / "run" / "flaky-metrics.json").exists()


def test_a_session_that_ran_no_eval_says_no_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_ok():\n    pass\n")
    result = pytester.runpytest_inprocess(
        "--evalreplay-html=report.html", "-p", "no:cacheprovider", "--evalreplay-output=run"
    )
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "report.html").exists()


@pytest.mark.slow
@renders
def test_under_xdist_the_controller_writes_the_report(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    make_project(pytester)
    result = pytester.runpytest_subprocess("--evalreplay-output=run", "-n", "2", "--evalreplay-html=r.html")
    result.stdout.fnmatch_lines(["evalreplay: HTML report written to */r.html (*bytes)"])
    data = payload((pytester.path / "r.html").read_text())
    assert sorted(s["id"] for s in data["tasks"][0]["samples"] if s["failed"]) == sorted(FAILED)


@renders
def test_after_a_merge_the_report_shows_the_merged_dir(pytester: pytest.Pytester) -> None:
    import contextlib
    import io

    make_project(pytester)
    for k in (1, 2):
        pytester.runpytest_inprocess(
            f"--evalreplay-output=s{k}", "-p", "no:randomly", f"--evalreplay-shard={k}/2"
        )
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(
            ["merge", "merged", "s1", "s2", "--", "-p", "no:randomly", "--evalreplay-html=merged.html"]
        )
    assert code == 1, stderr.getvalue()  # the failed items and the gate fail, as in one run
    assert f"evalreplay: HTML report written to {pytester.path / 'merged.html'}" in stdout.getvalue()
    data = payload((pytester.path / "merged.html").read_text())
    assert data["run_dir"] == str(pytester.path / "merged")
    (task,) = data["tasks"]
    assert len(task["samples"]) == 13 and task["counts"]["failed"] == 4
    assert sorted(s["id"] for s in task["samples"] if s["failed"]) == sorted(FAILED)


def test_a_resumed_episode_says_where_it_went_live(pytester: pytest.Pytester) -> None:
    shutil.copytree(SAVED.parent, pytester.path, dirs_exist_ok=True)
    pytester.runpytest_inprocess("test_agent.py", "--evalreplay-output=run", "-p", "no:randomly")
    journal = pytester.path / "run" / "calculator-turns-journal.jsonl"
    lines = journal.read_bytes().splitlines()
    first = next(i for i, line in enumerate(lines) if b'"type":"gen"' in line and b'"calc-00|' in line)
    row = orjson.loads(lines[first])
    row["run"] = "an-earlier-run"  # turn 1 answered by a run that stopped after it, as a resumed episode's
    lines[first] = orjson.dumps(row)
    journal.write_bytes(b"\n".join(lines) + b"\n")
    calculator = build(pytester.path / "run")["tasks"][0]
    episode = next(e for e in calculator["episodes"] if e["id"] == "calc-00")
    assert [t["run"] == "an-earlier-run" for t in episode["turns"]] == [True, False]
    assert episode["live_from"] == 2
    assert all(e["live_from"] is None for e in calculator["episodes"] if e["id"] != "calc-00")


def test_a_graded_tasks_criteria_replies_are_in_the_report(pytester: pytest.Pytester) -> None:
    from test_grading import CONFTEST, EVALS, RUBRIC

    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = sampler\n")
    pytester.makepyfile(test_evals=EVALS.format(rubric=RUBRIC))
    pytester.runpytest_inprocess("--evalreplay-output=run").assert_outcomes(passed=4)
    (math,) = build(pytester.path / "run")["tasks"]
    replies = {j["id"]: j["replies"] for j in math["judge"]}
    assert replies["q0|r0|correct|t0"] == ["[[YES]]"] and replies["q1|r0|polite|t0"] == ["[[NO]]"]
    assert len(replies) == 4 * len(RUBRIC)
    asked = next(j["asked"] for j in math["judge"] if j["id"] == "q2|r0|polite|t0")
    assert "[Criterion]\nThe answer says thank" in asked and "[Answer]\n4" in asked
