"""A suite with a plain task and a 2-stage EloEval run as 3 shards in 3
processes (separate output dirs), stage by stage with a merge between, ends
as one single-process run of the same seed: the same run dir files, the same
plan and rating; also with a shard SIGKILLed and resumed before its merge."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from elo_project import Project
from subprocess_pytest import PYTEST, child_env

PLAIN = """
from pytest_evalreplay import EvalTask, Gate

plain = EvalTask(
    "plain",
    [{"id": f"p{n:03d}", "gold": f"gold {n}"} for n in range(12)],
    prompt="P: {id}",
    scorer=lambda text, inst: text == inst["gold"],
    num_samples=2,
    gate=Gate("score", min=0.1),
)
"""
STAGES = "[Stage(tasks=6), Stage(tasks=6, references=1)]"
N = 3


@pytest.fixture
def project(tmp_path: Path) -> Project:
    p = Project(tmp_path / "p", stages=STAGES, seed="7", gate="Gate('elo', min=800)")
    (p.path / "test_plain.py").write_text(PLAIN)
    return p


def run(p: Project, out: Path, *args: str, **env: str) -> int:
    result = p.run(f"--evalreplay-output={out}", *args, **env)
    assert result.returncode in (0, -signal.SIGKILL), result.stdout + result.stderr
    return result.returncode


def merge(p: Project, out: Path, dirs: list[Path]) -> subprocess.CompletedProcess[str]:
    """The merge command, as a merge job runs it: from the project dir the
    shards started in, with the shards' suite arguments after -- (PYTEST's
    plugins; Project.run adds only provider, output, shard, resume and terminal options)."""
    suite = PYTEST[PYTEST.index("pytest") + 1 :]
    cmd = [sys.executable, "-m", "pytest_evalreplay", "merge", str(out), *map(str, dirs), "--", *suite]
    logs = {
        name: str(p.path / f"{name.lower()}.jsonl") for name in ("CALL_LOG", "JUDGE_LOG", "JUDGE_MODEL_LOG")
    }
    env = child_env(("KILL_", "INTERRUPT_", "JUDGE_"), **logs)  # the judge's log, as Project.run sets it
    result = subprocess.run(cmd, cwd=p.path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def run_dir(path: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in sorted(path.iterdir()):
        if f.name.endswith("-metrics.json"):
            out[f.name] = {k: v for k, v in orjson.loads(f.read_bytes()).items() if k != "session"}
        elif f.name.endswith((".jsonl", ".json")) and "journal" not in f.name and "shard" not in f.name:
            out[f.name] = f.read_bytes()
    return out


def sharded(p: Project, kill: int | None = None) -> Path:
    """Stage 1 on every shard, a merge; stage 2 on every shard from a copy of
    the merged dir, a merge; --resume on the last merge writes the run dir."""
    base = p.path / ("killed" if kill else "sharded")
    merged: Path | None = None
    for stage in (1, 2):
        dirs = []
        for k in range(1, N + 1):
            out = base / f"stage{stage}-shard{k}"
            if merged is not None:
                shutil.copytree(merged, out)
            args = [f"--evalreplay-shard={k}/{N}", *(["--resume"] if merged is not None else [])]
            if kill == k and stage == 1:
                assert run(p, out, *args, KILL_AT_JUDGE="4") == -signal.SIGKILL
                args = [*args, "--resume"]
            assert run(p, out, *args) == 0
            dirs.append(out)
        merged = base / f"merged{stage}"
        merge(p, merged, dirs)  # the last one completes stage 2, writes the run dir, judges the gates
    assert merged is not None
    return merged


def test_a_sharded_elo_eval_needs_a_seed(pytester: pytest.Pytester) -> None:
    p = Project(pytester, at="p", stages=STAGES, seed="None")
    result = p.run("--evalreplay-shard=1/2")
    assert result.returncode == pytest.ExitCode.INTERRUPTED
    assert "--evalreplay-shard=1/2 would draw its own: give it EloEval(seed=...)" in result.stdout


@pytest.mark.slow
def test_three_shards_end_as_one_process_would(project: Project) -> None:
    single = project.path / "single"
    assert run(project, single) == 0
    merged = sharded(project)
    assert run_dir(merged) == run_dir(single)
    elo = orjson.loads((merged / "memo-metrics.json").read_bytes())["elo"]
    assert [s["complete"] for s in elo["stages"]] == [True, True]
    assert len(elo["stages"][1]["references"]) == 1


@pytest.mark.slow
def test_a_shard_killed_and_resumed_merges_the_same(project: Project) -> None:
    single = project.path / "single"
    assert run(project, single) == 0
    assert run_dir(sharded(project, kill=2)) == run_dir(single)
