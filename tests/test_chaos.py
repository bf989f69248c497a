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
  uninterrupted run's, and the same failures, scores and stage records;
- no run asked the provider for a rollout whose `gen` (or final `fail`) row
  was committed before it started, and no run asked twice for a rollout
  unless it failed retryably;
- no run printed INTERNALERROR.

A test id names everything a scenario draws: its seed (`python -c "from
test_chaos import scenario; print(scenario(SEED))"` rebuilds it), the suite,
the provider and each kill as `kind@fraction` of the uninterrupted run's
count of that kind (`clock@f`: f of its wall time), `tear` where the killed
write leaves half its bytes. The failure message gives the resolved event
numbers. The xdist variants SIGKILL one worker (`-n 2`) instead.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chaos_project import KINDS, SUITES, Key, Project, Run, without_session

SEED = 1212  # scenario i draws from random.Random(SEED + i)
SCENARIOS = 20
XDIST_SCENARIOS = 3
BASELINE_RC = {"tasks": pytest.ExitCode.TESTS_FAILED, "elo": pytest.ExitCode.OK}


@dataclass(frozen=True)
class Kill:
    kind: str
    fraction: float  # of the uninterrupted run's count of this kind (of its wall time for `clock`)
    tear: bool = False  # `append` / `write`: leave half the bytes behind
    worker: str = ""  # an xdist worker ("gw1"): kill that worker, not the session

    def __str__(self) -> str:
        where = f"{self.worker}:" if self.worker else ""
        return f"{where}{self.kind}@{self.fraction:.2f}{'tear' if self.tear else ''}"

    def resolve(self, totals: dict[str, int], ms: int) -> dict[str, Any]:
        """The event number (or delay in ms) this kill lands on, for the project's conftest."""
        n = (
            round(self.fraction * ms)
            if self.kind == "clock"
            else 1 + math.floor(self.fraction * totals[self.kind])
        )
        return {"kind": self.kind, "n": n, "tear": self.tear, "worker": self.worker}


@dataclass(frozen=True)
class Scenario:
    seed: int
    suite: str
    provider: str
    kills: tuple[Kill, ...]
    workers: int = 0  # -n for the killed run

    def __str__(self) -> str:
        n = f"-n{self.workers}" if self.workers else ""
        return f"seed{self.seed}-{self.suite}-{self.provider}{n}-" + "+".join(map(str, self.kills))


def _kill(rng: random.Random, kind: str, within: float = 1.0) -> Kill:
    return Kill(kind, round(rng.random() * within, 2), kind in ("append", "write") and rng.random() < 0.5)


