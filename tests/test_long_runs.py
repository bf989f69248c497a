"""Long runs: results saved as they come back (a SIGKILL mid-batch loses only
the last group and what was in flight), live progress, timeouts, several
servers. Runs that are killed are real `python -m pytest` processes against
real local HTTP servers (tests/http_stub.py) or the real vLLM engine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from subprocess_pytest import PYTEST, child_env

HERE = Path(__file__).parent
N = 40

EVALS = """
from pytest_evalreplay import EvalTask
t = EvalTask("t", [{{"id": f"q{{n:02d}}"}} for n in range({n})], prompt="Q {{id}}",
             scorer=lambda text, i: float(text.startswith("Q")), sampling={{"max_tokens": 8}})
"""


class Stub:
    """tests/http_stub.py as a subprocess: an OpenAI-compatible server that
    logs each request it answers."""

    def __init__(self, tmp: Path, name: str, model: str = "stub-model", delay: float = 0.0) -> None:
        self.log = tmp / f"{name}.jsonl"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "http_stub.py"),
                "--port",
                "0",
                "--model",
                model,
                "--delay",
                str(delay),
                "--log",
                str(self.log),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def answered(self) -> list[str]:
        if not self.log.exists():
            return []
        return [orjson.loads(x)["prompt"] for x in self.log.read_bytes().splitlines() if x.strip()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def stubs(tmp_path):
    made: list[Stub] = []

    def make(name: str, **kwargs) -> Stub:
        stub = Stub(tmp_path, name, **kwargs)
        made.append(stub)
        return stub

    yield make
    for stub in made:
        stub.stop()


def pytest_cmd(project: Path, *args: str) -> list[str]:
    return [*PYTEST, "-q", "--evalreplay-output=out", *args]


def env() -> dict[str, str]:
    return child_env()


def journaled(project: Path, task: str = "t") -> list[tuple[str, int]]:
    path = project / "out" / f"{task}-journal.jsonl"
    data = path.read_bytes() if path.exists() else b""
    lines = data.splitlines()
    if data and not data.endswith(b"\n"):
        lines = lines[:-1]
    rows = [orjson.loads(x) for x in lines]
    return [(r["instance_id"], r["rollout"]) for r in rows if r.get("type") == "gen"]


def test_a_kill_after_half_the_answers_loses_only_the_last_group_and_what_was_in_flight(tmp_path, stubs):
    stub = stubs("server", delay=0.1)
    (tmp_path / "test_evals.py").write_text(EVALS.format(n=N))
    args = [
        "--evalreplay-provider=openai",
        f"--evalreplay-base-url={stub.url}",
        "--evalreplay-model=stub-model",
        "--evalreplay-concurrency=2",
    ]
    proc = subprocess.Popen(
        pytest_cmd(tmp_path, *args),
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while len(stub.answered()) < N // 2 and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    answered_before = len(stub.answered())
    saved = journaled(tmp_path)
    assert len(saved) >= N // 2 - 2 - 10  # at most the last group (0.5 s of answers) and what was in flight
    result = subprocess.run(
        pytest_cmd(tmp_path, *args, "--resume"),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    resumed = stub.answered()[answered_before:]
    assert len(resumed) == N - len(saved)
    assert not {p.removeprefix("Q ") for p in resumed} & {iid for iid, _ in saved}
    assert sorted(journaled(tmp_path)) == sorted({(f"q{n:02d}", 0) for n in range(N)})


def test_progress_lines_appear_in_a_log_before_the_batch_ends_and_not_under_q(pytester):
    pytester.makeconftest(
        """
import time
from pytest_evalreplay import Generation

class Slow:
    kind, model, batch_size = "slow", "slow-1", None

    def generate_stream(self, requests):
        for i, r in enumerate(requests):
            time.sleep(0.05)
            yield i, [Generation(text="x", completion_tokens=4) for _ in r.rollouts]

    def generate(self, requests):
        return [g for _, g in sorted(self.generate_stream(requests))]

def pytest_evalreplay_make_provider(config, kind):
    return Slow() if kind == "slow" else None
"""
    )
    pytester.makeini("[pytest]\nevalreplay_provider = slow\nevalreplay_progress_interval = 0.1\n")
    pytester.makepyfile(test_evals=EVALS.format(n=10))
    result = pytester.runpytest("--evalreplay-output=out")
    result.assert_outcomes(passed=10)
    progress = [x for x in result.outlines if x.startswith("evalreplay: t: ")]
    assert progress, result.stdout.str()
    done = [int(x.split(": ")[2].split("/")[0]) for x in progress]
    assert min(done) < 10  # a line while the batch was still running
    assert all("ETA" in x for x, d in zip(progress, done, strict=True) if d < 10)
    assert "tok/s" in progress[-1]
    quiet = pytester.runpytest("--evalreplay-output=out2", "-q")
    assert not [x for x in quiet.outlines if x.startswith("evalreplay: t: ")]


def test_a_conftest_provider_that_blocks_forever_fails_after_the_timeout(pytester, monkeypatch):
    release = pytester.path / "release"
    monkeypatch.setenv("RELEASE", str(release))
    pytester.makeconftest(
        """
import os, time
from pytest_evalreplay import Generation

