"""--resume as pytest users meet it: the config fingerprint, reuse, fresh
starts, and failures across runs. Each test builds a small project with
`pytester`; the provider logs every call to a file, so calls are counted
across runs (and across processes, where a test needs a real interrupt)."""

from __future__ import annotations

import shutil

import orjson
import pytest

# A provider that answers "answer <id>" and logs each generate() call as one
# JSON line of [instance_id, rollouts] pairs. Instance ids steer failures:
#   bad*    -> terminal error ("context too long"), every time
#   flaky*  -> retryable error for its first $FLAKY_FAILS attempts (counted in a file)
#   stop*   -> KeyboardInterrupt, while $INTERRUPT is set
# The provider's kind is the one asked for, its model --evalreplay-model.
CONFTEST = """
import os
import orjson
import pytest
from pytest_evalreplay import Generation, GenerationError

class Counting:
    batch_size = None

    def __init__(self, kind, model):
        self.kind, self.model = kind, model

    def generate(self, requests):
        with open(os.environ["CALL_LOG"], "ab") as fh:
            fh.write(orjson.dumps([[r.instance_id, list(r.rollouts)] for r in requests]) + b"\\n")
        out = []
        for r in requests:
            if r.instance_id.startswith("stop") and os.environ.get("INTERRUPT"):
                raise KeyboardInterrupt
            if r.instance_id.startswith("bad"):
                out.append(GenerationError("context too long", retryable=False))
                continue
            if r.instance_id.startswith("flaky"):
                counter = os.environ["CALL_LOG"] + "." + r.instance_id
                n = 1
                if os.path.exists(counter):
                    with open(counter) as fh:
                        n += int(fh.read())
                with open(counter, "w") as fh:
                    fh.write(str(n))
                if n <= int(os.environ.get("FLAKY_FAILS", "0")):
                    out.append(GenerationError(f"503 from server (call {n})", retryable=True))
                    continue
            out.append([Generation(text=f"answer {r.instance_id}", finish_reason="stop") for _ in r.rollouts])
        return out

def pytest_evalreplay_make_provider(config, kind):
    if kind in ("counting", "counting2"):
        return Counting(kind, config.getoption("evalreplay_model") or "m1")
    return None

def pytest_collection_modifyitems(items):
    if os.environ.get("REVERSE_ITEMS"):
        items.reverse()
"""

EVALS = """
from pytest_evalreplay import EvalTask, scorers

def ask(instance):
    return {ask_body}

def judge(text, instance):
    return {judge_body}

t = EvalTask(
    "t",
    {instances},
    prompt={prompt},
    scorer={scorer},
    target={target},
    system_prompt={system_prompt},
    num_samples={num_samples},
    sampling={sampling},
    strip_reasoning={strip_reasoning},
)
"""

BASE = {
    "instances": '[{"id": "alpha", "gold": "answer alpha", "alt": "x"}, '
    '{"id": "beta", "gold": "no", "alt": "y"}]',
    "prompt": '"Question {id}"',
    "ask_body": '"Question " + instance["id"]',
    "judge_body": 'float(text.endswith(instance["id"]))',
    "scorer": '"exact_match"',
    "target": '"gold"',
    "system_prompt": "None",
    "num_samples": "2",
    "sampling": '{"temperature": 0.0, "max_tokens": 16}',
    "strip_reasoning": "False",
}
ITEMS = 4  # 2 instances x 2 samples


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    log = pytester.path / "calls.jsonl"
    monkeypatch.setenv("CALL_LOG", str(log))
    pytester.makeconftest(CONFTEST)
    # pytest-benchmark, where installed, warns in these inner runs when the suite runs under xdist.
    pytester.makeini("[pytest]\nevalreplay_provider = counting\naddopts = -p no:benchmark -p no:randomly\n")

    def make(source: str | None = None, **fields: str) -> None:
        pytester.makepyfile(test_evals=source or EVALS.format(**{**BASE, **fields}))

    def calls() -> list[list[list]]:
        return [orjson.loads(line) for line in log.read_bytes().splitlines()] if log.exists() else []

    def asked() -> list[tuple[str, int]]:
        return [(iid, r) for call in calls() for iid, rollouts in call for r in rollouts]

    def rows(name: str, out: str = "run") -> list[dict]:
        path = pytester.path / out / name
        return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []

    def metrics(out: str = "run") -> dict:
        return orjson.loads((pytester.path / out / "t-metrics.json").read_bytes())

    make.calls, make.asked, make.rows, make.metrics = calls, asked, rows, metrics
    return make


