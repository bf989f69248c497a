"""Comparing two runs: run dirs read from files, in-memory snapshots, the
text and Markdown reports, and the `python -m pytest_evalreplay compare` CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_evalreplay.__main__ import main
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.stats import instance_interval, paired_test
from pytest_evalreplay.report.compare import (
    RunSnapshot,
    TaskSnapshot,
    compare_run_dirs,
    compare_runs,
    compare_with_saved,
)
from pytest_evalreplay.report.compare_render import md_escape, render_markdown, render_text
from pytest_evalreplay.rundir.snapshot import load_run_dir
from pytest_evalreplay.values.snippets import prompt_line, shorten

REPO = Path(__file__).resolve().parent.parent

# instance -> (rollout scores, first answer)
Instances = dict[str, tuple[list[float], str]]


def write_run(root: Path, tasks: dict[str, Instances], model: str = "m1", metric: str = "acc") -> Path:
    """A run dir as the plugin writes it: manifest, and per task requests,
    predictions (scores = mean over rollouts, sample_scores) and metrics."""
    root.mkdir(parents=True, exist_ok=True)
    manifest = {"format": "evalreplay/1", "model": model, "provider": {"kind": "x"}, "tasks": sorted(tasks)}
    (root / "manifest.json").write_bytes(orjson.dumps(manifest))
    for task, instances in tasks.items():
        requests, predictions, means = [], [], []
        for iid, (samples, answer) in instances.items():
            requests.append(
                {
                    "instance_id": iid,
                    "request_type": "generate",
                    "context": f"\n  Question {iid}:   what is it?\nThink step by step.",
                    "system_prompt": None,
                    "num_samples": len(samples),
                    "sampling": {},
                }
            )
            gens = [
                {"text": answer if r == 0 else f"other {r}", "finish_reason": "stop"}
                for r in range(len(samples))
            ]
            mean = sum(samples) / len(samples)
            means.append(mean)
            predictions.append(
                {
                    "instance_id": iid,
                    "model": model,
                    "generations": gens,
                    "scores": {metric: mean},
                    "sample_scores": [{metric: s} for s in samples],
                }
            )
        for kind, rows in (("requests", requests), ("predictions", predictions)):
            (root / f"{task}-{kind}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        doc = {"task": task, "model": model, "metrics": {metric: sum(means) / len(means)}}
        (root / f"{task}-metrics.json").write_bytes(orjson.dumps(doc))
    return root


BASE: Instances = {
    "q1": ([1.0, 1.0], "The answer is 4."),
    "q2": ([1.0, 1.0], "Paris"),
    "q3": ([0.0, 0.0], "41"),
    "q4": ([1.0, 1.0], "yes"),
    "q5": ([0.0, 1.0], "maybe"),
    "q6": ([1.0, 0.0], "no"),
}
NEW: Instances = {
    "q1": ([1.0, 0.0], "The answer is 5."),  # regressed by 0.5
    "q2": ([0.0, 0.0], "Lyon"),  # regressed by 1
    "q3": ([1.0, 1.0], "42"),  # improved by 1
    "q4": ([1.0, 1.0], "yes"),
    "q5": ([1.0, 0.0], "maybe not"),  # same mean: not a flip
    "q6": ([1.0, 0.0], "no"),
}


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    base = write_run(tmp_path / "base", {"qa": BASE, "gone": {"g1": ([1.0], "x")}}, model="m1")
    new = write_run(tmp_path / "new", {"qa": NEW, "added": {"a1": ([0.0], "y")}}, model="m2")
    return base, new


def test_flips_regressed_first_by_size_then_improved(runs):
    cmp = compare_run_dirs(*runs)
    (qa,) = cmp.tasks
    assert qa.task == "qa"
    assert [(f.instance_id, f.base, f.new) for f in qa.flips] == [
        ("q2", 1.0, 0.0),
        ("q1", 1.0, 0.5),
        ("q3", 0.0, 1.0),
    ]
    assert [f.instance_id for f in qa.regressed] == ["q2", "q1"]
    assert [f.instance_id for f in qa.improved] == ["q3"]
    q2 = qa.flips[0]
    assert q2.prompt == "Question q2: what is it?"
    assert (q2.base_answer, q2.new_answer) == ("Paris", "Lyon")
    assert (qa.num_base, qa.num_new, qa.num_both) == (6, 6, 6)
    assert cmp.only_base == ("gone",)
    assert cmp.only_new == ("added",)
    assert (cmp.base_model, cmp.new_model) == ("m1", "m2")


def test_metric_difference_and_intervals(runs):
    (qa,) = compare_run_dirs(*runs).tasks
    (acc,) = qa.metrics
    base = {k: sum(v[0]) / len(v[0]) for k, v in BASE.items()}
    new = {k: sum(v[0]) / len(v[0]) for k, v in NEW.items()}
    assert acc.metric == "acc"
    assert acc.base == pytest.approx(4 / 6)
    assert acc.new == pytest.approx(3.5 / 6)
    assert acc.delta == pytest.approx(-0.5 / 6)
    assert acc.paired == paired_test(new, base)
    assert acc.paired.estimate == pytest.approx(acc.delta)
    assert acc.base_interval == instance_interval(base.values())
    assert acc.new_interval == instance_interval(new.values())


def test_text_report(runs):
    lines = render_text(compare_run_dirs(*runs))
    text = "\n".join(lines)
    assert lines[0].startswith("evalreplay compare: base ") and lines[0].endswith("base (m1)")
    assert "qa: 6 instances scored in both runs" in lines
    assert "  flips: 2 regressed, 1 improved" in lines
    flips = [line for line in lines if line.startswith("    - ") or line.startswith("    + ")]
    assert flips == [
        "    - q2 [acc 1 -> 0] Question q2: what is it?",
        "    - q1 [acc 1 -> 0.5] Question q1: what is it?",
        "    + q3 [acc 0 -> 1] Question q3: what is it?",
    ]
    assert '        base: "Paris"  new: "Lyon"' in lines
    assert "  acc: 0.6667 +-" in text
    assert "diff -0.0833; paired t-test over 6 instances: change -0.0833, 90% interval [" in text
    assert lines[-2:] == ["only in base: gone", "only in new: added"]


def test_text_report_shows_the_top_flips_only(runs):
    lines = render_text(compare_run_dirs(*runs), top=1)
    assert sum(line.startswith("    - ") or line.startswith("    + ") for line in lines) == 1
    assert "    ... 2 more flips not shown" in lines
    none = render_text(compare_run_dirs(*runs), top=0)
    assert not any(line.startswith("    - ") or line.startswith("    + ") for line in none)
    assert "    ... 3 more flips not shown" in none
    with pytest.raises(ValueError):
        render_text(compare_run_dirs(*runs), top=-1)


def test_markdown_lists_every_flip_escaped(tmp_path):
    base = {f"i{k}": ([1.0], f"ok {k}") for k in range(30)}
    new = {f"i{k}": ([0.0], f"bad | {k}\nsecond line <b>") for k in range(30)}
    cmp = compare_run_dirs(write_run(tmp_path / "a", {"t": base}), write_run(tmp_path / "b", {"t": new}))
    md = render_markdown(cmp)
    rows = [line for line in md.splitlines() if line.startswith("| regressed |")]
    assert len(rows) == 30
    assert rows[0] == (
        "| regressed | i0 | acc | 1 | 0 | Question i0: what is it? | ok 0 | bad \\| 0 second line &lt;b&gt; |"
    )
    # every instance agrees: zero-width intervals, and a significant drop is bold
    assert (
        "| acc | 1.0000 [1.0000, 1.0000] | 0.0000 [0.0000, 0.0000] | -1.0000 "
        "| **paired t-test over 30 instances: change -1.0000, 90% interval [-1.0000, -1.0000], "
        "one-sided p=0 for a drop, significant drop** |"
    ) in md
    assert "Flips: 30 regressed, 0 improved." in md
    assert len(render_text(cmp)) < 60  # the terminal keeps to the top 20


def test_markdown_of_tasks_in_one_run(runs):
    md = render_markdown(compare_run_dirs(*runs))
    assert "- only in base: gone" in md
    assert "- only in new: added" in md
    assert "| --- | --- | --- | --- | --- | --- | --- | --- |" in md
    assert "| metric | base [95% CI] | new [95% CI] | new - base | paired test |" in md


def test_in_memory_snapshot_takes_the_same_path(runs):
    base_dir, new_dir = runs
    from_files = compare_run_dirs(base_dir, new_dir)
    current = RunSnapshot(
        label="this run",
        model="m2",
        tasks={
            "qa": TaskSnapshot(
                metrics={"acc": 3.5 / 6},
                scores={k: {"acc": sum(v[0]) / len(v[0])} for k, v in NEW.items()},
                prompts={k: f"\n  Question {k}:   what is it?\nThink step by step." for k in NEW},
                answers={k: v[1] for k, v in NEW.items()},
            ),
            "added": TaskSnapshot(metrics={"acc": 0.0}, scores={"a1": {"acc": 0.0}}),
        },
    )
    in_memory = compare_with_saved(base_dir, current)
    assert in_memory.new_label == "this run"
    assert in_memory.tasks == from_files.tasks
    assert (in_memory.only_base, in_memory.only_new) == (from_files.only_base, from_files.only_new)


def test_snapshot_without_prompts_or_answers():
    base = RunSnapshot("a", {"t": TaskSnapshot({"acc": 1.0}, {"x": {"acc": 1.0}})})
    new = RunSnapshot("b", {"t": TaskSnapshot({"acc": 0.0}, {"x": {"acc": 0.0}})})
    (flip,) = compare_runs(base, new).tasks[0].flips
    assert (flip.prompt, flip.base_answer, flip.new_answer) == ("", "", "")
    assert '        base: ""  new: ""' in render_text(compare_runs(base, new))


def test_a_nan_score_in_memory_is_an_error():
    bad = RunSnapshot("this run", {"t": TaskSnapshot({"acc": 0.5}, {"x": {"acc": math.nan}})})
    good = RunSnapshot("saved", {"t": TaskSnapshot({"acc": 0.5}, {"x": {"acc": 0.5}})})
    with pytest.raises(EvalReplayError, match=r"this run: task 't', instance 'x': score 'acc' is nan"):
        compare_runs(good, bad)


def test_metrics_in_one_run_only_and_partial_coverage():
    base = RunSnapshot(
        "a", {"t": TaskSnapshot({"acc": 0.5, "f1": 0.2}, {"x": {"acc": 1.0, "f1": 0.2}, "y": {"acc": 0.0}})}
    )
    new = RunSnapshot("b", {"t": TaskSnapshot({"acc": 1.0}, {"x": {"acc": 1.0}, "z": {"acc": 1.0}})})
    (t,) = compare_runs(base, new).tasks
    acc, f1 = t.metrics
    assert (acc.paired.n, acc.paired.estimate, acc.paired.lo) == (1, 0.0, None)
    assert (f1.base, f1.new, f1.delta, f1.paired.n) == (0.2, None, None, 0)
    assert (t.num_base, t.num_new, t.num_both) == (2, 2, 1)
    lines = render_text(compare_runs(base, new))
    assert "t: 1 instances scored in both runs (base 2, new 2)" in lines
    assert "  f1: only in the base run (0.2000)" in lines
    assert "no interval" in "\n".join(lines)
    json.dumps(compare_runs(base, new).to_dict(), allow_nan=False)


def test_a_flip_on_two_metrics_is_listed_per_metric():
    base = RunSnapshot("a", {"t": TaskSnapshot({"acc": 1.0, "f1": 1.0}, {"x": {"acc": 1.0, "f1": 1.0}})})
    new = RunSnapshot("b", {"t": TaskSnapshot({"acc": 0.0, "f1": 0.5}, {"x": {"acc": 0.0, "f1": 0.5}})})
    flips = compare_runs(base, new).tasks[0].flips
    assert [(f.metric, f.change) for f in flips] == [("acc", -1.0), ("f1", -0.5)]


def test_float_noise_is_not_a_flip():
    base = RunSnapshot("a", {"t": TaskSnapshot({"acc": 0.3}, {"x": {"acc": 0.1 + 0.2}})})
    new = RunSnapshot("b", {"t": TaskSnapshot({"acc": 0.3}, {"x": {"acc": 0.3}})})
    assert compare_runs(base, new).tasks[0].flips == ()


score_maps = st.dictionaries(st.sampled_from("abcdefgh"), st.sampled_from([0.0, 0.25, 0.5, 1.0]), max_size=8)


@settings(deadline=None)  # the first example pays numpy's and scipy's import
@given(score_maps, score_maps)
def test_swapping_the_runs_mirrors_the_comparison(a, b):
    def snap(label: str, scores: dict[str, float]) -> RunSnapshot:
        mean = sum(scores.values()) / len(scores) if scores else 0.0
        return RunSnapshot(
            label, {"t": TaskSnapshot({"acc": mean}, {k: {"acc": v} for k, v in scores.items()})}
        )

    (ab,) = compare_runs(snap("a", a), snap("b", b)).tasks
    (ba,) = compare_runs(snap("b", b), snap("a", a)).tasks
    assert {(f.instance_id, f.change) for f in ab.flips} == {(f.instance_id, -f.change) for f in ba.flips}
    assert len(ab.regressed) == len(ba.improved)
    p, q = ab.metrics[0].paired, ba.metrics[0].paired
    assert p.n == q.n
    if p.estimate is not None:
        assert q.estimate == -p.estimate
        assert (q.significant_drop, q.significant_gain) == (p.significant_gain, p.significant_drop)
    if p.lo is not None:
        assert (q.lo, q.hi) == (-p.hi, -p.lo)
    changes = [f.change for f in ab.regressed]
    assert changes == sorted(changes)
    assert all(f.change < 0 for f in ab.regressed) and all(f.change > 0 for f in ab.improved)


def test_several_stages_pool_their_samples(tmp_path):
    root = write_run(tmp_path / "r", {"t": {"x": ([1.0, 1.0], "a")}})
    rows = [
        {"instance_id": "x", "model": "m1", "generations": [{"text": "a"}] * 2, "scores": {"acc": 1.0},
         "sample_scores": [{"acc": 1.0}, {"acc": 1.0}]},
        {"instance_id": "x", "stage": 2, "model": "m1", "generations": [{"text": "b"}, {"text": "c"}],
         "scores": {"acc": 0.0}, "sample_scores": [{"acc": 0.0}, None]},
    ]  # fmt: skip
    (root / "t-predictions.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    snap = load_run_dir(root).tasks["t"]
    assert snap.scores == {"x": {"acc": 2 / 3}}  # three scored samples; the unscored one is not a 0
    assert snap.answers == {"x": "a"}


def test_the_example_saved_run_reads():
    snap = load_run_dir(REPO / "examples" / "saved_run")
    assert sorted(snap.tasks) == [
        "arithmetic",
        "calculator",
        "capitals",
        "capitals_bpb",
        "capitals_mc",
        "quiz_elo",
    ]
    mc = snap.tasks["capitals_mc"]
    assert sum(s["acc_norm"] for s in mc.scores.values()) / 9 == pytest.approx(mc.metrics["acc_norm"])
    arith = snap.tasks["arithmetic"]
    assert len(arith.scores) == 12
    assert sum(s["numeric_match"] for s in arith.scores.values()) / 12 == pytest.approx(
        arith.metrics["numeric_match"]
    )
    assert arith.prompts["arith-00"] == "Question: What is 22 + 6?"
    assert arith.answers["arith-00"] == "The answer is 28."
    elo = snap.tasks["quiz_elo"].elo
    assert elo is not None and elo.seed == 7 and len(elo.judged()) == 24
    assert elo.mean_verdicts("q-arith-00", {"ref-800", "ref-1000"}) == 0.75  # a win and a tie


# ---------------------------------------------------------------- bad input


def _message(fn: Any, *args: Any) -> str:
    with pytest.raises(EvalReplayError) as info:
        fn(*args)
    return str(info.value)


def test_malformed_json_names_file_and_line(runs):
    base, new = runs
    path = new / "qa-predictions.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"instance_id": "q3", "generations": [\n'
    path.write_bytes(b"".join(lines))
    assert _message(compare_run_dirs, base, new).startswith(f"{path}:3: not valid JSON")


@pytest.mark.parametrize(
    ("row", "what"),
    [
        ([1, 2], "must be a JSON object"),
        ({"generations": []}, "needs a string 'instance_id'"),
        ({"instance_id": "x", "generations": "no"}, "'generations' must be a list"),
        ({"instance_id": "x", "generations": [{}]}, "a generation must be an object with a string 'text'"),
        ({"instance_id": "x", "generations": [], "scores": {"acc": "high"}}, "'acc' must be a number"),
        # a second row for q1: its samples are pooled with the first row's, so they are read
        ({"instance_id": "q1", "generations": [{"text": ""}], "sample_scores": []}, "one object (or null)"),
        (
            {"instance_id": "q1", "generations": [{"text": ""}], "sample_scores": [{"acc": "1"}]},
            "must be a number",
        ),
        ({"instance_id": "q1", "generations": [{"text": ""}]}, "this one has no 'sample_scores'"),
        (
            {"instance_id": "q1", "generations": [{"text": ""}], "rollouts": [], "sample_scores": [None]},
            "'rollouts' must list one distinct sample index per generation",
        ),
        ({"instance_id": "x", "generations": [], "stage": "2"}, "'stage' must be a positive integer"),
        ({"instance_id": "x", "generations": [], "doc": ["2+2"]}, "'doc' must be an object (the lm-eval"),
    ],
)
def test_bad_predictions_rows_name_file_and_line(runs, row, what):
    base, _ = runs
    path = base / "qa-predictions.jsonl"
    path.write_bytes(path.read_bytes() + orjson.dumps(row) + b"\n")
    message = _message(load_run_dir, base)
    assert message.startswith(f"{path}:7: ")
    assert what in message


def test_bad_metrics_and_manifest(runs):
    base, _ = runs
    (base / "qa-metrics.json").write_bytes(b'{"metrics": {"acc": null}}')
    assert "qa-metrics.json: 'metrics': 'acc' must be a number" in _message(load_run_dir, base)
    (base / "qa-metrics.json").write_bytes(b"{oops")
    assert "qa-metrics.json: not valid JSON" in _message(load_run_dir, base)
    (base / "qa-metrics.json").unlink()
    assert "qa-metrics.json: missing; manifest.json lists task 'qa'" in _message(load_run_dir, base)
    (base / "manifest.json").write_bytes(b'{"format": "evalreplay/0", "tasks": []}')
    assert "run dir format 'evalreplay/0', and this version" in _message(load_run_dir, base)
    (base / "manifest.json").write_bytes(b'{"format": "evalreplay/1", "tasks": ["../x"]}')
    assert "'tasks' must be a list of task names" in _message(load_run_dir, base)


def test_a_bad_requests_row_names_file_and_line(runs):
    base, _ = runs
    (base / "qa-requests.jsonl").write_bytes(b'{"instance_id": "q1"}\n')
    assert (
        _message(load_run_dir, base) == f"{base / 'qa-requests.jsonl'}:1: a requests row needs its 'context'"
    )


def test_foreign_layouts_are_refused_clearly(tmp_path):
    olmo = tmp_path / "olmo"
    (olmo / "predictions" / "m").mkdir(parents=True)
    assert "looks like an olmo-eval results dir" in _message(load_run_dir, olmo)
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "samples_gsm8k_2024.jsonl").write_bytes(b"{}\n")
    message = _message(load_run_dir, harness)
    assert "looks like lm-evaluation-harness samples" in message
    assert "pytest --evalreplay-predictions=SAVES --evalreplay-output=RUN_DIR" in message
    assert "no manifest.json" in _message(load_run_dir, tmp_path)
    assert "no such run dir" in _message(load_run_dir, tmp_path / "nope")
    assert "not a directory" in _message(load_run_dir, harness / "samples_gsm8k_2024.jsonl")


# ---------------------------------------------------------------- one-line text


def test_prompt_line():
    assert prompt_line("\n\n  First   line \nsecond") == "First line"
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "example question"},
        {"role": "assistant", "content": "example answer"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "\nReal question?\nmore"}]},
    ]
    assert prompt_line(chat) == "Real question?"
    assert prompt_line([]) == ""
    assert prompt_line(None) == ""


def test_shorten_keeps_both_ends_of_an_answer():
    text = "reasoning " * 50 + "#### 42"
    short = shorten(text, 40, keep_end=True)
    assert len(short) <= 40 and short.endswith("#### 42") and " ... " in short
    assert shorten("Question: what is the capital of France?", 20) == "Question: what is..."
    assert shorten("short", 20) == "short"


def test_md_escape():
    assert md_escape("a|b\nc\\d <x>") == "a\\|b c\\\\d &lt;x&gt;"


# ---------------------------------------------------------------- CLI


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest_evalreplay", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def test_cli_prints_the_report_and_writes_markdown(runs, tmp_path):
    base, new = runs
    md = tmp_path / "report.md"
    done = run_cli("compare", base, new, "--markdown", md, "--top", "2")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == render_text(compare_run_dirs(base, new), top=2)
    assert md.read_text() == render_markdown(compare_run_dirs(base, new))


def test_cli_bad_path_is_one_line_and_exit_2(runs, tmp_path):
    missing = tmp_path / "no-such-run"
    done = run_cli("compare", runs[0], missing)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert str(missing) in done.stderr and "no such run dir" in done.stderr


def test_cli_malformed_file_is_one_line_and_exit_2(runs):
    base, new = runs
    (new / "qa-predictions.jsonl").write_bytes(b"{not json\n")
    done = run_cli("compare", base, new)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert f"{new / 'qa-predictions.jsonl'}:1: not valid JSON" in line


def test_cli_markdown_to_a_missing_folder_is_exit_2(runs, tmp_path):
    done = run_cli("compare", *runs, "--markdown", tmp_path / "no" / "r.md")
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and "r.md: cannot write" in done.stderr


@pytest.mark.parametrize(
    "name", ["qa-predictions.jsonl", "manifest.json", "t-journal.jsonl", ".manifest.lock"]
)
@pytest.mark.parametrize("which", [0, 1])
def test_cli_markdown_on_a_run_dir_s_own_file_is_refused(runs, name, which, capsys):
    # The report written over a compared run's own files destroyed its results.
    target = runs[which] / name
    before = target.read_bytes() if target.exists() else None
    assert main(["compare", *map(str, runs), "--markdown", str(target)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"--markdown {target} is one of the run dir {runs[which]}'s own files" in line
    assert "Write it elsewhere" in line
    assert (target.read_bytes() if target.exists() else None) == before


def test_cli_usage_errors_exit_2(runs):
    assert run_cli("compare", runs[0]).returncode == 2
    done = run_cli("compare", *runs, "--top", "-1")
    assert done.returncode == 2 and "must be >= 0" in done.stderr


def test_cli_does_not_import_pytest(runs):
    code = (
        "import sys; from pytest_evalreplay.__main__ import main; "
        f"rc = main(['compare', {str(runs[0])!r}, {str(runs[1])!r}]); "
        "print('pytest' in sys.modules, '_pytest' in sys.modules, rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "False False 0", done.stderr


def test_main_in_process(runs, capsys):
    assert main(["compare", *map(str, runs)]) == 0
    assert "flips: 2 regressed, 1 improved" in capsys.readouterr().out


def test_cli_alpha_is_the_gates_level(runs, capsys):
    assert main(["compare", *map(str, runs), "--alpha", "0.01"]) == 0
    assert "paired t-test over 6 instances: change -0.0833, 98% interval [" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["compare", *map(str, runs), "--alpha", "0.5"])
    assert exit_.value.code == 2
    assert "must be between 0 and 0.5" in capsys.readouterr().err


# ---------------------------------------------------------------- an EloEval (issue #17, case 5)


def _elo_run_pair(tmp_path: Path) -> tuple[Path, Path]:
    """The example run dir as base, and a copy whose judge turned q-arith-00's
    verdicts to losses and q-arith-08's to wins (its rating refitted to match)."""
    import shutil

    from pytest_evalreplay.numbers.elo.fit import fit_elo, table_from_json

    base, new = tmp_path / "base", tmp_path / "new"
    shutil.copytree(REPO / "examples" / "saved_run", base)
    shutil.copytree(REPO / "examples" / "saved_run", new)
    path = new / "quiz_elo-metrics.json"
    doc = orjson.loads(path.read_bytes())
    cells = doc["elo"]["table"]["tasks"]
    cells["q-arith-00"] = {ref: [0, 0, 1] for ref in cells["q-arith-00"]}
    cells["q-arith-08"] = {ref: [1, 0, 0] for ref in cells["q-arith-08"]}
    doc["elo"]["rating"] = doc["metrics"]["elo"] = fit_elo(
        table_from_json(doc["elo"]["table"], "t"), n_boot=0
    ).rating
    path.write_bytes(orjson.dumps(doc))
    predictions = new / "quiz_elo-predictions.jsonl"
    rows = [orjson.loads(line) for line in predictions.read_bytes().splitlines()]
    for row in rows:
        if row["instance_id"] in ("q-arith-00", "q-arith-08"):
            verdict = 0.0 if row["instance_id"] == "q-arith-00" else 1.0
            row["scores"] = {ref: verdict for ref in row["scores"]}
            row["sample_scores"] = [dict(row["scores"])]
    predictions.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return base, new


