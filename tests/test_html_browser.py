"""The HTML report in a real headless Chromium (Debian's `chromium`, driven by
Playwright's Python package with `executable_path`): what each view shows, that
no prompt's markup runs, that the page asks the network for nothing and logs
no JavaScript error. Each view's screenshot is written to $EVALREPLAY_SCREENSHOTS
(default .artifacts/screenshots/, git-ignored): artifacts of the run, not committed.
Skipped, with the reason, where Playwright or the browser is missing."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from html_project import FAILED, WRONG, XSS, XSS_PROMPT, make_run

from pytest_evalreplay.report.html import write_report

pytest.importorskip("jinja2", reason="the HTML report needs jinja2 (pip install '.[html]')")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs Playwright's Python package (pip install '.[test]')"
)

ROOT = Path(__file__).resolve().parent.parent
SAVED = ROOT / "examples" / "saved_run"
CHROMIUM = os.environ.get("EVALREPLAY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(os.environ.get("EVALREPLAY_SCREENSHOTS") or ROOT / ".artifacts" / "screenshots")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set $EVALREPLAY_CHROMIUM)")
    with sync_api.sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        launched = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def wait_until(page: Any, predicate: str, arg: Any = None, timeout: float = 10.0) -> None:
    """Poll `predicate` through page.evaluate until it holds. Not Playwright's
    wait_for_function: Playwright 1.65.2 (seen) evals a string predicate in the page,
    which the report's own Content-Security-Policy (no 'unsafe-eval') refuses."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(predicate, arg):
        if time.monotonic() > deadline:
            raise AssertionError(f"the page never satisfied {predicate!r} in {timeout} s")
        page.wait_for_timeout(20)


@dataclass
class Opened:
    """A report open in a page, with everything it asked for and said."""

    page: Any
    url: str
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def show(self, hash_: str) -> None:
        self.page.evaluate("h => { location.hash = h; }", hash_)
        wait_until(self.page, "h => document.body.dataset.ready && location.hash === '#' + h", hash_)

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    def check_quiet(self) -> None:
        """No request but the file itself, no JavaScript error, no dialog."""
        assert [r for r in self.requests if r != self.url] == []
        assert self.errors == []
        assert self.dialogs == []


@pytest.fixture
def open_report(browser: Any, tmp_path: Path) -> Iterator[Callable[..., Opened]]:
    pages = []

    def opener(run_dir: Path, base: Path | None = None) -> Opened:
        path = tmp_path / f"report-{len(pages)}.html"
        write_report(path, run_dir, base)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        pages.append(page)
        opened = Opened(page, path.as_uri())
        page.on("request", lambda r: opened.requests.append(r.url))
        page.on("console", lambda m: opened.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: opened.errors.append(str(e)))
        page.on("dialog", lambda d: (opened.dialogs.append(d.message), d.dismiss()))
        page.goto(opened.url)
        wait_until(page, "document.body.dataset.ready")
        return opened

    yield opener
    for page in pages:
        page.close()


def test_the_overview_shows_every_task_and_metric_of_the_example_suite(open_report) -> None:
    opened = open_report(SAVED)
    page = opened.page
    tasks = orjson.loads((SAVED / "manifest.json").read_bytes())["tasks"]
    assert page.locator("section.task").evaluate_all("s => s.map(x => x.dataset.task)") == sorted(tasks)
    for task in tasks:
        metrics = orjson.loads((SAVED / f"{task}-metrics.json").read_bytes())["metrics"]
        rows = page.locator(f'section.task[data-task="{task}"] tr.metric')
        assert rows.evaluate_all("r => r.map(x => x.dataset.metric)") == list(metrics)
        for name, value in metrics.items():
            row = page.locator(f'section.task[data-task="{task}"] tr.metric[data-metric="{name}"]')
            shown = f"{value:.1f}" if abs(value) >= 100 else f"{value:.4f}"
            assert row.locator("td").nth(1).inner_text() == shown
            assert row.locator("svg.interval-bar circle").count() == 1
    opened.shot("overview")
    opened.check_quiet()