def run(pytester: pytest.Pytester, *args: str, out: str = "run", **kwargs: bool) -> pytest.RunResult:
    return pytester.runpytest(f"--evalreplay-output={out}", *args, **kwargs)


def journal_rows(project, kind: str, out: str = "run") -> list[dict]:
    return [r for r in project.rows("t-journal.jsonl", out) if r["type"] == kind]


def fail_rows(project, out: str = "run") -> list[tuple[str, int, str, bool]]:
    return [
        (f["instance_id"], f["attempt"], f["failure_class"], f["final"])
        for f in journal_rows(project, "fail", out)
    ]


# -- what decides reuse: the request as sent, and the provider ------------------------

# field changed -> (fields before, fields after, extra args, rollouts asked again)
REGENERATE = {
    "prompt template": ({}, {"prompt": '"Q: {id}"'}, ()),
    "prompt callable's source": (
        {"prompt": "ask"},
        {"prompt": "ask", "ask_body": '"Q: " + instance["id"]'},
        (),
    ),
    "instance field the prompt reads": (
        {"prompt": '"Question {id} {alt}"'},
        {
            "prompt": '"Question {id} {alt}"',
            "instances": BASE["instances"].replace('"x"', '"x2"').replace('"y"', '"y2"'),
        },
        (),
    ),
    "system prompt": ({}, {"system_prompt": '"Answer briefly."'}, ()),
    "sampling temperature": ({}, {"sampling": '{"temperature": 0.7, "max_tokens": 16}'}, ()),
    "sampling top_p": ({}, {"sampling": '{"temperature": 0.0, "max_tokens": 16, "top_p": 0.9}'}, ()),
    "provider kind": ({}, {}, ("--evalreplay-provider=counting2",)),
    "provider model": ({}, {}, ("--evalreplay-model=m2",)),
}


@pytest.mark.parametrize("case", list(REGENERATE))
def test_a_changed_request_or_provider_regenerates_and_says_why(pytester, project, case):
    before, after, args = REGENERATE[case]
    project(**before)
    run(pytester).assert_outcomes(passed=ITEMS)
    first = len(project.asked())
    project(**{**before, **after})
    result = run(pytester, "--resume", *args)
    result.assert_outcomes(passed=ITEMS)
    why = "provider changed" if case.startswith("provider") else "request changed"
    result.stdout.fnmatch_lines(
        [
            f"t: 2 instances, {ITEMS} items, 0 failed | {ITEMS} generated, 0 reused, "
            f"{ITEMS} regenerated ({why})*"
        ]
    )
    assert len(project.asked()) == first + ITEMS


def test_editing_a_module_level_string_the_prompt_callable_reads_regenerates(pytester, project):
    # Issue 8, case 1: a prompt callable was fingerprinted by its own source, so
    # editing the few-shot string it reads reused every old generation.
    source = (
        "from pytest_evalreplay import EvalTask\n"
        "FEWSHOT = {shot!r}\n"
        "t = EvalTask('t', [{{'id': 'alpha'}}, {{'id': 'beta'}}], prompt=lambda i: FEWSHOT + i['id'],\n"
        "             scorer=lambda text, i: 1.0)\n"
    )
    project(source.format(shot="Q: 1+1? A: 2\n"))
    run(pytester).assert_outcomes(passed=2)
    project(source.format(shot="Q: 2+2? A: 4\n"))
    result = run(pytester, "--resume")
    result.assert_outcomes(passed=2)
    assert len(project.asked()) == 4
    contexts = [r["context"] for r in project.rows("t-requests.jsonl")]
    assert contexts == ["Q: 2+2? A: 4\nalpha", "Q: 2+2? A: 4\nbeta"]


