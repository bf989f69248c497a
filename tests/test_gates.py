"""Gate verdicts and the paired drop test, called directly."""

from __future__ import annotations

import math

import pytest

from pytest_evalreplay import Gate
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.gates import BaselineTask, PairedDrop, evaluate
from pytest_evalreplay.numbers.stats import paired_test
from pytest_evalreplay.report.compare import RunSnapshot, TaskSnapshot, compare_runs
from pytest_evalreplay.report.compare_render import render_text
from pytest_evalreplay.rundir.baseline import read, update


def judge(gate, scores, baseline=None, failed=0, budget=0.0):
    metrics = {gate.metric: sum(scores.values()) / len(scores)} if scores else {}
    return evaluate("t", gate, metrics, scores, len(scores) + failed, failed, budget, baseline)


def test_min_threshold():
    assert judge(Gate("acc", min=0.5), {"a": 1.0, "b": 0.0}).passed
    outcome = judge(Gate("acc", min=0.6), {"a": 1.0, "b": 0.0})
    assert not outcome.passed
    assert "acc 0.5000 is below min 0.6" in outcome.reasons[0]


def test_missing_metric_fails_naming_what_exists():
    outcome = evaluate("t", Gate("acc", min=0.0), {"f1": 0.5}, {}, 2, 0, 0.0, None)
    assert "produced no 'acc' metric (it has: ['f1'])" in outcome.reasons[0]


def test_failure_budget():
    scores = {f"i{n}": 1.0 for n in range(9)}
    assert not judge(Gate("acc", min=0.0), scores, failed=1).passed
    assert judge(Gate("acc", min=0.0), scores, failed=1, budget=0.1).passed
    assert not judge(Gate("acc", min=0.0), scores, failed=2, budget=0.1).passed


def test_paired_drop_detects_a_real_regression():
    base = {f"i{n}": 1.0 for n in range(60)}
    now = {f"i{n}": (0.0 if n < 15 else 1.0) for n in range(60)}
    result = paired_test(now, base)
    assert result.n == 60
    assert result.drop == pytest.approx(0.25)
    assert result.p_value < 0.001
    outcome = judge(Gate("acc", max_drop=0.05), now, BaselineTask({"acc": 1.0}, base, "acc"))
    assert not outcome.passed
    assert "dropped 0.2500 below the baseline over 60 paired instances" in outcome.reasons[0]


def test_only_a_drop_below_the_baseline_points_to_the_comparison():
    base = {f"i{n}": 1.0 for n in range(60)}
    now = {f"i{n}": (0.0 if n < 15 else 1.0) for n in range(60)}
    gate = Gate("acc", max_drop=0.05)
    dropped = judge(gate, now, BaselineTask({"acc": 1.0}, base, "acc")).describe()
    assert "what changed: run again with --evalreplay-compare=RUN_DIR" in dropped
    compared = evaluate(
        "t", gate, {"acc": 0.75}, now, 60, 0, 0.0, BaselineTask({"acc": 1.0}, base, "acc"), compared=True
    )
    assert compared.describe().endswith("what changed: see the comparison below")
    below_min = judge(Gate("acc", min=0.9), now).describe()
    assert below_min.startswith("FAIL") and "what changed" not in below_min


def test_a_noisy_small_drop_is_not_significant():
    base = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}
    now = {"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0}  # drop 0.25 on four instances
    outcome = judge(Gate("acc", max_drop=0.1), now, BaselineTask({"acc": 0.5}, base, "acc"))
    assert outcome.passed
    assert outcome.paired.p_value > 0.05


def test_a_drop_within_max_drop_passes_even_if_significant():
    base = {f"i{n}": 1.0 for n in range(200)}
    now = {f"i{n}": (0.0 if n < 4 else 1.0) for n in range(200)}
    assert judge(Gate("acc", max_drop=0.05), now, BaselineTask({"acc": 1.0}, base, "acc")).passed


def test_identical_runs_and_improvements_pass():
    base = {f"i{n}": float(n % 2) for n in range(30)}
    assert paired_test(base, base).p_value == 1.0
    better = {k: 1.0 for k in base}
    assert judge(Gate("acc", max_drop=0.0), better, BaselineTask({"acc": 0.5}, base, "acc")).passed


def test_baseline_without_pairable_scores_fails_with_the_fix():
    outcome = judge(Gate("acc", max_drop=0.1), {"a": 1.0}, BaselineTask({"acc": 1.0}, {}, None))
    assert "--evalreplay-update-baseline" in outcome.reasons[0]
    assert "no baseline" in judge(Gate("acc", max_drop=0.1), {"a": 1.0}).notes[0]


def test_bad_gates():
    with pytest.raises(EvalReplayError, match="alpha"):
        Gate("acc", alpha=1.5)
    with pytest.raises(EvalReplayError, match=r"between 0 and 0.5: the level of a one-sided test"):
        Gate("acc", alpha=0.5)
    with pytest.raises(EvalReplayError, match="max_drop"):
        Gate("acc", max_drop=-0.1)


def test_baseline_file_round_trip_and_merge(tmp_path):
    path = tmp_path / "baseline.json"
    assert read(path) == {}
    update(path, {"a": BaselineTask({"acc": 0.5}, {"i1": 1.0, "i2": 0.0}, "acc")})
    update(path, {"b": BaselineTask({"f1": 0.7})})
    tasks = read(path)
    assert set(tasks) == {"a", "b"}
    assert tasks["a"].scores == {"i1": 1.0, "i2": 0.0}
    assert tasks["a"].metric == "acc"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "malformed JSON"),
        ('{"format": "other"}', "not an evalreplay-baseline/1 baseline"),
        ('{"format": "evalreplay-baseline/1", "tasks": {"a": {}}}', 'needs a "metrics" object'),
        (
            '{"format": "evalreplay-baseline/1", "tasks": {"a": {"metrics": {"acc": "x"}}}}',
            "expected a number",
        ),
    ],
)
def test_bad_baseline_files_name_the_file(tmp_path, content, message):
    path = tmp_path / "b.json"
    path.write_text(content)
    with pytest.raises(EvalReplayError, match=message) as exc:
        read(path)
    assert str(path) in str(exc.value)