def test_filtering_to_failed_samples_shows_exactly_the_failed_ones(open_report, pytester) -> None:
    opened = open_report(make_run(pytester))
    page = opened.page
    opened.show("samples/flaky")
    ids = "r => r.map(x => x.dataset.id)"
    assert len(page.locator("tr.sample-row").evaluate_all(ids)) == 13
    page.select_option("#filter", "failed")
    assert sorted(page.locator("tr.sample-row").evaluate_all(ids)) == sorted(FAILED)
    assert page.inner_text("#count") == f"{len(FAILED)} of 13 samples"
    page.select_option("#filter", "wrong")
    assert sorted(page.locator("tr.sample-row").evaluate_all(ids)) == sorted(WRONG)
    page.select_option("#filter", "all")
    page.fill("#search", "ALERT(1)")
    page.press("#search", "Enter")
    assert page.locator("tr.sample-row").evaluate_all(ids) == [XSS]
    page.fill("#search", "")
    page.press("#search", "Enter")
    page.fill("#max", "0.5")
    page.press("#max", "Enter")
    assert sorted(page.locator("tr.sample-row").evaluate_all(ids)) == sorted(WRONG)
    opened.shot("samples")
    page.locator('tr.sample-row[data-id="q01"]').click()
    wait_until(page, "document.getElementById('view').dataset.view === 'sample'")
    assert page.locator(".rollout").count() == 2
    assert page.locator("pre.raw").first.inner_text() == "<think>hmm</think>wrong"
    opened.shot("sample")
    opened.check_quiet()


def test_a_prompt_holding_a_script_is_shown_as_text_and_opens_no_dialog(open_report, pytester) -> None:
    opened = open_report(make_run(pytester))
    page = opened.page
    opened.show(f"sample/flaky/1/{XSS}")
    assert page.inner_text("pre.prompt") == XSS_PROMPT
    assert page.inner_text("pre.system") == "Be brief."
    assert page.locator("#view script").count() == 0
    opened.show("samples/flaky")
    assert XSS_PROMPT in page.inner_text(f'tr.sample-row[data-id="{XSS}"]')
    page.wait_for_timeout(200)  # a dialog would open now, if any script of the prompt ran
    opened.check_quiet()


def test_the_example_agent_episode_shows_its_tool_calls(open_report) -> None:
    opened = open_report(SAVED)
    page = opened.page
    opened.show("episodes")
    page.locator('tr.episode-row[data-id="calc-00"]').click()
    wait_until(page, "document.getElementById('view').dataset.view === 'episode'")
    row = orjson.loads((SAVED / "calculator-transcripts.jsonl").read_bytes().splitlines()[0])
    calls = [c for m in row["messages"] for c in m.get("tool_calls") or ()]
    tool_calls = page.locator(".tool-call")
    assert tool_calls.count() == len(calls) == 1
    assert tool_calls.first.get_attribute("data-tool") == "calculate"
    assert '"a": 17' in tool_calls.first.inner_text() and '"b": 23' in tool_calls.first.inner_text()
    assert page.locator("pre.tool-result").first.inner_text() == "391"
    assert "turn 1 · finish tool_calls · tokens 2 / 8" in page.inner_text(".conversation")
    opened.shot("episode")
    opened.check_quiet()


def test_the_elo_chart_has_one_point_per_stage(open_report) -> None:
    opened = open_report(SAVED)
    page = opened.page
    opened.show("judging")
    stages = orjson.loads((SAVED / "quiz_elo-metrics.json").read_bytes())["elo"]["stages"]
    assert page.locator("svg.elo-chart circle.elo-point").count() == len(stages) == 3
    titles = page.locator("circle.elo-point title").evaluate_all("t => t.map(x => x.textContent)")
    assert titles[0].startswith(f"stage 1: {stages[0]['rating']:.1f}")
    assert page.locator("table.stages tr").count() == len(stages) + 1
    opened.shot("judging")
    opened.check_quiet()


