"""Results you can trust: each numbered case of issue 8 that gave wrong or lost
results, as a pytester run (no mocks of the plugin's own parts)."""

from __future__ import annotations

import os
import socket

import orjson
import pytest

CONFTEST = """
import os, orjson
from pytest_evalreplay import Generation, GenerationError

class Counting:
    kind, batch_size = "counting", None

    def __init__(self, model):
        self.model = model

    def generate(self, requests):
        with open(os.environ["CALL_LOG"], "ab") as fh:
            fh.write(orjson.dumps([[r.instance_id, list(r.rollouts)] for r in requests]) + b"\\n")
        out = []
        for r in requests:
            if r.instance_id.startswith("none"):
                out.append([Generation(text=None) for _ in r.rollouts])
            elif r.instance_id.startswith("strtok"):
                out.append([Generation(text="x", prompt_tokens="5") for _ in r.rollouts])
            else:
                out.append([Generation(text=f"answer {r.instance_id} by {self.model}", finish_reason="stop")
                            for _ in r.rollouts])
        return out

def pytest_evalreplay_make_provider(config, kind):
    if kind == "counting":
        return Counting(config.getoption("evalreplay_model") or "m1")
    return None

def pytest_collection_modifyitems(items):
    if os.environ.get("REVERSE_ITEMS"):
        items.reverse()
"""