def test_an_elo_eval_lists_the_tasks_whose_verdicts_flipped(tmp_path):
    """Compare of an EloEval once said "24 instances scored in both runs", then
    "no instance scored by both runs", and listed no flipped verdict."""
    cmp = compare_run_dirs(*_elo_run_pair(tmp_path))
    elo = next(t for t in cmp.tasks if t.task == "quiz_elo")
    assert [(f.instance_id, f.base, f.new) for f in elo.flips] == [
        ("q-arith-00", 0.625, 0.0),
        ("q-arith-08", 0.125, 1.0),
    ]
    assert (elo.num_base, elo.num_new, elo.num_both) == (24, 24, 24)
    (rating,) = elo.metrics
    assert (rating.metric, rating.base) == ("elo", pytest.approx(1126.53, abs=0.01))
    assert rating.new > rating.base  # one task lost, one won: the rating rose
    # The gate's paired bootstrap over the tasks both judged: all of them here, so it is the difference.
    paired = rating.paired
    assert (paired.name, paired.n, paired.unit) == ("paired bootstrap of the rating", 24, "task")
    assert paired.estimate == pytest.approx(rating.delta)
    assert not paired.significant_drop
    text = "\n".join(render_text(cmp))
    assert "no instance scored by both runs" not in text
    assert "quiz_elo: 24 tasks judged in both runs" in text
    assert (
        f"paired bootstrap of the rating over 24 tasks: change {paired.estimate:+.1f}, 95% interval [" in text
    )
    assert "- q-arith-00 [mean verdict 0.625 -> 0]" in text
    assert "+ q-arith-08 [mean verdict 0.125 -> 1]" in text
    assert "q-arith-00" in render_markdown(cmp)


@pytest.mark.parametrize(
    ("block", "what"),
    [
        (5, "'elo' must be an object with the judgments' 'table'"),
        ({"table": {"references": {"r": 1000.0}, "tasks": {"x": {"r": [1, 2]}}}}, "elo.table: task 'x'"),
        ({"table": {"references": {"s": 900.0}, "tasks": {"x": {"r": [1, 0, 0]}}}}, "names reference 'r'"),
    ],
)
def test_a_bad_elo_block_names_the_file(runs, block, what):
    base, new = runs
    path = new / "qa-metrics.json"
    doc = orjson.loads(path.read_bytes())
    path.write_bytes(orjson.dumps({**doc, "elo": block}))
    message = _message(compare_run_dirs, base, new)
    assert str(path) in message and what in message