def test_pass_at_k_and_the_comparison(open_report, pytester, monkeypatch) -> None:
    base = make_run(pytester, out="base")
    monkeypatch.setenv("FLAKY_WRONG", "q00,q02")
    opened = open_report(make_run(pytester, out="new"), base)
    page = opened.page
    opened.show("curves")
    assert page.locator("circle.curve-point").count() == 2  # pass@1:right, pass@2:right
    opened.shot("curves")
    opened.show("compare")
    right = page.locator('tr.diff[data-metric="right"] td').all_inner_texts()
    assert right[4].startswith("paired t-test 0.0909 (11)") and right[5].endswith(" at 90%")
    first = page.locator(".flip").first
    assert first.get_attribute("class") == "rollout flip regressed"
    assert first.locator(".base pre").all_inner_texts() == [f"right {first.get_attribute('data-id')}"] * 2
    assert first.locator(".new pre").all_inner_texts() == ["wrong", "wrong"]
    opened.shot("compare")
    opened.show("samples/flaky")
    page.select_option("#filter", "flipped")
    flipped = sorted(page.locator("tr.sample-row").evaluate_all("r => r.map(x => x.dataset.id)"))
    assert flipped == sorted({"q00", "q02", *WRONG})
    opened.check_quiet()


def test_the_benchmark_runs_small(browser, capsys) -> None:
    pytest.importorskip("benchmarks.html_report")
    from benchmarks.html_report import main

    result = main(["--samples", "200", "--runs", "1"], browser)
    assert result["shown_after_filter"] == "10 of 200 samples"  # every 20th has a failed rollout
    assert result["first_render_ms"] > 0 and result["baseline_parse_ms"] > 0
    assert "for the bare parse" in capsys.readouterr().out


def test_a_graded_sample_shows_each_criterions_reply(open_report, pytester) -> None:
    from test_grading import CONFTEST, EVALS, RUBRIC

    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nevalreplay_provider = sampler\n")
    pytester.makepyfile(test_evals=EVALS.format(rubric=RUBRIC))
    pytester.runpytest_inprocess("--evalreplay-output=run").assert_outcomes(passed=4)
    opened = open_report(pytester.path / "run")
    opened.show("sample/math/1/q2")
    judged = opened.page.locator(".judge")
    assert judged.evaluate_all("j => j.map(x => x.dataset.judge)") == ["q2|r0|correct|t0", "q2|r0|polite|t0"]
    assert judged.locator("pre.reply").all_inner_texts() == ["[[YES]]", "[[NO]]"]
    opened.show("judging")
    assert opened.page.locator(".judge").count() == 4 * len(RUBRIC)
    opened.shot("graded")
    opened.check_quiet()


def test_an_lm_eval_documents_fields_are_shown_in_its_sample_and_the_list(open_report, tmp_path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAVED, run)
    path = run / "capitals-predictions.jsonl"
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    doc = {
        "question": "<script>alert(1)</script>",
        "answer": "Paris",
        "source": "zebra atlas",
    }  # as lm-eval's
    rows[0]["doc"] = doc
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    opened = open_report(run)
    page = opened.page
    opened.show(f"sample/capitals/1/{rows[0]['instance_id']}")
    assert orjson.loads(page.inner_text("pre.doc")) == doc
    assert page.locator("pre.doc").count() == 1 and page.locator("#view script").count() == 0
    opened.show("samples/capitals")
    assert '"answer":"Paris"' in page.inner_text(f'tr.sample-row[data-id="{rows[0]["instance_id"]}"]')
    assert page.locator("pre.doc").count() == 0
    page.fill("#search", "zebra")
    page.dispatch_event("#search", "change")
    assert page.locator("tr.sample-row").count() == 1  # the document is searched too
    opened.show(f"sample/capitals/1/{rows[1]['instance_id']}")
    assert page.locator("pre.doc").count() == 0  # a row without one (an older run dir's) shows none
    page.wait_for_timeout(200)
    opened.check_quiet()
