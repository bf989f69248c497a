"""Model output holds anything, terminal control sequences included: whatever
is printed (`python -m pytest_evalreplay compare`, the summary's comparison)
or written as Markdown shows them escaped, never acts on the terminal."""

from __future__ import annotations

from pathlib import Path

from test_compare import write_run

from pytest_evalreplay.__main__ import main
from pytest_evalreplay.report.compare import compare_run_dirs
from pytest_evalreplay.report.compare_render import md_escape, render_markdown, render_text
from pytest_evalreplay.values.snippets import clip, one_line, printable, prompt_line

CLEAR = "\x1b[2J"
TITLE = "\x1b]0;pwned\x07"
HOSTILE = f"{CLEAR}{TITLE}answer\x9b31m\x7f\x00 done"


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) <= 0x9F]


def test_printable_escapes_every_control_character():
    assert printable(HOSTILE) == "\\x1b[2J\\x1b]0;pwned\\x07answer\\x9b31m\\x7f\\x00 done"
    assert printable("plain text, ünïcode ✓") == "plain text, ünïcode ✓"


def test_the_one_line_helpers_escape_controls():
    for helper in (one_line, clip, prompt_line):
        assert not _raw_controls(helper(HOSTILE)), helper.__name__
    assert one_line("a\tb\nc") == "a b c"  # whitespace is still collapsed, not escaped
    assert md_escape(HOSTILE).startswith("\\\\x1b[2J")


def _hostile_runs(tmp_path: Path) -> tuple[Path, Path]:
    base = write_run(tmp_path / "base", {"qa": {f"q{CLEAR}": ([1.0], "fine")}})
    new = write_run(tmp_path / "new", {"qa": {f"q{CLEAR}": ([0.0], HOSTILE)}}, model=f"m{TITLE}")
    return base, new


def test_text_and_markdown_of_a_comparison_carry_no_raw_controls(tmp_path):
    cmp = compare_run_dirs(*_hostile_runs(tmp_path))
    text = "\n".join(render_text(cmp))
    assert "\\x1b[2J" in text and not _raw_controls(text), text
    md = render_markdown(cmp)
    assert "x1b]0;pwned" in md and not _raw_controls(md), md


def test_the_compare_command_prints_no_raw_controls(tmp_path, capsys):
    base, new = _hostile_runs(tmp_path)
    assert main(["compare", str(base), str(new), "--markdown", str(tmp_path / "c.md")]) == 0
    out = capsys.readouterr().out
    assert "\\x1b[2J" in out and not _raw_controls(out), out
    assert not _raw_controls((tmp_path / "c.md").read_text())


CONFTEST = """
from pathlib import Path
from pytest_evalreplay import Generation

class FromFile:
    kind, model = "file", "file-1"

    def generate(self, requests):
        text = Path("answer.txt").read_text()
        return [[Generation(text=text) for _ in r.rollouts] for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return FromFile() if kind == "file" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask
t = EvalTask("t", [{"id": "a", "q": "x"}], prompt="Q {q}", scorer=lambda text, i: float(text == "fine"))
"""


def test_the_summary_and_report_of_a_comparison_carry_no_raw_controls(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = file\n")
    pytester.makepyfile(test_evals=EVALS)
    (pytester.path / "answer.txt").write_text("fine")
    pytester.runpytest("--evalreplay-output=base").assert_outcomes(passed=1)
    (pytester.path / "answer.txt").write_text(HOSTILE)
    result = pytester.runpytest(
        "--evalreplay-output=new", "--evalreplay-compare=base", "--evalreplay-report=r.md"
    )
    text = result.stdout.str()
    assert "flips: 1 regressed" in text, text
    assert "\\x1b[2J" in text and "\x1b[2J" not in text and "\x07" not in text, text
    assert not _raw_controls((pytester.path / "r.md").read_text())