def test_editing_a_helper_the_scorer_calls_rescores_without_generating(pytester, project):
    # Issue 8, case 1 (scorer half): scores are recomputed by the current scorer on every run.
    source = (
        "from pytest_evalreplay import EvalTask\n"
        "def helper(text):\n"
        "    return {value}\n"
        "t = EvalTask('t', [{{'id': 'alpha'}}, {{'id': 'beta'}}], prompt='Q {{id}}',\n"
        "             scorer=lambda text, i: helper(text))\n"
    )
    project(source.format(value="0.0"))
    run(pytester).assert_outcomes(passed=2)
    assert project.metrics()["metrics"] == {"score": 0.0}
    project(source.format(value="1.0"))
    result = run(pytester, "--resume")
    result.stdout.fnmatch_lines(
        ["*t: 2 instances, 2 items, 0 failed | 0 generated, 2 reused | score=1.0000*"]
    )
    assert len(project.asked()) == 2
    assert project.metrics()["metrics"] == {"score": 1.0}
    assert [p["scores"] for p in project.rows("t-predictions.jsonl")] == [{"score": 1.0}] * 2


RESCORE_ONLY = {
    "builtin scorer parameters": {"scorer": "scorers.exact_match(normalize=False)"},
    "scorer source": {"scorer": "judge", "judge_body": 'float(text.startswith("answer"))'},
    "target field": {"target": '"alt"'},
    "strip_reasoning": {"strip_reasoning": "True"},
    "an instance field the prompt does not read": {"instances": BASE["instances"].replace('"x"', '"x2"')},
    "key order of sampling": {"sampling": '{"max_tokens": 16, "temperature": 0.0}'},
}


@pytest.mark.parametrize("case", list(RESCORE_ONLY))
def test_what_does_not_change_the_request_is_rescored_not_regenerated(pytester, project, case):
    project()
    run(pytester).assert_outcomes(passed=ITEMS)
    project(**RESCORE_ONLY[case])
    result = run(pytester, "--resume")
    result.assert_outcomes(passed=0)
    result.stdout.fnmatch_lines([f"*{ITEMS} reused from the journal (deselected)*"])
    assert len(project.asked()) == ITEMS


def test_more_samples_generate_only_the_new_rollouts(pytester, project):
    project()
    run(pytester).assert_outcomes(passed=ITEMS)
    project(num_samples="3")
    run(pytester, "--resume").assert_outcomes(passed=2)
    assert project.asked()[ITEMS:] == [("alpha", 2), ("beta", 2)]


@pytest.mark.slow  # pytest-xdist workers started
def test_batch_size_item_order_and_worker_count_do_not_matter(pytester, project, monkeypatch):
    project()
    run(pytester).assert_outcomes(passed=ITEMS)
    monkeypatch.setenv("REVERSE_ITEMS", "1")
    run(pytester, "--resume", "--evalreplay-batch-size=1").assert_outcomes(passed=0)
    pytest.importorskip("xdist")
    run(pytester, "--resume", "-n", "2").assert_outcomes(skipped=ITEMS)
    assert len(project.asked()) == ITEMS


def test_a_moved_output_dir_is_reused(pytester, project):
    project()
    run(pytester, out="here").assert_outcomes(passed=ITEMS)
    shutil.move(pytester.path / "here", pytester.path / "there")
    run(pytester, "--resume", out="there").assert_outcomes(passed=0)
    assert len(project.asked()) == ITEMS


# -- reuse --------------------------------------------------------------------------


def test_resume_deselects_reused_items_and_counts_them(pytester, project):
    project()
    run(pytester).assert_outcomes(passed=ITEMS)
    metrics = project.metrics()
    result = run(pytester, "--resume")
    result.assert_outcomes(deselected=ITEMS)
    result.stdout.fnmatch_lines(
        [
            f"evalreplay: 1 task, 0 to run, {ITEMS} reused from the journal (deselected)",
            f"t: 2 instances, {ITEMS} items, 0 failed | 0 generated, {ITEMS} reused | exact_match=0.5000*",
        ]
    )
    assert len(project.asked()) == ITEMS
    again = project.metrics()
    assert {k: v for k, v in again.items() if k != "session"} == {
        k: v for k, v in metrics.items() if k != "session"
    }


