"""A model-based test of resume: random sequences of full runs, `-k` subsets,
`--resume`, kills (SIGKILL) at random moments, prompt edits and scorer
edits, each a real pytest process over one output dir, with a deterministic
provider. After every step that finished, the run dir must equal what one
clean run of the current configuration would write for the items that have a
result so far; and a `--resume` step must never ask the provider for a
rollout whose request the journal already holds.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from subprocess_pytest import PYTEST, child_env

pytestmark = pytest.mark.slow  # a hypothesis state machine of child pytest runs

INSTANCES = ["inst0", "inst1", "inst2"]
SAMPLES = 2
KEYS = [(iid, r) for iid in INSTANCES for r in range(SAMPLES)]

CONFTEST = """
import os, signal, orjson
from pytest_evalreplay import Generation

class Echo:
    kind, model, batch_size = "echo", "echo-1", None

    def generate(self, requests):
        with open(os.environ["CALL_LOG"], "ab") as fh:
            for r in requests:
                for k in r.rollouts:
                    fh.write(orjson.dumps([r.instance_id, k, r.context]) + b"\\n")
        if os.environ.get("KILL_AT_CALL"):
            os.kill(os.getpid(), signal.SIGKILL)
        return [[Generation(text=f"{r.context} -> r{k}", finish_reason="stop") for k in r.rollouts]
                for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Echo() if kind == "echo" else None
"""

EVALS = """
import os, signal
from pytest_evalreplay import EvalTask


PROMPT = {prompt!r}
SCORER = {scorer!r}
scored = 0

def score(text, instance):
    global scored
    scored += 1
    if scored == int(os.environ.get("KILL_AT_SCORE", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
    return expected_score(text, SCORER)

def expected_score(text, version):
    return (sum(map(ord, text)) % (version + 3)) / (version + 2)

t = EvalTask("t", [{{"id": i}} for i in {instances!r}], prompt=lambda inst: PROMPT + " " + inst["id"],
             scorer=score, num_samples={samples})
"""


def expected_score(text: str, version: int) -> float:
    return (sum(map(ord, text)) % (version + 3)) / (version + 2)


class ResumeModel(RuleBasedStateMachine):
    """The model: which prompt each key's journaled generations answered. No run
    but --evalreplay-reset discards one (a plain run appends, and its compaction
    keeps the newest generation of each prompt)."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt_version = 0
        self.scorer_version = 0
        self.gens: dict[tuple[str, int], set[int]] = {}  # key -> prompt versions the journal holds
        self.finished = False

    @initialize()
    def project(self) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="resume-model-"))
        (self.dir / "conftest.py").write_text(CONFTEST)
        self.log = self.dir / "calls.jsonl"
        self.write_evals()

    def write_evals(self) -> None:
        (self.dir / "test_evals.py").write_text(
            EVALS.format(
                prompt=f"P{self.prompt_version}",
                scorer=self.scorer_version,
                instances=INSTANCES,
                samples=SAMPLES,
            )
        )

    @property
    def prompt(self) -> str:
        return f"P{self.prompt_version}"

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environ = child_env(("KILL_",), **env, CALL_LOG=str(self.log))
        cmd = [*PYTEST, "--evalreplay-provider=echo", "--evalreplay-output=out", "-q", *args]
        return subprocess.run(cmd, cwd=self.dir, env=environ, capture_output=True, text=True, timeout=120)

    def asked(self) -> list[tuple[str, int, str]]:
        if not self.log.exists():
            return []
        return [tuple(orjson.loads(line)) for line in self.log.read_bytes().splitlines()]  # type: ignore[misc]

    def held(self) -> set[tuple[str, int]]:
        return {key for key, versions in self.gens.items() if self.prompt_version in versions}

    # -- rules ---------------------------------------------------------------------

    @rule(subset=st.sets(st.sampled_from(KEYS), min_size=1), resume=st.booleans(), full=st.booleans())
    def run_items(self, subset: set[tuple[str, int]], resume: bool, full: bool) -> None:
        selected = set(KEYS) if full else subset
        args = ["--resume"] if resume else []
        if not full:
            args += ["-k", " or ".join(f"({iid} and r{r})" for iid, r in sorted(selected))]
        before, asked = self.held(), len(self.asked())
        result = self.run(*args)
        assert result.returncode in (0, 5), result.stdout + result.stderr
        new = {(iid, r) for iid, r, _ in self.asked()[asked:]}
        if resume:
            assert not new & before, f"asked again for rollouts the journal holds: {sorted(new & before)}"
            assert new == selected - before
        else:
            assert new == selected  # a plain run regenerates what it selects and discards nothing
        for key in new:
            self.gens.setdefault(key, set()).add(self.prompt_version)
        self.finished = True

    @rule(resume=st.booleans(), at_score=st.integers(min_value=1, max_value=len(KEYS)))
    def killed_while_scoring(self, resume: bool, at_score: int) -> None:
        before, asked = self.held(), len(self.asked())
        result = self.run(*(["--resume"] if resume else []), KILL_AT_SCORE=str(at_score))
        new = {(iid, r) for iid, r, _ in self.asked()[asked:]}
        if resume:
            assert not new & before
        # The generation chunk completed (its rows committed) before any item was scored.
        for key in new:
            self.gens.setdefault(key, set()).add(self.prompt_version)
        self.finished = result.returncode in (0, 5)

    @rule(resume=st.booleans())
    def killed_at_the_provider(self, resume: bool) -> None:
        result = self.run(*(["--resume"] if resume else []), KILL_AT_CALL="1")  # nothing is discarded
        self.finished = result.returncode in (0, 5)

    @rule()
    def edit_prompt(self) -> None:
        self.prompt_version += 1
        self.write_evals()
        self.finished = False

    @rule()
    def edit_scorer(self) -> None:
        self.scorer_version += 1
        self.write_evals()
        self.finished = False

    # -- the run dir -----------------------------------------------------------------

    @invariant()
    def run_dir_is_a_clean_run_of_what_has_a_result(self) -> None:
        if not self.finished:
            return
        out = self.dir / "out"
        held = self.held()
        preds_path = out / "t-predictions.jsonl"
        rows = [orjson.loads(x) for x in preds_path.read_bytes().splitlines()] if preds_path.exists() else []
        got = {
            (r["instance_id"], k): g["text"]
            for r in rows
            for k, g in zip(r.get("rollouts", range(SAMPLES)), r["generations"], strict=True)
        }
        want = {(iid, r): f"{self.prompt} {iid} -> r{r}" for iid, r in held}
        assert got == want
        metrics = orjson.loads((out / "t-metrics.json").read_bytes())
        per_instance: dict[str, list[float]] = {}
        for (iid, _r), text in want.items():
            per_instance.setdefault(iid, []).append(expected_score(text, self.scorer_version))
        means = [sum(v) / len(v) for v in per_instance.values()]
        if means:
            assert metrics["metrics"]["score"] == pytest.approx(sum(means) / len(means))
        else:
            assert metrics["metrics"] == {}
        assert metrics["num_missing"] == len(KEYS) - len(held)
        requests = [orjson.loads(x) for x in (out / "t-requests.jsonl").read_bytes().splitlines()]
        assert {r["instance_id"]: r["context"] for r in requests} == {
            iid: f"{self.prompt} {iid}" for iid, _ in held
        }


ResumeModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("EVALREPLAY_MODEL_EXAMPLES", "8")),
    stateful_step_count=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_resume_model = ResumeModel.TestCase
