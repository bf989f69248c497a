"""A pytester project the HTML report tests run: one task of 13 instances,
two rollouts each, whose provider fails some requests for good, answers some
wrong ($FLAKY_WRONG says which, for a second run to compare), and is asked
one prompt holding `<script>alert(1)</script>`."""

from __future__ import annotations

from pathlib import Path

import pytest

FAILED = ("q03", "q07")  # every rollout fails for good: nothing saved, listed in metrics.json's "failed"
WRONG = ("q01", "q05", "q09")
XSS = "xss"
XSS_PROMPT = "What does <script>alert(1)</script> print?"

CONFTEST = f"""
import os
from pytest_evalreplay import Generation, GenerationError

FAILED = {FAILED!r}

class Flaky:
    kind, model, batch_size = "flaky", "flaky-1", None

    def generate(self, requests):
        wrong = os.environ.get("FLAKY_WRONG", {",".join(WRONG)!r}).split(",")  # another run, other answers
        out = []
        for r in requests:
            if r.instance_id in FAILED:
                out.append(GenerationError("the server said no", retryable=False))
            else:
                text = "wrong" if r.instance_id in wrong else "right " + r.instance_id
                out.append([Generation(text=text, original_text="<think>hmm</think>" + text,
                                       finish_reason="stop", prompt_tokens=5, completion_tokens=2)
                            for _ in r.rollouts])
        return out

def pytest_evalreplay_make_provider(config, kind):
    return Flaky() if kind == "flaky" else None
"""

TASK = f"""
from pytest_evalreplay import EvalTask, Gate

def score(text, instance):
    return {{"right": float(text == "right " + instance["id"]), "length": float(len(text))}}

rows = [{{"id": f"q{{i:02d}}", "q": f"question {{i}}"}} for i in range(12)]
rows.append({{"id": {XSS!r}, "q": {XSS_PROMPT!r}}})
flaky = EvalTask("flaky", rows, prompt="{{q}}", scorer=score, num_samples=2, system_prompt="Be brief.",
                 sampling={{"temperature": 0.5}}, gate=Gate("right", min=0.1),
                 metrics=["pass@1:right", "pass@2:right"])
"""


def make_project(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_flaky=TASK)
    pytester.makeini("[pytest]\nevalreplay_provider = flaky\n")


def make_run(pytester: pytest.Pytester, *args: str, out: str = "run") -> Path:
    """Run the project into `out` (the failed items and the gate fail the session: that is the point)."""
    make_project(pytester)
    result = pytester.runpytest_inprocess(f"--evalreplay-output={out}", "-p", "no:randomly", *args)
    # 13 instances x 2 rollouts; the gate fails too (4 failed items, a failure budget of 0)
    result.assert_outcomes(passed=(13 - len(FAILED)) * 2, failed=len(FAILED) * 2 + 1)
    return pytester.path / out
