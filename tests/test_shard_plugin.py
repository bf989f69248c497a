"""--evalreplay-shard=K/N in a pytest session: each shard runs its slice of
every task into its own output dir, reports the rest deselected, says which
shard it is, and refuses a dir another shard wrote."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from pytest_evalreplay.values.shard import Shard

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


SUITE = ("--", "-p", "no:randomly")  # the shards' suite arguments (provider, output, shard aside)


def merge(p: pytest.Pytester, out: str, *dirs: str, suite: tuple[str, ...] = SUITE) -> tuple[int, str, str]:
    """The merge command in this process, from the project dir (pytester's
    cwd), with the suite's arguments after -- as a merge job gives them."""
    import contextlib
    import io

    from pytest_evalreplay.__main__ import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        paths = [d if d.startswith("--") else str(p.path / d) for d in dirs]
        code = main(["merge", str(p.path / out), *paths, *suite])
    return code, stdout.getvalue(), stderr.getvalue()


def run_dir(path: Path) -> dict[str, object]:
    """The run dir files (metrics.json less what the writing session did)."""
    out: dict[str, object] = {}
    for f in sorted(path.iterdir()):
        if f.name.endswith("-metrics.json"):
            out[f.name] = {k: v for k, v in orjson.loads(f.read_bytes()).items() if k != "session"}
        elif (
            f.suffix in (".jsonl", ".json") and "journal" not in f.name and f.name != "evalreplay-shard.json"
        ):
            out[f.name] = f.read_bytes()
    return out


def test_the_merge_writes_the_single_run_dir(project: pytest.Pytester) -> None:
    assert run(project, "single").ret == 0
    for k in (1, 2, 3):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/3").ret == 0
    code, out, err = merge(project, "merged", "s3", "s1", "s2")
    assert code == 0, err
    assert "merged shards 1/3, 2/3, 3/3" in out
    # The merge ran the suite with the shards' arguments: nothing generated, the gate judged.
    assert "1 passed, 24 deselected" in out
    assert run_dir(project.path / "merged") == run_dir(project.path / "single")
    # --resume into it still works (nothing left: no provider needed).
    result = project.runpytest("-p", "no:randomly", "--resume", "--evalreplay-output=merged")
    result.assert_outcomes(passed=1, deselected=24)
    assert run_dir(project.path / "merged") == run_dir(project.path / "single")


def test_the_merge_keeps_the_shards_scores_unless_told_to_rescore(project: pytest.Pytester) -> None:
    for k in (1, 2, 3):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/3").ret == 0
    project.makepyfile(test_evals=EVALS.replace('text == inst["gold"]', "False"))  # the scorer changed since
    code, out, err = merge(project, "kept", "s1", "s2", "s3")
    assert code == 0, err
    assert "keeping the shards' scores" in out
    kept = orjson.loads((project.path / "kept" / "t-metrics.json").read_bytes())
    assert kept["metrics"]["score"] == 0.5  # the shards' scores: rollout 0 of each instance right
    sys.modules.pop("test_evals", None)  # the merge imported the suite in-process (pytester drops it after)
    code, out, err = merge(project, "rescored", "s1", "s2", "s3", "--rescore")
    assert code == 0, err
    assert "scoring every rollout again" in out
    rescored = orjson.loads((project.path / "rescored" / "t-metrics.json").read_bytes())
    assert rescored["metrics"]["score"] == 0.0


def test_a_missing_shard_is_refused_unless_allowed(project: pytest.Pytester) -> None:
    for k in (1, 3):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/3").ret == 0
    code, out, err = merge(project, "merged", "s1", "s3")
    assert code == 2 and out == ""
    assert "shard 2/3 is missing (given: 1/3, 3/3)" in err and "--allow-missing" in err
    assert not (project.path / "merged").exists()
    code, out, err = merge(project, "merged", "s1", "s3", "--allow-missing")
    assert code == 0, err
    assert "shard 2/3 is missing" in out
    mine = len(owned(2, 3))
    doc = orjson.loads((project.path / "merged" / "t-metrics.json").read_bytes())
    assert doc["complete"] is False and doc["num_missing"] == mine and doc["num_items"] == 24
    # With the provider, --resume generates exactly the missing shard's items.
    result = run(project, "merged", "--resume")
    result.assert_outcomes(passed=mine + 1, deselected=24 - mine)
    assert orjson.loads((project.path / "merged" / "t-metrics.json").read_bytes())["complete"] is True


