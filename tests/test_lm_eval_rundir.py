"""An lm-eval task's run dir (docs/lm_eval.md, docs/rundir.md): lm-eval's
document in each predictions row, read back by compare, the HTML report and
replay (and older run dirs without it); shards merged into the one run's
numbers; compare and gates on lm-eval's metric names (`exact_match,strict`,
`acc_norm`). Each runs the plugin in a child pytest against the local stub."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from http_stub import StubServer
from lm_eval_tasks import (
    lm_eval_env,
    needs_lm_eval,
    our_metrics,
    provider_args,
    run_plugin,
    write_arith,
    write_group,
    write_tiny_mc,
)
from subprocess_pytest import PYTEST, child_env

from pytest_evalreplay.__main__ import main
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.report.html_data import build
from pytest_evalreplay.rundir.snapshot import load_run_dir


def rows(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@needs_lm_eval
def test_predictions_rows_carry_lm_evals_document_and_the_readers_show_it(
    tmp_path: Path, stub: StubServer
) -> None:
    write_arith(tmp_path / "tasks", n=5)
    done = run_plugin(tmp_path, stub)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    docs = rows(tmp_path / "tasks" / "arith_test.jsonl")
    saved = rows(tmp_path / "run" / "arith-predictions.jsonl")
    assert [r["instance_id"] for r in saved] == [str(i) for i in range(5)]
    assert [r["doc"] for r in saved] == docs
    # the HTML report's sample and compare's flip line show the document, not the few-shot prompt's start
    samples = build(tmp_path / "run")["tasks"][0]["samples"]
    assert [s["doc"] for s in samples] == docs
    prompts = load_run_dir(tmp_path / "run").tasks["arith"].prompts
    assert prompts["3"] == orjson.dumps(docs[3]).decode()
    # replay of it is unchanged by the document (the same numbers, no model asked)
    asked = stub.received
    done = run_plugin(tmp_path, stub, "--evalreplay-predictions=run", "--evalreplay-output=replayed")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        our_metrics(tmp_path, "arith")
        == orjson.loads((tmp_path / "replayed" / "arith-metrics.json").read_bytes())["metrics"]
    )
    assert stub.received == asked
    assert [r["doc"] for r in rows(tmp_path / "replayed" / "arith-predictions.jsonl")] == docs
    # an older run dir (rows without "doc") reads as before: the prompt's first line, no document
    path = tmp_path / "run" / "arith-predictions.jsonl"
    path.write_bytes(
        b"".join(orjson.dumps({k: v for k, v in r.items() if k != "doc"}) + b"\n" for r in saved)
    )
    assert "doc" not in build(tmp_path / "run")["tasks"][0]["samples"][0]
    assert load_run_dir(tmp_path / "run").tasks["arith"].prompts["3"].startswith("Question: ")


TWO_TASKS = """
from pytest_evalreplay import EvalTask, Gate
arith = EvalTask.from_lm_eval("arith", include_path="tasks/"{arith})
{mc} = EvalTask.from_lm_eval("{mc}", include_path="tasks/"{gate})
"""


def run_suite(project: Path, stub: StubServer, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest with the plugin on the project's test_lm.py (as written), against the stub."""
    cmd = [*PYTEST, "-rA", "test_lm.py", *provider_args(stub, args), *args]
    env = child_env(**lm_eval_env(project / "hf"))
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)


def run_dir_files(path: Path) -> dict[str, object]:
    """A run dir's files, metrics.json less what the writing session did."""
    out: dict[str, object] = {}
    for f in sorted(path.iterdir()):
        if f.name.endswith("-metrics.json"):
            out[f.name] = {k: v for k, v in orjson.loads(f.read_bytes()).items() if k != "session"}
        elif f.name.endswith((".jsonl", ".json")) and "journal" not in f.name and "shard" not in f.name:
            out[f.name] = f.read_bytes()
    return out