def test_report_reused_keeps_reused_items_as_skipped_with_their_scores(pytester, project):
    project()
    run(pytester).assert_outcomes(passed=ITEMS)
    result = run(pytester, "--resume", "--evalreplay-report-reused", "-rs", "--junitxml=out.xml")
    result.assert_outcomes(skipped=ITEMS)
    result.stdout.fnmatch_lines([f"SKIPPED [[]{ITEMS}[]] *: evalreplay: reused from journal"])
    xml = (pytester.path / "out.xml").read_text()
    assert xml.count('name="score.exact_match"') == ITEMS and 'name="evalreplay.reused"' in xml


def test_resume_runs_only_the_rest_and_the_run_dir_matches_an_uninterrupted_run(pytester, project):
    project()
    run(pytester, out="whole").assert_outcomes(passed=ITEMS)
    run(pytester, "-k", "alpha and r1").assert_outcomes(passed=1, deselected=ITEMS - 1)
    run(pytester, "--resume", "-k", "beta").assert_outcomes(passed=2, deselected=2)
    result = run(pytester, "--resume")
    result.assert_outcomes(passed=1, deselected=3)
    assert project.calls()[-3:] == [[["alpha", [1]]], [["beta", [0, 1]]], [["alpha", [0]]]]
    for name in ("t-requests.jsonl", "t-predictions.jsonl", "manifest.json"):
        assert (pytester.path / "run" / name).read_bytes() == (pytester.path / "whole" / name).read_bytes()
    whole = project.metrics("whole")
    assert {k: v for k, v in project.metrics().items() if k != "session"} == {
        k: v for k, v in whole.items() if k != "session"
    }


# -- narrowed runs keep the rest (issue 8, case 2) -------------------------------------


def test_a_k_run_without_resume_regenerates_what_it_selects_and_keeps_the_rest(pytester, project):
    project()
    run(pytester).assert_outcomes(passed=ITEMS)
    full = project.metrics()
    run(pytester, "-k", "beta and r0").assert_outcomes(passed=1, deselected=ITEMS - 1)
    assert project.asked()[ITEMS:] == [("beta", 0)]
    metrics = project.metrics()
    assert (metrics["num_items"], metrics["num_missing"], metrics["complete"]) == (ITEMS, 0, True)
    assert metrics["metrics"] == full["metrics"]
    assert len(project.rows("t-predictions.jsonl")) == 2


def test_lf_after_a_full_run_keeps_everything_else(pytester, project):
    project(instances='[{"id": "alpha"}, {"id": "bad1"}]', scorer="judge")
    run(pytester).assert_outcomes(passed=2, failed=2)
    result = run(pytester, "--lf")
    result.assert_outcomes(failed=2, deselected=2)
    metrics = project.metrics()
    assert (metrics["num_items"], metrics["num_failed"], metrics["metrics"]) == (4, 2, {"judge": 1.0})
    assert [p["instance_id"] for p in project.rows("t-predictions.jsonl")] == ["alpha"]


def test_a_narrowed_run_says_how_many_items_are_missing(pytester, project):
    project()
    run(pytester, "-k", "alpha").assert_outcomes(passed=2, deselected=2)
    metrics = project.metrics()
    assert (metrics["num_items"], metrics["num_missing"], metrics["complete"]) == (ITEMS, 2, False)


def test_reset_discards_a_tasks_saved_results(pytester, project):
    project()
    run(pytester).assert_outcomes(passed=ITEMS)
    run(pytester, "--evalreplay-reset", "-k", "alpha").assert_outcomes(passed=2, deselected=2)
    metrics = project.metrics()
    assert (metrics["num_items"], metrics["num_missing"]) == (ITEMS, 2)
    assert [p["instance_id"] for p in project.rows("t-predictions.jsonl")] == ["alpha"]


