"""Chaos: runs SIGKILLed at seeded random moments, then resumed, end with the
run dir of an uninterrupted run.

Two suites (tests/chaos_project.py): three EvalTasks (failing instances of
every class, num_samples > 1, chat messages) and a three-stage ELO eval,
each with a plain and a streaming provider. Each scenario kills the first
run at one event drawn from a seeded RNG (the Nth provider call or streamed
result, journal append, scorer or judge call, run dir write, or a delay),
resumes it with `--resume` (perhaps killed again), and resumes to the end.
Then:

- the run dir is byte-identical to the uninterrupted run's (each
  `*-metrics.json` but its `session` block), with no temporary file left;
- every rollout has exactly one `gen` row in its journal, the same as the
  uninterrupted run's, and the journals hold the same failures, scores and
  stage records;
- no run asked the provider for a rollout whose `gen` (or final `fail`) row
  was committed before it started, and no run of one process asked twice
  for a rollout unless it failed retryably;
- no journal holds a row twice, and no run printed INTERNALERROR.

A test id names everything a scenario draws: its seed (`scenario(seed)`
rebuilds it), the suite, the provider and each kill as `kind@fraction` of
the uninterrupted run's count of that kind (`clock@f`: f of its wall time),
`tear` where the killed write leaves half its bytes behind. A failure
message gives the resolved event numbers and each run's exit code; `-k
seed1215` reruns one scenario, `-rP` shows where each kill landed. The xdist
variants (`-n2`, `*:kind@f`) SIGKILL whichever worker first reaches the
event, not the session. Scenarios run two at a time in background threads
(the file takes about half as long on two cores). They are marked `slow`:
`pytest --run-slow` or `-m slow` runs them (CI does, once).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from chaos_project import KINDS, SUITES, Key, Project, Run, without_session

SEED = 1212  # scenario i draws from random.Random(SEED + i)
SCENARIOS = 20
XDIST_SEED = 4242  # xdist scenario i draws from random.Random(XDIST_SEED + i)
XDIST_SCENARIOS = 2
BASELINE_RC = {"tasks": pytest.ExitCode.TESTS_FAILED, "elo": pytest.ExitCode.OK}


@dataclass(frozen=True)
class Kill:
    kind: str
    fraction: float  # of the uninterrupted run's count of this kind (of its wall time for `clock`)
    tear: bool = False  # `append` / `write`: leave half the bytes behind
    worker: str = ""  # "*": whichever xdist worker first gets there, not the session

    def __str__(self) -> str:
        where = f"{self.worker}:" if self.worker else ""
        return f"{where}{self.kind}@{self.fraction:.2f}{'tear' if self.tear else ''}"

    def resolve(self, totals: dict[str, int], ms: int) -> dict[str, Any]:
        """The event number (or delay in ms) it lands on, as the project's conftest reads it."""
        if self.kind == "clock":
            n = round(self.fraction * ms)
        else:
            # fraction 1.00 (a draw rounded up) is the last event, not one past it
            n = min(1 + math.floor(self.fraction * totals[self.kind]), totals[self.kind])
        return {"kind": self.kind, "n": n, "tear": self.tear, "worker": self.worker}


@dataclass(frozen=True)
class Scenario:
    seed: int
    suite: str
    provider: str
    kills: tuple[Kill, ...]
    workers: int = 0  # -n of its runs

    def __str__(self) -> str:
        n = f"-n{self.workers}" if self.workers else ""
        return f"seed{self.seed}-{self.suite}-{self.provider}{n}-" + "+".join(map(str, self.kills))


def _kill(rng: random.Random, kind: str, within: float = 1.0) -> Kill:
    return Kill(kind, round(rng.random() * within, 2), kind in ("append", "write") and rng.random() < 0.5)