@needs_lm_eval
@pytest.mark.slow
def test_shards_merged_give_the_one_runs_run_dir_groups_included(tmp_path: Path, stub: StubServer) -> None:
    write_arith(tmp_path / "tasks", n=12)
    write_tiny_mc(tmp_path / "tasks", n=10, seed=1, name="tiny_mc_a")
    write_tiny_mc(tmp_path / "tasks", n=5, seed=3, name="tiny_mc_b")
    write_group(tmp_path / "tasks", ["tiny_mc_a", "tiny_mc_b"])
    (tmp_path / "test_lm.py").write_text(TWO_TASKS.format(arith="", mc="tiny_group", gate=""), "utf-8")
    single = run_suite(tmp_path, stub, "--evalreplay-output=single")
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    asked = stub.received
    for k in (1, 2):
        shard = run_suite(tmp_path, stub, f"--evalreplay-output=s{k}", f"--evalreplay-shard={k}/2")
        assert shard.returncode == 0, shard.stdout[-3000:] + shard.stderr[-3000:]
        assert 0 < shard.stdout.count("PASSED") < 12 + 15
    assert stub.received == 2 * asked  # the shards asked each document once between them
    suite = [*PYTEST[PYTEST.index("pytest") + 1 :], "test_lm.py"]  # as the shards ran it, less their own
    merge = [sys.executable, "-m", "pytest_evalreplay", "merge", "merged", "s1", "s2", "--", *suite]
    env = child_env(**lm_eval_env(tmp_path / "hf"))
    done = subprocess.run(merge, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "merged shards 1/2, 2/2" in done.stdout
    assert stub.received == 2 * asked  # the merge asked nothing
    merged, one = run_dir_files(tmp_path / "merged"), run_dir_files(tmp_path / "single")
    assert merged == one
    group = merged["tiny_group-metrics.json"]
    assert {"acc", "acc_norm", "tiny_mc_a/acc", "tiny_mc_b/acc_norm"} <= set(group["metrics"])  # type: ignore[index]
    assert set(merged["arith-metrics.json"]["metrics"]) == {"exact_match,strict", "exact_match,flexible"}  # type: ignore[index]


@needs_lm_eval
@pytest.mark.slow
def test_compare_and_gates_on_lm_eval_metric_names(
    tmp_path: Path, stub: StubServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run A; then B replays A's answers with every right answer made wrong (a
    strict regex that no longer matches; a multiple-choice gold moved off the
    choice acc_norm picked): both gates fail on a drop against A's baseline,
    and compare names the metrics (commas and all) and the documents."""
    yaml = write_arith(tmp_path / "tasks", n=24)
    write_tiny_mc(tmp_path / "tasks", n=24)
    gates = ', gate=Gate("exact_match,strict", max_drop=0.0)', ', gate=Gate("acc_norm", max_drop=0.0)'
    (tmp_path / "test_lm.py").write_text(
        TWO_TASKS.format(arith=gates[0], mc="tiny_mc", gate=gates[1]), "utf-8"
    )
    a = run_suite(
        tmp_path,
        stub,
        "--evalreplay-output=a",
        "--evalreplay-baseline=base.json",
        "--evalreplay-update-baseline",
    )
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-3000:]
    base = orjson.loads((tmp_path / "base.json").read_bytes())["tasks"]
    assert set(base["arith"]["metrics"]) == {"exact_match,strict", "exact_match,flexible"}
    assert set(base["tiny_mc"]["metrics"]) == {"acc", "acc_norm"}
    right = {iid for iid, s in base["tiny_mc"]["scores"].items() if s == 1.0}
    strict = {
        r["instance_id"]
        for r in rows(tmp_path / "a" / "arith-predictions.jsonl")
        if r["scores"]["exact_match,strict"] == 1.0
    }
    assert len(right) >= 4 and len(strict) >= 4  # enough right answers for a significant drop
    yaml.write_text(yaml.read_text("utf-8").replace('"Answer: (-?[0-9]+)"', '"Answer: (-?[0-9]+)!"'), "utf-8")
    docs = tmp_path / "tasks" / "tiny_mc.jsonl"
    moved = [
        {**d, "gold": (d["gold"] + 1) % len(d["choices"])} if str(i) in right else d
        for i, d in enumerate(rows(docs))
    ]
    docs.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in moved))
    b = run_suite(
        tmp_path,
        stub,
        "--evalreplay-predictions=a",
        "--evalreplay-output=b",
        "--evalreplay-baseline=base.json",
    )
    assert b.returncode == pytest.ExitCode.TESTS_FAILED, b.stdout[-3000:] + b.stderr[-3000:]
    assert "FAILED test_lm.py::arith::gate" in b.stdout and "FAILED test_lm.py::tiny_mc::gate" in b.stdout
    assert f"exact_match,strict dropped {len(strict) / 24:.4f} below the baseline" in b.stdout, b.stdout[
        -3000:
    ]
    assert f"acc_norm dropped {len(right) / 24:.4f} below the baseline" in b.stdout, b.stdout[-3000:]
    ours = orjson.loads((tmp_path / "b" / "tiny_mc-metrics.json").read_bytes())["metrics"]
    assert ours["acc_norm"] == 0.0
    # compare A B: the drops by lm-eval's names, the flipped documents shown by their fields
    code = main(
        [
            "compare",
            str(tmp_path / "a"),
            str(tmp_path / "b"),
            "--top=100",
            "--fail-on-regression",
            "--gated",
            "arith:exact_match,strict",
            "--gated",
            "acc_norm",
        ]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert "regression: arith exact_match,strict: " in out and "regression: tiny_mc acc_norm: " in out, out
    flips = [line.split(maxsplit=3) for line in out.splitlines() if line.startswith(("    - ", "    + "))]
    dropped = {(metric[1:], iid) for sign, iid, metric, _ in flips if sign == "-"}
    assert {iid for metric, iid in dropped if metric == "exact_match,strict"} == strict
    assert {iid for metric, iid in dropped if metric == "acc_norm"} == right
    assert all(rest.split("] ", 1)[1].startswith('{"question":') for *_, rest in flips), out  # the document
    code = main(
        [
            "compare",
            str(tmp_path / "a"),
            str(tmp_path / "b"),
            "--fail-on-regression",
            "--gated",
            "exact_match,flexible",
        ]
    )
    assert code == 0  # the flexible filter's scores did not change


@needs_lm_eval
def test_a_document_is_saved_as_lm_evals_log_samples_writes_it() -> None:
    import json

    import numpy as np
    from lm_eval.utils import handle_non_serializable

    from pytest_evalreplay.lmeval.loading import json_doc

    doc = {
        "n": np.int64(3),
        "x": np.float32(0.5),
        "ok": np.bool_(True),
        "tags": {"a"},
        "raw": b"\x00",
        7: "key",
    }
    logged = json.loads(json.dumps(doc, default=handle_non_serializable, ensure_ascii=False))
    assert (
        json_doc(doc, "task 't', document 0")
        == logged
        == {
            "n": 3,
            "x": 0.5,
            "ok": True,
            "tags": ["a"],
            "raw": "b'\\x00'",
            "7": "key",
        }
    )
    # what orjson cannot write (an int past 64 bits) is kept readable (the rest as before), never an error
    assert json_doc({"big": 2**70, "n": np.int64(1), "x": float("nan")}, "w") == {
        "big": str(2**70),
        "n": 1,
        "x": None,
    }
    assert json_doc({"q": "a\udc80b", "n": np.int64(2)}, "w") == {"q": "a?b", "n": 2}  # a lone surrogate
    saved = json_doc({"big": 2**70}, "w")
    assert orjson.loads(orjson.dumps(saved)) == saved
    cycle: dict = {}
    cycle["self"] = [cycle]
    with pytest.raises(
        EvalReplayError, match=r"^task 't', document 0: its document cannot be saved as JSON \("
    ):
        json_doc(cycle, "task 't', document 0")
