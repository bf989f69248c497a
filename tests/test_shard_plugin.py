"""--evalreplay-shard=K/N in a pytest session: each shard runs its slice of
every task into its own output dir, reports the rest deselected, says which
shard it is, and refuses a dir another shard wrote."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pytest_evalreplay.shard import Shard

CONFTEST = """
from pytest_evalreplay import Generation

class Echo:
    kind, model, batch_size = "echo", "m1", None

    def generate(self, requests):
        return [[Generation(text=f"answer {r.instance_id} {n}") for n in r.rollouts] for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Echo() if kind == "echo" else None
"""

EVALS = """
from pytest_evalreplay import EvalTask, Gate

t = EvalTask(
    "t",
    [{"id": f"q{i}", "gold": f"answer q{i} 0"} for i in range(12)],
    prompt="{id}",
    scorer=lambda text, inst: text == inst["gold"],
    num_samples=2,
    gate=Gate("score", min=0.0),
)
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    return pytester


def run(p: pytest.Pytester, out: str, *args: str) -> pytest.RunResult:
    return p.runpytest("-p", "no:randomly", "--evalreplay-provider=echo", f"--evalreplay-output={out}", *args)


def owned(k: int, n: int) -> set[str]:
    return {f"q{i}[s1-r{r}]" for i in range(12) for r in range(2) if Shard(k, n).owns("t", (1, f"q{i}", r))}


def test_each_shard_runs_its_slice_and_deselects_the_rest(project: pytest.Pytester) -> None:
    result = run(project, "out1", "--evalreplay-shard=1/3", "-v")
    mine = owned(1, 3)
    assert 0 < len(mine) < 24
    result.assert_outcomes(passed=len(mine), deselected=24 - len(mine) + 1)  # the gate waits for the merge
    result.stdout.fnmatch_lines(["*shard: 1/3*", f"*shard 1/3: {len(mine)} of 24 items of t*"])
    ran = {line.split("::")[-1].split()[0] for line in result.outlines if "PASSED" in line}
    assert ran == mine
    doc = orjson.loads((project.path / "out1" / "t-metrics.json").read_bytes())
    assert doc["complete"] is False and doc["num_missing"] == 24 - len(mine)


def test_the_shards_together_run_every_item_once(project: pytest.Pytester) -> None:
    seen = 0
    for k in (1, 2, 3):
        result = run(project, f"out{k}", f"--evalreplay-shard={k}/3")
        seen += result.parseoutcomes().get("passed", 0)
    assert seen == 24


def test_resume_resumes_one_shard(project: pytest.Pytester) -> None:
    mine = len(owned(2, 3))
    run(project, "out2", "--evalreplay-shard=2/3").assert_outcomes(passed=mine, deselected=24 - mine + 1)
    again = run(project, "out2", "--evalreplay-shard=2/3", "--resume")
    assert again.ret == 0
    again.stdout.fnmatch_lines([f"*{mine} reused from the journal*"])


def test_a_dir_written_by_another_shard_is_refused(project: pytest.Pytester) -> None:
    assert run(project, "out", "--evalreplay-shard=1/3").ret == 0
    result = run(project, "out", "--evalreplay-shard=2/3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*holds shard 1/3*pass another --evalreplay-output*"])


@pytest.mark.parametrize("bad", ["0/3", "4/3", "x", "3"])
def test_a_bad_shard_is_a_usage_error(project: pytest.Pytester, bad: str) -> None:
    result = run(project, "out", f"--evalreplay-shard={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--evalreplay-shard (ini evalreplay_shard)*K/N*"])


def test_the_ini_twin(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nevalreplay_shard = 3/3\n")
    result = run(project, "out3")
    result.assert_outcomes(passed=len(owned(3, 3)), deselected=24 - len(owned(3, 3)) + 1)
    assert (Path(project.path) / "out3" / "evalreplay-shard.json").is_file()