def scenario(seed: int) -> Scenario:
    """Scenario `seed - SEED`. The suites alternate, and each suite's ten
    scenarios kill first at each kind of event with each provider; where in
    the run, whether the write tears, and whether (and where) the resume is
    killed again are drawn."""
    i = seed - SEED
    suite = ("tasks", "elo")[i % 2]
    provider = ("plain", "stream")[(i // 2) // 5 % 2]
    kinds = KINDS[suite, provider]
    rng = random.Random(seed)
    kills = [_kill(rng, kinds[(i // 2) % len(kinds)])]
    if rng.random() < 0.3:  # the resume is killed too, early in it
        kills.append(_kill(rng, kinds[rng.randrange(len(kinds))], within=0.5))
    return Scenario(seed, suite, provider, tuple(kills))


def xdist_scenario(seed: int) -> Scenario:
    """`-n 2`; whichever worker first reaches the drawn event (scoring,
    judging, generating or appending: events workers have) is killed, early
    in the run so that one surely gets there."""
    i = seed - XDIST_SEED
    suite, provider = [("tasks", "plain"), ("elo", "stream")][i % 2]
    rng = random.Random(seed)
    kinds = [k for k in KINDS[suite, provider] if k not in ("write", "clock")]
    kill = _kill(rng, kinds[rng.randrange(len(kinds))], within=0.3)
    return Scenario(seed, suite, provider, (Kill(kill.kind, kill.fraction, kill.tear, "*"),), workers=2)


ALL = [scenario(SEED + i) for i in range(SCENARIOS)]
XDIST = [xdist_scenario(XDIST_SEED + i) for i in range(XDIST_SCENARIOS)]


def check_asks(run: Run, committed: set[Key], one_process: bool) -> None:
    """A run asks for nothing committed before it started; one process asks
    for a rollout twice only when it failed retryably (the `flaky` instances).
    (A run whose xdist worker was killed may ask again for what the dead
    worker had in flight.)"""
    asked = [key for _, key in run.asked()]
    again = committed & set(asked)
    assert not again, f"asked again for rollouts committed before this run: {sorted(again)}"
    if one_process:
        twice = [key for key, n in Counter(asked).items() if n > 1 and not key[2].startswith("flaky")]
        assert not twice, f"asked twice in one run: {twice}"


def journal_content(project: Project) -> dict[str, Any]:
    """What the journals must hold whatever the interruptions: per rollout its
    generations, every failed attempt, the scores, and the ELO stage records
    (run ids and the order of the rows aside)."""
    gens: dict[Key, list[Any]] = {}
    scores: Counter[str] = Counter()
    stages: list[Any] = []
    for task in SUITES[project.suite]:
        for row in project.journal(f"{task}-journal.jsonl"):
            key = (task, row.get("stage"), row.get("instance_id"), row.get("rollout"))
            if row["type"] == "gen":
                gens.setdefault(key, []).append(row["generation"])
            elif row["type"] == "score":
                rest = {k: v for k, v in row.items() if k not in ("type", "run", "of")}
                scores[repr(sorted(rest.items()))] += 1
            elif row["type"] == "stage":
                stages.append({k: v for k, v in row.items() if k != "run"})
    return {"gens": gens, "failures": project.failures(), "scores": scores, "stages": stages}


def check_final(project: Project, baseline: Project) -> None:
    files, expected = project.run_dir_files(), baseline.run_dir_files()
    assert sorted(files) == sorted(expected)
    for name, data in expected.items():
        assert without_session(name, files[name]) == without_session(name, data), name
    left = [*project.out.glob("*.tmp"), *project.out.glob(".*.tmp")]
    assert not left, f"temporary files left: {left}"

    duplicated = [row for row, n in Counter(project.gen_rows()).items() if n > 1]
    assert not duplicated, f"gen rows duplicated within a run: {duplicated}"
    assert not project.duplicate_rows(), f"journal rows written twice: {project.duplicate_rows()}"
    got, want = journal_content(project), journal_content(baseline)
    twice = {key: len(g) for key, g in got["gens"].items() if len(g) > 1}
    assert not twice, f"rollouts with more than one gen row after resuming: {twice}"
    assert sorted(got["gens"]) == sorted(want["gens"]), "rollouts lost or added"
    assert got["gens"] == want["gens"]
    assert got["failures"] == want["failures"]
    assert got["scores"] == want["scores"]
    assert got["stages"] == want["stages"]


def play(project: Project, sc: Scenario, totals: dict[str, int], ms: int) -> list[str]:
    """The scenario's kills, then `--resume` to the end; returns what happened, for messages."""
    story: list[str] = []

    def why(run: Run) -> str:
        return f"{sc}: " + "; ".join(story) + "\n" + run.output

    for n, kill in enumerate(sc.kills):
        committed = project.committed()
        resolved = kill.resolve(totals, ms)
        run = project.run(*(["--resume"] if n else []), kill=resolved, workers=sc.workers)
        story.append(f"run {n}: kill {resolved} -> rc {run.returncode}")
        assert "INTERNALERROR" not in run.output, why(run)
        if sc.workers:
            assert any(row[1] == "killed" for row in run.log), why(run)  # a worker died
            assert run.returncode == pytest.ExitCode.TESTS_FAILED, why(run)
        elif n == 0 and kill.kind != "clock":
            assert run.killed, f"the kill did not land: {why(run)}"
        else:  # a resume, or a delay, may end before its kill lands
            assert run.killed or run.returncode == BASELINE_RC[sc.suite], why(run)
        check_asks(run, committed, one_process=not sc.workers)
        if not run.killed and not sc.workers:
            break
    committed = project.committed()
    run = project.run("--resume", workers=sc.workers)
    story.append(f"final --resume -> rc {run.returncode}")
    assert "INTERNALERROR" not in run.output, why(run)
    assert run.returncode == BASELINE_RC[sc.suite], why(run)
    check_asks(run, committed, one_process=not sc.workers)
    return story


class Lab:
    """Plays scenarios two at a time in background threads (each is a chain
    of pytest processes keeping about one core busy), in the order the
    session runs their tests; a test waits for its own. With `parallel=1`
    (under xdist, where every worker collects every test) a scenario is
    played when its test asks for it."""

    def __init__(self, factory: pytest.TempPathFactory, parallel: int) -> None:
        self.factory = factory
        self.pool = ThreadPoolExecutor(parallel) if parallel > 1 else None
        self.baselines: dict[tuple[Any, ...], Future[tuple[Project, Run]]] = {}
        self.played: dict[Scenario, Future[tuple[Project, list[str]]]] = {}

    def start(self, scenarios: list[Scenario]) -> None:
        for sc in scenarios:  # the baselines first: the scenarios' threads wait for them
            self._future(self.baselines, (sc.suite, sc.provider), self._baseline, sc.suite, sc.provider)
        for sc in scenarios:
            self._future(self.played, sc, self._play, sc)

    def baseline(self, suite: str, provider: str) -> tuple[Project, Run]:
        return self._future(self.baselines, (suite, provider), self._baseline, suite, provider).result()

    def start_xdist_elo(self) -> Future[tuple[Project, Run]]:
        """An uninterrupted `-n 2` run of the ELO suite."""
        return self._future(self.baselines, ("elo", "stream", 2), self._baseline, "elo", "stream", 2)

    def xdist_elo(self) -> tuple[Project, Run]:
        return self.start_xdist_elo().result()

    def play(self, sc: Scenario) -> tuple[Project, list[str]]:
        return self._future(self.played, sc, self._play, sc).result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def _future(
        self, table: dict[Any, Future[Any]], key: Any, fn: Callable[..., Any], *args: Any
    ) -> Future[Any]:
        if key not in table:
            if self.pool is not None:
                table[key] = self.pool.submit(fn, *args)
            else:
                table[key] = future = Future()
                try:
                    future.set_result(fn(*args))
                except Exception as exc:
                    future.set_exception(exc)
        return table[key]

    def _baseline(self, suite: str, provider: str, workers: int = 0) -> tuple[Project, Run]:
        project = Project(self.factory.mktemp(f"baseline-{suite}-{provider}-n{workers}"), suite, provider)
        run = project.run(workers=workers)
        assert run.returncode == BASELINE_RC[suite], run.output
        assert "INTERNALERROR" not in run.output, run.output
        return project, run

    def _play(self, sc: Scenario) -> tuple[Project, list[str]]:
        _, base_run = self.baseline(sc.suite, sc.provider)
        totals, ms = base_run.totals()
        project = Project(self.factory.mktemp(f"seed{sc.seed}"), sc.suite, sc.provider)
        return project, play(project, sc, totals, ms)


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    under_xdist = hasattr(request.config, "workerinput")
    lab = Lab(tmp_path_factory, parallel=1 if under_xdist else 2)
    selected = [
        item.callspec.params["sc"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and "sc" in getattr(getattr(item, "callspec", None), "params", {})
    ]
    if not under_xdist:
        if any(item.name.startswith("test_an_xdist_elo") for item in request.session.items):
            lab.start_xdist_elo()
        lab.start(selected)
    yield lab
    lab.close()


@pytest.mark.slow
@pytest.mark.parametrize("sc", ALL + XDIST, ids=str)
def test_killed_and_resumed_ends_as_the_uninterrupted_run(lab: Lab, sc: Scenario) -> None:
    if sc.workers:
        pytest.importorskip("xdist")
    project, story = lab.play(sc)
    print(sc, *story, sep="\n  ")  # shown with -rP: where the kills landed
    baseline, _ = lab.baseline(sc.suite, sc.provider)
    try:
        check_final(project, baseline)
    except AssertionError as exc:
        raise AssertionError(f"{sc}: " + "; ".join(story) + f"\n{exc}") from None


def test_the_scenarios_cover_every_kill_kind_of_both_suites_and_providers() -> None:
    first = {(sc.suite, sc.provider, sc.kills[0].kind) for sc in ALL}
    assert first == {(suite, provider, kind) for (suite, provider), kinds in KINDS.items() for kind in kinds}
    assert sum(len(sc.kills) for sc in ALL) > SCENARIOS
    assert any(k.tear for sc in ALL for k in sc.kills)
    assert {(sc.suite, sc.workers) for sc in XDIST} == {("tasks", 2), ("elo", 2)}


@pytest.mark.slow
def test_the_uninterrupted_runs_hold_the_failures_the_kills_cross(lab: Lab) -> None:
    tasks, run = lab.baseline("tasks", "plain")
    counts, _ = run.totals()
    assert counts["call"] >= 5 and counts["append"] >= 5 and counts["score"] >= 10
    failed = Counter((f[0], f[2], f[5], f[6]) for f in tasks.failures().elements())
    assert failed == Counter(
        {
            ("arith", "bad1", "terminal", True): 1,
            ("words", "flaky1", "retryable", False): 2,
            ("words", "flaky1", "retryable", True): 1,
        }
    )
    assert len(tasks.gen_rows()) == 8 + 9 + 3
    elo, run = lab.baseline("elo", "stream")
    counts, _ = run.totals()
    assert counts["result"] == 12 and counts["judge"] == 2 * (4 * 3 + 4 * 2 + 4 * 1)
    assert [s["kind"] for s in journal_content(elo)["stages"]].count("complete") == 3


# Found by the xdist ELO scenarios: an uninterrupted `-n 2` run of an EloEval
# with a function judge writes journal rows twice. Each fails until fixed.


@pytest.mark.slow
def test_an_xdist_elo_run_records_its_seed_once(lab: Lab) -> None:
    """Each worker decides at collection, from its own snapshot of the
    journal, that the drawn seed is not recorded yet (`elorun.seed_rows`),
    so both record it: two identical `seed` rows of one run."""
    pytest.importorskip("xdist")
    project, _ = lab.xdist_elo()
    seeds = [r for r in project.journal("memo-journal.jsonl") if r["type"] == "stage" and r["kind"] == "seed"]
    assert len(seeds) == 1, seeds


@pytest.mark.slow
def test_an_xdist_elo_run_judges_each_rollout_once(lab: Lab) -> None:
    """A worker that needs a stage complete (to plan the next) judges each of
    the stage's rollouts it has not judged itself (`EloDriver.complete_stage`
    -> `result_for`) instead of reading its peer's verdicts from the journal:
    every pair is judged by both workers and its `score` row written twice."""
    pytest.importorskip("xdist")
    project, run = lab.xdist_elo()
    _, serial = lab.baseline("elo", "stream")
    calls = Counter(worker for worker, *_ in run.judged())
    assert len(serial.judged()) == 48
    assert sum(calls.values()) == 48, f"judge calls per worker: {dict(calls)}; a serial run makes 48"
    keys = Counter(
        (r["stage"], r["instance_id"], r["rollout"])
        for r in project.journal("memo-journal.jsonl")
        if r["type"] == "score"
    )
    assert not [key for key, n in keys.items() if n > 1]
