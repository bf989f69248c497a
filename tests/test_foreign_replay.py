"""Replay of saves written by the other harnesses themselves (tests/data):
lm-evaluation-harness multiple choice and an inspect_ai `.eval` log, read
into the index as they are, and rescored to exactly the numbers those
harnesses printed; olmo-eval's loglikelihood saves in both of its layouts."""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import sys
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest

from pytest_evalreplay import EvalTask, ReplayProvider
from pytest_evalreplay.formats import inspect_ai, lm_eval, load, olmo_eval
from pytest_evalreplay.model import EvalReplayError

DATA = Path(__file__).parent / "data"
LM_DIR = DATA / "lm_eval_mc"
LM_OUT = LM_DIR / "out" / "__tmp__fx__tiny"
LM_SAMPLES = LM_OUT / "samples_tiny_mc_2026-12-01T21-31-43.685009.jsonl"
LM_RESULTS = LM_OUT / "results_2026-12-01T21-31-43.685009.json"
LM_DATA = LM_DIR / "task" / "tiny_mc.jsonl"
INSPECT_DIR = DATA / "inspect_eval"
INSPECT_LOG = INSPECT_DIR / "2026-12-01T21-32-43-00-00_tiny-qa_8qG3L8ds67rMVTrcVZChB2.eval"
INSPECT_DEFLATE = INSPECT_DIR / "deflate" / "tiny_qa-deflate.eval"
# tests/data/inspect_eval/tiny_qa.py's dataset
INSPECT_QUESTIONS = [
    ("q1", "What is two plus two?", "four"),
    ("q2", "Which animal jumps over the lazy dog?", "dog"),
    ("q3", "Name a prime number.", "seven"),
    ("q4", "What does pytest collect?", "pytest"),
    ("q5", "What colour is the fox?", "brown"),
    ("q6", "Is seven a prime number?", "seven"),
]
ZSTD_READABLE = sys.version_info >= (3, 14) or importlib.util.find_spec("zstandard") is not None


def lm_results() -> dict[str, float]:
    return json.loads(LM_RESULTS.read_text())["results"]["tiny_mc"]


def lm_eval_metrics(rows: list[tuple[list[float], list[str], int]]) -> dict[str, float]:
    """acc and acc_norm as lm-eval's process_results computes them: argmax of
    the log-likelihoods, and of each divided by the choice's length in characters."""
    acc = norm = 0.0
    for lls, choices, gold in rows:
        acc += max(range(len(lls)), key=lambda i: lls[i]) == gold
        norm += max(range(len(lls)), key=lambda i: lls[i] / len(choices[i])) == gold
    return {"acc": acc / len(rows), "acc_norm": norm / len(rows)}


def needs_choices() -> None:
    if "choices" not in inspect.signature(EvalTask).parameters:
        pytest.skip("EvalTask(choices=...) and the replay of loglikelihood saves come with branch mc")


# -- lm-evaluation-harness ---------------------------------------------------


def test_lm_eval_multiple_choice_samples_are_read_as_loglikelihood_saves() -> None:
    index = load(LM_SAMPLES)
    assert index.model == "/tmp/fx/tiny" and index.skipped == 0 and len(index) == 16
    data = [json.loads(line) for line in LM_DATA.read_text().splitlines()]
    saved = [json.loads(line) for line in LM_SAMPLES.read_text().splitlines()]
    rows = []
    for doc, sample in zip(data, saved, strict=True):
        (row,) = index.rows((f"Question: {doc['question']}\nAnswer:", None))
        assert row.instance_id == str(sample["doc_id"]) and row.rollouts == (0,)
        assert row.continuations == tuple(" " + c for c in doc["choices"])
        (generation,) = row.generations
        assert generation.text == ""
        # lm-eval 0.4.13 logs [loglikelihood, is_greedy] as strings; read back to the bit
        assert generation.loglikelihoods == tuple(
            (float(ll), greedy == "True") for ((ll, greedy),) in sample["resps"]
        )
        rows.append(([ll for ll, _ in generation.loglikelihoods], doc["choices"], doc["gold"]))
    expected = lm_results()
    assert lm_eval_metrics(rows) == {"acc": expected["acc,none"], "acc_norm": expected["acc_norm,none"]}


