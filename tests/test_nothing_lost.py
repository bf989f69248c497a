"""Nothing lost (issue #18, cases 1 and 2): a SIGKILLed run keeps every
answer that came back before the kill, and no plain run discards a saved
result.

Each run is a real `python -m pytest` process killed with SIGKILL (a signal
to an in-process pytester run would kill the test session too). The
provider streams answers and, once it has handed back `STALL_AT` of them,
writes a marker file and blocks: the test waits for the marker, then kills.
By then every answer handed back has been through the journal's writer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
from subprocess_pytest import PYTEST, child_env

CONFTEST = """
import os, time, orjson
from pytest_evalreplay import Generation

class Slow:
    kind, model, batch_size = "slow", "m1", None

    def generate_stream(self, requests):
        with open(os.environ["CALL_LOG"], "ab") as fh:
            fh.write(orjson.dumps([r.instance_id for r in requests]) + b"\\n")
        stall = int(os.environ.get("STALL_AT", "-1"))
        for i, r in enumerate(requests):
            if i == stall:
                with open(os.environ["MARKER"], "w") as fh:
                    fh.write(str(i))
                time.sleep(120)
            yield i, [Generation(text=f"{r.instance_id} {os.environ['TAG']}") for _ in r.rollouts]

    def generate(self, requests):
        return [g for _, g in sorted(self.generate_stream(requests))]

def pytest_evalreplay_make_provider(config, kind):
    return Slow() if kind == "slow" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask

t = EvalTask("t", [{"id": f"q{i}"} for i in range(6)], prompt="Q {id}", scorer=lambda text, i: 1.0)
"""

N = 6


class Project:
    def __init__(self, path: Path) -> None:
        self.path = path
        (path / "conftest.py").write_text(CONFTEST)
        (path / "test_evals.py").write_text(EVALS)
        self.log = path / "calls.jsonl"
        self.marker = path / "stalled"
        self.out = path / "out"
        self.journal = self.out / "t-journal.jsonl"

    def cmd(self, *args: str) -> list[str]:
        return [
            *PYTEST,
            "--evalreplay-provider=slow",
            f"--evalreplay-output={self.out}",
            "-q",
            "-p",
            "no:randomly",
            *args,
        ]

    def env(self, tag: str, **extra: str) -> dict[str, str]:
        return child_env(("STALL_",), CALL_LOG=str(self.log), MARKER=str(self.marker), TAG=tag, **extra)

    def run(self, *args: str, tag: str = "run") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(*args), cwd=self.path, env=self.env(tag), capture_output=True, text=True, timeout=120
        )

    def run_killed(self, *args: str, stall_at: int, tag: str) -> None:
        """Run until the provider has handed back `stall_at` answers, then SIGKILL it."""
        self.marker.unlink(missing_ok=True)
        proc = subprocess.Popen(
            self.cmd(*args),
            cwd=self.path,
            env=self.env(tag, STALL_AT=str(stall_at)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 90
            while not self.marker.exists():
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "the provider never stalled"
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
            if proc.stdout is not None:
                proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL

    def asked(self) -> list[list[str]]:
        return (
            [orjson.loads(line) for line in self.log.read_bytes().splitlines()] if self.log.exists() else []
        )

    def gens(self) -> list[tuple[str, str]]:
        """(instance, text) of each gen row the journal holds, in order (a torn last line skipped)."""
        data = self.journal.read_bytes() if self.journal.exists() else b""
        lines = data.split(b"\n")[:-1]
        rows = [orjson.loads(line) for line in lines if line.strip()]
        return [(r["instance_id"], r["generation"]["text"]) for r in rows if r["type"] == "gen"]


def test_a_killed_run_keeps_every_answer_that_came_back(tmp_path):
    """Case 1: answers reach the journal file as they arrive, not in groups."""
    project = Project(tmp_path)
    project.run_killed(stall_at=3, tag="first")
    assert project.gens() == [(f"q{i}", f"q{i} first") for i in range(3)]

    result = project.run("--resume", tag="resumed")
    assert result.returncode == 0, result.stdout + result.stderr
    assert project.asked()[-1] == ["q3", "q4", "q5"]  # only what was in flight or not asked yet


def test_a_plain_run_killed_early_discards_nothing_resume_can_use(tmp_path):
    """Case 2: forgetting --resume once, and killing that run, loses no saved generation."""
    project = Project(tmp_path)
    project.run_killed(stall_at=4, tag="first")
    shown = project.run("--collect-only", tag="look")
    assert "evalreplay: t: the output dir holds an unfinished run: --resume would reuse 4 results" in (
        shown.stdout
    )
    project.run_killed(stall_at=1, tag="plain")  # no --resume: regenerates q0, then is killed
    saved = {iid for iid, _ in project.gens()}
    assert saved == {"q0", "q1", "q2", "q3"}

    result = project.run("--resume", tag="resumed")
    assert result.returncode == 0, result.stdout + result.stderr
    assert project.asked()[-1] == ["q4", "q5"]
    predictions = [orjson.loads(x) for x in (project.out / "t-predictions.jsonl").read_bytes().splitlines()]
    texts = {p["instance_id"]: p["generations"][0]["text"] for p in predictions}
    # The newest generation of each item stands: the plain run's q0, the first run's q1..q3.
    assert texts == {
        "q0": "q0 plain",
        "q1": "q1 first",
        "q2": "q2 first",
        "q3": "q3 first",
        "q4": "q4 resumed",
        "q5": "q5 resumed",
    }


def test_plain_runs_regenerate_everything_and_the_journal_stays_bounded(tmp_path):
    """Case 2: a plain run reuses nothing, and repeating it does not grow the journal without end."""
    project = Project(tmp_path)
    for n in range(3):
        result = project.run(tag=f"run{n}")
        assert result.returncode == 0, result.stdout + result.stderr
        assert project.asked()[-1] == [f"q{i}" for i in range(N)]
        predictions = (project.out / "t-predictions.jsonl").read_bytes().splitlines()
        texts = {orjson.loads(p)["generations"][0]["text"] for p in predictions}
        assert texts == {f"q{i} run{n}" for i in range(N)}
    # Each run compacts at its end what it superseded: one generation per item stays.
    assert len(project.gens()) == N
    assert [text for _, text in project.gens()][-N:] == [f"q{i} run2" for i in range(N)]

    result = project.run("--evalreplay-reset", tag="reset")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [text for _, text in project.gens()] == [f"q{i} reset" for i in range(N)]


def test_the_header_count_of_what_resume_would_reuse(tmp_path: Path):
    """Case 2: a plain run says when the output dir holds an unfinished run."""
    from pytest_evalreplay.journal import rows as journal
    from pytest_evalreplay.journal.index import JournalIndex
    from pytest_evalreplay.model import Generation
    from pytest_evalreplay.numbers import planning

    def index_with(tmp: Path, iids: list[str]) -> JournalIndex:
        rows = [journal.header_row("t", "r1")]
        rows += [journal.gen_row((1, i, 0), "rq", "pv", "r1", Generation("x")) for i in iids]
        (tmp / "t-journal.jsonl").write_bytes(journal.encode(rows))
        return JournalIndex.read(tmp, "t")

    keys = tuple((1, f"q{i}", 0) for i in range(3))
    plan = planning.TaskPlan("t", keys, {(1, f"q{i}"): "rq" for i in range(3)}, "pv")
    assert planning.resumable(plan, keys, index_with(tmp_path, ["q0", "q1"]), 3) == 2
    assert planning.resumable(plan, keys, index_with(tmp_path, ["q0", "q1", "q2"]), 3) == 0  # finished
    assert planning.resumable(plan, keys, index_with(tmp_path, []), 3) == 0
    assert planning.resumable_line("t", 2) == (
        "t: the output dir holds an unfinished run: --resume would reuse 2 results"
    )
    assert planning.resumable_line("t", 0) is None