def test_a_full_run_without_resume_regenerates_everything_and_keeps_the_journal(pytester, project):
    project(instances='[{"id": "a"}, {"id": "bad1"}]', scorer="judge")
    run(pytester).assert_outcomes(passed=2, failed=2)
    project(instances='[{"id": "a"}, {"id": "b"}]', scorer="judge")
    run(pytester).assert_outcomes(passed=ITEMS)
    rows = project.rows("t-journal.jsonl")
    gens = [(r["instance_id"], r["rollout"]) for r in rows if r["type"] == "gen"]
    assert sorted(set(gens)) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert project.asked().count(("a", 0)) == 2


def test_a_bare_run_dying_before_its_first_row_keeps_what_the_journal_held(pytester, project, monkeypatch):
    project(instances='[{"id": "stop"}]', num_samples="1", scorer="judge")
    run(pytester).assert_outcomes(passed=1)
    monkeypatch.setenv("INTERRUPT", "1")
    result = run(pytester, no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert len(journal_rows(project, "gen")) == 1  # the first run's answer is still there
    monkeypatch.delenv("INTERRUPT")
    run(pytester, "--resume").assert_outcomes(passed=0)  # reused: nothing asked again
    assert project.asked() == [("stop", 0)] * 2


def test_cache_clear_removes_the_journal(pytester, project):
    project()
    pytester.runpytest().assert_outcomes(passed=ITEMS)
    assert (pytester.path / ".pytest_cache" / "d" / "evalreplay" / "t-journal.jsonl").exists()
    pytester.runpytest("--resume").assert_outcomes(passed=0)
    pytester.runpytest("--resume", "--cache-clear").assert_outcomes(passed=ITEMS)
    assert len(project.asked()) == 2 * ITEMS


# -- failures across runs -----------------------------------------------------------


def test_retryable_failures_are_retried_in_the_run_and_kept_out_of_metrics(pytester, project, monkeypatch):
    monkeypatch.setenv("FLAKY_FAILS", "2")
    project(instances='[{"id": "a"}, {"id": "flaky"}]', num_samples="1", scorer="judge")
    run(pytester).assert_outcomes(passed=2)
    assert project.asked().count(("flaky", 0)) == 3
    assert fail_rows(project) == [("flaky", 1, "retryable", False), ("flaky", 2, "retryable", False)]
    assert "503 from server" in journal_rows(project, "fail")[0]["message"]
    assert project.metrics()["num_failed"] == 0
    assert [r["instance_id"] for r in journal_rows(project, "gen")] == ["a", "flaky"]


def test_the_attempt_cap_holds_across_runs_and_a_raised_cap_retries(pytester, project, monkeypatch):
    monkeypatch.setenv("FLAKY_FAILS", "4")
    project(instances='[{"id": "a"}, {"id": "flaky"}]', num_samples="1", scorer="judge")
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*t flaky[[]s1-r0[]]: 503 from server (call 3)*"])
    assert project.asked().count(("flaky", 0)) == 3
    assert project.metrics()["failed"] == ["flaky[s1-r0]"]
    assert project.metrics()["metrics"] == {"judge": 1.0}

    result = run(pytester, "--resume")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(
        ["*failed for good in an earlier run (attempt 3, retryable)*raise --evalreplay-max-attempts*"]
    )
    assert project.asked().count(("flaky", 0)) == 3

    run(pytester, "--resume", "--evalreplay-max-attempts=5").assert_outcomes(passed=1, deselected=1)
    assert project.asked().count(("flaky", 0)) == 5
    attempts = [(a, final) for _, a, _, final in fail_rows(project)]
    assert attempts == [(1, False), (2, False), (3, True), (4, False)]
    assert project.metrics()["num_failed"] == 0


def test_attempts_are_durable_before_the_retry_so_an_interrupted_retry_still_counts(
    pytester, project, monkeypatch
):
    # Attempt 1 fails retryably; the retry is interrupted (a kill-shaped end
    # that records nothing). The next run makes attempt 2 of 2, and no more.
    monkeypatch.setenv("FLAKY_FAILS", "9")
    pytester.makeconftest(
        CONFTEST
        + """
_generate = Counting.generate
def generate(self, requests):
    if os.environ.get("INTERRUPT_AT_RETRY") and os.path.exists(os.environ["CALL_LOG"] + ".flaky"):
        raise KeyboardInterrupt
    return _generate(self, requests)
Counting.generate = generate
"""
    )
    project(instances='[{"id": "flaky"}]', num_samples="1", scorer="judge")
    monkeypatch.setenv("INTERRUPT_AT_RETRY", "1")
    result = run(pytester, "--evalreplay-max-attempts=2", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert [a for _, a, _, _ in fail_rows(project)] == [1]
    monkeypatch.delenv("INTERRUPT_AT_RETRY")
    run(pytester, "--resume", "--evalreplay-max-attempts=2").assert_outcomes(failed=1)
    assert project.asked() == [("flaky", 0)] * 2
    assert [(a, final) for _, a, _, final in fail_rows(project)] == [(1, False), (2, True)]


def test_a_terminal_failure_is_final_at_once_and_its_hint_is_true(pytester, project):
    project(instances='[{"id": "a"}, {"id": "bad1"}]', num_samples="1", scorer="judge")
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*t bad1[[]s1-r0[]]: context too long*"])
    assert fail_rows(project) == [("bad1", 1, "terminal", True)]
    for args in ((), ("--evalreplay-max-attempts=9",)):
        result = run(pytester, "--resume", *args)
        result.assert_outcomes(failed=1, deselected=1)
        result.stdout.fnmatch_lines(
            ["*failed for good in an earlier run (attempt 1, terminal)*run without --resume*"]
        )
        assert "max-attempts" not in result.stdout.str()
    assert project.asked().count(("bad1", 0)) == 1
    metrics = project.metrics()
    assert (metrics["metrics"], metrics["num_items"], metrics["num_failed"]) == ({"judge": 1.0}, 2, 1)


def test_a_task_whose_only_item_failed_for_good_is_still_written_on_resume(pytester, project):
    project(instances='[{"id": "bad1"}]', num_samples="1", scorer="judge")
    run(pytester).assert_outcomes(failed=1)
    (pytester.path / "run" / "t-metrics.json").unlink()
    run(pytester, "--resume").assert_outcomes(failed=1)
    assert project.metrics()["failed"] == ["bad1[s1-r0]"]


def test_keyboard_interrupt_writes_nothing_for_what_was_in_flight(pytester, project, monkeypatch):
    project(instances='[{"id": "a"}, {"id": "stop"}, {"id": "c"}]', num_samples="1", scorer="judge")
    monkeypatch.setenv("INTERRUPT", "1")
    result = run(pytester, "--evalreplay-batch-size=1", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert [r["instance_id"] for r in journal_rows(project, "gen")] == ["a"]
    assert fail_rows(project) == []
    monkeypatch.delenv("INTERRUPT")
    result = run(pytester, "--resume", "--evalreplay-batch-size=1")
    result.assert_outcomes(passed=2, deselected=1)
    assert project.asked() == [("a", 0), ("stop", 0), ("stop", 0), ("c", 0)]
    assert [p["instance_id"] for p in project.rows("t-predictions.jsonl")] == ["a", "stop", "c"]


# -- damaged journals ---------------------------------------------------------------


def test_a_torn_last_line_is_skipped_with_a_note_even_when_warnings_are_errors(pytester, project):
    project()
    run(pytester, "-k", "alpha").assert_outcomes(passed=2, deselected=2)
    path = pytester.path / "run" / "t-journal.jsonl"
    with path.open("ab") as fh:
        fh.write(b'{"type": "gen", "stage": 1, "instance_id": "beta", "rol')
    result = run(pytester, "--resume", "-W", "error")
    result.assert_outcomes(passed=2, deselected=2)
    result.stdout.fnmatch_lines(["note: *t-journal.jsonl:*: ignored a torn last line (a run died mid-write)"])
    assert all(line.startswith(b"{") and line.endswith(b"}") for line in path.read_bytes().splitlines())
    assert len(project.asked()) == ITEMS
    assert "INTERNALERROR" not in result.stdout.str()


def test_a_malformed_journal_line_is_a_usage_error_naming_file_and_line(pytester, project):
    project()
    run(pytester).assert_outcomes(passed=ITEMS)
    path = pytester.path / "run" / "t-journal.jsonl"
    rows = path.read_bytes().splitlines()
    rows[2] = rows[2][:-5]
    path.write_bytes(b"\n".join(rows) + b"\n")
    result = run(pytester, "--resume")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*t-journal.jsonl:3: malformed journal line*--evalreplay-reset*"])
    # A plain run reads the journal too (it keeps what it holds): the bad line is still named.
    assert run(pytester).ret == pytest.ExitCode.USAGE_ERROR
    run(pytester, "--evalreplay-reset").assert_outcomes(passed=ITEMS)  # only a reset starts over


def test_journal_rows_of_items_the_task_does_not_have_are_ignored_naming_file_and_line(pytester, project):
    # Issue 8, case 11.
    project()
    run(pytester).assert_outcomes(passed=ITEMS)
    path = pytester.path / "run" / "t-journal.jsonl"
    good = next(r for r in project.rows("t-journal.jsonl") if r["type"] == "gen")
    bad = [{**good, "instance_id": "ghost"}, {**good, "rollout": 7}, {**good, "stage": -3}]
    with path.open("ab") as fh:
        fh.write(b"".join(orjson.dumps(r) + b"\n" for r in bad))
    result = run(pytester, "--resume")
    result.assert_outcomes(passed=0)
    result.stdout.fnmatch_lines(
        ["note: t: ignored journal rows for items the task does not have: *t-journal.jsonl:*"]
    )
    metrics = project.metrics()
    assert (metrics["num_items"], metrics["metrics"]) == (ITEMS, {"exact_match": 0.5})


def test_reuse_scores_keeps_saved_scores_of_an_expensive_scorer(pytester, project):
    source = (
        "import os\n"
        "from pytest_evalreplay import EvalTask\n"
        "def expensive(text, instance):\n"
        "    with open(os.environ['CALL_LOG'] + '.scored', 'a') as fh:\n"
        "        fh.write(instance['id'] + '\\n')\n"
        "    return {value}\n"
        "t = EvalTask('t', [{{'id': 'alpha'}}, {{'id': 'beta'}}], prompt='Q {{id}}', scorer=expensive)\n"
    )
    project(source.format(value="0.25"))
    run(pytester).assert_outcomes(passed=2)
    project(source.format(value="1.0"))
    scored = pytester.path / "calls.jsonl.scored"
    result = run(pytester, "--resume", "--evalreplay-reuse-scores")
    result.stdout.fnmatch_lines(["*| 0 generated, 2 reused | expensive=0.2500*"])
    assert scored.read_text().split() == ["alpha", "beta"]  # scored once, in the first run
    run(pytester, "--resume")
    assert project.metrics()["metrics"] == {"expensive": 1.0}


def test_a_narrowed_run_after_a_scorer_edit_rescores_the_rest_with_the_current_scorer(pytester, project):
    source = (
        "from pytest_evalreplay import EvalTask\n"
        "t = EvalTask('t', [{{'id': 'alpha'}}, {{'id': 'beta'}}], prompt='Q {{id}}',\n"
        "             scorer=lambda text, i: {value})\n"
    )
    project(source.format(value="0.0"))
    run(pytester).assert_outcomes(passed=2)
    project(source.format(value="1.0"))
    run(pytester, "-k", "alpha").assert_outcomes(passed=1, deselected=1)
    assert project.asked() == [("alpha", 0), ("beta", 0), ("alpha", 0)]  # beta not generated again...
    assert project.metrics()["metrics"] == {"score": 1.0}  # ...but scored by the current scorer
    assert [p["scores"] for p in project.rows("t-predictions.jsonl")] == [{"score": 1.0}] * 2
