"""Stop means stop across xdist (issue #18, case 3): when the controller of
an `-n 2` run is SIGKILLed, its workers stop within a second, and a
`--resume` started at once on the same output dir never runs beside them.

Real processes: a child pytest with xdist workers and a slow provider that
logs every call with the calling process and the time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from subprocess_pytest import PYTEST, child_env

CONFTEST = """
import os, time, orjson
from pytest_evalreplay import Generation

class Slow:
    kind, model, batch_size = "slow", "slow-1", None

    def generate_stream(self, requests):
        for n, r in enumerate(requests):
            time.sleep(0.05)
            with open(os.environ["CALL_LOG"], "ab") as fh:
                fh.write(orjson.dumps([os.getpid(), r.instance_id, time.time()]) + b"\\n")
            yield n, [Generation(text="answer " + r.instance_id) for _ in r.rollouts]

    def generate(self, requests):
        return [result for _, result in self.generate_stream(requests)]

def pytest_evalreplay_make_provider(config, kind):
    return Slow() if kind == "slow" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask

qa = EvalTask("qa", [{"id": f"q{i:03d}"} for i in range(80)], prompt="Q {id}", scorer=lambda t, i: True)
"""


def calls(log: Path) -> list[list]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines()] if log.exists() else []


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow  # pytest-xdist in a child pytest, a SIGKILL and a resume
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads worker pids from /proc")
def test_killing_the_controller_stops_its_workers_and_a_resume_never_runs_beside_them(tmp_path):
    pytest.importorskip("xdist")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_evals.py").write_text(EVALS)
    log = tmp_path / "calls.jsonl"
    env = child_env(CALL_LOG=str(log))
    cmd = [*PYTEST, "--evalreplay-provider=slow", f"--evalreplay-output={tmp_path / 'out'}", "-q"]
    controller = subprocess.Popen(
        [*cmd, "-p", "xdist", "-n", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(calls(log)) < 20:
            assert time.monotonic() < deadline, "the workers never started generating"
            assert controller.poll() is None, "the run ended before the kill"
            time.sleep(0.05)
        workers = children(controller.pid)
        assert {pid for pid, _, _ in calls(log)} <= set(workers)
        killed_at = time.time()
        controller.send_signal(signal.SIGKILL)
        resume = subprocess.run([*cmd, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True)
    finally:
        controller.kill()
        controller.wait()
    assert not any(alive(pid) for pid in workers), "a worker outlived its controller"
    by_workers = [row for row in calls(log) if row[0] in workers]
    assert max(t for _, _, t in by_workers) < killed_at + 1.0, "workers went on generating after the kill"
    refused = resume.returncode == pytest.ExitCode.USAGE_ERROR and "still written" in resume.stderr
    assert refused or resume.returncode == 0, resume.stdout + resume.stderr
    resumed = [row for row in calls(log) if row[0] not in workers]
    assert not resumed or min(t for _, _, t in resumed) > max(t for _, _, t in by_workers)
    # Asked twice: at most what was in flight at the kill (rows not yet in the journal).
    twice = [iid for iid, n in Counter(iid for _, iid, _ in calls(log)).items() if n > 1]
    assert len(twice) <= 20, twice


def test_a_worker_claim_makes_a_new_session_wait_then_refuse(tmp_path, monkeypatch):
    from pytest_evalreplay.model import EvalReplayError
    from pytest_evalreplay.rundir import writer as rundir

    monkeypatch.setattr(rundir, "WORKERS_GONE_WAIT", 0.3)
    old = rundir.SessionLock(tmp_path, "old")
    old.acquire()
    worker = rundir.SessionLock(tmp_path, "old")
    worker.claim_for_worker()
    old.release()  # the controller died; its worker still holds its claim
    new = rundir.SessionLock(tmp_path, "new")
    with pytest.raises(EvalReplayError, match="still written by pytest-xdist workers"):
        new.acquire()
    worker.release()
    new.acquire()  # the worker is gone: the dir is free
    new.release()


def test_a_worker_stops_when_its_controller_is_gone():
    from pytest_evalreplay.plugin.distributed import EXIT_ORPHANED

    script = (
        "import os, sys, time\n"
        "from pytest_evalreplay.plugin.distributed import watch_controller\n"
        "watch_controller(int(sys.argv[1]), interval=0.02)\n"
        "time.sleep(30)\n"
    )
    gone = subprocess.Popen(["true"])
    gone.wait()
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, str(gone.pid)], timeout=20)
    assert done.returncode == EXIT_ORPHANED
    assert time.monotonic() - start < 10


def test_a_session_lock_held_by_another_process_refuses_this_one(tmp_path):
    """Two processes, not two locks in one: the OS lock is per output dir."""
    from pytest_evalreplay.model import EvalReplayError
    from pytest_evalreplay.rundir.writer import SessionLock

    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from pytest_evalreplay.rundir.writer import SessionLock\n"
        "lock = SessionLock(Path(sys.argv[1]), 'first')\n"
        "lock.acquire()\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n"
        "lock.release()\n"
        "print('released', flush=True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "held\n"
        second = SessionLock(tmp_path, "second")
        with pytest.raises(EvalReplayError, match=f"in use by another pytest session \\(pid {child.pid} "):
            second.acquire()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "released\n"
        second.acquire()  # the first process let go: the dir is free
        second.release()
    finally:
        child.kill()
        child.communicate()  # waits, and closes the pipes (an open one is a ResourceWarning under -W error)
