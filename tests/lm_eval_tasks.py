"""lm-evaluation-harness tasks over local files, for the side-by-side tests
and the benchmark: each writes its YAML and JSONL into a folder (no hub).

- `arith` (generate_until): "Question: a+b\\nAnswer:" with two few-shot
  examples from a train split, stop at a blank line, and two regex filters
  (`strict`: the first "Answer: N"; `flexible`: the last number).
- `tiny_mc` (multiple_choice): a question and 3-4 choices, gold index.
- `tiny_ppl` (loglikelihood_rolling): word and byte perplexity, bits per byte.
- a group (`write_group`) of tasks written beside it, with an aggregate.

The second half runs the plugin on a one-task test module in a child pytest
(`run_plugin`) and reads either side's metrics.

Run lm-eval on them with `lm_eval_command` (HF_DATASETS_OFFLINE=1 and
HF_HUB_OFFLINE=1 set by `lm_eval_env`).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

import orjson
import pytest
from http_stub import StubServer
from subprocess_pytest import PYTEST, child_env

NEEDS = "lm-evaluation-harness is not installed (pip install 'pytest-evalreplay[lm-eval]')"
needs_lm_eval = pytest.mark.skipif(find_spec("lm_eval") is None, reason=NEEDS)

ARITH = """task: arith
dataset_path: json
dataset_kwargs:
  data_files:
    train: {train}
    test: {test}
training_split: train
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
num_fewshot: 2
generation_kwargs:
  until: ["\\n\\n", "Question:"]
  max_gen_toks: 32
  do_sample: false
  temperature: 0.0
filter_list:
  - name: strict
    filter:
      - function: regex
        regex_pattern: "Answer: (-?[0-9]+)"
      - function: take_first
  - name: flexible
    filter:
      - function: regex
        regex_pattern: "(-?[0-9]+)"
        group_select: -1
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""

TINY_MC = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {test}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""

TINY_PPL = """task: tiny_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {test}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
"""

GROUP = """group: {name}
task:
{tasks}aggregate_metric_list:
  - metric: acc
    aggregation: mean
    weight_by_size: true
  - metric: acc_norm
    aggregation: mean
    weight_by_size: false
"""

WORDS = "red green blue apple river stone cloud seven quick lazy bright narrow".split()  # noqa: SIM905


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_arith(folder: Path, n: int = 12, seed: int = 0) -> Path:
    """The generate_until task; returns its YAML."""
    rng = random.Random(seed)

    def rows(count: int) -> list[dict]:
        out = []
        for _ in range(count):
            a, b = rng.randint(0, 3), rng.randint(0, 3)
            out.append({"question": f"{a}+{b}", "answer": str(a + b)})
        return out

    folder.mkdir(parents=True, exist_ok=True)
    train = _jsonl(folder / "arith_train.jsonl", rows(20))
    test = _jsonl(folder / "arith_test.jsonl", rows(n))
    yaml = folder / "arith.yaml"
    yaml.write_text(ARITH.format(train=train, test=test), encoding="utf-8")
    return yaml