EVALS = """
from pytest_evalreplay import EvalTask, Gate

def score(text, instance):
    return float(int(instance["id"][1:]) % 3 != 0)

t = EvalTask("t", [{{"id": f"i{{n}}"}} for n in range({n})], prompt="Q {{id}}", scorer=score,
             num_samples={samples}, gate=Gate("score", min=0.5))
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    log = pytester.path / "calls.jsonl"
    monkeypatch.setenv("CALL_LOG", str(log))
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = counting\naddopts = -p no:benchmark -p no:randomly\n")

    class Project:
        out = pytester.path / "run"

        def make(self, n: int = 6, samples: int = 2, source: str | None = None) -> None:
            pytester.makepyfile(test_evals=source or EVALS.format(n=n, samples=samples))

        def asked(self) -> list[tuple[str, int]]:
            if not log.exists():
                return []
            calls = [orjson.loads(line) for line in log.read_bytes().splitlines()]
            return [(iid, r) for call in calls for iid, rollouts in call for r in rollouts]

        def metrics(self, task: str = "t") -> dict:
            return orjson.loads((self.out / f"{task}-metrics.json").read_bytes())

        def rows(self, name: str) -> list[dict]:
            path = self.out / name
            return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []

    return Project()


def run(pytester: pytest.Pytester, *args: str, **kwargs) -> pytest.RunResult:
    return pytester.runpytest("--evalreplay-output=run", *args, **kwargs)


def summary_value(result: pytest.RunResult, task: str = "t") -> str:
    line = next(x for x in result.outlines if x.startswith(f"{task}: ") and "|" in x)
    return line.split("score=")[1].split(" ")[0]


# -- 3: the gate verdict does not depend on item order ----------------------------


def test_the_gate_runs_after_its_task_whatever_the_order(pytester, project, monkeypatch):
    project.make()
    monkeypatch.setenv("REVERSE_ITEMS", "1")
    result = run(pytester, "--evalreplay-batch-size=1", "-v")
    result.assert_outcomes(passed=13)
    lines = [x for x in result.outlines if "PASSED" in x]
    assert "t::gate" in lines[-1]
    result.stdout.fnmatch_lines(["gate t: PASS score=0.6667; min 0.5; 0/12 items failed*"])


def test_a_gate_selected_alone_judges_what_the_journal_holds(pytester, project):
    project.make()
    result = run(pytester, "-k", "gate")
    result.assert_outcomes(failed=1, deselected=12)
    result.stdout.fnmatch_lines(["*12 items of the task have no result in the journal*"])
    run(pytester).assert_outcomes(passed=13)
    result = run(pytester, "-k", "gate")
    result.assert_outcomes(passed=1, deselected=12)
    result.stdout.fnmatch_lines(["gate t: PASS score=0.6667*"])
    assert len(project.asked()) == 12


# -- 4: one set of numbers ---------------------------------------------------------


def test_under_exitfirst_the_summary_and_metrics_json_agree(pytester, project):
    project.make(
        source=EVALS.format(n=6, samples=2).replace(
            "return float", "assert instance['id'] != 'i4'\n    return float"
        )
    )
    result = run(pytester, "-x")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    metrics = project.metrics()
    assert summary_value(result) == f"{metrics['metrics']['score']:.4f}"
    assert metrics["num_missing"] > 0 and not metrics["complete"]


def test_a_narrowed_resume_shows_the_same_number_in_summary_gate_and_metrics(pytester, project):
    project.make()
    run(pytester).assert_outcomes(passed=13)
    result = run(pytester, "--resume", "-k", "i0 or gate")
    metrics = project.metrics()
    value = f"{metrics['metrics']['score']:.4f}"
    assert summary_value(result) == value == "0.6667"
    result.stdout.fnmatch_lines([f"gate t: PASS score={value}*"])


# -- 5: one session per output dir ---------------------------------------------------


def test_a_second_session_on_the_same_output_dir_is_refused_naming_the_holder(pytester, project):
    from pytest_evalreplay.rundir.writer import SessionLock

    project.make()
    (pytester.path / "run").mkdir()
    holder = SessionLock(pytester.path / "run", "other-run")
    holder.acquire()
    try:
        result = run(pytester)
    finally:
        holder.release()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [f"*in use by another pytest session (pid {os.getpid()} on {socket.gethostname()}, started *"]
    )
    assert project.asked() == []


def test_another_model_never_reuses_this_models_rows(pytester, project):
    project.make(n=3, samples=1)
    run(pytester, "--evalreplay-model=A").assert_outcomes(passed=4)
    run(pytester, "--resume", "--evalreplay-model=B").assert_outcomes(passed=4)
    rows = project.rows("t-predictions.jsonl")
    assert {r["model"] for r in rows} == {"B"}
    assert all(r["generations"][0]["text"].endswith("by B") for r in rows)
    assert len(project.asked()) == 6


# -- 6: replaying a run dir never modifies it --------------------------------------


def test_replaying_a_run_dir_into_itself_is_refused(pytester, project):
    project.make(n=3, samples=1)
    run(pytester).assert_outcomes(passed=4)
    before = {p.name: p.read_bytes() for p in project.out.iterdir() if p.is_file()}
    result = run(pytester, "--evalreplay-predictions=run")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*replaying a run into itself would overwrite what it replays*"])
    assert {p.name: p.read_bytes() for p in project.out.iterdir() if p.is_file()} == before


def test_replaying_the_default_output_dir_into_itself_is_refused(pytester, project):
    project.make(n=3, samples=1)
    pytester.runpytest().assert_outcomes(passed=4)
    result = pytester.runpytest("--evalreplay-predictions=.pytest_cache/d/evalreplay")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_a_generation_whose_scorer_raised_is_still_saved_in_the_run_dir(pytester, project):
    project.make(
        source=EVALS.format(n=3, samples=1).replace(
            "return float", "assert instance['id'] != 'i1'\n    return float"
        )
    )
    result = run(pytester)
    result.assert_outcomes(passed=2, failed=2)
    saved = {r["instance_id"]: r for r in project.rows("t-predictions.jsonl")}
    assert saved["i1"]["generations"][0]["text"] == "answer i1 by m1"
    assert saved["i1"]["sample_scores"] == [None]
    # ...so replaying that run with a fixed scorer scores it.
    project.make(n=3, samples=1)
    result = pytester.runpytest("--evalreplay-predictions=run", "--evalreplay-output=replayed")
    result.assert_outcomes(passed=1, deselected=3)


# -- 7: only finite scores and well-typed generations --------------------------------


def test_a_nan_score_fails_its_item_naming_the_value_and_the_run_dir_is_written(pytester, project):
    project.make(
        source=EVALS.format(n=3, samples=1).replace(
            "return float(", "return float('nan') if instance['id'] == 'i2' else float("
        )
    )
    result = run(pytester)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*t i2[[]s1-r0[]]: scorer returned nan for 'score'; scores must be finite*"])
    metrics = project.metrics()
    assert metrics["failed"] == ["i2[s1-r0]"] and metrics["metrics"] == {"score": 0.5}
    result = run(pytester, "--resume")
    assert (
        result.ret == pytest.ExitCode.TESTS_FAILED
    )  # the scorer still says nan: still a failure, not a usage error


@pytest.mark.parametrize(
    ("iid", "field"), [("none0", "'text' must be a string"), ("strtok0", "'prompt_tokens'")]
)
def test_a_badly_typed_generation_fails_that_request_not_scored_zero(pytester, project, iid, field):
    project.make(
        source=f"""