def test_no_generate_writes_the_run_dir_without_generating(project: pytest.Pytester) -> None:
    assert run(project, "s1", "--evalreplay-shard=1/3").ret == 0
    result = project.runpytest("-p", "no:randomly", "--evalreplay-no-generate", "--evalreplay-output=s1")
    mine = len(owned(1, 3))
    result.assert_outcomes(deselected=25)  # the gate too: its task has missing rollouts
    result.stdout.fnmatch_lines(
        [f"*{24 - mine} items of t need generating (deselected: --evalreplay-no-generate)*"]
    )
    doc = orjson.loads((project.path / "s1" / "t-metrics.json").read_bytes())
    assert doc["complete"] is False and doc["num_missing"] == 24 - mine


def test_a_merged_dir_replays(project: pytest.Pytester) -> None:
    for k in (1, 2):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/2").ret == 0
    assert merge(project, "merged", "s1", "s2")[0] == 0
    replay = project.runpytest(
        "-p", "no:randomly", "--evalreplay-predictions=merged", "--evalreplay-output=re"
    )
    replay.assert_outcomes(passed=1, deselected=24)
    replayed, merged = (
        orjson.loads((project.path / d / "t-metrics.json").read_bytes()) for d in ("re", "merged")
    )
    assert replayed["metrics"] == merged["metrics"] and replayed["num_items"] == merged["num_items"] == 24


def test_the_merge_refuses_a_shard_given_twice(project: pytest.Pytester) -> None:
    assert run(project, "s1", "--evalreplay-shard=1/2").ret == 0
    code, _, err = merge(project, "merged", "s1", "s1")
    assert code == 2 and "s1 is given twice" in err
    import shutil

    shutil.copytree(project.path / "s1", project.path / "s1b")
    code, _, err = merge(project, "merged", "s1", "s1b")
    assert code == 2 and "shard 1/2 is given twice" in err and "/s1b" in err


def test_the_merge_refuses_shards_of_different_configurations(project: pytest.Pytester) -> None:
    assert run(project, "s1", "--evalreplay-shard=1/2").ret == 0
    project.makepyfile(test_evals=EVALS.replace('prompt="{id}"', 'prompt="Q: {id}"'))
    assert run(project, "s2", "--evalreplay-shard=2/2").ret == 0
    code, _, err = merge(project, "merged", "s1", "s2")
    assert code == 2
    assert "s1 and" in err and "s2 are shards of different configurations: task 't'" in err
    assert "requests" in err


def test_a_dir_that_is_no_shard_is_refused(project: pytest.Pytester) -> None:
    assert run(project, "plain").ret == 0
    code, _, err = merge(project, "merged", "plain")
    assert code == 2 and "is not a shard dir (no evalreplay-shard.json)" in err


def test_merging_is_independent_of_the_order_of_the_dirs(project: pytest.Pytester) -> None:
    for k in (1, 2, 3):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/3").ret == 0
    assert merge(project, "a", "s1", "s2", "s3")[0] == 0
    assert merge(project, "b", "s3", "s2", "s1")[0] == 0
    j = "t-journal.jsonl"
    assert (project.path / "a" / j).read_bytes() == (project.path / "b" / j).read_bytes()