def scenario(seed: int) -> Scenario:
    """Scenario `seed - SEED`: the suites alternate, and each suite's ten
    scenarios cover every kind of kill with both providers; where in the run
    it lands, whether it tears, and whether the resume is killed again, are
    drawn."""
    i = seed - SEED
    suite = ("tasks", "elo")[i % 2]
    provider = ("plain", "stream")[(i // 2) // 5 % 2]
    kinds = KINDS[suite, provider]
    rng = random.Random(seed)
    kills = [_kill(rng, kinds[(i // 2) % len(kinds)])]
    while len(kills) < 3 and rng.random() < 0.35:  # the resume is killed too (early in it)
        kills.append(_kill(rng, rng.choice(kinds), within=0.5))
    return Scenario(seed, suite, provider, tuple(kills))


def xdist_scenario(seed: int) -> Scenario:
    """A worker of `-n 2` killed at an event only workers have (scoring,
    judging, generating, appending), early enough that it has not run out of
    items."""
    rng = random.Random(seed)
    suite, provider = rng.choice(["tasks", "elo"]), rng.choice(["plain", "stream"])
    kinds = [k for k in KINDS[suite, provider] if k not in ("write", "clock")]
    kill = _kill(rng, rng.choice(kinds), within=0.3)
    worker = rng.choice(["gw0", "gw1"])
    return Scenario(seed, suite, provider, (Kill(kill.kind, kill.fraction, kill.tear, worker),), workers=2)


ALL = [scenario(SEED + i) for i in range(SCENARIOS)]
XDIST = [xdist_scenario(SEED + 1000 + i) for i in range(XDIST_SCENARIOS)]


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory):
    """Uninterrupted runs, one per suite and provider, made when first needed."""
    made: dict[tuple[str, str], tuple[Project, Run]] = {}

    def get(suite: str, provider: str) -> tuple[Project, Run]:
        if (suite, provider) not in made:
            project = Project(tmp_path_factory.mktemp(f"baseline-{suite}-{provider}"), suite, provider)
            run = project.run()
            assert run.returncode == BASELINE_RC[suite], run.output
            assert "INTERNALERROR" not in run.output
            made[suite, provider] = project, run
        return made[suite, provider]

    return get


def check_asks(project: Project, run: Run, committed: set[Key]) -> None:
    """A run asks for nothing committed before it started, and for a rollout
    twice only when it failed retryably (the suites' `flaky` instances)."""
    asked = [key for _, key in run.asked()]
    again = committed & set(asked)
    assert not again, f"asked again for rollouts committed before this run: {sorted(again)}"
    twice = [key for key, n in Counter(asked).items() if n > 1 and not key[2].startswith("flaky")]
    assert not twice, f"asked twice in one run: {twice}"


def journal_content(project: Project) -> dict[str, Any]:
    """What the journals must hold whatever the interruptions: per rollout its
    generation, every failed attempt, the scores, and the ELO stage records
    (run ids and the runs' order of rows aside)."""
    gens: dict[Key, list[Any]] = {}
    scores: Counter[Any] = Counter()
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
    assert not list(project.out.glob("*.tmp")) and not list(project.out.glob(".*.tmp")), (
        "a temporary file left"
    )

    gen_rows = project.gen_rows()
    duplicated = [row for row, n in Counter(gen_rows).items() if n > 1]
    assert not duplicated, f"gen rows duplicated within a run: {duplicated}"
    got, want = journal_content(project), journal_content(baseline)
    twice = {key: len(g) for key, g in got["gens"].items() if len(g) > 1}
    assert not twice, f"rollouts with more than one gen row after resuming: {twice}"
    assert sorted(got["gens"]) == sorted(want["gens"]), "rollouts lost or added"
    assert got["gens"] == want["gens"]
    assert got["failures"] == want["failures"]
    assert got["scores"] == want["scores"]
    assert got["stages"] == want["stages"]


def play(project: Project, sc: Scenario, totals: dict[str, int], ms: int) -> list[str]:
    """Run the scenario's kills, then resume to the end; return what happened, for failure messages."""
    story: list[str] = []
    for n, kill in enumerate(sc.kills):
        committed = project.committed()
        resolved = kill.resolve(totals, ms)
        run = project.run(*(["--resume"] if n else []), kill=resolved, workers=sc.workers if not n else 0)
        story.append(f"run {n} {resolved} -> rc {run.returncode}")
        assert "INTERNALERROR" not in run.output, "\n".join(story) + "\n" + run.output
        if sc.workers:
            assert "crashed" in run.output or "node down" in run.output, run.output  # the worker died
            assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.output
        elif n == 0 and kill.kind != "clock":
            assert run.killed, f"{story}: the kill did not land\n{run.output}"
        else:  # a resume, or a delay, may end before its kill lands
            assert run.killed or run.returncode == BASELINE_RC[sc.suite], "\n".join(story) + "\n" + run.output
        check_asks(project, run, committed)
        if not run.killed and not sc.workers:
            break
    committed = project.committed()
    run = project.run("--resume", workers=sc.workers)
    story.append(f"final --resume -> rc {run.returncode}")
    assert "INTERNALERROR" not in run.output, "\n".join(story) + "\n" + run.output
    assert run.returncode == BASELINE_RC[sc.suite], "\n".join(story) + "\n" + run.output
    check_asks(project, run, committed)
    return story


@pytest.mark.parametrize("sc", ALL + XDIST, ids=str)
def test_killed_and_resumed_ends_as_the_uninterrupted_run(tmp_path: Path, baselines, sc: Scenario) -> None:
    if sc.workers:
        pytest.importorskip("xdist")
    baseline, base_run = baselines(sc.suite, sc.provider)
    totals, ms = base_run.totals()
    project = Project(tmp_path, sc.suite, sc.provider)
    story = play(project, sc, totals, ms)
    try:
        check_final(project, baseline)
    except AssertionError as exc:
        raise AssertionError(f"{sc}: " + "; ".join(story) + f"\n{exc}") from None


def test_the_scenarios_cover_every_kill_kind_of_both_suites_and_providers() -> None:
    first = {(sc.suite, sc.provider, sc.kills[0].kind) for sc in ALL}
    assert first == {(suite, provider, kind) for (suite, provider), kinds in KINDS.items() for kind in kinds}
    assert sum(len(sc.kills) for sc in ALL) >= SCENARIOS
    assert any(len(sc.kills) > 1 for sc in ALL) and any(k.tear for sc in ALL for k in sc.kills)


def test_the_uninterrupted_runs_have_the_failures_the_kills_are_meant_to_cross(baselines) -> None:
    tasks, run = baselines("tasks", "plain")
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
    elo, run = baselines("elo", "stream")
    counts, _ = run.totals()
    assert counts["result"] == 12 and counts["judge"] == 2 * (4 * 3 + 4 * 2 + 4 * 1)
    assert [s["kind"] for s in journal_content(elo)["stages"]].count("complete") == 3
