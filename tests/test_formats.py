"""The saved-run readers: layout detection, our run dir's join, olmo-eval and
lm-evaluation-harness files in their real layouts, and the load benchmark."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalreplay import EvalReplayError, EvalTask, GenerationError, Request
from pytest_evalreplay.formats import lm_eval, load, native, olmo_eval
from pytest_evalreplay.formats.saved import IndexBuilder, split_lines
from pytest_evalreplay.providers.replay import ReplayProvider
from pytest_evalreplay.storage.runschema import request_row_of


def jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows))
    return path


def req(iid: str, context: Any, **kw: Any) -> Request:
    return Request(task="t", instance_id=iid, context=context, **kw)


def texts(results: list[Any]) -> list[Any]:
    return [r.message if isinstance(r, GenerationError) else [g.text for g in r] for r in results]


# -- our run dir --------------------------------------------------------------


def native_pred(iid: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"instance_id": iid, "model": "m", "generations": [{"text": text}], "scores": {}, **extra}


def test_requests_in_another_order_than_predictions(tmp_path: Path) -> None:
    requests = [req(f"q{i}", f"prompt {i}") for i in range(6)]
    jsonl(tmp_path / "t-requests.jsonl", [request_row_of(r) for r in reversed(requests)])
    jsonl(tmp_path / "t-predictions.jsonl", [native_pred(f"q{i}", f"a{i}") for i in (0, 2, 4, 5)])
    results = ReplayProvider.from_path(tmp_path).generate(requests)
    assert texts(results)[0::2] == [["a0"], ["a2"], ["a4"]]
    assert texts(results)[5] == ["a5"]
    assert "no saved generation" in texts(results)[1]


def test_rows_appended_twice_by_a_resumed_run(tmp_path: Path) -> None:
    a, b = req("a", "pa", num_samples=2), req("b", "pb", num_samples=2)
    jsonl(tmp_path / "t-requests.jsonl", [request_row_of(a), request_row_of(b), request_row_of(a)])
    jsonl(
        tmp_path / "t-predictions.jsonl",
        [
            native_pred("a", "a0", rollouts=[0]),
            {**native_pred("b", "b0"), "generations": [{"text": "b0"}, {"text": "b1"}]},
            native_pred("a", "a1", rollouts=[1]),
        ],
    )
    assert texts(ReplayProvider.from_path(tmp_path).generate([a, b])) == [["a0", "a1"], ["b0", "b1"]]


def test_each_appended_predictions_row_joins_its_own_requests_row(tmp_path: Path) -> None:
    # a log appended batch by batch: each batch's requests row precedes its predictions row
    jsonl(tmp_path / "t-requests.jsonl", [request_row_of(req("a", "one")), request_row_of(req("a", "two"))])
    jsonl(tmp_path / "t-predictions.jsonl", [native_pred("a", "x"), native_pred("a", "y")])
    results = ReplayProvider.from_path(tmp_path).generate([req("a", "one"), req("a", "two")])
    assert texts(results) == [["x"], ["y"]]


def test_an_instance_with_two_prompts_and_no_order_to_tell_is_rejected(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "t-requests.jsonl", [request_row_of(req("a", "one")), request_row_of(req("a", "two"))]
    )
    jsonl(tmp_path / "t-predictions.jsonl", [native_pred("a", "x")] * 3)
    expected = rf"{re.escape(str(path))}: instance 'a' \(stage 1\) appears with different prompts"
    with pytest.raises(EvalReplayError, match=expected):
        load(tmp_path)


def test_a_bad_requests_line_after_the_last_prediction_is_reported(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "t-requests.jsonl", [request_row_of(req("a", "x")), request_row_of(req("b", "y"))]
    )
    path.write_bytes(path.read_bytes() + b"{oops\n")
    jsonl(tmp_path / "t-predictions.jsonl", [native_pred("a", "x")])
    with pytest.raises(EvalReplayError, match=rf"{re.escape(str(path))}:3: not valid JSON"):
        load(tmp_path)


def test_a_requests_row_without_a_context_names_its_line(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "t-requests.jsonl", [request_row_of(req("a", "x")), {"instance_id": "b"}])
    jsonl(tmp_path / "t-predictions.jsonl", [native_pred("a", "x"), native_pred("b", "y")])
    expected = rf"{re.escape(str(path))}:2: a requests row needs its 'context'$"
    with pytest.raises(EvalReplayError, match=expected):
        load(tmp_path)


def test_the_other_files_of_a_run_dir_are_ignored(tmp_path: Path) -> None:
    jsonl(tmp_path / "t-requests.jsonl", [request_row_of(req("a", "x"))])
    jsonl(tmp_path / "t-predictions.jsonl", [native_pred("a", "y")])
    (tmp_path / "manifest.json").write_text('{"format": "evalreplay/1", "model": "m"}')
    (tmp_path / "t-metrics.json").write_text("{not json")
    (tmp_path / "t-failures.jsonl").write_text("{not json\n")
    (tmp_path / "t-journal.jsonl").write_text("{not json\n")
    assert len(load(tmp_path)) == 1


def test_unknown_paths_say_what_can_be_read(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(EvalReplayError, match="not a predictions file; expected a run dir"):
        load(tmp_path / "notes.txt")
    with pytest.raises(EvalReplayError, match=r"no saved predictions here.*olmo-eval.*samples_"):
        load(tmp_path)


# -- olmo-eval ----------------------------------------------------------------


def olmo_request(doc_id: int, context: Any, request_type: str = "generate_until", **request: Any) -> dict:
    return {
        "request_type": request_type,
        "doc": {"query": f"doc {doc_id}"},
        "request": {
            "context": context,
            "stop_sequences": ["\n\n"],
            "generation_kwargs": {"max_gen_toks": 64, "do_sample": False, "temperature": 0.0},
            **request,
        },
        "idx": 0,
        "task_name": "gsm8k",
        "doc_id": doc_id,
        "native_id": f"gsm-{doc_id}",
        "label": "4",
    }


def olmo_prediction(doc_id: int, *outputs: str) -> dict:
    return {
        "doc_id": doc_id,
        "native_id": f"gsm-{doc_id}",
        "model_output": [{"text": t, "extracted_answer": t[-1:], "num_chars": len(t)} for t in outputs],
        "instance_metrics": {"exact_match": {"exact_match": 1.0}},
        "label": "4",
    }


def olmo_results(root: Path, model: str = "olmo-7b", spec: str = "gsm8k_olmes_a1b2c3") -> Path:
    jsonl(
        root / "requests" / model / f"{spec}-requests.jsonl",
        [
            olmo_request(0, "Q: 2+2?\nA:"),
            olmo_request(1, [{"role": "user", "content": "Q: 3+3?"}], system_prompt="Think."),
            olmo_request(2, "Q: capital?\nA:", request_type="loglikelihood", continuation=" Paris"),
        ],
    )
    jsonl(
        root / "predictions" / model / f"{spec}-predictions.jsonl",
        [
            olmo_prediction(0, " 4"),
            olmo_prediction(1, "6", "six"),
            {"doc_id": 2, "native_id": "gsm-2", "model_output": [{"sum_logits": -1.5, "num_tokens": 1}]},
        ],
    )
    (root / "metrics.json").write_text(json.dumps({"tasks": [], "summary": {}}))
    return root / "predictions" / model / f"{spec}-predictions.jsonl"


OLMO_REQUESTS = [
    req("x", "Q: 2+2?\nA:"),
    req("y", [{"role": "user", "content": "Q: 3+3?"}], system_prompt="Think.", num_samples=2),
]


@pytest.mark.parametrize("where", ["root", "model_dir", "file"])
def test_olmo_eval_results_in_their_layout(tmp_path: Path, where: str) -> None:
    file = olmo_results(tmp_path)
    path = {"root": tmp_path, "model_dir": file.parent, "file": file}[where]
    provider = ReplayProvider.from_path(path)
    assert provider.model == "olmo-7b"
    assert provider.index.skipped == 0
    assert texts(provider.generate(OLMO_REQUESTS)) == [[" 4"], ["6", "six"]]
    (save,) = provider.index.rows(("Q: capital?\nA:", None))  # a loglikelihood save, read since #20
    assert save.continuations == (" Paris",)
    assert save.generations[0].loglikelihoods == ((-1.5, False),)


def test_olmo_eval_rescored_by_a_task(tmp_path: Path) -> None:
    olmo_results(tmp_path)
    task = EvalTask(
        "gsm",
        [{"id": "x", "q": "2+2", "answer": "4"}],
        prompt="Q: {q}?\nA:",
        scorer="numeric_match",
        target="answer",
    )
    assert task.evaluate(ReplayProvider.from_path(tmp_path)).metrics == {"numeric_match": 1.0}


def test_olmo_eval_instances_render_the_saved_prompts(tmp_path: Path) -> None:
    olmo_results(tmp_path)
    requests_file = tmp_path / "requests" / "olmo-7b" / "gsm8k_olmes_a1b2c3-requests.jsonl"
    found = olmo_eval.instances(requests_file)
    assert [(i["id"], i["native_id"], i["target"]) for i in found] == [
        ("0", "gsm-0", "4"),
        ("1", "gsm-1", "4"),
        ("2", "gsm-2", "4"),
    ]
    assert found[2]["continuations"] == [" Paris"]
    task = EvalTask("gsm", found[:1], prompt=lambda i: i["prompt"], scorer="numeric_match")
    assert task.evaluate(ReplayProvider.from_path(tmp_path)).metrics == {"numeric_match": 1.0}


def test_olmo_eval_original_text_and_oe_eval_continuation(tmp_path: Path) -> None:
    jsonl(tmp_path / "task-000-gsm8k-requests.jsonl", [olmo_request(0, "p0"), olmo_request(1, "p1")])
    jsonl(
        tmp_path / "task-000-gsm8k-predictions.jsonl",
        [
            {"doc_id": 0, "native_id": 10, "model_output": [{"continuation": " 7", "sum_logits": -2.0}]},
            {"doc_id": 1, "model_output": [{"text": "4", "original_text": "<think>..</think>4"}]},
        ],
    )
    provider = ReplayProvider.from_path(tmp_path)
    assert provider.model is None
    assert texts(provider.generate([req("a", "p0"), req("b", "p1")])) == [[" 7"], ["<think>..</think>4"]]


def test_olmo_eval_keeps_every_per_sample_field(tmp_path: Path) -> None:
    """prompt_tokens and every field olmo-eval adds to a sample (a Harmony
    decode, a parser error, a context-cut marker, its extracted answer) reach
    the Generation: prompt_tokens as itself, the rest as its metadata."""
    output = {
        "text": "4",
        "original_text": "<|channel|>analysis...4",
        "finish_reason": "length",
        "num_tokens": 3,
        "prompt_tokens": 12,
        "harmony": {"analysis": "2+2 is 4", "final": "4"},
        "parser_error": "unterminated channel",
        "context_cut": True,
        "extracted_answer": "4",
    }
    jsonl(tmp_path / "task-000-gsm8k-requests.jsonl", [olmo_request(0, "p0")])
    jsonl(tmp_path / "task-000-gsm8k-predictions.jsonl", [{"doc_id": 0, "model_output": [output]}])
    (gens,) = ReplayProvider.from_path(tmp_path).generate([req("a", "p0")])
    (gen,) = gens
    # served raw, as every replay is, so the task's own reasoning strip applies
    assert (gen.text, gen.finish_reason) == ("<|channel|>analysis...4", "length")
    assert (gen.prompt_tokens, gen.completion_tokens) == (12, 3)
    assert gen.metadata == {
        "harmony": {"analysis": "2+2 is 4", "final": "4"},
        "parser_error": "unterminated channel",
        "context_cut": True,
        "extracted_answer": "4",
    }


def test_olmo_eval_prompt_tokens_of_the_wrong_type_name_the_line(tmp_path: Path) -> None:
    jsonl(tmp_path / "task-000-gsm8k-requests.jsonl", [olmo_request(0, "p0")])
    row = {"doc_id": 0, "model_output": [{"text": "4", "prompt_tokens": "12"}]}
    jsonl(tmp_path / "task-000-gsm8k-predictions.jsonl", [row])
    (result,) = ReplayProvider.from_path(tmp_path).generate([req("a", "p0")])
    assert "predictions.jsonl:1" in result.message and "model_output[0].prompt_tokens" in result.message


def test_olmo_eval_dir_of_two_models_is_rejected(tmp_path: Path) -> None:
    olmo_results(tmp_path, model="olmo-7b")
    olmo_results(tmp_path, model="olmo-13b")
    with pytest.raises(EvalReplayError, match=r"2 models.*'olmo-13b' in .*olmo-13b.*'olmo-7b'"):
        load(tmp_path)


def test_olmo_eval_prediction_without_request_is_rejected(tmp_path: Path) -> None:
    file = olmo_results(tmp_path)
    file.write_bytes(file.read_bytes() + orjson.dumps(olmo_prediction(9, "x")) + b"\n")
    with pytest.raises(EvalReplayError, match=rf"{re.escape(str(file))}:4: doc_id 9 has no generate row"):
        load(tmp_path)


# -- lm-evaluation-harness ----------------------------------------------------

DATE = "2025-01-31T10-20-30.123456"


def lm_row(doc_id: int, context: Any, resps: list[str], filt: str = "strict-match") -> dict:
    return {
        "doc_id": doc_id,
        "doc": {"question": f"q{doc_id}", "answer": "#### 4"},
        "target": "4",
        "arguments": {
            "gen_args_0": {"arg_0": context, "arg_1": {"until": ["Question:"], "do_sample": False}}
        },
        "resps": [resps],
        "filtered_resps": [resps[0][-1:]],
        "filter": filt,
        "metrics": ["exact_match"],
        "doc_hash": "d",
        "prompt_hash": "p",
        "target_hash": "t",
        "exact_match": 1.0,
    }


def lm_loglikelihood_row(doc_id: int) -> dict:
    return {
        "doc_id": doc_id,
        "doc": {},
        "target": "0",
        "arguments": {
            "gen_args_0": {"arg_0": "Q: sky?\nA:", "arg_1": " blue"},
            "gen_args_1": {"arg_0": "Q: sky?\nA:", "arg_1": " green"},
        },
        "resps": [[[-0.5, True]], [[-3.0, False]]],
        "filtered_resps": [[-0.5, True], [-3.0, False]],
        "filter": "none",
        "metrics": ["acc"],
        "acc": 1.0,
    }


CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Q: 5+5?"}]


def lm_samples(
    directory: Path, model: str = "org/model-7b", task: str = "gsm8k_cot", date: str = DATE
) -> Path:
    few_shot = "Question: 1+1?\nAnswer: 2\n\nQuestion: 2+2?\nAnswer:"
    rows = [
        lm_row(0, few_shot, [" 4"]),
        lm_row(0, few_shot, [" 4"], filt="flexible-extract"),  # the same doc under another filter
        lm_row(1, [json.dumps(CHAT)], ["10", "ten"]),  # a chat API model's JsonChatStr
        lm_loglikelihood_row(2),
    ]
    path = jsonl(directory / f"samples_{task}_{date}.jsonl", rows)
    (directory / f"results_{date}.json").write_text(json.dumps({"results": {}, "model_name": model}))
    return path


LM_REQUESTS = [
    req("a", "Question: 1+1?\nAnswer: 2\n\nQuestion: 2+2?\nAnswer:"),
    req("b", CHAT, num_samples=2),
    req("c", CHAT[1:], system_prompt="You are terse.", num_samples=2),
]


@pytest.mark.parametrize("where", ["file", "model_dir", "output_root"])
def test_lm_eval_samples_in_their_layout(tmp_path: Path, where: str) -> None:
    model_dir = tmp_path / "org__model-7b"
    file = lm_samples(model_dir)
    path = {"file": file, "model_dir": model_dir, "output_root": tmp_path}[where]
    provider = ReplayProvider.from_path(path)
    assert provider.model == "org/model-7b"
    assert provider.index.skipped == 0
    assert texts(provider.generate(LM_REQUESTS)) == [[" 4"], ["10", "ten"], ["10", "ten"]]
    (save,) = provider.index.rows(("Q: sky?\nA:", None))  # a multiple-choice save, read since #20
    assert save.continuations == (" blue", " green")
    assert save.generations[0].loglikelihoods == ((-0.5, True), (-3.0, False))


def test_lm_eval_instances_render_the_saved_prompts(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / f"samples_arith_{DATE}.jsonl",
        [
            lm_row(0, "Question: 2+2?\nAnswer:", [" 4"]),
            lm_row(0, "Question: 2+2?\nAnswer:", [" 4"], filt="flexible-extract"),
            {**lm_row(1, [json.dumps(CHAT)], ["10"]), "target": "11"},
            lm_loglikelihood_row(2),
        ],
    )
    found = lm_eval.instances(path)
    assert [(i["id"], i["prompt"], i["target"]) for i in found] == [
        ("0", "Question: 2+2?\nAnswer:", "4"),
        ("1", CHAT, "11"),
        ("2", "Q: sky?\nA:", "0"),
    ]
    assert found[2]["continuations"] == [" blue", " green"]
    found = found[:2]
    task = EvalTask("arith", found, prompt=lambda i: i["prompt"], scorer="numeric_match")
    result = task.evaluate(ReplayProvider.from_path(path))
    assert result.scores == {"0": {"numeric_match": 1.0}, "1": {"numeric_match": 0.0}}
    assert result.errors == {}


def test_lm_eval_older_list_arguments_and_no_results_file(tmp_path: Path) -> None:
    row = lm_row(0, "Q?", ["yes"])
    row["arguments"] = [["Q?", {"until": ["\n"]}]]
    jsonl(tmp_path / "my-model" / "samples_boolq_gen.jsonl", [row])
    provider = ReplayProvider.from_path(tmp_path / "my-model")
    assert provider.model == "my-model"
    assert texts(provider.generate([req("a", "Q?")])) == [["yes"]]


def test_lm_eval_output_of_two_models_is_rejected(tmp_path: Path) -> None:
    lm_samples(tmp_path / "org__a", model="org/a")
    lm_samples(tmp_path / "org__b", model="org/b")
    with pytest.raises(EvalReplayError, match=r"2 models.*'org/a'.*'org/b'"):
        load(tmp_path)


def test_lm_eval_two_runs_of_one_task_are_rejected(tmp_path: Path) -> None:
    first = lm_samples(tmp_path)
    second = lm_samples(tmp_path, date="2025-02-01T08-00-00.000001")
    with pytest.raises(EvalReplayError) as info:
        load(tmp_path)
    assert str(first) in str(info.value) and str(second) in str(info.value)
    assert "pass the file instead" in str(info.value)
    assert len(load(second)) == 4


def test_lm_eval_malformed_line(tmp_path: Path) -> None:
    path = lm_samples(tmp_path)
    path.write_bytes(path.read_bytes() + b'{"doc_id": 3,\n')
    with pytest.raises(EvalReplayError, match=rf"{re.escape(str(path))}:5: not valid JSON"):
        load(path)


# -- the benchmark ------------------------------------------------------------


def test_the_load_benchmark_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("benchmarks.replay_load")
    from benchmarks.replay_load import main

    result = main(["--rows", "1000", "--repeats", "1"])
    assert result["rows"] == 1000 and result["load_s"] > 0
    assert "of bare" in capsys.readouterr().out


# -- the two ways through our run dir agree -----------------------------------


def read_both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """What `load` makes of `path`, and what it makes with the in-step way off:
    the prompts, the served results of every saved prompt, or the error."""

    def outcome() -> Any:
        try:
            provider = ReplayProvider.from_path(path)
        except EvalReplayError as exc:
            return ("error", str(exc))
        prompts = sorted(provider.index.prompts(), key=repr)
        requests = [
            req(f"i{n}", context, system_prompt=system, num_samples=k)
            for n, (context, system) in enumerate(prompts)
            for k in (1, 2)
        ]
        return prompts, texts(provider.generate(requests))

    fast = outcome()
    with monkeypatch.context() as patch:
        patch.setattr(native, "_load_in_step", lambda *args: False)
        general = outcome()
    return fast, general


def uses_in_step(path: Path) -> bool:
    return all(f.decode is native.decode_in_step for f in load(path).files)


def test_the_plugins_files_take_the_in_step_way_and_read_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = [
        req(f"q{i}", f"question {i}", system_prompt=None if i % 3 else "Be brief.") for i in range(600)
    ]
    jsonl(tmp_path / "t-requests.jsonl", [request_row_of(r) for r in requests])
    jsonl(
        tmp_path / "t-predictions.jsonl",
        [native_pred(r.instance_id, f"answer {n}") for n, r in enumerate(requests)],
    )
    assert uses_in_step(tmp_path)
    fast, general = read_both_ways(tmp_path, monkeypatch)
    assert fast == general and len(fast[0]) == 600


@pytest.mark.parametrize(
    "change",
    [
        "a prompt saved twice in the last block",
        "a stage-2 row",
        "a loglikelihood row",
        "an image row",
        "a chat context",
        "an id JSON escapes",
        "a model that changes",
        "a predictions row missing",
        "a blank line",
    ],
)
def test_what_the_in_step_way_leaves_to_the_general_way_reads_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    requests = [req(f"q{i}", f"question {i}") for i in range(600)]
    predictions = [native_pred(r.instance_id, f"answer {n}") for n, r in enumerate(requests)]
    if change == "a prompt saved twice in the last block":
        requests[590] = req("q590", "question 3")
    elif change == "a stage-2 row":
        requests[10] = req("q10", "question 10", stage=2)
        predictions[10] = {**predictions[10], "stage": 2}
    elif change == "a loglikelihood row":
        requests[300] = req("q300", "question 300", request_type="loglikelihood", continuations=(" x",))
    elif change == "an image row":
        requests[300] = req("q300", "question 300", images=("cat.png",))
    elif change == "a chat context":
        requests[5] = req("q5", [{"role": "user", "content": "question 5"}])
    elif change == "an id JSON escapes":
        requests[7] = req('q"7', "question 7")
        predictions[7] = native_pred('q"7', "answer 7")
    elif change == "a model that changes":
        predictions[400] = {**predictions[400], "model": "other"}
    elif change == "a predictions row missing":
        del predictions[200]
    jsonl(tmp_path / "t-requests.jsonl", [request_row_of(r) for r in requests])
    path = jsonl(tmp_path / "t-predictions.jsonl", predictions)
    if change == "a blank line":
        path.write_bytes(path.read_bytes().replace(b"\n", b"\n\n", 1))
    if change != "a model that changes":  # (that one is refused both ways)
        assert not uses_in_step(tmp_path)
    fast, general = read_both_ways(tmp_path, monkeypatch)
    assert fast == general


def test_the_in_step_way_leaves_nothing_behind_when_it_gives_up(tmp_path: Path) -> None:
    requests = [request_row_of(req(f"q{i}", f"question {i}")) for i in range(1000)]
    requests[900] = {**requests[900], "stage": 2}  # in a later block than the first
    request_data = b"".join(orjson.dumps(r) + b"\n" for r in requests)
    data = b"".join(orjson.dumps(native_pred(f"q{i}", "x")) + b"\n" for i in range(1000))
    builder = IndexBuilder(tmp_path)
    builder.keys["kept"] = 0
    assert not native._load_in_step(
        builder, tmp_path / "t-predictions.jsonl", "t", io.BytesIO(request_data), data
    )
    assert builder.keys == {"kept": 0} and builder.files == []


_id_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(
            _id_text,
            st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
            st.none() | st.sampled_from(["", "sys"]),
            st.lists(
                st.text(st.characters(blacklist_categories=("Cs",)), max_size=4), min_size=1, max_size=2
            ),
        ),
        max_size=12,
    )
)
def test_any_run_dir_reads_the_same_both_ways(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, rows: list[Any]
) -> None:
    directory = tmp_path_factory.mktemp("run")
    jsonl(directory / "t-requests.jsonl", [request_row_of(req(i, c, system_prompt=s)) for i, c, s, _ in rows])
    jsonl(
        directory / "t-predictions.jsonl",
        [{**native_pred(i, ""), "generations": [{"text": t} for t in g]} for i, _, _, g in rows],
    )
    fast, general = read_both_ways(directory, monkeypatch)
    assert fast == general


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.lists(st.sampled_from([b"", b"\n", b"a", b"bc", b"\n\n"]), max_size=12).map(b"".join),
    chunk=st.integers(1, 5),
    block=st.integers(1, 3),
)
def test_request_blocks_split_as_split_lines(
    monkeypatch: pytest.MonkeyPatch, data: bytes, chunk: int, block: int
) -> None:
    """The in-step way reads the requests file in pieces; its lines, block by
    block, are the lines the general way splits from the whole file."""
    monkeypatch.setattr(native, "_CHUNK", chunk)
    monkeypatch.setattr(native, "BLOCK", block)
    blocks = list(native.request_blocks(io.BytesIO(data)))
    assert [line for lines in blocks for line in lines] == split_lines(data)
    assert all(len(lines) == block for lines in blocks[:-1])


def test_a_requests_file_with_a_byte_order_mark_reads_the_same(tmp_path: Path) -> None:
    requests = b"".join(orjson.dumps(request_row_of(req(f"q{i}", f"question {i}"))) + b"\n" for i in range(3))
    data = b"".join(orjson.dumps(native_pred(f"q{i}", f"answer {i}")) + b"\n" for i in range(3))
    (tmp_path / "t-requests.jsonl").write_bytes(b"\xef\xbb\xbf" + requests)
    (tmp_path / "t-predictions.jsonl").write_bytes(data)
    provider = ReplayProvider.from_path(tmp_path)
    assert sorted(provider.index.keys) == [f"question {i}" for i in range(3)]
    (save,) = provider.index.rows(("question 2", None))
    assert save.generations[0].text == "answer 2"


def _run_dir_with_system_prompts(directory: Path, n: int) -> Path:
    """A run dir whose index holds `n` (context, system prompt) pairs: tuples, which the collector tracks."""
    requests = [req(f"q{i}", f"question {i}", system_prompt="Be brief.") for i in range(n)]
    jsonl(directory / "t-requests.jsonl", [request_row_of(r) for r in requests])
    jsonl(
        directory / "t-predictions.jsonl",
        [native_pred(r.instance_id, f"answer {i}") for i, r in enumerate(requests)],
    )
    return directory


def test_the_next_young_collection_does_not_walk_a_loaded_index(tmp_path: Path) -> None:
    """The index lives on: left in the youngest generation, the first collection
    after the load would walk every key (0.25 s at 1M rows), for nothing."""
    import gc

    _run_dir_with_system_prompts(tmp_path, 5000)
    walked: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] < 2:
            walked.append(info["generation"])

    gc.collect()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.callbacks.append(note)
    try:
        provider = ReplayProvider.from_path(tmp_path)
    finally:
        gc.callbacks.remove(note)
    assert walked == [] and gc.get_count()[0] < 700 and gc.get_freeze_count() == 0
    assert len(provider.index) == 5000
    saved = provider.index.rows(("question 4999", "Be brief."))
    assert [g.text for g in saved[0].generations] == ["answer 4999"]


def test_a_load_leaves_objects_frozen_by_others_frozen(tmp_path: Path) -> None:
    import gc

    _run_dir_with_system_prompts(tmp_path, 50)
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert len(ReplayProvider.from_path(tmp_path).index) == 50
        # An unfreeze would empty the permanent generation and a freeze would
        # add the index to it; frozen objects freed by their last reference
        # going away (a cache another test left, evicted during the load)
        # leave it, so the count may fall a little but never to zero.
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
