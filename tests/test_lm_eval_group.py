"""A group of lm-eval tasks as one `EvalTask.from_lm_eval` (docs/lm_eval.md):
one item per (subtask, document), ids `subtask/doc_id`, each task scored by
its own lm-eval code, the group's aggregate by lm-eval's `Group.aggregate`,
side by side with `lm_eval --tasks GROUP` against one stub."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from http_stub import StubServer
from lm_eval_tasks import (
    as_ours,
    lm_eval_results,
    needs_lm_eval,
    run_plugin,
    their_metrics,
    write_arith,
    write_group,
    write_tiny_mc,
)


def write_mc_group(folder: Path) -> None:
    write_tiny_mc(folder, n=10, seed=1, name="tiny_mc_a")
    write_tiny_mc(folder, n=5, seed=3, name="tiny_mc_b")
    write_group(folder, ["tiny_mc_a", "tiny_mc_b"])


@needs_lm_eval
@pytest.mark.slow
def test_a_group_gives_each_subtask_and_lm_evals_aggregate(tmp_path: Path, stub: StubServer) -> None:
    write_mc_group(tmp_path / "tasks")
    done = run_plugin(tmp_path, stub, name="tiny_group")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = orjson.loads((tmp_path / "run" / "tiny_group-metrics.json").read_bytes())
    their_group = their_metrics(tmp_path, "tiny_group", stub)
    results = lm_eval_results(tmp_path / "lm-eval-out")["results"]
    expected = as_ours(their_group)
    for sub in ("tiny_mc_a", "tiny_mc_b"):
        expected.update({f"{sub}/{k}": v for k, v in as_ours(results[sub]).items()})
    assert doc["metrics"] == expected
    # acc weighted by size is the pooled mean; acc_norm unweighted is not (the sizes differ)
    a, b = (as_ours(results[s])["acc_norm"] for s in ("tiny_mc_a", "tiny_mc_b"))
    assert doc["metrics"]["acc_norm"] == pytest.approx((a + b) / 2, abs=1e-15)
    assert doc["lm_eval"]["stderr"]["acc"] == pytest.approx(their_group["acc_stderr,none"], rel=1e-12)
    assert doc["lm_eval"]["group"] == "tiny_group"
    assert doc["lm_eval"]["tasks"] == ["tiny_mc_a", "tiny_mc_b"]
    assert doc["lm_eval"]["higher_is_better"]["tiny_mc_b/acc_norm"] is True


@needs_lm_eval
def test_group_items_are_subtask_slash_doc_and_k_selects_a_subtask(tmp_path: Path, stub: StubServer) -> None:
    write_mc_group(tmp_path / "tasks")
    done = run_plugin(tmp_path, stub, "--collect-only", name="tiny_group")
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    expected = [f"test_lm.py::tiny_group::tiny_mc_a/{i}[s1-r0]" for i in range(10)]
    expected += [f"test_lm.py::tiny_group::tiny_mc_b/{i}[s1-r0]" for i in range(5)]
    assert ids == expected
    done = run_plugin(tmp_path, stub, "--collect-only", "-k", "tiny_mc_b", name="tiny_group")
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert ids == expected[10:], done.stdout + done.stderr
    assert stub.received == 0


@needs_lm_eval
def test_a_group_mixing_output_types_is_a_collection_error(tmp_path: Path, stub: StubServer) -> None:
    write_arith(tmp_path / "tasks", n=3)
    write_tiny_mc(tmp_path / "tasks", n=3)
    write_group(tmp_path / "tasks", ["arith", "tiny_mc"])
    done = run_plugin(tmp_path, stub, "--collect-only", name="tiny_group")
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "lm-eval task 'tiny_group': its tasks mix output types (generate_until, multiple_choice)" in out
    assert "Traceback" not in out and "lm_eval/" not in out, out


@needs_lm_eval
@pytest.mark.slow
def test_a_group_under_xdist_gives_the_serial_runs_metrics(tmp_path: Path, stub: StubServer) -> None:
    write_mc_group(tmp_path / "tasks")
    serial = run_plugin(tmp_path, stub, name="tiny_group")
    assert serial.returncode == 0, serial.stdout[-3000:] + serial.stderr[-3000:]
    asked = stub.received
    spread = run_plugin(
        tmp_path, stub, "-p", "xdist", "-n", "2", "--evalreplay-output=run-n2", name="tiny_group"
    )
    assert spread.returncode == 0, spread.stdout[-3000:] + spread.stderr[-3000:]
    assert "15 passed" in spread.stdout, spread.stdout[-3000:]
    metrics = [
        orjson.loads((tmp_path / d / "tiny_group-metrics.json").read_bytes())["metrics"]
        for d in ("run", "run-n2")
    ]
    assert metrics[0] == metrics[1]
    assert stub.received == 2 * asked  # each document asked once more, by one worker
    rows = [(tmp_path / d / "tiny_group-predictions.jsonl").read_bytes() for d in ("run", "run-n2")]
    assert rows[0] == rows[1] and rows[0].count(b'"doc":{"question":') == 15  # the documents too
