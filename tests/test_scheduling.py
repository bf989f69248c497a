"""pytest-xdist keeps a chunk's items on the worker that generates it
(scheduling.py): the grouping itself as plain functions, then `-n 2` runs
with pytester (which worker ran each item, what the provider was asked,
and that the run dir is the one `-n 0` writes)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("xdist")  # a test extra; the plugin uses the scheduler only where xdist is

from xdist.remote import Producer

from pytest_evalreplay.plugin.scheduling import (
    MIN_CHUNKS_PER_WORKER,
    UNGROUPED,
    ChunkScheduling,
    agreed_groups,
    chunk_groups,
)

pytestmark = pytest.mark.filterwarnings("error")


def _chunked(
    task: str, n: int, size: int
) -> tuple[list[tuple[str, tuple[int, str]]], dict[tuple[int, str], int]]:
    keys = [(task, (1, f"q{i}")) for i in range(n)]
    return keys, {(1, f"q{i}"): i // size for i in range(n)}


def test_a_chunks_items_share_a_group_numbered_in_first_seen_order():
    keys, chunk_of = _chunked("t", 8, 2)
    groups = chunk_groups([None, *keys, None], {"t": chunk_of}, {"t": 4}, workers=2)
    assert groups == [UNGROUPED, 0, 0, 1, 1, 2, 2, 3, 3, UNGROUPED]


def test_a_task_with_too_few_chunks_per_worker_is_not_grouped():
    keys, chunk_of = _chunked("t", 6, 2)  # 3 chunks, 2 workers: fewer than 2 per worker
    assert set(chunk_groups(keys, {"t": chunk_of}, {"t": 3}, workers=2)) == {UNGROUPED}
    other, other_chunks = _chunked("u", 8, 2)
    groups = chunk_groups(keys + other, {"t": chunk_of, "u": other_chunks}, {"t": 3, "u": 4}, workers=2)
    assert groups == [UNGROUPED] * 6 + [0, 0, 1, 1, 2, 2, 3, 3]


def test_an_item_outside_the_chunks_stays_alone():
    keys, chunk_of = _chunked("t", 8, 2)
    del chunk_of[(1, "q3")]  # reused: not in what this run generates
    assert chunk_groups(keys, {"t": chunk_of}, {"t": 4}, workers=2)[3] == UNGROUPED


@given(st.integers(1, 60), st.integers(1, 9), st.integers(1, 8))
def test_groups_are_exactly_the_chunks_when_grouped(n, size, workers):
    keys, chunk_of = _chunked("t", n, size)
    count = -(-n // size)
    groups = chunk_groups(keys, {"t": chunk_of}, {"t": count}, workers)
    if count < MIN_CHUNKS_PER_WORKER * workers:
        assert set(groups) == {UNGROUPED}
    else:
        assert groups == [chunk_of[rk] for _, rk in keys]


def test_the_controller_groups_only_what_every_worker_reported_alike():
    ids = ["a", "b", "c", "d", "e"]
    scopes = agreed_groups(ids, [[-1, 0, 0, -1, -1], [-1, 0, 0, -1, -1]], bundle=2)
    assert scopes is not None
    assert scopes["b"] == scopes["c"] != scopes["a"]
    assert scopes["a"] == scopes["d"] != scopes["e"]  # the others in bundles of 2
    assert agreed_groups(ids, [[0, 0, -1, -1, -1], [0, 1, -1, -1, -1]]) is None  # workers disagree
    assert agreed_groups(ids, [[0, 0, -1, -1, -1], None]) is None  # a worker sent nothing
    assert agreed_groups(ids, [[0, 0]]) is None  # not this collection
    assert agreed_groups(ids, [[-1] * 5]) is None  # nothing grouped: xdist's load
    assert agreed_groups(ids, []) is None


QUIET = Producer("test", enabled=False)


class _Config:
    """What xdist's schedulers read of the config, for `n` popen workers."""

    def __init__(self, n: int) -> None:
        self.option = type("Option", (), {"loadscopereorder": False, "maxschedchunk": None})()
        self._tx = [f"{n}*popen"]

    def getvalue(self, name: str) -> object:
        return self._tx if name == "tx" else None

    def getoption(self, name: str) -> object:
        return getattr(self.option, name, None)


class _Node:
    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down = False
        self.queue: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _drive(
    sched: ChunkScheduling, nodes: list[_Node], ids: list[str], crash: int | None = None
) -> dict[str, str]:
    """Run the schedule to the end, one item per node in turn; `crash`: the
    node that dies (xdist's remove_node) after its first item."""
    ran: dict[str, str] = {}
    live = list(nodes)
    while any(node.queue for node in live):
        for node in list(live):
            if node.queue:
                index = node.queue.pop(0)
                ran[ids[index]] = node.gateway.id
                sched.mark_test_complete(node, index)
                if crash is not None and node is nodes[crash]:
                    crash = None
                    node.queue.clear()
                    sched.remove_node(node)
                    live.remove(node)
    assert sched.tests_finished
    return ran