def write_tiny_mc(folder: Path, n: int = 16, seed: int = 1, name: str = "tiny_mc") -> Path:
    """The multiple_choice task; returns its YAML."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        k = rng.choice([3, 4])
        choices = rng.sample(WORDS, k)
        if i % 5 == 0:
            choices[0] = choices[0] + " " + rng.choice(WORDS)  # a longer choice: acc_norm differs
        rows.append({"question": f"Which word {i}?", "choices": choices, "gold": rng.randrange(k)})
    folder.mkdir(parents=True, exist_ok=True)
    test = _jsonl(folder / f"{name}.jsonl", rows)
    yaml = folder / f"{name}.yaml"
    yaml.write_text(TINY_MC.format(test=test, name=name), encoding="utf-8")
    return yaml


def write_group(folder: Path, tasks: Sequence[str], name: str = "tiny_group") -> Path:
    """A group of tasks written beside it, aggregating acc weighted by size
    and acc_norm unweighted; returns its YAML."""
    yaml = folder / f"{name}.yaml"
    listed = "".join(f"  - {t}\n" for t in tasks)
    yaml.write_text(GROUP.format(name=name, tasks=listed), encoding="utf-8")
    return yaml


def write_tiny_ppl(folder: Path, n: int = 10, seed: int = 2, words: tuple[int, int] = (3, 12)) -> Path:
    """The loglikelihood_rolling task (lm-eval's default metrics: word and
    byte perplexity, bits per byte), texts of `words` words (bounds
    included); returns its YAML."""
    rng = random.Random(seed)
    rows = [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(*words)))} for _ in range(n)]
    folder.mkdir(parents=True, exist_ok=True)
    test = _jsonl(folder / "tiny_ppl.jsonl", rows)
    yaml = folder / "tiny_ppl.yaml"
    yaml.write_text(TINY_PPL.format(test=test), encoding="utf-8")
    return yaml


def lm_eval_env(hf_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_ADDOPTS", "PYTEST_XDIST_"))}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(hf_home), OPENAI_API_KEY="x")
    return env


def lm_eval_command(
    task: str,
    include: Path,
    out: Path,
    base_url: str,
    model: str = "local-completions",
    extra: str = "",
    flags: Sequence[str] = (),
) -> list[str]:
    """`lm_eval` against an OpenAI-compatible server at `base_url` (ending in /v1)."""
    endpoint = "/chat/completions" if "chat" in model else "/completions"
    args = f"model=stub-model,base_url={base_url}{endpoint},num_concurrent=4,max_retries=1"
    args += ",tokenizer_backend=remote" if task != "arith" else ",tokenizer_backend=none"
    return [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        model,
        "--model_args",
        args + extra,
        "--tasks",
        task,
        "--include_path",
        str(include),
        "--output_path",
        str(out),
        "--log_samples",
        *flags,
    ]


def lm_eval_results(out: Path) -> dict:
    """The results JSON lm-eval wrote under `out`."""
    found = sorted(out.rglob("results_*.json"))
    assert found, f"lm-eval wrote no results under {out}"
    return json.loads(found[-1].read_text(encoding="utf-8"))


# -- the plugin's side: a test module with one from_lm_eval task, run in a child pytest --

MODULE = """
from pytest_evalreplay import EvalTask
{name} = EvalTask.from_lm_eval("{name}", include_path="tasks/"{extra})
"""


def run_plugin(
    project: Path,
    stub: StubServer,
    *args: str,
    name: str = "arith",
    extra: str = "",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """pytest with the plugin on `project`'s test module, against the stub."""
    (project / "test_lm.py").write_text(MODULE.format(name=name, extra=extra), encoding="utf-8")
    cmd = [
        *PYTEST,
        "-q",
        "test_lm.py",
        *provider_args(stub, args),
        *args,
    ]
    env = child_env(**{**lm_eval_env(project / "hf"), **(env or {})})
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)


def provider_args(stub: StubServer, args: tuple[str, ...]) -> list[str]:
    """The stub as the provider, unless the run replays (`--evalreplay-predictions`)."""
    out = [] if any(a.startswith("--evalreplay-output") for a in args) else ["--evalreplay-output=run"]
    if any(a.startswith("--evalreplay-predictions") for a in args):
        return out
    return [
        *out,
        "--evalreplay-provider=openai",
        "--evalreplay-model=stub-model",
        f"--evalreplay-base-url={stub.url}",
    ]


def our_metrics(project: Path, task: str) -> dict[str, float]:
    return orjson.loads((project / "run" / f"{task}-metrics.json").read_bytes())["metrics"]


def their_metrics(
    project: Path,
    task: str,
    stub: StubServer,
    model: str = "local-completions",
    flags: Sequence[str] = (),
    extra: str = "",
) -> dict:
    """lm-eval's results for `task` against the stub (`extra`: more `,key=value` model args)."""
    cmd = lm_eval_command(task, project / "tasks", project / "lm-eval-out", stub.url, model, extra, flags)
    done = subprocess.run(cmd, env=lm_eval_env(project / "hf"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return lm_eval_results(project / "lm-eval-out")["results"][task]


def as_ours(results: dict) -> dict[str, float]:
    """lm-eval's `metric,filter` keys as the plugin names them (`none` dropped), stderrs left out."""
    out = {}
    for key, value in results.items():
        if "," not in key or "_stderr," in key:
            continue
        metric, filt = key.split(",", 1)
        out[metric if filt == "none" else key] = value
    return out
