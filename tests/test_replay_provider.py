"""The replay provider's rules, each on its own small run dir written with orjson."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_evalreplay import EvalReplayError, EvalTask, Generation, GenerationError, Request
from pytest_evalreplay.providers import make_builtin
from pytest_evalreplay.providers.replay import ReplayProvider, from_settings
from pytest_evalreplay.settings import Settings
from pytest_evalreplay.storage.runschema import request_row_of


def jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows))
    return path


def pred(iid: str, *texts: str, model: str | None = "m", **extra: Any) -> dict[str, Any]:
    gens = [{"text": t, "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 1} for t in texts]
    return {"instance_id": iid, "model": model, "generations": gens, "scores": {}, **extra}


def save(directory: Path, task: str, requests: list[Request], predictions: list[dict[str, Any]]) -> Path:
    """A run dir's pair of files for one task, as the plugin writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    jsonl(directory / f"{task}-requests.jsonl", [request_row_of(r) for r in requests])
    return jsonl(directory / f"{task}-predictions.jsonl", predictions)


def req(iid: str, context: Any = None, **kw: Any) -> Request:
    return Request(task=kw.pop("task", "t"), instance_id=iid, context=context or f"Q {iid}?", **kw)


QA = [
    {"id": "a", "q": "1+1", "answer": "2"},
    {"id": "b", "q": "2+2", "answer": "4"},
    {"id": "c", "q": "3+3", "answer": "6"},
    {"id": "d", "q": "4+4", "answer": "8"},
]


def qa_task(**kw: Any) -> EvalTask:
    return EvalTask("qa", QA, prompt="What is {q}?", scorer="exact_match", target="answer", **kw)


def save_task(directory: Path, task: EvalTask, answers: Mapping[str, list[str]]) -> Path:
    requests = [task.request(i) for i in task.instances]
    preds = [pred(i["id"], *answers[i["id"]]) for i in task.instances if i["id"] in answers]
    return save(directory, task.name, requests, preds)


# -- rescoring ----------------------------------------------------------------


def test_editing_a_saved_answer_to_gold_changes_the_score_exactly(tmp_path: Path) -> None:
    task = qa_task()
    answers = {"a": ["2"], "b": ["5"], "c": ["6"], "d": ["7"]}
    save_task(tmp_path, task, answers)
    before = task.evaluate(ReplayProvider.from_path(tmp_path))
    assert before.metrics == {"exact_match": 0.5}
    assert before.errors == {}

    answers["d"] = ["8"]  # the saved answer edited to the gold one
    save_task(tmp_path, task, answers)
    after = task.evaluate(ReplayProvider.from_path(tmp_path))
    assert after.metrics == {"exact_match": 0.75}
    assert after.scores["d"] == {"exact_match": 1.0}
    assert {k: v for k, v in after.scores.items() if k != "d"} == {
        k: v for k, v in before.scores.items() if k != "d"
    }


def test_missing_saved_instances_are_errors_not_zeros(tmp_path: Path) -> None:
    task = qa_task()
    save_task(tmp_path, task, {"a": ["2"], "b": ["5"]})
    result = task.evaluate(ReplayProvider.from_path(tmp_path))
    assert set(result.errors) == {"c", "d"}
    assert result.errors["c"].startswith(
        "replay: no saved generation matches this prompt (task qa, instance c)"
    )
    assert set(result.scores) == {"a", "b"}
    assert result.metrics == {"exact_match": 0.5}  # c and d are left out, not scored 0


