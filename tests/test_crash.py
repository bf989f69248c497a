"""Crash safety: a run ended by SIGTERM, and a run killed twice (the resume
killed too), then resumed, end with the run dir of an uninterrupted run, and
never ask the provider again for a rollout that was already saved.

SIGKILL at each kind of moment (a provider call, a journal append or a run
dir write, torn or not) is tests/test_chaos.py's job; these are the two
fixed cases it does not draw.

Each run is a real `python -m pytest` process (a signal to an in-process
pytester run would kill the test session too). The project's conftest kills
its own process at the Nth provider call when an environment variable says so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest
from subprocess_pytest import PYTEST, child_env

CONFTEST = """
import os, signal, orjson
from pytest_evalreplay import Generation, GenerationError

def env(name):
    return int(os.environ.get(name, "0"))

def die():
    os.kill(os.getpid(), getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL")))

class Counting:
    kind, model, batch_size = "counting", "m1", None
    calls = 0

    def generate(self, requests):
        Counting.calls += 1
        with open(os.environ["CALL_LOG"], "ab") as fh:
            fh.write(orjson.dumps([[r.task, r.instance_id, list(r.rollouts)] for r in requests]) + b"\\n")
        if Counting.calls == env("KILL_AT_CALL"):
            die()
        return [
            GenerationError("context too long", retryable=False) if r.instance_id.startswith("bad")
            else [Generation(text=f"{r.task} {r.instance_id} {k}", finish_reason="stop",
                             prompt_tokens=len(r.context), completion_tokens=k + 1) for k in r.rollouts]
            for r in requests
        ]

def pytest_evalreplay_make_provider(config, kind):
    return Counting() if kind == "counting" else None

"""

# Provider calls with --evalreplay-batch-size=2, in order:
#   1 doomed (bad0: terminal error)   2 alpha q0,q1   3 alpha q2,q3   4 alpha bad1 (terminal)
#   5 beta r0,r1   6 beta r2
EVALS = """
from pytest_evalreplay import EvalTask

def score(text, instance):
    return {"acc": float(text.endswith(" 0")), "len": float(len(text))}

doomed = EvalTask("doomed", [{"id": "bad0"}], prompt="D {id}", scorer=score)
alpha = EvalTask("alpha", [{"id": f"q{i}"} for i in range(4)] + [{"id": "bad1"}],
                 prompt="A {id}", scorer=score, num_samples=2)
beta = EvalTask("beta", [{"id": f"r{i}"} for i in range(3)], prompt="B {id}", scorer=score,
                sampling={"temperature": 0.5})
"""

TASKS = ("doomed", "alpha", "beta")
RUN_DIR_FILES = ["manifest.json"] + [
    f"{t}-{kind}" for t in TASKS for kind in ("requests.jsonl", "predictions.jsonl", "metrics.json")
]


class Project:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        (path / "conftest.py").write_text(CONFTEST)
        (path / "test_evals.py").write_text(EVALS)
        self.log = path / "calls.jsonl"
        self.out = path / "out"

    def run(self, *args: str, **kill: str) -> subprocess.CompletedProcess[str]:
        env = child_env(("KILL_",), **kill, CALL_LOG=str(self.log))
        cmd = [*PYTEST, "--evalreplay-provider=counting", f"--evalreplay-output={self.out}"]
        cmd += ["--evalreplay-batch-size=2", "-q", "-rs", *args]
        return subprocess.run(cmd, cwd=self.path, env=env, capture_output=True, text=True, timeout=120)

    def asked(self) -> list[tuple[str, str, int]]:
        if not self.log.exists():
            return []
        calls = [orjson.loads(line) for line in self.log.read_bytes().splitlines()]
        return [(task, iid, r) for call in calls for task, iid, rollouts in call for r in rollouts]

    def journal(self, task: str) -> list[dict]:
        path = self.out / f"{task}-journal.jsonl"
        return _rows(path) if path.exists() else []

    def saved(self) -> set[tuple[str, str, int]]:
        """Rollouts the journals hold as generated or failed for good (a torn last line skipped)."""
        out: set[tuple[str, str, int]] = set()
        for task in TASKS:
            for row in self.journal(task):
                if row.get("type") == "gen":
                    out.add((task, row["instance_id"], row["rollout"]))
                elif row.get("type") == "fail" and row.get("final"):
                    out.update((task, row["instance_id"], r) for r in row["rollouts"])
        return out

    def failures(self, task: str) -> list[tuple[str, int, str, bool]]:
        rows = [r for r in self.journal(task) if r["type"] == "fail"]
        return [(f["instance_id"], f["attempt"], f["failure_class"], f["final"]) for f in rows]

    def done_rows(self, task: str) -> list[tuple[int, str, int]]:
        return [
            (r["stage"], r["instance_id"], r["rollout"]) for r in self.journal(task) if r["type"] == "gen"
        ]


def same_file(a: Path, b: Path) -> bool:
    """Byte-identical, except metrics.json's `session` block (what that session generated or reused)."""
    if a.name.endswith("-metrics.json"):
        strip = lambda p: {k: v for k, v in orjson.loads(p.read_bytes()).items() if k != "session"}  # noqa: E731
        return strip(a) == strip(b)
    return a.read_bytes() == b.read_bytes()


def _rows(path: Path) -> list[dict]:
    data = path.read_bytes()
    lines = data.splitlines()
    if data and not data.endswith(b"\n"):
        lines = lines[:-1]  # torn
    return [orjson.loads(line) for line in lines]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Project:
    project = Project(tmp_path_factory.mktemp("uninterrupted"))
    result = project.run()
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    assert "3 failed, 11 passed" in result.stdout
    return project


KILL, TERM = -9, -15  # a child's return code when a signal ended it

# name -> the kill of each interrupted run, in order (then one clean --resume).
SCENARIOS: dict[str, list[dict[str, str]]] = {
    "mid-task by SIGTERM": [{"KILL_AT_CALL": "6", "KILL_SIGNAL": "SIGTERM"}],
    "twice: mid-task, then the resume mid-task": [{"KILL_AT_CALL": "3"}, {"KILL_AT_CALL": "2"}],
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_killed_run_resumes_to_the_uninterrupted_run_dir(tmp_path, uninterrupted, name):
    project = Project(tmp_path)
    for n, kill in enumerate(SCENARIOS[name]):
        saved, asked = project.saved(), len(project.asked())
        result = project.run(*(["--resume"] if n else []), **kill)
        signal = TERM if kill.get("KILL_SIGNAL") == "SIGTERM" else KILL
        assert result.returncode == signal, result.stdout + result.stderr
        assert not saved & set(project.asked()[asked:]), "asked again for a saved rollout"

    saved, asked = project.saved(), len(project.asked())
    result = project.run("--resume")
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    resumed = project.asked()[asked:]
    assert not saved & set(resumed), "asked again for a saved rollout"
    assert len(resumed) == len(set(resumed))
    # Everything the uninterrupted run asked for was asked for at least once.
    assert set(project.asked()) == set(uninterrupted.asked())

    for file in RUN_DIR_FILES:
        assert same_file(project.out / file, uninterrupted.out / file), file
    assert not list(project.out.glob("*.tmp")) and not list(project.out.glob(".*.tmp"))
    for task in TASKS:
        rows = project.done_rows(task)
        assert len(rows) == len(set(rows)), f"duplicate done rows in {task}"
        assert sorted(rows) == sorted(uninterrupted.done_rows(task))
        assert project.failures(task) == uninterrupted.failures(task)


def test_the_uninterrupted_run_dir_is_what_the_kills_are_compared_with(uninterrupted):
    metrics = orjson.loads((uninterrupted.out / "alpha-metrics.json").read_bytes())
    assert metrics["metrics"]["acc"] == 0.5
    assert (metrics["num_items"], metrics["num_failed"]) == (10, 2)
    assert orjson.loads((uninterrupted.out / "doomed-metrics.json").read_bytes())["failed"] == ["bad0[s1-r0]"]
    manifest = orjson.loads((uninterrupted.out / "manifest.json").read_bytes())
    assert manifest["tasks"] == ["alpha", "beta", "doomed"]
    assert len(uninterrupted.asked()) == len(set(uninterrupted.asked())) == 1 + 10 + 3
