"""The HTML report of a large run: its size, and how fast headless Chromium
opens it and filters it, against a baseline page that only parses the same JSON.

Writes a synthetic run dir (--samples instances of one task, two rollouts
each, prompts of about 300 characters and answers of about 120, 5% failed),
writes its report (`report/html.py`), and a baseline page holding the same
embedded JSON whose script does nothing but `JSON.parse` it. Then, in one
headless Chromium (Debian's, through Playwright), the median of --runs
interleaved opens of each:

- first render: from navigation start to the view drawn (the report's
  `data-ready`; the baseline's, set right after its parse), in-page clock;
- filter: choosing "failed" in the samples view until its rows are drawn,
  against the baseline filtering the parsed samples by the same test.

Goals (issue #33: "opens and filters without stalling"): first render
<= 1.5x the baseline's (the view costs little beside the parse every
self-contained page pays) and a filter under 200 ms (a frame budget a
user does not feel as a stall); the exit status is 1 when either is missed.
Prints both, and a JSON line.

    python benchmarks/html_report.py                 # 20,000 samples
    python benchmarks/html_report.py --samples 500   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.report.html import embedded_json, write_report
from pytest_evalreplay.report.html_data import build

FIRST_RENDER_GOAL = 1.5  # x the baseline page's parse
FILTER_GOAL_MS = 200.0
CHROMIUM = os.environ.get("EVALREPLAY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

BASELINE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>baseline</title></head><body>
<script type="application/json" id="evalreplay-data">{payload}</script>
<script>
const DATA = JSON.parse(document.getElementById("evalreplay-data").textContent);
window.FILTER = () => DATA.tasks[0].samples.filter((s) => s.failed.length).length;
window.EVALREPLAY_FIRST_RENDER = performance.now();
document.body.dataset.ready = "1";
</script></body></html>
"""


def write_run_dir(directory: Path, samples: int) -> None:
    """One task as the plugin writes it: requests, predictions, metrics, manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    failed = [f"q{i:06d}[s1-r0]" for i in range(0, samples, 20)]
    with (
        open(directory / "big-requests.jsonl", "wb") as req,
        open(directory / "big-predictions.jsonl", "wb") as pred,
    ):
        for i in range(samples):
            iid = f"q{i:06d}"
            context = f"Question {i}: " + "what is the sum of the numbers in this list? " * 6
            row = {
                "instance_id": iid,
                "request_type": "generate",
                "context": context,
                "system_prompt": None,
                "num_samples": 2,
                "sampling": {"temperature": 0.7},
            }
            req.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
            rollouts = [1] if i % 20 == 0 else [0, 1]
            gens = [
                {
                    "text": f"The answer is {i + r}. " + "Checked twice. " * 6,
                    "finish_reason": "stop",
                    "prompt_tokens": 60,
                    "completion_tokens": 30,
                }
                for r in rollouts
            ]
            scores = [{"acc": float((i + r) % 3 == 0)} for r in rollouts]
            row = {
                "instance_id": iid,
                "model": "m",
                "generations": gens,
                "scores": {"acc": sum(s["acc"] for s in scores) / len(scores)},
                "sample_scores": scores,
            }
            if rollouts != [0, 1]:
                row["rollouts"] = rollouts
            pred.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
    metrics = {
        "task": "big",
        "model": "m",
        "metrics": {"acc": 1 / 3},
        "ci95": {"acc": [0.32, 0.34]},
        "num_instances": samples,
        "num_items": 2 * samples,
        "num_failed": len(failed),
        "num_missing": 0,
        "complete": True,
        "failed": failed,
        "session": {"run": "bench", "generated": 2 * samples},
    }
    (directory / "big-metrics.json").write_bytes(orjson.dumps(metrics))
    manifest = {"format": "evalreplay/1", "model": "m", "provider": {"kind": "bench"}, "tasks": ["big"]}
    (directory / "manifest.json").write_bytes(orjson.dumps(manifest))


def open_ms(page: Any, url: str) -> float:
    """Navigation start to the page's first render (`EVALREPLAY_FIRST_RENDER`), by its own clock."""
    page.goto(url)
    page.wait_for_function("document.body.dataset.ready")
    return float(page.evaluate("() => window.EVALREPLAY_FIRST_RENDER"))


def main(argv: list[str] | None = None, browser: Any = None) -> dict[str, Any]:
    """Measure, in `browser` (a Playwright browser; None: launch Chromium here)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    if browser is None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            launched = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                return measure(args.samples, args.runs, launched)
            finally:
                launched.close()
    return measure(args.samples, args.runs, browser)


def measure(samples: int, runs: int, browser: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_run_dir(root / "run", samples)
        t0 = time.perf_counter()
        size = write_report(root / "report.html", root / "run")
        write_s = time.perf_counter() - t0
        baseline = BASELINE.format(payload=embedded_json(build(root / "run")))
        (root / "baseline.html").write_text(baseline, encoding="utf-8")
        report_url, baseline_url = (root / "report.html").as_uri(), (root / "baseline.html").as_uri()
        first, base_first, filt, base_filt = [], [], [], []
        page = browser.new_page()
        try:
            for _ in range(runs):
                first.append(open_ms(page, report_url))
                page.evaluate("() => { location.hash = 'samples/big'; }")
                page.wait_for_selector("#filter")
                filt.append(
                    page.evaluate("""() => {
                    const t = performance.now(), s = document.getElementById("filter");
                    s.value = "failed"; s.dispatchEvent(new Event("change"));
                    document.querySelectorAll("tr.sample-row").length;
                    return performance.now() - t;
                }""")
                )
                shown = page.inner_text("#count")
                base_first.append(open_ms(page, baseline_url))
                base_filt.append(
                    page.evaluate(
                        "() => { const t = performance.now(); FILTER(); return performance.now() - t; }"
                    )
                )
        finally:
            page.close()
    result = {
        "samples": samples,
        "bytes": size,
        "bytes_per_sample": size / samples,
        "write_s": write_s,
        "first_render_ms": statistics.median(first),
        "baseline_parse_ms": statistics.median(base_first),
        "filter_ms": statistics.median(filt),
        "baseline_filter_ms": statistics.median(base_filt),
        "shown_after_filter": shown,
    }
    result["first_render_ratio"] = result["first_render_ms"] / result["baseline_parse_ms"]
    ok = result["first_render_ratio"] <= FIRST_RENDER_GOAL and result["filter_ms"] <= FILTER_GOAL_MS
    result["goals_met"] = ok
    print(
        f"report of {samples:,} samples: {size / 1e6:.1f} MB "
        f"({result['bytes_per_sample']:.0f} bytes a sample), written in {write_s:.2f} s"
    )
    print(
        f"first render {result['first_render_ms']:.0f} ms vs {result['baseline_parse_ms']:.0f} ms for "
        f"the bare parse: {result['first_render_ratio']:.2f}x (goal <= {FIRST_RENDER_GOAL}x)"
    )
    print(
        f"filter to failed ({shown}): {result['filter_ms']:.1f} ms vs {result['baseline_filter_ms']:.1f} ms "
        f"for the bare filter (goal under {FILTER_GOAL_MS:.0f} ms) -> {'met' if ok else 'MISSED'}"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["goals_met"] else 1)