from pytest_evalreplay import EvalTask
t = EvalTask("t", [{{"id": "{iid}"}}, {{"id": "ok"}}], prompt="Q {{id}}", scorer=lambda text, i: 1.0)
"""
    )
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*t {iid}[[]s1-r0[]]: provider returned a bad Generation*{field}*"])
    assert project.metrics()["metrics"] == {"score": 1.0}


# -- 8: pytest-xdist under every --dist mode ---------------------------------------------


# `load` and `worksteal` are tests/test_scale.py's: each rollout generated once
# and the run dir a serial run writes.
@pytest.mark.slow
@pytest.mark.parametrize("dist", ["loadscope", "loadfile", "loadgroup"])
def test_xdist_generates_each_rollout_once_under_every_dist_mode(pytester, project, dist):
    pytest.importorskip("xdist")
    project.make(n=20, samples=2)
    result = run(pytester, "-n", "2", f"--dist={dist}", "--evalreplay-batch-size=3")
    result.assert_outcomes(passed=41)
    asked = project.asked()
    assert len(asked) == len(set(asked)) == 40
    gens = [(r["instance_id"], r["rollout"]) for r in project.rows("t-journal.jsonl") if r["type"] == "gen"]
    assert len(gens) == len(set(gens)) == 40
    assert summary_value(result) == f"{project.metrics()['metrics']['score']:.4f}"


@pytest.mark.slow
def test_xdist_copes_with_instance_ids_holding_colons(pytester, project):
    pytest.importorskip("xdist")
    project.make(
        source="""
from pytest_evalreplay import EvalTask
t = EvalTask("t", [{"id": f"doc:{n}:q"} for n in range(8)], prompt="Q {id}", scorer=lambda text, i: 1.0,
             num_samples=2)
"""
    )
    result = run(pytester, "-n", "2")
    result.assert_outcomes(passed=16)
    asked = project.asked()
    assert len(asked) == len(set(asked)) == 16


# -- 9: files in the output dir never follow links ----------------------------------------


def test_symlinks_planted_in_the_output_dir_are_never_written_through(pytester, project, tmp_path):
    project.make(n=3, samples=1)
    out = pytester.path / "run"
    out.mkdir()
    victims = {}
    for name in ("t-predictions.jsonl", ".t-predictions.jsonl.tmp", "t-metrics.json", ".t-metrics.json.tmp"):
        victim = tmp_path / f"victim-{name.strip('.')}"
        victim.write_bytes(b"precious\n")
        (out / name).symlink_to(victim)
        victims[name] = victim
    run(pytester).assert_outcomes(passed=4)
    assert all(v.read_bytes() == b"precious\n" for v in victims.values())
    assert not (out / "t-predictions.jsonl").is_symlink()


def test_a_symlinked_journal_is_refused_not_appended_through(pytester, project, tmp_path):
    project.make(n=3, samples=1)
    run(pytester, "-k", "i0").assert_outcomes(passed=1, deselected=3)
    victim = tmp_path / "victim.jsonl"
    journal = pytester.path / "run" / "t-journal.jsonl"
    victim.write_bytes(journal.read_bytes())
    journal.unlink()
    journal.symlink_to(victim)
    before = victim.read_bytes()
    result = run(pytester, "--resume")
    assert victim.read_bytes() == before
    assert "symlink" in result.stdout.str() + result.stderr.str()


# -- 10: a task imported into a second module ----------------------------------------------


def test_a_task_imported_into_a_second_module_is_collected_and_generated_once(pytester, project):
    project.make(n=3, samples=1)
    pytester.makepyfile(test_more="from test_evals import t\n\ndef test_plain():\n    assert t.name == 't'\n")
    result = run(pytester, "--collect-only", "-q")
    ids = [x for x in result.outlines if "::" in x]
    assert [x for x in ids if "t::i0" in x] == ["test_evals.py::t::i0[s1-r0]"]
    run(pytester).assert_outcomes(passed=5)
    assert len(project.asked()) == 3


# -- issue #30 case 2: an output path on one of the run dir's own files ------------


@pytest.mark.parametrize(
    "option",
    [
        "--evalreplay-report=run/t-journal.jsonl",
        "--evalreplay-report=run/manifest.json",
        "--evalreplay-report=run/.evalreplay-locks/t.lock",
        "--evalreplay-baseline=run/t-metrics.json",
        "--evalreplay-compare=run",
    ],
)
def test_an_output_path_on_the_run_dirs_own_files_is_refused_and_nothing_is_lost(pytester, project, option):
    project.make(n=3, samples=1)
    run(pytester).assert_outcomes(passed=4)
    before = {p.name: p.read_bytes() for p in project.out.iterdir() if p.is_file()}
    extra = ("--evalreplay-update-baseline",) if "baseline" in option else ()
    result = run(pytester, option, *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    name = option.split("=")[0]
    result.stderr.fnmatch_lines([f"*{name} *output dir*"])
    assert {p.name: p.read_bytes() for p in project.out.iterdir() if p.is_file()} == before


def test_a_report_beside_the_run_dirs_files_is_written(pytester, project):
    project.make(n=3, samples=1)
    run(pytester, "--evalreplay-report=run/report.md").assert_outcomes(passed=4)
    assert (project.out / "report.md").read_text().startswith("#")