class Stuck:
    kind, model, batch_size = "stuck", "stuck-1", None

    def generate(self, requests):
        while not os.path.exists(os.environ["RELEASE"]):  # blocks until the test ends
            time.sleep(0.05)
        return [[Generation(text="late")] for _ in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Stuck() if kind == "stuck" else None
"""
    )
    pytester.makeini("[pytest]\nevalreplay_provider = stuck\n")
    pytester.makepyfile(test_evals=EVALS.format(n=2))
    try:
        result = pytester.runpytest(
            "--evalreplay-output=out", "--evalreplay-timeout=0.3", "--evalreplay-max-attempts=2"
        )
    finally:
        release.touch()  # lets the abandoned provider threads end
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["*no result from the provider within --evalreplay-timeout=0.3s; the call was abandoned*thread*"]
    )


def test_a_server_that_never_answers_fails_after_the_timeout(pytester):
    sys.path.insert(0, str(HERE))
    try:
        from http_stub import Hang, StubServer
    finally:
        sys.path.remove(str(HERE))
    with StubServer(model="m") as server:
        server.default = Hang()
        pytester.makepyfile(test_evals=EVALS.format(n=2))
        result = pytester.runpytest(
            "--evalreplay-output=out",
            "--evalreplay-provider=openai",
            f"--evalreplay-base-url={server.url}",
            "--evalreplay-model=m",
            "--evalreplay-timeout=0.3",
            "--evalreplay-max-attempts=1",
        )
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*--evalreplay-timeout*"])


def test_two_servers_one_killed_mid_run_nothing_lost_or_duplicated(tmp_path, stubs):
    first, second = stubs("a", delay=0.05), stubs("b", delay=0.05)
    (tmp_path / "test_evals.py").write_text(EVALS.format(n=N))
    args = [
        "--evalreplay-provider=openai",
        f"--evalreplay-base-url={first.url}",
        f"--evalreplay-base-url={second.url}",
        "--evalreplay-model=stub-model",
        "--evalreplay-concurrency=4",
    ]
    proc = subprocess.Popen(
        pytest_cmd(tmp_path, *args),
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    while len(first.answered()) < 5 and proc.poll() is None:
        time.sleep(0.01)
    first.stop()
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert len(first.answered()) < N and len(second.answered()) > 0
    gens = journaled(tmp_path)
    assert sorted(gens) == sorted((f"q{n:02d}", 0) for n in range(N))  # none lost, none twice


def test_a_server_serving_another_model_is_refused_at_start(tmp_path, stubs):
    right, wrong = stubs("right", model="m"), stubs("wrong", model="other")
    (tmp_path / "test_evals.py").write_text(EVALS.format(n=2))
    result = subprocess.run(
        pytest_cmd(
            tmp_path,
            "--evalreplay-provider=openai",
            f"--evalreplay-base-url={right.url}",
            f"--evalreplay-base-url={wrong.url}",
            "--evalreplay-model=m",
        ),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert wrong.url in result.stderr and "other" in result.stderr
    assert right.answered() == [] and wrong.answered() == []


def test_xdist_with_the_in_process_vllm_provider_is_refused(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_evals=EVALS.format(n=2))
    result = pytester.runpytest("-n", "2", "--evalreplay-provider=vllm", "--evalreplay-model=x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*would load the model in every xdist worker*--evalreplay-provider=openai*"])


@pytest.mark.slow  # pytest-xdist in a child pytest
def test_xdist_controller_shows_the_workers_progress(pytester):
    pytest.importorskip("xdist")
    pytester.makeconftest(
        """
import time
from pytest_evalreplay import Generation

class Slow:
    kind, model, batch_size = "slow", "slow-1", None

    def generate_stream(self, requests):
        for i, r in enumerate(requests):
            time.sleep(0.1)
            yield i, [Generation(text="x") for _ in r.rollouts]

    def generate(self, requests):
        return [g for _, g in sorted(self.generate_stream(requests))]

def pytest_evalreplay_make_provider(config, kind):
    return Slow() if kind == "slow" else None
"""
    )
    pytester.makeini("[pytest]\nevalreplay_provider = slow\nevalreplay_progress_interval = 0.2\n")
    pytester.makepyfile(test_evals=EVALS.format(n=20))
    result = pytester.runpytest_subprocess("--evalreplay-output=out", "-n", "2", "-p", "no:randomly")
    result.assert_outcomes(passed=20)
    assert [x for x in result.outlines if x.startswith("evalreplay: [gw")], result.stdout.str()


def test_vllm_killed_mid_batch_resumes_generating_only_what_was_not_journaled(tmp_path, vllm_options):
    (tmp_path / "conftest.py").write_text(
        "import os, signal\n"
        # every answer is one append: the kill lands between them
        "from pytest_evalreplay.journal import rows as journal\n"
        "_append, calls = journal.append_durably, 0\n"
        "def append(path, blob):\n"
        "    global calls\n"
        "    at = _append(path, blob)\n"
        "    calls += 1\n"
        "    if calls == int(os.environ.get('KILL_AT_APPEND', '0')):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return at\n"
        "journal.append_durably = append\n"
    )
    (tmp_path / "test_evals.py").write_text(
        "from pytest_evalreplay import EvalTask\n"
        "t = EvalTask('t', [{'id': f'q{n:02d}'} for n in range(48)], prompt='Count: {id}',\n"
        "             scorer=lambda text, i: 1.0,\n"
        "             sampling={'temperature': 0.0, 'max_tokens': 24, 'ignore_eos': True})\n"
    )
    args = list(vllm_options)
    # Its own process group: SIGKILL of pytest orphans vLLM's engine processes; the group kill ends them.
    proc = subprocess.Popen(
        pytest_cmd(tmp_path, *args),
        cwd=tmp_path,
        env={**env(), "KILL_AT_APPEND": "3"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -9, out
    saved = journaled(tmp_path)
    assert 0 < len(saved) < 48
    resumed = subprocess.run(
        pytest_cmd(tmp_path, *args, "--resume"),
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = [orjson.loads(x) for x in (tmp_path / "out" / "t-journal.jsonl").read_bytes().splitlines()]
    runs = [r["run"] for r in rows if r["type"] == "gen"]
    assert len(runs) == 48 and runs.count(runs[-1]) == 48 - len(saved)