@pytest.mark.slow
def test_a_shard_under_xdist_runs_the_same_slice(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess(
        "-p",
        "no:randomly",
        "-n",
        "2",
        "--evalreplay-provider=echo",
        "--evalreplay-output=out1",
        "--evalreplay-shard=1/3",
    )
    mine = owned(1, 3)
    result.assert_outcomes(passed=len(mine))
    doc = orjson.loads((project.path / "out1" / "t-metrics.json").read_bytes())
    assert doc["num_missing"] == 24 - len(mine)


def edit_marker(p: pytest.Pytester, k: int, edit: Callable[[dict], object]) -> Path:
    marker = p.path / f"s{k}" / "evalreplay-shard.json"
    doc = orjson.loads(marker.read_bytes())
    edit(doc)
    marker.write_bytes(orjson.dumps(doc))
    return marker


def test_a_marker_without_the_suite_it_ran_is_refused(project: pytest.Pytester) -> None:
    for k in (1, 2):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/2").ret == 0
    marker = edit_marker(project, 2, lambda doc: doc.pop("suite"))
    code, _, err = merge(project, "merged", "s1", "s2")
    assert code == 2 and f"{marker}: shard 2/2's marker does not record the suite it ran" in err
    assert not (project.path / "merged").exists()


def test_the_merge_runs_the_suite_here_with_the_arguments_after_the_dashes(
    project: pytest.Pytester,
) -> None:
    for k in (1, 2):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/2").ret == 0
        doc = orjson.loads((project.path / f"s{k}" / "evalreplay-shard.json").read_bytes())
        # What identifies the suite: its arguments less the shard's own, provider, output and terminal ones.
        assert doc["suite"] == {"args": ["-p", "no:randomly"], "start": ".", "config": None}
    # Without --: pytest with no arguments, which the shards did not run.
    code, out, err = merge(project, "merged", "s1", "s2", suite=())
    marker = project.path / "s1" / "evalreplay-shard.json"
    assert code == 2 and out == ""
    assert f"{marker}: shard 1/2 ran the suite with the arguments '-p no:randomly'" in err
    assert "and this merge runs it with none" in err and "after --" in err
    assert not (project.path / "merged").exists()
    # Provider, report and terminal options may differ; the merge says what it runs, and where.
    code, out, err = merge(
        project, "merged", "s1", "s2", suite=("--", "-p", "no:randomly", "-q", "--evalreplay-report=r.md")
    )
    assert code == 0, err
    assert f"writing the run dir: pytest -p no:randomly -q --evalreplay-report=r.md in {project.path}" in out
    assert (project.path / "r.md").is_file()


ELSEWHERE_CONFTEST = """
import pathlib
pathlib.Path(__file__).with_name("imported").write_text("the merge imported this conftest")
"""


def test_a_hand_edited_marker_is_refused_never_run(
    project: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The attack of issue 30: a marker edited to run the suite from another
    folder (its conftest imported) and to write a report outside OUT."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "conftest.py").write_text(ELSEWHERE_CONFTEST)
    report = elsewhere / "stolen.md"
    for k in (1, 2):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/2").ret == 0

    def attack(doc: dict) -> None:
        doc["suite"]["dir"] = str(elsewhere)
        doc["suite"]["args"].append(f"--evalreplay-report={report}")

    for k in (1, 2):
        edit_marker(project, k, attack)
    code, out, err = merge(project, "merged", "s1", "s2", suite=())
    assert code == 2, out + err
    assert str(project.path / "s1" / "evalreplay-shard.json") in err
    assert f"--evalreplay-report={report}" in err and "edited" in err
    assert not (elsewhere / "imported").exists() and not report.exists()
    assert not (project.path / "merged").exists()
    # Given the arguments the marker asks for, the merge still refuses: no shard records them.
    code, _, err = merge(
        project, "merged", "s1", "s2", suite=("--", "-p", "no:randomly", f"--evalreplay-report={report}")
    )
    assert (
        code == 2 and "edited" in err and f"{project.path / 's1' / 'evalreplay-shard.json'}: shard 1/2" in err
    )
    assert not (elsewhere / "imported").exists() and not report.exists()


def test_shards_started_elsewhere_in_the_checkout_are_refused(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.makeini("[pytest]\n")
    for k in (1, 2):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/2").ret == 0
    marker = edit_marker(project, 2, lambda doc: doc["suite"].update(start="sub"))
    code, _, err = merge(project, "merged", "s1", "s2")
    assert code == 2
    assert f"{marker}: shard 2/2 was started in 'sub' of its rootdir, and this merge in '.'" in err
    assert not (project.path / "merged").exists()
    # Run from a subdir of the rootdir, every shard disagrees.
    monkeypatch.chdir(project.mkdir("other"))
    code, _, err = merge(project, "merged", "s1", "s2")
    assert code == 2 and "shard 1/2 was started in '.' of its rootdir, and this merge in 'other'" in err


def test_a_configuration_file_changed_since_the_shards_is_refused(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nmarkers = a\n")
    for k in (1, 2):
        assert run(project, f"s{k}", f"--evalreplay-shard={k}/2").ret == 0
        doc = orjson.loads((project.path / f"s{k}" / "evalreplay-shard.json").read_bytes())
        assert doc["suite"]["config"]["file"] == "tox.ini"
    project.makeini("[pytest]\nmarkers = b\n")
    code, _, err = merge(project, "merged", "s1", "s2")
    marker = project.path / "s1" / "evalreplay-shard.json"
    assert code == 2
    assert f"{marker}: shard 1/2 ran with the configuration file tox.ini" in err and "content differs" in err
    assert not (project.path / "merged").exists()
    project.makeini("[pytest]\nmarkers = a\n")
    code, _, err = merge(project, "merged", "s1", "s2")
    assert code == 0, err


def test_shards_that_ran_different_suites_are_refused(project: pytest.Pytester) -> None:
    assert run(project, "s1", "--evalreplay-shard=1/2").ret == 0
    assert run(project, "s2", "--evalreplay-shard=2/2", "-k", "q1").ret == 0
    code, _, err = merge(project, "merged", "s1", "s2")
    marker = project.path / "s2" / "evalreplay-shard.json"
    assert code == 2 and f"{marker}: shard 2/2 ran the suite with the arguments '-p no:randomly -k q1'" in err
