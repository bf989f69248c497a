"""The loss bound of a crash (issue #18, "Done when"): a real `python -m pytest`
run against a real local HTTP server (tests/http_stub.py, in this process,
127.0.0.1 only) is SIGKILLed once the server has answered half the task, and
the `--resume` that follows asks the server again only for what was in
flight at the kill: at most the concurrency, with the default settings.

The server decides what "answered before the kill" means: it records an
answer before sending it, so an answer it sent that the killed run never
read counts as answered, and asking for it again counts as re-asked.
benchmarks/loss_bound.py measures the same at several kill points.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest
from http_stub import Staggered, StubServer
from subprocess_pytest import PYTEST, child_env

from pytest_evalreplay.settings import DEFAULT_CONCURRENCY

N = 200
KILL_AT = 100
# Each answer after 0.05-0.35 s (by prompt): with 32 in flight, a steady stream
# of about 160 answers a second, so a run that held answers back for half a
# second before writing them would lose about 80 to the kill.
SERVER = Staggered(low=0.05, high=0.35)

EVALS = """
from pytest_evalreplay import EvalTask
t = EvalTask("t", [{{"id": f"q{{n:03d}}"}} for n in range({n})], prompt="Q {{id}}",
             scorer=lambda text, i: float(text.startswith("Q")), sampling={{"max_tokens": 8}})
"""


def command(url: str, *args: str) -> list[str]:
    """The default settings but for the provider: no concurrency, batch or flush option."""
    return [
        *PYTEST,
        "-q",
        "--evalreplay-provider=openai",
        f"--evalreplay-base-url={url}",
        "--evalreplay-model=stub-model",
        "--evalreplay-output=out",
        *args,
    ]


def journaled(project: Path) -> set[str]:
    """Instance ids of the journal's gen rows (a torn last line skipped)."""
    path = project / "out" / "t-journal.jsonl"
    lines = path.read_bytes().split(b"\n")[:-1] if path.exists() else []
    rows = [orjson.loads(line) for line in lines if line.strip()]
    return {r["instance_id"] for r in rows if r.get("type") == "gen"}


def answered(stub: StubServer) -> set[str]:
    return {p.removeprefix("Q ") for p in stub.prompts("answered")}


def received_since(stub: StubServer, start: int) -> list[str]:
    with stub._cond:
        events = stub.events[start:]
    return [e["prompt"].removeprefix("Q ") for e in events if e["event"] == "received"]


@pytest.mark.slow
def test_resume_after_a_sigkill_asks_again_only_for_what_was_in_flight(tmp_path):
    (tmp_path / "test_evals.py").write_text(EVALS.format(n=N))
    with StubServer("stub-model") as stub:
        stub.default = SERVER
        proc = subprocess.Popen(
            command(stub.url),
            cwd=tmp_path,
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            reached = stub.wait_until(lambda s: s.answered >= KILL_AT or proc.poll() is not None, 90)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
        assert reached and proc.returncode == -signal.SIGKILL, "the run ended before the kill"
        # The run is dead: once the stub has read what it sent, nothing more is answered to it.
        assert stub.settle(), "the stub still had the killed run's requests after a minute"
        before = answered(stub)
        saved = journaled(tmp_path)
        assert KILL_AT <= len(before) < N
        assert saved <= before
        mark = len(stub.events)

        result = subprocess.run(
            command(stub.url, "--resume"),
            cwd=tmp_path,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        asked = received_since(stub, mark)

    reasked = [iid for iid in asked if iid in before]
    assert sorted(reasked) == sorted(before - saved)  # the lost ones, each asked once
    assert len(reasked) <= DEFAULT_CONCURRENCY, (len(before), len(saved), reasked)
    assert sorted(asked) == sorted({f"q{n:03d}" for n in range(N)} - saved)
    assert journaled(tmp_path) == {f"q{n:03d}" for n in range(N)}