def test_lm_eval_instances_give_the_continuations() -> None:
    found = lm_eval.instances(LM_SAMPLES)
    assert len(found) == 16
    assert found[0]["prompt"] == "Question: What is two plus two?\nAnswer:"
    assert found[0]["continuations"] == [" three", " four", " five", " six"]
    assert found[0]["target"] == "1"


def lm_task() -> EvalTask:
    """The EvalTask twin of tests/data/lm_eval_mc/task/tiny_mc.yaml."""
    return EvalTask(
        "tiny_mc",
        LM_DATA,
        prompt="Question: {question}\nAnswer:",
        choices="choices",
        target="gold",
    )


def test_lm_eval_run_rescored_to_lm_evals_own_acc_and_acc_norm() -> None:
    needs_choices()
    result = lm_task().evaluate(ReplayProvider.from_path(LM_SAMPLES))
    assert result.errors == {}
    expected = lm_results()
    assert result.metrics["acc"] == expected["acc,none"]
    assert result.metrics["acc_norm"] == expected["acc_norm,none"]


LM_EVALS = f"""
from pytest_evalreplay import EvalTask

tiny_mc = EvalTask("tiny_mc", {str(LM_DATA)!r}, prompt="Question: {{question}}\\nAnswer:",
                   choices="choices", target="gold")
"""