@pytest.mark.parametrize("crash", [None, 0])
def test_the_scheduler_runs_every_item_once_with_a_chunk_on_one_node(crash):
    ids = [f"t.py::qa::q{i:05d}" for i in range(2_000)] + ["t.py::qa::gate"]
    groups = [i // 50 for i in range(2_000)] + [UNGROUPED]
    nodes = [_Node("gw0"), _Node("gw1")]
    sched = ChunkScheduling(_Config(2), QUIET, {"gw0": groups, "gw1": groups})  # type: ignore[arg-type]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, ids)
    assert sched.collection_is_completed
    sched.schedule()
    assert sched.grouped
    ran = _drive(sched, nodes, ids, crash)
    assert sorted(ran) == sorted(ids)
    if crash is None:
        for chunk in range(40):
            assert len({ran[ids[i]] for i in range(chunk * 50, chunk * 50 + 50)}) == 1


def test_the_scheduler_is_xdists_load_without_a_grouping():
    ids = [f"t.py::q{i}" for i in range(10)]
    nodes = [_Node("gw0"), _Node("gw1")]
    sched = ChunkScheduling(_Config(2), QUIET, {"gw0": [UNGROUPED] * 10})  # type: ignore[arg-type]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, ids)
    sched.schedule()
    assert not sched.grouped
    assert sorted(_drive(sched, nodes, ids)) == sorted(ids)


# -- -n 2 in a pytester project ---------------------------------------------------------------

CONFTEST = """
import os, orjson
from pytest_evalreplay import Generation

class Logged:
    kind = "logged"
    model = "logged-1"

    def generate(self, requests):
        with open(os.environ["CALL_LOG"], "ab") as fh:
            fh.write(orjson.dumps([r.instance_id for r in requests]) + b"\\n")
        return [[Generation(text="answer " + r.instance_id, finish_reason="stop") for _ in r.rollouts]
                for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Logged() if kind == "logged" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask, Gate

def even(text, instance):
    return int(instance["id"][1:]) % 2 == 0

qa = EvalTask("qa", [{"id": f"q{i:02d}"} for i in range(12)], prompt="Question {id}", scorer=even,
              gate=Gate("even", min=0.1))
"""

_RAN = re.compile(r"\[(gw\d+)\] .*(?:PASSED|FAILED|SKIPPED) (\S+)")


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("CALL_LOG", str(pytester.path / "calls.jsonl"))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    return pytester


def _run(p: pytest.Pytester, out: str, *args: str) -> pytest.RunResult:
    (p.path / "calls.jsonl").unlink(missing_ok=True)
    return p.runpytest(
        "--evalreplay-provider=logged", f"--evalreplay-output={out}", "-p", "no:randomly", "-v", *args
    )


def _workers(result: pytest.RunResult) -> dict[str, str]:
    return {m.group(2): m.group(1) for line in result.outlines if (m := _RAN.search(line))}


def _calls(p: pytest.Pytester) -> list[list[str]]:
    return [orjson.loads(line) for line in (p.path / "calls.jsonl").read_bytes().splitlines()]


def _run_dir(path: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in sorted(path.iterdir()):
        if f.name.endswith("-metrics.json"):
            out[f.name] = {k: v for k, v in orjson.loads(f.read_bytes()).items() if k != "session"}
        elif f.name.endswith((".jsonl", ".json")) and "journal" not in f.name:
            out[f.name] = f.read_bytes()
    return out


@pytest.mark.slow  # pytest-xdist workers started
def test_n2_runs_each_chunk_on_one_worker_and_writes_what_n0_writes(project):
    serial = _run(project, "serial", "-n", "0", "--evalreplay-batch-size=3")
    serial.assert_outcomes(passed=13)
    result = _run(project, "xdist", "-n", "2", "--evalreplay-batch-size=3")
    result.assert_outcomes(passed=13)
    ran = _workers(result)
    chunks = [[f"q{i:02d}" for i in range(c, c + 3)] for c in range(0, 12, 3)]
    for chunk in chunks:
        assert len({ran[f"test_evals.py::qa::{iid}[s1-r0]"] for iid in chunk}) == 1, (chunk, ran)
    assert len(set(ran.values())) == 2  # both workers had chunks
    assert sorted(_calls(project)) == chunks  # each chunk asked once, whole
    assert _run_dir(project.path / "xdist") == _run_dir(project.path / "serial")


@pytest.mark.slow
def test_selection_and_resume_keep_the_grouping_right(project):
    """-k narrows the chunks before they are formed; --resume forms them from
    what is left to generate; the gate runs after them."""
    result = _run(project, "out", "-n", "2", "--evalreplay-batch-size=2", "-k", "not q00 and not q11")
    result.assert_outcomes(passed=11)  # 10 items and the gate
    calls = _calls(project)
    assert sorted(calls) == [[f"q{i:02d}", f"q{i + 1:02d}"] for i in range(1, 11, 2)]
    ran = _workers(result)
    for call in calls:
        assert len({ran[f"test_evals.py::qa::{iid}[s1-r0]"] for iid in call}) == 1, (call, ran)
    result = _run(project, "out", "-n", "2", "--evalreplay-batch-size=2", "--resume")
    result.assert_outcomes(passed=3, skipped=10)
    assert _calls(project) == [["q00", "q11"]]


@pytest.mark.slow
def test_an_explicit_dist_mode_is_xdists_own(project):
    result = _run(project, "out", "-n", "2", "--dist=load", "--evalreplay-batch-size=3")
    result.assert_outcomes(passed=13)
    result.stdout.fnmatch_lines(["scheduling tests via LoadScheduling"])
    grouped = _run(project, "out2", "-n", "2", "--evalreplay-batch-size=3")
    grouped.stdout.fnmatch_lines(["scheduling tests via ChunkScheduling"])