# ---------------------------------------------------------------- one paired test (issue #17, case 3)


def flipped(down: int, up: int, n: int = 20) -> tuple[dict[str, float], dict[str, float]]:
    """(current, baseline) over n instances: `down` flip 1 -> 0, `up` flip 0 -> 1, the rest stay 1."""
    base = {f"i{k:02d}": (0.0 if down <= k < down + up else 1.0) for k in range(n)}
    now = {iid: (1.0 - v if k < down + up else v) for k, (iid, v) in enumerate(base.items())}
    return now, base


@pytest.mark.parametrize(("down", "up"), [(4, 0), (6, 1)])
def test_the_gate_and_compare_agree_on_a_paired_drop(down, up):
    """Once the gate said p=0.070 (pass) where compare showed a significant drop,
    and p=0.0497 (fail) where compare's interval held 0: one test decides both."""
    now, base = flipped(down, up)
    gate = judge(Gate("acc", max_drop=0.05), now, BaselineTask({"acc": sum(base.values()) / 20}, base, "acc"))

    def snapshot(label: str, scores: dict[str, float]) -> RunSnapshot:
        per_instance = {iid: {"acc": v} for iid, v in scores.items()}
        return RunSnapshot(label, {"t": TaskSnapshot({"acc": sum(scores.values()) / 20}, per_instance)})

    cmp = compare_runs(snapshot("base", base), snapshot("new", now))
    text = "\n".join(render_text(cmp))
    assert gate.passed == ("significant drop" not in text)
    (acc,) = cmp.tasks[0].metrics
    assert acc.paired == gate.paired  # the same test, the same numbers
    assert not gate.passed and acc.paired.significant_drop  # both are real drops by the paired t-test
    shown = acc.paired.describe()
    assert shown.startswith("paired t-test") and shown in gate.describe() and shown in text


def test_the_gate_names_the_test_estimate_interval_and_p():
    now, base = flipped(4, 0)
    text = judge(Gate("acc", max_drop=0.05), now, BaselineTask({"acc": 1.0}, base, "acc")).describe()
    assert (
        "baseline 1.0000, max_drop 0.05 at alpha 0.05: paired t-test over 20 instances: change -0.2000, "
        "90% interval [-0.3587, -0.0413], one-sided p=0.021 for a drop"
    ) in text
    assert "acc dropped 0.2000 below the baseline over 20 paired instances" in text


def test_a_stricter_alpha_narrows_what_fails_and_widens_the_interval():
    now, base = flipped(4, 0)
    outcome = judge(Gate("acc", max_drop=0.05, alpha=0.01), now, BaselineTask({"acc": 1.0}, base, "acc"))
    assert outcome.passed
    assert outcome.paired.confidence == pytest.approx(0.98)
    assert outcome.paired.hi > 0 and outcome.paired.p_value > 0.01


def test_an_elo_drop_from_elsewhere_is_judged_and_printed_the_same_way():
    """elorun hands the rating's paired bootstrap in as a PairedDrop (with or without its interval)."""
    gate = Gate("elo", max_drop=30)
    baseline = BaselineTask({"elo": 1200.0}, elo={"table": {}})
    drop = PairedDrop(n=20, drop=40.0, p_value=0.01, interval=(10.0, 70.0))
    outcome = evaluate("e", gate, {"elo": 1160.0}, {}, 20, 0, 0.0, baseline, paired=drop)
    assert not outcome.passed and outcome.dropped
    assert (
        "paired bootstrap of the rating over 20 tasks: change -40.0, 95% interval [-70.0, -10.0], "
        "one-sided p=0.01 for a drop"
    ) in outcome.describe()
    assert "elo dropped 40.0 below the baseline over 20 paired tasks" in outcome.reasons[0]
    bare = evaluate("e", gate, {"elo": 1190.0}, {}, 20, 0, 0.0, baseline, paired=PairedDrop(20, 10.0, 0.2))
    assert bare.passed and "change -10.0, no interval, one-sided p=0.2 for a drop" in bare.describe()
    nothing = evaluate(
        "e", gate, {"elo": 1190.0}, {}, 20, 0, 0.0, baseline, paired=PairedDrop(0, math.nan, 1.0)
    )
    assert nothing.reasons == ("no task was scored by both this run and the baseline",)


@pytest.mark.parametrize("kwargs", [{}, {"alpha": 0.1}, {"min": None, "max_drop": None}])
def test_a_gate_with_no_bound_is_refused(kwargs) -> None:
    """Issue #30 case 14: Gate("acc") passed whatever the score."""
    with pytest.raises(EvalReplayError, match=r"Gate\('acc'\) has no bound: give min=\.\.\."):
        Gate("acc", **kwargs)