@pytest.mark.parametrize("path", [LM_SAMPLES, LM_DIR / "out"], ids=["samples_file", "output_path"])
def test_lm_eval_run_rescored_under_pytest(pytester: pytest.Pytester, path: Path) -> None:
    needs_choices()
    pytester.makepyfile(test_evals=LM_EVALS)
    result = pytester.runpytest(
        f"--evalreplay-predictions={path}", "--evalreplay-output=out", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(deselected=16)
    doc = orjson.loads((pytester.path / "out" / "tiny_mc-metrics.json").read_bytes())
    expected = lm_results()
    assert doc["metrics"]["acc"] == expected["acc,none"]
    assert doc["metrics"]["acc_norm"] == expected["acc_norm,none"]
    assert doc["model"] == "/tmp/fx/tiny"


# -- inspect_ai ----------------------------------------------------------------


def inspect_header(path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(path) as archive:
        return orjson.loads(archive.read("header.json"))


def inspect_scores(path: Path) -> dict[str, float]:
    """Each sample's `includes` score as inspect wrote it (C: 1, I: 0)."""
    with zipfile.ZipFile(path) as archive:
        samples = [
            orjson.loads(archive.read(name)) for name in archive.namelist() if name.startswith("samples/")
        ]
    return {s["id"]: float(s["scores"]["includes"]["value"] == "C") for s in samples}


def test_inspect_log_samples_are_read_as_chat_generations() -> None:
    index = load(INSPECT_DEFLATE)
    assert index.model == "openai-api/stub/tiny" and index.skipped == 0
    for iid, question, _ in INSPECT_QUESTIONS:
        user = [{"role": "user", "content": question}]
        system = [{"role": "system", "content": "Answer briefly."}]
        # matched with the system message as system_prompt, or inside the messages
        for prompt in ((user, "Answer briefly."), (system + user, None)):
            (row,) = index.rows((orjson.dumps(prompt[0], option=orjson.OPT_SORT_KEYS), prompt[1]))
            assert row.instance_id == iid and row.rollouts == (0,)
            assert row.where == f"{INSPECT_DEFLATE}:samples/{iid}_epoch_1.json"
            (generation,) = row.generations
            assert generation.text == f"{question}|seed=None|i=0"
            assert (generation.finish_reason, generation.prompt_tokens, generation.completion_tokens) == (
                "stop",
                5,
                10,
            )


@pytest.mark.skipif(not ZSTD_READABLE, reason="zstd members need Python 3.14+ or the zstandard package")
def test_inspect_zstd_log_reads_as_its_deflate_copy() -> None:
    original, copy = load(INSPECT_LOG), load(INSPECT_DEFLATE)
    assert original.keys.keys() == copy.keys.keys()
    for key, pos in original.keys.items():
        assert original.decode(pos).generations == copy.decode(copy.keys[key]).generations


@pytest.mark.skipif(ZSTD_READABLE, reason="this Python reads zstd members")
def test_inspect_zstd_log_without_zstandard_says_what_to_install() -> None:
    with pytest.raises(EvalReplayError, match=r"compressed with zstd.*pip install zstandard.*Python 3\.14"):
        load(INSPECT_LOG)


def includes(text: str, instance: dict[str, Any]) -> bool:
    """inspect_ai's `includes()` scorer: the target anywhere in the answer, ignoring case."""
    return instance["target"].lower() in text.lower()


def inspect_task(scorer: Any = includes) -> EvalTask:
    """The EvalTask twin of tests/data/inspect_eval/tiny_qa.py."""
    return EvalTask(
        "tiny_qa",
        [{"id": i, "input": q, "target": t} for i, q, t in INSPECT_QUESTIONS],
        prompt=lambda inst: [{"role": "user", "content": inst["input"]}],
        system_prompt="Answer briefly.",
        scorer=scorer,
    )


def test_inspect_log_rescored_to_inspects_own_scores() -> None:
    result = inspect_task().evaluate(ReplayProvider.from_path(INSPECT_DEFLATE))
    assert result.errors == {}
    accuracy = inspect_header(INSPECT_DEFLATE)["results"]["scores"][0]["metrics"]["accuracy"]["value"]
    assert result.metrics == {"includes": accuracy} == {"includes": 0.5}
    assert {iid: s["includes"] for iid, s in result.scores.items()} == inspect_scores(INSPECT_DEFLATE)


def test_inspect_log_rescored_with_a_new_scorer() -> None:
    def echoes(text: str, instance: dict[str, Any]) -> bool:
        return text.startswith(instance["input"])

    result = inspect_task(echoes).evaluate(ReplayProvider.from_path(INSPECT_DEFLATE.parent))
    assert result.metrics == {"echoes": 1.0}


def test_inspect_instances_render_the_logged_messages() -> None:
    found = inspect_ai.instances(INSPECT_DEFLATE)
    assert [(i["id"], i["target"]) for i in found] == [(i, t) for i, _, t in INSPECT_QUESTIONS]
    assert found[0]["prompt"] == [{"role": "user", "content": "What is two plus two?"}]
    assert found[0]["system_prompt"] == "Answer briefly."
    task = EvalTask(
        "tiny_qa",
        found,
        prompt=lambda inst: inst["prompt"],
        system_prompt="Answer briefly.",
        scorer=includes,
    )
    assert task.evaluate(ReplayProvider.from_path(INSPECT_DEFLATE)).metrics == {"includes": 0.5}


INSPECT_EVALS = f"""
from pytest_evalreplay import EvalTask

QUESTIONS = {INSPECT_QUESTIONS!r}


def includes(text, instance):
    return instance["target"].lower() in text.lower()


tiny_qa = EvalTask("tiny_qa", [{{"id": i, "input": q, "target": t}} for i, q, t in QUESTIONS],
                   prompt=lambda inst: [{{"role": "user", "content": inst["input"]}}],
                   system_prompt="Answer briefly.", scorer=includes)
"""


def test_inspect_log_rescored_under_pytest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_evals=INSPECT_EVALS)
    result = pytester.runpytest(
        f"--evalreplay-predictions={INSPECT_DEFLATE}", "--evalreplay-output=out", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(deselected=6)
    doc = orjson.loads((pytester.path / "out" / "tiny_qa-metrics.json").read_bytes())
    assert doc["metrics"] == {"includes": 0.5}
    assert doc["model"] == "openai-api/stub/tiny"


# -- olmo-eval -----------------------------------------------------------------


def jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def output(ll: float, text: str, greedy: bool = False) -> dict[str, Any]:
    """One continuation's entry of olmo-eval's model_output, as its
    runners/io/builders.py writes it (allenai/olmo-eval e8b88f19)."""
    nbytes = len(text.encode())
    return {
        "text": text,
        "extracted_answer": None,
        "sum_logits": ll,
        "num_tokens": 2,
        "num_tokens_all": 9,
        "is_greedy": greedy,
        "logits_per_token": ll / 2,
        "logits_per_char": ll / len(text),
        "bits_per_byte": -ll / (nbytes * math.log(2)),
        "num_chars": len(text),
    }


def olmo_eval_run(root: Path) -> Path:
    """olmo-eval's results dir for an MC task (one requests row per document,
    `request.continuations`), an acc_uncond variant (`continuation_prompts`)
    and a BPB task (the gold continuation alone)."""
    conts = [" Paris", " Rome"]
    rows = [
        {"request": {"context": "Q: capital of France?\nA:", "continuations": conts}},
        {
            "request": {
                "context": "Q: capital of Italy?\nA:",
                "continuations": conts + conts,
                "continuation_prompts": ["Q: capital of Italy?\nA:"] * 2 + ["Answer:"] * 2,
            }
        },
        {"request": {"context": "The sky is", "continuations": [" blue."]}},
    ]
    requests = [
        {
            "request_type": "loglikelihood",
            "doc": {"query": "q"},
            "request": {**r["request"], "perplexity_context": r["request"]["context"]},
            "idx": 0,
            "task_name": "mc",
            "doc_id": n,
            "native_id": f"n{n}",
            "label": 0,
        }
        for n, r in enumerate(rows)
    ]
    predictions = [
        {
            "doc_id": 0,
            "native_id": "n0",
            "model_output": [output(-1.0, " Paris", True), output(-2.5, " Rome")],
        },
        {
            "doc_id": 1,
            "native_id": "n1",
            "model_output": [
                output(-3.0, " Paris"),
                output(-0.5, " Rome", True),
                output(-7.0, " Paris"),
                output(-8.0, " Rome"),
            ],
        },
        {"doc_id": 2, "native_id": "n2", "model_output": [output(-4.25, " blue.")]},
    ]
    jsonl(root / "requests" / "olmo-1b" / "mc-requests.jsonl", requests)
    return jsonl(root / "predictions" / "olmo-1b" / "mc-predictions.jsonl", predictions)


def test_olmo_eval_multiple_choice_and_bpb_saves(tmp_path: Path) -> None:
    olmo_eval_run(tmp_path)
    index = load(tmp_path)
    assert index.model == "olmo-1b" and index.skipped == 0
    (france,) = index.rows(("Q: capital of France?\nA:", None))
    assert france.instance_id == "n0" and france.continuations == (" Paris", " Rome")
    assert france.generations[0].loglikelihoods == ((-1.0, True), (-2.5, False))
    assert france.generations[0].metadata == {"num_tokens": [2, 2]}
    (italy,) = index.rows(("Q: capital of Italy?\nA:", None))  # the unconditional half left out
    assert italy.continuations == (" Paris", " Rome")
    assert italy.generations[0].loglikelihoods == ((-3.0, False), (-0.5, True))
    (sky,) = index.rows(("The sky is", None))
    assert sky.continuations == (" blue.",) and sky.generations[0].loglikelihoods == ((-4.25, False),)
    found = olmo_eval.instances(tmp_path / "requests" / "olmo-1b" / "mc-requests.jsonl")
    assert [i["continuations"] for i in found] == [[" Paris", " Rome"], [" Paris", " Rome"], [" blue."]]


def test_olmo_eval_bpb_rescored_to_olmo_evals_bits_per_byte(tmp_path: Path) -> None:
    needs_choices()
    from pytest_evalreplay import scorers

    file = olmo_eval_run(tmp_path)
    task = EvalTask(
        "bpb",
        [{"id": "sky", "text": "The sky is", "gold": "blue."}],
        prompt="{text}",
        choices=lambda inst: [inst["gold"]],
        target="gold",
        scorer=scorers.multiple_choice(metrics=("bpb",)),
    )
    result = task.evaluate(ReplayProvider.from_path(tmp_path))
    saved = orjson.loads(file.read_bytes().splitlines()[2])["model_output"][0]["bits_per_byte"]
    assert result.metrics["bpb"] == pytest.approx(saved, rel=1e-12)


def test_oe_eval_one_requests_row_per_choice(tmp_path: Path) -> None:
    """oe-eval / OLMES: a loglikelihood requests row per choice, its position
    in `idx` (rows in any order), model_output in idx order without texts
    (oe_eval/metrics/metric.py and models/eleuther_huggingface.py)."""
    requests = [
        {
            "request_type": "loglikelihood",
            "doc": {},
            "request": {"context": "Q: 1+1?\nA:", "continuation": cont},
            "idx": idx,
            "task_name": "arith",
            "doc_id": 7,
            "native_id": "a7",
            "label": 1,
        }
        for idx, cont in ((1, " 2"), (0, " 1"), (2, " 3"))
    ]
    outs = [
        {"sum_logits": ll, "num_tokens": 1, "is_greedy": g}
        for ll, g in ((-2.0, False), (-0.1, True), (-5.0, False))
    ]
    jsonl(tmp_path / "task-000-arith-requests.jsonl", requests)
    jsonl(
        tmp_path / "task-000-arith-predictions.jsonl",
        [{"doc_id": 7, "native_id": "a7", "model_output": outs}],
    )
    (row,) = load(tmp_path).rows(("Q: 1+1?\nA:", None))
    assert row.continuations == (" 1", " 2", " 3")
    assert row.generations[0].loglikelihoods == ((-2.0, False), (-0.1, True), (-5.0, False))


# -- inspect_ai: shapes the fixture does not show --------------------------------


def eval_log(path: Path, samples: list[dict[str, Any]], model: Any = "m") -> Path:
    """A `.eval` archive as inspect_ai writes it (deflate, as versions before 0.3.2xx did)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("_journal/start.json", orjson.dumps({"eval": {"model": model}}))
        for s in samples:
            archive.writestr(f"samples/{s['id']}_epoch_{s.get('epoch', 1)}.json", orjson.dumps(s))
    return path


def sample(
    sid: str, answer: str, messages: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    messages = messages or [{"role": "user", "content": f"Q {sid}"}]
    return {
        "id": sid,
        "epoch": 1,
        "input": f"Q {sid}",
        "target": "t",
        "messages": [*messages, {"role": "assistant", "content": answer}],
        "output": {
            "model": "m",
            "choices": [{"message": {"role": "assistant", "content": answer}, "stop_reason": "max_tokens"}],
            "completion": answer,
        },
        **extra,
    }


def user(sid: str) -> bytes:
    return orjson.dumps([{"role": "user", "content": f"Q {sid}"}], option=orjson.OPT_SORT_KEYS)


def test_inspect_epochs_are_rollouts_and_odd_samples_are_skipped(tmp_path: Path) -> None:
    tool_turn = [
        {"role": "user", "content": "Q c"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "function": "f", "arguments": {}}]},
        {"role": "tool", "content": "42"},
    ]
    image = [{"role": "user", "content": [{"type": "text", "text": "Q d"}, {"type": "image", "image": "x"}]}]
    log = eval_log(
        tmp_path / "log.eval",
        [
            sample("a", "one"),
            sample("a", "two", epoch=2),
            sample("b", "attachment://h1", attachments={"h1": "a long answer"}),
            sample("c", "done", tool_turn),
            sample("d", "cat", image),
            {
                **sample("e", "x"),
                "output": {"model": "m", "choices": [], "completion": ""},
                "error": {"message": "boom"},
            },
        ],
    )
    index = load(log)
    assert index.skipped == 3 and index.model == "m"
    rows = index.rows((user("a"), None))
    assert sorted((r.rollouts, r.generations[0].text) for r in rows) == [((0,), "one"), ((1,), "two")]
    (b,) = index.rows((user("b"), None))
    assert b.generations[0].text == "a long answer" and b.generations[0].finish_reason == "max_tokens"
    task = EvalTask(
        "qa",
        [{"id": "a"}, {"id": "b"}],
        prompt=lambda inst: [{"role": "user", "content": f"Q {inst['id']}"}],
        scorer=lambda text, inst: len(text),
        num_samples=2,
    )
    result = task.evaluate(ReplayProvider.from_path(log))
    assert result.scores["a"] == {"score": 3.0}  # the mean over its two epochs: "one", "two"
    assert "b" in result.errors  # one epoch saved, two asked


def test_inspect_text_parts_stay_parts(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "Q"}, {"type": "text", "text": "again"}]
    log = eval_log(
        tmp_path / "log.eval", [sample("a", "x", [{"role": "user", "content": parts, "source": "input"}])]
    )
    key = orjson.dumps([{"role": "user", "content": parts}], option=orjson.OPT_SORT_KEYS)
    assert [r.generations[0].text for r in load(log).rows((key, None))] == ["x"]


def test_inspect_log_model_may_be_null_and_else_must_be_a_string(tmp_path: Path) -> None:
    assert load(eval_log(tmp_path / "none.eval", [sample("a", "x")], model=None)).model is None
    log = eval_log(tmp_path / "seven.eval", [sample("a", "x")], model=7)
    with pytest.raises(EvalReplayError, match=r"'eval.model' must be a string or null, got a number"):
        load(log)


def test_inspect_logs_of_two_models_in_one_dir_are_refused(tmp_path: Path) -> None:
    eval_log(tmp_path / "one.eval", [sample("a", "x")], model="m1")
    eval_log(tmp_path / "two.eval", [sample("b", "y")], model="m2")
    with pytest.raises(EvalReplayError, match=r"2 models.*'m1'.*'m2'"):
        load(tmp_path)
