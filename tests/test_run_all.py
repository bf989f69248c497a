"""benchmarks/run_all.py: the RESULT lines it gathers, the rows it cannot
measure (a missing script or option), a script stopped at its time share, and
the summary table. Timings are the benchmarks' business, not asserted here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("benchmarks.run_all")
from benchmarks.results import parse, result_line
from benchmarks.run_all import Ran, Row, Step, lacks, main, outcome, run_script, table, time_share

ROW = Row("elo", "EloEval vs bare", "1.3x")
STEP = Step("elo_overhead.py", (), (), (ROW,), budget_s=30, needs=("--runs",))


def ran(*lines: str, returncode: int = 0, stopped: bool = False) -> Ran:
    return Ran(lines, returncode, 12.0, stopped)


def test_result_lines_parse_back_and_bad_ones_are_skipped() -> None:
    lines = [
        "some prose",
        result_line("elo", "1.00 s", "1.50 s", "1.50x", "1.3x", False, items=1000),
        "RESULT {not json",
        'RESULT {"row": "no-met"}',
        result_line("elo", "1.00 s", "1.20 s", "1.20x", "1.3x", True),
    ]
    rows = parse(lines)
    assert list(rows) == ["elo"]
    assert rows["elo"]["ours"] == "1.20 s" and rows["elo"]["met"] is True


def test_a_missing_script_or_option_is_named(tmp_path: Path) -> None:
    assert lacks(STEP, tmp_path) == "no benchmarks/elo_overhead.py"
    (tmp_path / "elo_overhead.py").write_text('parser.add_argument("--quick")\n')
    assert lacks(STEP, tmp_path) == "elo_overhead.py lacks --runs"
    (tmp_path / "elo_overhead.py").write_text('parser.add_argument("--runs")\n')
    assert lacks(STEP, tmp_path) is None


def test_each_row_is_its_result_or_why_it_was_not_measured() -> None:
    line = result_line("elo", "1.00 s", "1.50 s", "1.50x", "1.3x", False)
    assert outcome(STEP, ROW, ran("x", line), None)["ratio"] == "1.50x"
    assert outcome(STEP, ROW, None, "elo_overhead.py lacks --runs")["note"] == (
        "not measured (elo_overhead.py lacks --runs)"
    )
    quiet = outcome(STEP, ROW, ran("  goal: CPU <= 1.3x -> MISSED"), None)["note"]
    assert quiet == (
        "not measured (elo_overhead.py printed no RESULT line for it); it said: goal: CPU <= 1.3x -> MISSED"
    )
    assert outcome(STEP, ROW, ran("half", stopped=True), None)["note"] == (
        "not measured (stopped after 12 s, its time share)"
    )
    other = result_line("elo-2", "1 s", "1 s", "1.0x", "1.3x", True)
    assert outcome(STEP, ROW, ran("  goal: CPU -> met", other, stopped=True), None)["note"] == (
        "not measured (stopped after 12 s, its time share)"
    )
    crashed = outcome(STEP, ROW, ran("Traceback", "ValueError: boom", returncode=2), None)["note"]
    assert crashed == "not measured (elo_overhead.py exited 2); it said: ValueError: boom"


def test_the_table_says_met_missed_or_not_measured_for_every_row() -> None:
    rows = [
        {"row": ROW, "baseline": "1 s", "ours": "1.5 s", "ratio": "1.5x", "goal": "1.3x", "met": False},
        {"row": Row("startup", "startup", "1.05x"), "baseline": "1 s", "ours": "1 s", "ratio": "1.0x"}
        | {"goal": "1.05x", "met": True, "wall": "1.01x"},
        {"row": Row("merge", "merge", "5x"), "note": "not measured (shards.py lacks --merge-vs-read)"},
    ]
    out = table(rows)
    assert out[2] == "| EloEval vs bare | 1 s | 1.5 s | 1.5x | 1.3x | MISSED |"
    assert out[3] == "| startup | 1 s | 1 s | 1.0x | 1.05x | met |"
    assert out[4] == "| merge | | | | 5x | not measured (shards.py lacks --merge-vs-read) |"
    assert out[5] == "  startup: wall 1.01x"


def test_later_scripts_keep_their_share_of_the_time() -> None:
    later = [STEP, Step("startup.py", (), (), (), budget_s=20)]
    assert time_share(600.0, later) == 535.0
    assert time_share(600.0, []) == 585.0


@pytest.mark.slow
def test_a_script_past_its_share_is_stopped_and_keeps_what_it_printed() -> None:
    line = result_line("elo", "1 s", "1 s", "1.0x", "1.3x", True)
    code = f"import time; print({line!r}, flush=True); time.sleep(60)"
    got = run_script([sys.executable, "-c", code], timeout_s=2)
    assert got.stopped and got.seconds < 30
    assert parse(got.lines)["elo"]["met"] is True


@pytest.mark.slow
def test_run_all_quick_measures_a_row(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--quick", "--only", "startup.py"])
    out = capsys.readouterr().out
    assert "| startup, one-test project vs -p no:evalreplay | " in out
    assert "all together" in out
