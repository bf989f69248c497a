"""loglikelihood_rolling requests: lm-eval's rolling windows (pure), the
answer's rows, the contract check, and the openai provider against the
local stub (tests/http_stub.py serves `/tokenize`, `/tokenizer_info` and
token-id echoes as `vllm serve` does). The side-by-side with lm-eval itself
is in test_lm_eval.py, the vLLM engine's in test_lm_eval_vllm.py."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import orjson
import pytest
from http_stub import Fail, StubServer
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_fixtures import stub_provider
from lm_eval_tasks import needs_lm_eval, our_metrics, run_plugin, write_tiny_ppl
from stub_logprobs import detokenize, token_ids, token_logprob

from pytest_evalreplay.formats.jsonl import generation_from_row
from pytest_evalreplay.model import (
    EvalReplayError,
    Generation,
    GenerationError,
    Request,
    RollingLoglikelihood,
    request_digest,
)
from pytest_evalreplay.providers.openai import OpenAIProvider
from pytest_evalreplay.providers.openai_rolling import ROUTES
from pytest_evalreplay.providers.rolling_requests import Window, rolling_windows
from pytest_evalreplay.run.execution import check_result

pytestmark = pytest.mark.usefixtures("no_api_key")


def rolling(text: str, iid: str = "0") -> Request:
    return Request(task="t", instance_id=iid, context=text, request_type="loglikelihood_rolling")


# -- the windows -------------------------------------------------------------------------


def test_a_text_longer_than_the_context_is_cut_into_windows_scoring_each_token_once() -> None:
    # context 5: at most 3 scored tokens a window, each window at most 4 tokens
    assert rolling_windows([1, 2, 3, 4, 5, 6, 7], prefix=0, max_length=5) == [
        Window((0,), (1, 2, 3)),
        Window((3,), (4, 5, 6)),
        Window((4, 5, 6), (7,)),
    ]
    assert rolling_windows([1, 2], prefix=0, max_length=5) == [Window((0,), (1, 2))]
    assert rolling_windows([], prefix=0, max_length=5) == []
    with pytest.raises(ValueError, match="no room for a window"):
        rolling_windows([1], prefix=0, max_length=2)


@given(st.lists(st.integers(0, 50), max_size=60), st.integers(3, 20))
def test_windows_cover_the_text_once_within_the_context(tokens: list[int], max_length: int) -> None:
    windows = rolling_windows(tokens, 99, max_length)
    assert [t for w in windows for t in w.scored] == tokens
    assert all(w.context and len(w.tokens) <= max_length - 1 for w in windows)
    assert all(len(w.scored) <= max_length - 2 for w in windows)


@pytest.mark.skipif(find_spec("lm_eval") is None, reason="lm-evaluation-harness is not installed")
@settings(deadline=None)  # the first example imports lm_eval
@given(st.lists(st.integers(0, 50), max_size=60), st.integers(3, 20))
def test_windows_are_lm_evals_own(tokens: list[int], max_length: int) -> None:
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    # as its API and vllm models call it: max_seq_len = the model's length - 2, context 1
    theirs = [make_disjoint_window(p) for p in get_rolling_token_windows(tokens, 99, max_length - 2, 1)]
    ours = rolling_windows(tokens, 99, max_length)
    assert [(list(w.context), list(w.scored)) for w in ours] == [(list(a), list(b)) for a, b in theirs]


# -- the answer in rows and in the contract ------------------------------------------------


def test_a_rolling_answer_round_trips_through_its_row(tmp_path: Path) -> None:
    gen = Generation(text="", rolling=RollingLoglikelihood(-12.5, 7))
    row = orjson.loads(orjson.dumps(gen.to_row()))
    assert row["rolling"] == {"loglikelihood": -12.5, "tokens": 7}
    assert Generation.from_row(row, "f:1") == gen
    assert generation_from_row(row, "f:1", 0) == gen
    assert gen.problem() is None


@pytest.mark.parametrize(
    "saved",
    [{"loglikelihood": "x", "tokens": 1}, {"loglikelihood": -1.0, "tokens": -1}, {"tokens": 1}, [1.0, 2]],
)
def test_a_bad_saved_rolling_answer_names_its_file_and_line(saved: object) -> None:
    row = {"text": "", "rolling": saved}
    with pytest.raises(EvalReplayError, match=r"^f:3: 'rolling' must be \{"):
        Generation.from_row(row, "f:3")
    with pytest.raises(EvalReplayError, match=r"^f:3: generations\[0\]: 'rolling' must be \{"):
        generation_from_row(row, "f:3", 0)


def test_a_provider_is_held_to_the_rolling_contract() -> None:
    request = rolling("a b c")
    (gen,) = check_result(request, RollingLoglikelihood(-3.0, 3))  # type: ignore[misc]
    assert gen.rolling == RollingLoglikelihood(-3.0, 3) and gen.text == ""
    wrong = check_result(request, [(-3.0, False)])
    assert isinstance(wrong, GenerationError) and not wrong.retryable
    assert "expected a RollingLoglikelihood(loglikelihood, tokens)" in wrong.message
    nan = check_result(request, RollingLoglikelihood(float("nan"), 3))
    assert isinstance(nan, GenerationError) and "bad rolling answer" in nan.message


def test_the_journal_key_tells_a_rolling_request_from_a_generation_of_the_same_text() -> None:
    text = "a b c"
    generate = Request(task="t", instance_id="0", context=text)
    assert request_digest(rolling(text)) != request_digest(generate)


# -- the openai provider -----------------------------------------------------------------


def expected_total(text: str, prefix: int, max_length: int) -> float:
    """The stub's log-probabilities summed over lm-eval's windows of `text`."""
    sums = []
    for window in rolling_windows(token_ids(text), prefix, max_length):
        words = detokenize(list(window.tokens))
        sums.append(sum(token_logprob(words[p], p) for p in range(len(window.context), len(words))))
    return sum(sums)


def test_the_openai_provider_sends_lm_evals_windows_and_sums_them(stub: StubServer) -> None:
    stub.bos, stub.max_model_len = True, 6
    text = " ".join(f"w{i}" for i in range(11))  # 11 tokens: windows of at most 4 scored
    with stub_provider(stub) as provider:
        (got,) = provider.loglikelihood([rolling(text)])
    prefix = token_ids("<s>")[0]
    assert got == RollingLoglikelihood(expected_total(text, prefix, 6), 11)
    (echo,) = [b for b in stub.bodies() if b.get("echo")]
    assert echo["max_tokens"] == 0 and echo["logprobs"] == 1
    assert echo["prompt"] == [list(w.tokens) for w in rolling_windows(token_ids(text), prefix, 6)]
    assert len(echo["prompt"]) == 3


def test_the_prefix_token_is_asked_once_and_a_short_text_is_one_window(stub: StubServer) -> None:
    stub.bos = True
    with stub_provider(stub) as provider:
        results = provider.loglikelihood([rolling("one two", "0"), rolling("three", "1"), rolling("", "2")])
    prefix = token_ids("<s>")[0]
    assert results == [
        RollingLoglikelihood(expected_total("one two", prefix, 2048), 2),
        RollingLoglikelihood(expected_total("three", prefix, 2048), 1),
        RollingLoglikelihood(0.0, 0),  # no token: nothing to score, no echo
    ]
    assert stub.count("answered") == 2  # one echo per text with tokens; the tokenizer calls aside


def test_an_echo_503_is_retried(stub: StubServer) -> None:
    stub.bos = True
    stub.script = [Fail(503, "busy")]
    with stub_provider(stub) as provider:
        (got,) = provider.loglikelihood([rolling("a b")])
    assert got == RollingLoglikelihood(expected_total("a b", token_ids("<s>")[0], 2048), 2)
    assert stub.received == 2


def test_a_server_without_the_tokenizer_routes_fails_the_request_saying_so(stub: StubServer) -> None:
    stub.bos = True
    # the base URL one level down: /../tokenize lands on /v1/tokenize, which is no route there
    url = stub.url.replace("/v1", "/v1/v1")
    with OpenAIProvider(url, "stub-model", retries=0, timeout=30.0) as provider:
        (got,) = provider.loglikelihood([rolling("a b")])
    assert isinstance(got, GenerationError) and not got.retryable
    assert got.message.startswith(ROUTES) and "HTTP 404" in got.message
    assert "/v1/tokenizer_info" in got.message


def test_a_server_that_gives_no_context_length_fails_the_request(stub: StubServer) -> None:
    stub.bos, stub.max_model_len = True, None
    with stub_provider(stub) as provider:
        (got,) = provider.loglikelihood([rolling("a b")])
    assert isinstance(got, GenerationError) and not got.retryable
    assert "gives no max_model_len" in got.message


def test_a_server_naming_no_special_token_fails_the_request(stub: StubServer) -> None:
    with stub_provider(stub) as provider:
        (got,) = provider.loglikelihood([rolling("a b")])
    assert isinstance(got, GenerationError) and "names no bos_token or eos_token" in got.message


def test_a_chat_context_is_refused_without_a_call(stub: StubServer) -> None:
    request = Request(
        task="t",
        instance_id="0",
        context=[{"role": "user", "content": "x"}],
        request_type="loglikelihood_rolling",
    )
    with stub_provider(stub) as provider:
        (got,) = provider.loglikelihood([request])
    assert isinstance(got, GenerationError) and "chat context" in got.message
    assert not [b for b in stub.bodies() if "prompt" in b]


# -- from_lm_eval: the journal and replay ------------------------------------------------

NO_OPENAI = "import sys\nsys.modules['pytest_evalreplay.providers.openai'] = None\n"


@needs_lm_eval
def test_a_rolling_task_resumes_from_its_journal_and_replays_without_the_provider(
    tmp_path: Path, stub: StubServer
) -> None:
    stub.bos, stub.eos, stub.max_model_len = True, "</s>", 8  # texts of up to 20 words: several windows
    write_tiny_ppl(tmp_path / "tasks", n=6, words=(3, 20))
    done = run_plugin(tmp_path, stub, name="tiny_ppl")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first = our_metrics(tmp_path, "tiny_ppl")
    assert set(first) == {"word_perplexity", "byte_perplexity", "bits_per_byte"}
    rows = [
        orjson.loads(line)
        for line in (tmp_path / "run" / "tiny_ppl-predictions.jsonl").read_bytes().splitlines()
    ]
    assert all(set(r["generations"][0]["rolling"]) == {"loglikelihood", "tokens"} for r in rows)
    requests = (tmp_path / "run" / "tiny_ppl-requests.jsonl").read_bytes().splitlines()
    assert all(orjson.loads(r)["request_type"] == "loglikelihood_rolling" for r in requests)
    asked = stub.received

    resumed = run_plugin(tmp_path, stub, "--resume", name="tiny_ppl")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "0 generated, 6 reused" in resumed.stdout
    assert stub.received == asked
    assert our_metrics(tmp_path, "tiny_ppl") == first

    (tmp_path / "conftest.py").write_text(NO_OPENAI, encoding="utf-8")
    replayed = run_plugin(
        tmp_path, stub, "--evalreplay-predictions=run", "--evalreplay-output=replayed", name="tiny_ppl"
    )
    assert replayed.returncode == 0, replayed.stdout[-3000:] + replayed.stderr[-3000:]
    metrics = orjson.loads((tmp_path / "replayed" / "tiny_ppl-metrics.json").read_bytes())["metrics"]
    assert metrics == first and stub.received == asked


# -- the vllm provider's plan (pure: no engine) --------------------------------------------


def test_the_vllm_provider_asks_each_window_and_sums_their_scores() -> None:
    from pytest_evalreplay.providers.vllm_loglikelihood import ScoreStream, plan_rolling

    encode = {"a b c d e f g": [1, 2, 3, 4, 5, 6, 7]}.__getitem__
    plan = plan_rolling(rolling("a b c d e f g"), encode, prefix=0, max_model_len=5)
    assert not isinstance(plan, GenerationError)
    assert plan.prompts == ((0, 1, 2, 3), (3, 4, 5, 6), (4, 5, 6, 7))
    assert plan.starts == (1, 1, 3)
    stream = ScoreStream()
    stream.answer(0, plan, [(-1.5, True), (-2.25, False), (-0.5, True)])
    assert list(stream.ready) == [(0, RollingLoglikelihood(-4.25, 7))]
    no_prefix = plan_rolling(rolling("x"), encode, prefix=None, max_model_len=5)
    assert isinstance(no_prefix, GenerationError) and "no start or end-of-text token" in no_prefix.message
    unknown = plan_rolling(rolling("x"), encode, prefix=0, max_model_len=None)
    assert isinstance(unknown, GenerationError) and "the engine gives no max_model_len" in unknown.message


# -- replay ------------------------------------------------------------------------------


def test_replay_serves_a_rolling_save_to_a_rolling_request_only(tmp_path: Path) -> None:
    from test_replay_provider import jsonl

    from pytest_evalreplay.providers.replay import ReplayProvider
    from pytest_evalreplay.storage.runschema import request_row_of

    answer = Generation(text="", rolling=RollingLoglikelihood(-7.25, 3))
    rolled, generated = rolling("a b c", "0"), Request(task="t", instance_id="1", context="d e")
    jsonl(tmp_path / "t-requests.jsonl", [request_row_of(rolled), request_row_of(generated)])
    rows = [
        {"instance_id": "0", "model": "m", "generations": [answer.to_row()], "scores": {}},
        {"instance_id": "1", "model": "m", "generations": [{"text": "f"}], "scores": {}},
    ]
    jsonl(tmp_path / "t-predictions.jsonl", rows)
    provider = ReplayProvider.from_path(tmp_path)
    assert provider.loglikelihood([rolled]) == [RollingLoglikelihood(-7.25, 3)]
    (wrong,) = provider.loglikelihood([rolling("d e", "1")])
    assert (
        isinstance(wrong, GenerationError)
        and "was not saved with its rolling log-likelihood" in wrong.message
    )
    (as_text,) = provider.generate([Request(task="t", instance_id="0", context="a b c")])
    assert isinstance(as_text, GenerationError)  # a rolling save is no generation
    assert provider.generate([generated])[0][0].text == "f"  # type: ignore[index]