def test_no_match_is_final_and_says_what_to_check(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a")], [pred("a", "x")])
    provider = ReplayProvider.from_path(tmp_path)
    (err,) = provider.generate([req("zz", "another prompt")])
    assert isinstance(err, GenerationError) and not err.retryable
    assert "(task t, instance zz)" in err.message
    assert "system prompt" in err.message and str(tmp_path) in err.message


def no_match(provider: ReplayProvider, request: Request) -> str:
    (result,) = provider.generate([request])
    assert isinstance(result, GenerationError) and not result.retryable
    assert result.message.startswith("replay: no saved generation matches this prompt")
    return result.message


def test_a_miss_shows_where_the_saved_prompt_of_the_instance_differs(tmp_path: Path) -> None:
    task = qa_task(system_prompt="Be brief.")
    path = save_task(tmp_path, task, {"a": ["2"], "b": ["4"], "c": ["6"]})
    provider = ReplayProvider.from_path(tmp_path)
    assert provider.index._cache == {}  # nothing is built for misses at load
    edited = qa_task(system_prompt="Be brief.")
    edited.prompt = "What is {q} ?"  # a one-character template edit
    message = no_match(provider, edited.request(QA[1]))
    assert (
        f"Nearest save: {path}:2 (this instance), where the context first differs at character 12" in message
    )
    assert "after 'What is 2+2': saved '?', this request ' ?'" in message
    message = no_match(provider, qa_task(system_prompt="Be terse.").request(QA[2]))
    assert (
        f"{path}:3 (this instance), where the context is the same but the system prompt is 'Be brief.'"
        in message
    )
    assert "there and 'Be terse.' here" in message
    # an instance the save does not know: the saved prompt sharing the longest prefix
    message = no_match(provider, req("zz", "What is 3+3? Think.", system_prompt="Be brief."))
    assert f"{path}:3 (instance c), where the context first differs at character 13" in message
    assert "this request's goes on with ' Think.' where the saved one ends" in message
    chat = no_match(
        provider, req("a", [{"role": "user", "content": "What is 1+1?"}], system_prompt="Be brief.")
    )
    assert "its context is a string and this request's is chat messages" in chat


def test_a_miss_on_an_empty_save_says_it_holds_nothing(tmp_path: Path) -> None:
    save(tmp_path, "t", [], [])
    message = no_match(ReplayProvider.from_path(tmp_path), req("a"))
    assert "holds 0 saved prompts" in message and "Nearest" not in message


def test_the_system_prompt_is_part_of_the_key(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a", "same", system_prompt="Be brief.")], [pred("a", "yes")])
    provider = ReplayProvider.from_path(tmp_path)
    same, other, none, empty = provider.generate(
        [
            req("a", "same", system_prompt="Be brief."),
            req("a", "same", system_prompt="Be verbose."),
            req("a", "same"),
            req("a", "same", system_prompt=""),
        ]
    )
    assert [g.text for g in same] == ["yes"]
    for result in (other, none, empty):
        assert isinstance(result, GenerationError)
        assert "no saved generation matches" in result.message


def test_the_prompt_not_the_instance_id_is_the_key(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a", "Q?")], [pred("a", "yes")])
    (gens,) = ReplayProvider.from_path(tmp_path).generate([req("renamed", "Q?", task="other")])
    assert [g.text for g in gens] == ["yes"]


def test_an_empty_saved_generation_stays_empty(tmp_path: Path) -> None:
    task = qa_task()
    save_task(tmp_path, task, {"a": [""], "b": ["4"], "c": ["6"], "d": ["8"]})
    provider = ReplayProvider.from_path(tmp_path)
    (gens,) = provider.generate([task.request(QA[0])])
    assert [g.text for g in gens] == [""]
    result = task.evaluate(provider)
    assert result.errors == {}
    assert result.scores["a"] == {"exact_match": 0.0}
    assert result.metrics == {"exact_match": 0.75}


def test_original_text_is_served_raw_and_stripped_again(tmp_path: Path) -> None:
    task = qa_task(strip_reasoning=True)
    raw = "<think>2+2 is 5? no, 4</think> 4"
    row = pred("b", "4")
    row["generations"][0].update(original_text=raw, metadata={"latency_s": 1.5})
    requests = [task.request(i) for i in task.instances]
    save(tmp_path, "qa", requests, [pred("a", "2"), row])
    provider = ReplayProvider.from_path(tmp_path)
    (_, gens) = provider.generate(requests[:2])
    (served,) = gens
    assert served.text == raw and served.original_text is None
    assert served.finish_reason == "stop"
    assert (served.prompt_tokens, served.completion_tokens) == (3, 1)
    assert dict(served.metadata) == {"latency_s": 1.5}

    result = task.evaluate(provider)
    assert result.scores["b"] == {"exact_match": 1.0}
    scored = next(r for r in result.rollouts if r.instance_id == "b")
    assert scored.generation is not None
    assert scored.generation.text == "4" and scored.generation.original_text == raw


def test_chat_contexts_are_compared_as_data(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Hi?"}]
    save(tmp_path, "t", [req("a", messages)], [pred("a", "hello")])
    provider = ReplayProvider.from_path(tmp_path)
    reordered = [{"content": "Hi?", "role": "user"}]
    ok, text = provider.generate([req("a", reordered), req("a", "Hi?")])
    assert [g.text for g in ok] == ["hello"]
    assert isinstance(text, GenerationError)


# -- prompts saved more than once ---------------------------------------------


def test_a_prompt_saved_for_several_instances_replays_when_they_agree(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a", "same"), req("b", "same")], [pred("a", "x"), pred("b", "x")])
    results = ReplayProvider.from_path(tmp_path).generate([req("a", "same"), req("b", "same")])
    assert [[g.text for g in r] for r in results] == [["x"], ["x"]]


def test_a_prompt_saved_for_several_instances_fails_when_they_differ(tmp_path: Path) -> None:
    path = save(
        tmp_path,
        "t",
        [req("a", "same"), req("b", "same"), req("c", "other")],
        [pred("a", "x"), pred("b", "y"), pred("c", "z")],
    )
    provider = ReplayProvider.from_path(tmp_path)
    a, b, c = provider.generate([req("a", "same"), req("b", "same"), req("c", "other")])
    for result in (a, b):
        assert isinstance(result, GenerationError) and not result.retryable
        assert "was saved 2 times with different generations" in result.message
        assert f"{path}:1 (instance a)" in result.message and f"{path}:2 (instance b)" in result.message
    assert [g.text for g in c] == ["z"]


def test_stages_disambiguate_a_prompt_saved_in_several_stages(tmp_path: Path) -> None:
    save(
        tmp_path,
        "t",
        [req("a", "same"), req("a", "same", stage=2)],
        [pred("a", "first"), pred("a", "second", stage=2)],
    )
    s1, s2 = ReplayProvider.from_path(tmp_path).generate([req("a", "same"), req("a", "same", stage=2)])
    assert [g.text for g in s1] == ["first"] and [g.text for g in s2] == ["second"]


def test_a_prompt_saved_by_two_task_files_serves_each_task_its_own(tmp_path: Path) -> None:
    """The plugin's own run dir names the task of each file: two tasks may share a prompt."""
    save(tmp_path, "one", [req("a", "same")], [pred("a", "x")])
    two = save(tmp_path, "two", [req("q7", "same")], [pred("q7", "y")])
    provider = ReplayProvider.from_path(tmp_path)
    (mine,) = provider.generate([req("a", "same", task="one")])
    (theirs,) = provider.generate([req("q7", "same", task="two")])
    assert [g.text for g in mine] == ["x"] and [g.text for g in theirs] == ["y"]
    (other,) = provider.generate([req("a", "same", task="three")])  # no file of its own: the prompt alone
    assert isinstance(other, GenerationError) and "different generations" in other.message
    (gens,) = ReplayProvider.from_path(two).generate([req("a", "same")])
    assert [g.text for g in gens] == ["y"]


def test_a_directory_of_several_models_is_rejected_naming_files(tmp_path: Path) -> None:
    one = save(tmp_path, "one", [req("a")], [pred("a", "x", model="model-a")])
    two = save(tmp_path, "two", [req("b")], [pred("b", "y", model="model-b")])
    with pytest.raises(EvalReplayError) as info:
        ReplayProvider.from_path(tmp_path)
    message = str(info.value)
    assert "2 models" in message and "'model-a'" in message and "'model-b'" in message
    assert str(one) in message and str(two) in message
    assert ReplayProvider.from_path(one).model == "model-a"


# -- bad saved files ----------------------------------------------------------


def test_a_predictions_row_without_a_requests_row_is_rejected(tmp_path: Path) -> None:
    path = save(tmp_path, "t", [req("a")], [pred("a", "x"), pred("ghost", "y")])
    with pytest.raises(EvalReplayError, match=rf"{re.escape(str(path))}:2: .*'ghost'.*t-requests\.jsonl"):
        ReplayProvider.from_path(tmp_path)


def test_a_predictions_file_without_its_requests_file_is_rejected(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "t-predictions.jsonl", [pred("a", "x")])
    with pytest.raises(EvalReplayError, match=r"no t-requests\.jsonl beside it"):
        ReplayProvider.from_path(path)


@pytest.mark.parametrize("which", ["requests", "predictions"])
def test_a_malformed_line_names_file_and_line(tmp_path: Path, which: str) -> None:
    save(tmp_path, "t", [req("a"), req("b")], [pred("a", "x"), pred("b", "y")])
    path = tmp_path / f"t-{which}.jsonl"
    lines = path.read_bytes().splitlines()
    path.write_bytes(lines[0] + b"\n\n" + lines[1][:-5] + b"\n")
    with pytest.raises(EvalReplayError, match=rf"{re.escape(str(path))}:3: not valid JSON"):
        ReplayProvider.from_path(tmp_path)


def test_a_malformed_saved_generation_fails_its_request_only(tmp_path: Path) -> None:
    bad = pred("b", "y")
    bad["generations"] = [{"no_text": 1}]
    path = save(tmp_path, "t", [req("a"), req("b")], [pred("a", "x"), bad])
    a, b = ReplayProvider.from_path(tmp_path).generate([req("a"), req("b")])
    assert [g.text for g in a] == ["x"]
    assert isinstance(b, GenerationError) and not b.retryable
    assert f"{path}:2" in b.message


def test_a_nonexistent_path_says_what_can_be_read(tmp_path: Path) -> None:
    with pytest.raises(EvalReplayError, match=r"no such file or directory.*evalreplay_predictions"):
        ReplayProvider.from_path(tmp_path / "missing")


# -- requests replay cannot answer ---------------------------------------------


def ll_pred(iid: str, pairs: list[tuple[float, bool]], model: str | None = "m") -> dict[str, Any]:
    gen = {"text": "", "finish_reason": None, "prompt_tokens": None, "completion_tokens": None}
    return {
        "instance_id": iid,
        "model": model,
        "generations": [{**gen, "loglikelihoods": pairs}],
        "scores": {},
    }


CAPITAL = req(
    "a", "Paris is the capital of", request_type="loglikelihood", continuations=(" France", " Spain")
)


def test_loglikelihood_saves_are_served_by_prompt_and_continuations(tmp_path: Path) -> None:
    save(tmp_path, "t", [CAPITAL, req("b")], [ll_pred("a", [(-1.5, True), (-7.0, False)]), pred("b", "y")])
    provider = ReplayProvider.from_path(tmp_path)
    assert provider.index.skipped == 0 and len(provider.index) == 2
    (served,) = provider.loglikelihood([CAPITAL])
    assert served == [(-1.5, True), (-7.0, False)]


def test_a_loglikelihood_save_answers_no_generation_and_the_other_way_round(tmp_path: Path) -> None:
    save(tmp_path, "t", [CAPITAL, req("b")], [ll_pred("a", [(-1.5, True), (-7.0, False)]), pred("b", "y")])
    provider = ReplayProvider.from_path(tmp_path)
    (as_generate,) = provider.generate([req("a", "Paris is the capital of")])
    assert isinstance(as_generate, GenerationError) and not as_generate.retryable
    assert "saved with log-likelihoods of answer choices only" in as_generate.message
    (as_ll,) = provider.loglikelihood([req("b", request_type="loglikelihood", continuations=(" y",))])
    assert isinstance(as_ll, GenerationError) and "was saved as a generation" in as_ll.message


def test_other_continuations_are_an_error_naming_the_save_and_the_first_difference(tmp_path: Path) -> None:
    path = save(tmp_path, "t", [CAPITAL], [ll_pred("a", [(-1.5, True), (-7.0, False)])])
    provider = ReplayProvider.from_path(tmp_path)
    other = req(
        "a", "Paris is the capital of", request_type="loglikelihood", continuations=(" France", " Italy")
    )
    (err,) = provider.loglikelihood([other])
    assert isinstance(err, GenerationError) and not err.retryable
    assert f"{path}:1" in err.message
    assert "continuation 1 is ' Spain' there and ' Italy' here" in err.message
    fewer = req("a", "Paris is the capital of", request_type="loglikelihood", continuations=(" France",))
    (err,) = provider.loglikelihood([fewer])
    assert isinstance(err, GenerationError) and "it has 2 continuations and this request 1" in err.message


def test_a_loglikelihood_save_with_the_wrong_number_of_pairs_is_an_error(tmp_path: Path) -> None:
    path = save(tmp_path, "t", [CAPITAL], [ll_pred("a", [(-1.5, True)])])
    (err,) = ReplayProvider.from_path(tmp_path).loglikelihood([CAPITAL])
    assert isinstance(err, GenerationError)
    assert f"{path}:1 holds 1 log-likelihoods for 2 continuations" in err.message


def test_a_loglikelihood_requests_row_without_continuations_is_refused_at_load(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a", "Paris", request_type="loglikelihood")], [ll_pred("a", [(-1.0, True)])])
    with pytest.raises(
        EvalReplayError, match=r"t-requests.jsonl:1: 'continuations' must be a non-empty list"
    ):
        ReplayProvider.from_path(tmp_path)


def test_image_and_tool_requests_are_generation_errors(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a", "look")], [pred("a", "a cat")])
    provider = ReplayProvider.from_path(tmp_path)
    image, tool = provider.generate(
        [
            req("a", "look", images=("cat.png",)),
            req("a", "look", tools=({"type": "function", "function": {"name": "f"}},)),
        ]
    )
    assert isinstance(image, GenerationError) and "images" in image.message and not image.retryable
    assert isinstance(tool, GenerationError) and "tools" in tool.message and not tool.retryable


def test_saves_of_image_requests_are_skipped(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a", "look", images=("cat.png",))], [pred("a", "a cat")])
    provider = ReplayProvider.from_path(tmp_path)
    (result,) = provider.generate([req("a", "look")])
    assert isinstance(result, GenerationError) and provider.index.skipped == 1


# -- samples and rollouts -----------------------------------------------------


def test_a_sample_count_mismatch_is_an_error(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a", num_samples=2)], [pred("a", "x", "y")])
    provider = ReplayProvider.from_path(tmp_path)
    (fewer, more, exact) = provider.generate(
        [
            req("a", num_samples=3),
            req("a", num_samples=1),
            req("a", num_samples=2),
        ]
    )
    assert isinstance(fewer, GenerationError) and not fewer.retryable
    assert "saved sample count 2 differs from num_samples 3" in fewer.message
    assert isinstance(more, GenerationError)
    assert "saved sample count 2 differs from num_samples 1" in more.message
    assert [g.text for g in exact] == ["x", "y"]


def test_only_the_wanted_rollouts_are_served_in_their_order(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a", num_samples=3)], [pred("a", "r0", "r1", "r2")])
    (gens,) = ReplayProvider.from_path(tmp_path).generate([req("a", num_samples=3, rollouts=(2, 0))])
    assert [g.text for g in gens] == ["r2", "r0"]


def test_a_row_with_some_rollouts_counts_only_those(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a", num_samples=3)], [pred("a", "r0", "r2", rollouts=[0, 2])])
    (result,) = ReplayProvider.from_path(tmp_path).generate([req("a", num_samples=3)])
    assert isinstance(result, GenerationError)
    assert "saved sample count 2 differs from num_samples 3" in result.message


def test_rows_appended_by_a_resumed_run_are_merged(tmp_path: Path) -> None:
    request = req("a", num_samples=3)
    save(
        tmp_path,
        "t",
        [request, request],
        [pred("a", "r0", "r1", rollouts=[0, 1]), pred("a", "r1", "r2", rollouts=[1, 2])],
    )
    (gens,) = ReplayProvider.from_path(tmp_path).generate([request])
    assert [g.text for g in gens] == ["r0", "r1", "r2"]


@pytest.mark.parametrize("layout", ["one row after another", "appended by a resumed run"])
def test_conflicting_saves_of_one_sample_fail_naming_both_lines(tmp_path: Path, layout: str) -> None:
    request = req("a", num_samples=2)
    rows = (
        [pred("a", "r0", "r1"), pred("a", "r0", "other")]
        if layout == "one row after another"
        else [pred("a", "r0", "r1"), pred("a", "other", rollouts=[1])]
    )
    path = save(tmp_path, "t", [request, request], rows)
    (result,) = ReplayProvider.from_path(tmp_path).generate([request])
    assert isinstance(result, GenerationError) and not result.retryable
    assert "conflicting saves" in result.message
    assert f"{path}:1" in result.message and f"{path}:2" in result.message
    assert "'r1'" in result.message and "'other'" in result.message


def test_identical_duplicate_rows_are_one_save(tmp_path: Path) -> None:
    request = req("a", num_samples=2)
    save(tmp_path, "t", [request, request], [pred("a", "r0", "r1"), pred("a", "r0", "r1")])
    (gens,) = ReplayProvider.from_path(tmp_path).generate([request])
    assert [g.text for g in gens] == ["r0", "r1"]


# -- the provider's surface ---------------------------------------------------


def test_provider_attributes(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a")], [pred("a", "x", model="org/model-7b")])
    provider = ReplayProvider.from_path(tmp_path)
    assert provider.kind == "replay" and provider.model == "org/model-7b"
    assert provider.batch_size is None
    assert provider.generate([]) == []
    provider.close()
    assert "1 prompts" in repr(provider)


def test_the_manifest_names_the_model_when_rows_do_not(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a")], [pred("a", "x", model=None)])
    (tmp_path / "manifest.json").write_bytes(orjson.dumps({"format": "evalreplay/1", "model": "m0"}))
    assert ReplayProvider.from_path(tmp_path).model == "m0"


def test_from_settings_without_predictions_names_the_option_and_ini_key() -> None:
    with pytest.raises(EvalReplayError) as info:
        from_settings(Settings())
    assert "--evalreplay-predictions" in str(info.value)
    assert "evalreplay_predictions" in str(info.value)


def test_from_settings_and_the_builtin_kind(tmp_path: Path) -> None:
    save(tmp_path, "t", [req("a")], [pred("a", "x")])
    provider = make_builtin("replay", Settings(predictions=tmp_path))
    assert isinstance(provider, ReplayProvider)
    assert isinstance(from_settings(Settings(predictions=tmp_path)), ReplayProvider)


# -- keys survive the files ---------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": _text},
    optional={"name": _text, "weight": st.integers(-5, 5) | st.floats(allow_nan=False)},
)
_context = _text | st.lists(_message, min_size=1, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.tuples(_context, st.none() | _text), min_size=1, max_size=5), answer=_text)
def test_any_prompt_round_trips_through_the_written_files(
    tmp_path_factory: pytest.TempPathFactory, prompts: list[tuple[Any, str | None]], answer: str
) -> None:
    directory = tmp_path_factory.mktemp("run")
    requests = [req(f"i{n}", context, system_prompt=sp) for n, (context, sp) in enumerate(prompts)]
    save(directory, "t", requests, [pred(r.instance_id, answer) for r in requests])
    results = ReplayProvider.from_path(directory).generate(requests)
    # repeated prompts all saved the same answer, so every request is served
    assert results == [
        [Generation(text=answer, finish_reason="stop", prompt_tokens=3, completion_tokens=1)]
        for _ in requests
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4),
            st.lists(st.tuples(st.floats(-1e9, 0.0), st.booleans()), min_size=4, max_size=4),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_saved_log_likelihoods_come_back_exactly(tmp_path: Path, items: list[Any]) -> None:
    directory = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    requests = [
        req(
            f"i{n}",
            f"prompt {n}",
            request_type="loglikelihood",
            continuations=tuple(" " + c for c in choices),
        )
        for n, (choices, _) in enumerate(items)
    ]
    rows = [
        ll_pred(r.instance_id, [list(p) for p in pairs[: len(r.continuations)]])
        for r, (_, pairs) in zip(requests, items, strict=True)
    ]
    save(directory, "t", requests, rows)
    served = ReplayProvider.from_path(directory).loglikelihood(requests)
    assert served == [
        [tuple(p) for p in pairs[: len(r.continuations)]]
        for r, (_, pairs) in zip(requests, items, strict=True)
    ]


@pytest.mark.parametrize(
    ("field", "other"),
    [("finish_reason", "length"), ("completion_tokens", 9), ("prompt_tokens", 7), ("metadata", {"k": 1})],
)
@pytest.mark.parametrize("where", ["one instance saved twice", "two instances of one prompt"])
def test_saves_of_one_prompt_that_differ_in_what_replay_serves_are_not_served(
    tmp_path: Path, field: str, other: Any, where: str
) -> None:
    """Issue #30 case 12: two saves with one text but another finish_reason or
    token count both got the first save's."""
    first = pred("a", "same")
    second = pred("a" if where == "one instance saved twice" else "b", "same")
    second["generations"][0][field] = other
    requests = [req("a"), req("a" if where == "one instance saved twice" else "b", context="Q a?")]
    save(tmp_path, "t", requests, [first, second])
    (result,) = ReplayProvider.from_path(tmp_path).generate([req("a")])
    assert isinstance(result, GenerationError) and not result.retryable, result
    assert field in result.message


def test_saves_that_agree_on_everything_are_served(tmp_path: Path) -> None:
    requests = [req("a"), req("b", context="Q a?")]
    save(tmp_path, "t", requests, [pred("a", "same"), pred("b", "same")])
    (gens,) = ReplayProvider.from_path(tmp_path).generate([req("a")])
    assert [(g.text, g.finish_reason, g.completion_tokens) for g in gens] == [("same", "stop", 1)]
