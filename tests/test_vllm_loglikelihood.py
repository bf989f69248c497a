"""Loglikelihood requests on the vllm provider against a real vLLM engine,
checked against the same tiny model's log-probabilities computed with
transformers directly (float32, log_softmax over the logits). Skips where
vLLM is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import test_openai_provider
from llm_fixtures import ll_request

from pytest_evalreplay.model import GenerationError, Request
from pytest_evalreplay.providers.loglikelihood_requests import split_pairs

# Per token, as the issue asks: vLLM's float32 CPU kernels against transformers'.
NATS_PER_TOKEN = 1e-3

CASES: list[tuple[str, tuple[str, ...]]] = [
    ("Question: name a prime number. Answer:", (" seven", " four", " the lazy dog")),
    ("What is two plus two? The answer is ", ("four.", "five.")),  # trailing space moves
    ("The quick brown fox jumps over the", (" lazy dog.", " quick fox", " 0 1 2 3")),
    ("pytest collects tests, runs them,", (" and reports the results.", " and", " system user")),
]


# `vllm serve` on the tiny model, for the slow test (started only if it runs).
vllm_server = test_openai_provider.vllm_server


@pytest.fixture(scope="module")
def reference(tiny_llama: Path) -> Any:
    """(loglikelihood, is_greedy, n_tokens) of a context and continuation,
    by transformers, with lm-evaluation-harness's token split."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, torch_dtype=torch.float32).eval()

    def score(context: str, continuation: str) -> tuple[float, bool, int]:
        stripped = context.rstrip()
        continuation = context[len(stripped) :] + continuation
        ctx = tok.encode(stripped)
        whole = tok.encode(stripped + continuation)
        with torch.no_grad():
            logits = model(torch.tensor([whole])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        positions = range(len(ctx), len(whole))
        total = sum(float(logprobs[p - 1, whole[p]]) for p in positions)
        greedy = all(int(logprobs[p - 1].argmax()) == whole[p] for p in positions)
        return total, greedy, len(positions)

    score.greedy_text = (
        lambda context, n: tok.decode(  # type: ignore[attr-defined]
            model.generate(torch.tensor([tok.encode(context)]), max_new_tokens=n, do_sample=False)[0][
                len(tok.encode(context)) :
            ]
        )
    )
    return score


def test_split_moves_trailing_whitespace() -> None:
    pairs = split_pairs("Answer: \n", [" a", "b"])
    assert pairs.context == "Answer:"
    assert pairs.continuations == (" \n a", " \nb")
    assert pairs.wholes() == ("Answer: \n a", "Answer: \nb")
    assert split_pairs("x", ["y"]).continuations == ("y",)


def test_loglikelihoods_match_transformers(vllm_provider: Any, reference: Any) -> None:
    # A continuation the model itself would pick, so is_greedy is tested both ways.
    greedy_context = "The quick brown fox"
    cases = [*CASES, (greedy_context, (reference.greedy_text(greedy_context, 3), " jumps"))]
    requests = [ll_request(c, conts, iid=f"q{n}") for n, (c, conts) in enumerate(cases)]
    results = vllm_provider.loglikelihood(requests)
    greedy_seen = set()
    for (context, continuations), result in zip(cases, results, strict=True):
        assert not isinstance(result, GenerationError), result
        assert len(result) == len(continuations)
        for continuation, (ll, greedy) in zip(continuations, result, strict=True):
            want, want_greedy, n_tokens = reference(context, continuation)
            assert n_tokens >= 1
            assert abs(ll - want) <= NATS_PER_TOKEN * n_tokens, (context, continuation, ll, want)
            assert greedy is want_greedy, (context, continuation)
            greedy_seen.add(greedy)
    assert greedy_seen == {True, False}


def test_stream_yields_each_request_once_and_matches_the_batch(vllm_provider: Any) -> None:
    requests = [ll_request(c, conts, iid=f"q{n}") for n, (c, conts) in enumerate(CASES)]
    streamed = dict(vllm_provider.loglikelihood_stream(requests))
    assert sorted(streamed) == list(range(len(CASES)))
    assert [streamed[i] for i in range(len(CASES))] == vllm_provider.loglikelihood(requests)


def test_a_system_prompt_is_prefixed_as_for_generation(vllm_provider: Any, reference: Any) -> None:
    (result,) = vllm_provider.loglikelihood([ll_request("Answer:", (" seven",), system_prompt="Be brief.")])
    ll, _ = result[0]
    want, _, n_tokens = reference("Be brief.\n\nAnswer:", " seven")
    assert abs(ll - want) <= NATS_PER_TOKEN * n_tokens


def test_repeated_continuations_are_scored_once(vllm_provider: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = vllm_provider.llm
    calls: list[int] = []
    enqueue = llm.enqueue

    def spy(prompts: Any, params: Any, **kwargs: Any) -> Any:
        calls.append(len(prompts))
        return enqueue(prompts, params, **kwargs)

    monkeypatch.setattr(llm, "enqueue", spy)
    (result,) = vllm_provider.loglikelihood([ll_request("Answer:", (" a", " b", " a"))])
    assert not isinstance(result, GenerationError)
    assert calls == [2]
    assert result[0] == result[2] and len(result) == 3


def test_requests_it_cannot_score_fail_alone(vllm_provider: Any) -> None:
    chat = ll_request([{"role": "user", "content": "Hi"}], (" a",))
    image = ll_request("Look:", (" a",), images=("img.png",))
    generate = Request(task="t", instance_id="g", context="Hi")
    empty = ll_request("", ("seven",))  # the tiny tokenizer adds no start token
    long = ll_request("0 1 2 3 " * 200, (" 4",))
    good = ll_request("Answer:", (" seven",))
    results = vllm_provider.loglikelihood([chat, image, generate, empty, long, good])
    messages = []
    for r in results[:5]:
        assert isinstance(r, GenerationError) and not r.retryable, r
        messages.append(r.message)
    assert "chat context" in messages[0]
    assert "images" in messages[1]
    assert "'generate' requests" in messages[2]
    assert "context is empty" in messages[3]
    assert "max_model_len" in messages[4]
    assert not isinstance(results[5], GenerationError) and len(results[5]) == 1


def test_closing_the_stream_aborts_what_is_in_flight(vllm_provider: Any) -> None:
    engine = vllm_provider.llm.llm_engine
    bad = ll_request([{"role": "user", "content": "Hi"}], (" a",))
    requests = [bad, *(ll_request(c, conts, iid=f"q{n}") for n, (c, conts) in enumerate(CASES))]
    stream = vllm_provider.loglikelihood_stream(requests)
    index, result = next(stream)  # the refused one comes first, before any step
    assert index == 0 and isinstance(result, GenerationError)
    stream.close()
    assert not engine.has_unfinished_requests()
    assert vllm_provider._in_flight == {}
    assert not isinstance(vllm_provider.loglikelihood(requests[1:2])[0], GenerationError)


def test_loglikelihood_and_generation_streams_nest(vllm_provider: Any) -> None:
    """A loglikelihood call while a generation stream is open: each gets its own results."""

    def gen(iid: str, tokens: int) -> Request:
        return Request(
            task="t", instance_id=iid, context="The quick", sampling={"max_tokens": tokens, "temperature": 0}
        )

    outer = vllm_provider.generate_stream([gen("short", 1), gen("long", 40)])
    first = next(outer)
    inner = vllm_provider.loglikelihood([ll_request(c, conts) for c, conts in CASES])
    assert not any(isinstance(r, GenerationError) for r in inner)
    rest = list(outer)
    assert sorted(i for i, _ in [first, *rest]) == [0, 1]
    assert not any(isinstance(r, GenerationError) for _, r in [first, *rest])


@pytest.mark.slow
def test_openai_provider_on_the_real_server_matches_transformers(
    vllm_server: str, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same check through `vllm serve` (echo + logprobs on /completions)."""
    from pytest_evalreplay.providers.openai import OpenAIProvider

    name, key = test_openai_provider.SERVED_NAME, test_openai_provider.SERVER_KEY

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("EVALREPLAY_API_KEY", key)
    greedy_context = "The quick brown fox"
    cases = [*CASES, (greedy_context, (reference.greedy_text(greedy_context, 3), " jumps"))]
    requests = [ll_request(c, conts, iid=f"q{n}") for n, (c, conts) in enumerate(cases)]
    with OpenAIProvider(vllm_server, name, concurrency=4, timeout=60, retries=1) as provider:
        results = provider.loglikelihood(requests)
    greedy_seen = set()
    for (context, continuations), result in zip(cases, results, strict=True):
        assert not isinstance(result, GenerationError), result
        for continuation, (ll, greedy) in zip(continuations, result, strict=True):
            want, want_greedy, n_tokens = reference(context, continuation)
            assert abs(ll - want) <= NATS_PER_TOKEN * n_tokens, (context, continuation, ll, want)
            assert greedy is want_greedy, (context, continuation)
            greedy_seen.add(greedy)
    assert greedy_seen == {True, False}
