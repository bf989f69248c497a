"""The same lm-eval multiple-choice task on the real vLLM engine (the
plugin's vllm provider, CPU build) and with lm-eval's own `hf` model, on the
same tiny random Llama weights (tests/llm_fixtures.py): acc and acc_norm
equal within 1e-4, and every choice's log-likelihood close (docs/lm_eval.md).
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
from lm_eval_tasks import MODULE, lm_eval_env, lm_eval_results, write_tiny_mc
from subprocess_pytest import PYTEST, child_env

MISSING = [m for m in ("vllm", "torch", "transformers", "accelerate", "lm_eval") if find_spec(m) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"not installed here: {', '.join(MISSING)}"),
]


def hf_samples(out: Path) -> dict[int, list[float]]:
    """Each document's per-choice log-likelihoods from lm-eval's samples file."""
    (path,) = sorted(out.rglob("samples_tiny_mc_*.jsonl"))
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        found[row["doc_id"]] = [float(r[0][0]) for r in row["resps"]]
    return found


def test_mc_on_vllm_equals_lm_evals_hf_model_on_the_same_weights(
    tmp_path: Path, tiny_llama: Path, vllm_options: list[str]
) -> None:
    write_tiny_mc(tmp_path / "tasks", n=16)
    (tmp_path / "test_lm.py").write_text(MODULE.format(name="tiny_mc", extra=""), encoding="utf-8")
    env = child_env(**lm_eval_env(tmp_path / "hf"))
    done = subprocess.run(
        [*PYTEST, "-q", "test_lm.py", *vllm_options, "--evalreplay-output=run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ours = orjson.loads((tmp_path / "run" / "tiny_mc-metrics.json").read_bytes())["metrics"]

    hf = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={tiny_llama},dtype=float32",
        "--device",
        "cpu",
        "--tasks",
        "tiny_mc",
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
    results = lm_eval_results(tmp_path / "hf-out")["results"]["tiny_mc"]
    assert set(ours) == {"acc", "acc_norm"}
    assert ours["acc"] == pytest.approx(results["acc,none"], abs=1e-4)
    assert ours["acc_norm"] == pytest.approx(results["acc_norm,none"], abs=1e-4)

    # the numbers under the accuracies: each choice's log-likelihood, engine against transformers
    rows = [
        orjson.loads(line)
        for line in (tmp_path / "run" / "tiny_mc-predictions.jsonl").read_bytes().splitlines()
    ]
    lls = {int(r["instance_id"]): [ll for ll, _ in r["generations"][0]["loglikelihoods"]] for r in rows}
    expected = hf_samples(tmp_path / "hf-out")
    assert set(lls) == set(expected)
    for doc_id, values in lls.items():
        assert values == pytest.approx(expected[doc_id], abs=1e-3), doc_id
