"""The vllm provider against a real vLLM engine running a tiny random Llama.

No mock engine: batching is checked with a spy that records and forwards the
real `LLM.generate` / `LLM.chat` calls. The engine starts once per session
(the `vllm_provider` fixture); these tests skip where vLLM is not installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
from llm_fixtures import make_request

from pytest_evalreplay.model import EvalReplayError, Generation, GenerationError, Request
from pytest_evalreplay.options import Settings
from pytest_evalreplay.providers import vllm as vllm_mod

MAX_TOKENS = 8


def req(context: Any, *args: Any, **sampling: Any) -> Request:
    sampling.setdefault("max_tokens", MAX_TOKENS)
    return make_request(context, *args, **sampling)


class Spy:
    """Records each call of a real engine method, then forwards it."""

    def __init__(self, method: Callable[..., Any]) -> None:
        self.method = method
        self.calls: list[tuple[list[Any], list[Any]]] = []

    def __call__(self, prompts: Any, params: Any, **kwargs: Any) -> Any:
        self.calls.append((list(prompts), list(params)))
        return self.method(prompts, params, **kwargs)


@pytest.fixture
def spies(vllm_provider: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Spy]:
    llm = vllm_provider.llm
    out = {}
    for name in ("generate", "chat"):
        spy = Spy(getattr(llm, name))
        monkeypatch.setattr(llm, name, spy)
        out[name] = spy
    return out


def ok(result: Any) -> list[Generation]:
    assert isinstance(result, list), result
    assert all(isinstance(g, Generation) for g in result)
    return result


# -- no engine needed ----------------------------------------------------------


def test_model_is_required() -> None:
    with pytest.raises(EvalReplayError, match="--evalreplay-model"):
        vllm_mod.from_settings(Settings(provider="vllm"))


def test_missing_vllm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes find_spec/import fail
    with pytest.raises(EvalReplayError) as info:
        vllm_mod.from_settings(Settings(provider="vllm", model="m"))
    assert str(info.value) == "the vllm provider needs vLLM: pip install 'pytest-evalreplay[vllm]'"


def test_provider_is_lazy_and_close_is_idempotent() -> None:
    provider = vllm_mod.VllmProvider("some/model", {"dtype": "float32"})
    assert (provider.kind, provider.model, provider.batch_size) == ("vllm", "some/model", None)
    assert provider._llm is None
    provider.close()
    provider.close()


def test_unsupported_requests_never_start_an_engine() -> None:
    provider = vllm_mod.VllmProvider("some/model")
    out = provider.generate(
        [
            Request(task="t", instance_id="a", context="x", request_type="loglikelihood"),
            Request(task="t", instance_id="b", context="x", images=("img.png",)),
        ]
    )
    assert all(isinstance(r, GenerationError) and not r.retryable for r in out)
    assert provider._llm is None


# -- real engine ---------------------------------------------------------------


def test_one_generate_call_for_the_whole_batch(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    requests = [req(f"Question {i}: what is {i} plus {i}?", iid=f"q{i}", seed=i) for i in range(6)]
    requests += [req("Unseeded sampling", iid="u", num_samples=3, temperature=1.0)]
    out = vllm_provider.generate(requests)
    assert len(spies["generate"].calls) == 1
    assert spies["chat"].calls == []
    prompts, params = spies["generate"].calls[0]
    assert len(prompts) == 7
    assert [p.n for p in params] == [1] * 6 + [3]
    for request, result in zip(requests, out, strict=True):
        gens = ok(result)
        assert len(gens) == len(request.rollouts)
        for g in gens:
            assert g.finish_reason in ("stop", "length")
            assert g.prompt_tokens and g.prompt_tokens > 0
            assert 0 < g.completion_tokens <= MAX_TOKENS  # type: ignore[operator]
            assert g.original_text is None


def test_n_samples_in_one_request(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    out = vllm_provider.generate([req("Sample me", num_samples=4, temperature=1.0, ignore_eos=True)])
    gens = ok(out[0])
    assert len(gens) == 4
    ((_, params),) = spies["generate"].calls
    assert len(params) == 1 and params[0].n == 4 and params[0].seed is None
    assert len({g.text for g in gens}) > 1  # real samples, not one text repeated
    assert all(g.completion_tokens == MAX_TOKENS and g.finish_reason == "length" for g in gens)


def test_seeded_rollouts_reproduce_alone(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    full = ok(vllm_provider.generate([req("Seeded", num_samples=3, seed=7, ignore_eos=True)])[0])
    ((_, params),) = spies["generate"].calls
    assert [(p.n, p.seed) for p in params] == [(1, 7), (1, 8), (1, 9)]
    assert len({g.text for g in full}) == 3  # each rollout its own seed
    # A resumed run asks only for the rollouts it is missing.
    alone = vllm_provider.generate(
        [
            req("Seeded", num_samples=3, rollouts=(2,), seed=7, ignore_eos=True),
            req("Seeded", num_samples=3, rollouts=(0, 1), seed=7, ignore_eos=True),
        ]
    )
    assert [g.text for g in ok(alone[0])] == [full[2].text]
    assert [g.text for g in ok(alone[1])] == [full[0].text, full[1].text]


def test_greedy_with_several_samples(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    out = vllm_provider.generate([req("Greedy", num_samples=3, temperature=0)])
    gens = ok(out[0])
    assert len(gens) == 3
    assert len({g.text for g in gens}) == 1
    ((_, params),) = spies["generate"].calls
    assert [p.n for p in params] == [1, 1, 1]


def test_too_long_prompt_fails_alone(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    long_text = "0 1 2 3 4 5 6 7 8 9 " * 200
    requests = [
        req("short one", iid="a"),
        req(long_text, iid="long-text"),
        req([{"role": "user", "content": "hello"}], iid="b"),
        req([{"role": "user", "content": long_text}], iid="long-chat"),
        req([{"role": "user", "content": "bye"}], iid="c"),
        req("short two", iid="d"),
    ]
    out = vllm_provider.generate(requests)
    for i in (0, 2, 4, 5):
        assert len(ok(out[i])) == 1
    for i in (1, 3):
        err = out[i]
        assert isinstance(err, GenerationError) and not err.retryable, err
        assert "256" in err.message  # names the context limit
    # The text one is caught before vLLM sees it: one generate call, no retry.
    assert len(spies["generate"].calls) == 1
    assert len(spies["generate"].calls[0][0]) == 2


def test_chat_uses_the_chat_template(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    messages = [{"role": "user", "content": "What is two plus two?"}]
    out = vllm_provider.generate(
        [
            req(messages, iid="plain"),
            req(messages, iid="sys", system_prompt="Answer briefly."),
            req("text too", iid="text"),
        ]
    )
    assert len(spies["chat"].calls) == 1 and len(spies["generate"].calls) == 1
    conversations, _ = spies["chat"].calls[0]
    assert conversations[0] == messages
    assert conversations[1] == [{"role": "system", "content": "Answer briefly."}, *messages]
    tok = vllm_provider.llm.get_tokenizer()
    for conv, result in zip(conversations, out[:2], strict=True):
        expected = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert expected.endswith("<|assistant|>")
        (g,) = ok(result)
        assert g.prompt_tokens == len(tok.encode(expected, add_special_tokens=False))


def test_text_system_prompt_is_prefixed(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    out = vllm_provider.generate([req("What is 2+2?", system_prompt="Answer briefly.")])
    (g,) = ok(out[0])
    ids = vllm_provider.llm.get_tokenizer().encode("Answer briefly.\n\nWhat is 2+2?")
    assert spies["generate"].calls[0][0] == [{"prompt_token_ids": ids}]
    assert g.prompt_tokens == len(ids)


def test_bad_sampling_fails_only_its_request(vllm_provider: Any) -> None:
    out = vllm_provider.generate(
        [
            req("fine", iid="a"),
            req("typo", iid="b", temprature=0.5),
            req("n", iid="c", n=4),
            req("range", iid="d", top_p=7.0),
        ]
    )
    assert len(ok(out[0])) == 1
    for err, word in zip(out[1:], ("'temprature'", "num_samples", "top_p"), strict=True):
        assert isinstance(err, GenerationError) and not err.retryable
        assert word in err.message


def test_evaluate_end_to_end(vllm_provider: Any) -> None:
    from pytest_evalreplay.task import EvalTask

    task = EvalTask(
        "tiny",
        [{"id": str(i), "q": f"{i}+{i}", "target": str(2 * i)} for i in range(4)],
        prompt="Q: {q}\nA:",
        scorer=lambda text, inst: float(inst["target"] in text),
        num_samples=2,
        sampling={"temperature": 0.8, "seed": 1, "max_tokens": 4},
    )
    result = task.evaluate(vllm_provider)
    assert result.errors == {}
    assert len(result.rollouts) == 8
    assert set(result.scores) == {"0", "1", "2", "3"}


# -- the plugin end to end: generate with vLLM, then replay without it --------------

ROUND_TRIP_EVALS = """
from pytest_evalreplay import EvalTask

INSTANCES = [{"id": f"q{i}", "q": f"{i} plus {i}", "target": str(2 * i)} for i in range(5)]

def score(text, instance):
    return {"has_target": float(instance["target"] in text), "length": float(len(text))}

qa = EvalTask(
    "qa",
    INSTANCES,
    prompt="Question: what is {q}?\\nAnswer:",
    system_prompt="Answer with a number.",
    scorer=score,
    num_samples=3,
    sampling={"temperature": 0.9, "seed": 11, "max_tokens": 6},
)

chat = EvalTask(
    "chat",
    INSTANCES,
    prompt=lambda inst: [{"role": "user", "content": "What is " + inst["q"] + "?"}],
    system_prompt="Be brief.",
    scorer=score,
    sampling={"temperature": 0, "max_tokens": 6},
)
"""


def test_generate_with_vllm_then_replay_without_it(
    pytester: pytest.Pytester, tiny_llama: Any, engine_args: dict[str, Any]
) -> None:
    """Real generation through the plugin writes a run dir that the replay
    provider serves back with identical texts and metrics, no engine needed."""
    import orjson

    pytester.makepyfile(test_evals=ROUND_TRIP_EVALS)
    engine = [f"--evalreplay-engine-arg={k}={orjson.dumps(v).decode()}" for k, v in engine_args.items()]
    generated = pytester.runpytest_subprocess(
        "--evalreplay-provider=vllm",
        f"--evalreplay-model={tiny_llama}",
        *engine,
        "--evalreplay-output=run1",
        "-p",
        "no:cacheprovider",
        "-q",
        timeout=300,
    )
    generated.assert_outcomes(passed=5 * 3 + 5)
    # The replay run must not touch vLLM: make it unimportable there.
    pytester.makeconftest("import sys\nsys.modules['vllm'] = None\n")
    replayed = pytester.runpytest_subprocess(
        "--evalreplay-predictions=run1", "--evalreplay-output=run2", "-p", "no:cacheprovider", "-q"
    )
    replayed.assert_outcomes(passed=5 * 3 + 5)
    run1, run2 = pytester.path / "run1", pytester.path / "run2"
    for task in ("qa", "chat"):
        rows1 = [orjson.loads(x) for x in (run1 / f"{task}-predictions.jsonl").read_bytes().splitlines()]
        rows2 = [orjson.loads(x) for x in (run2 / f"{task}-predictions.jsonl").read_bytes().splitlines()]
        assert len(rows1) == 5
        for a, b in zip(rows1, rows2, strict=True):
            assert a["generations"] == b["generations"]
            assert a["scores"] == b["scores"]
        assert all(len(r["generations"]) == (3 if task == "qa" else 1) for r in rows1)
        assert all(g["prompt_tokens"] and g["completion_tokens"] for r in rows1 for g in r["generations"])
        metrics1 = orjson.loads((run1 / f"{task}-metrics.json").read_bytes())
        metrics2 = orjson.loads((run2 / f"{task}-metrics.json").read_bytes())
        assert metrics1["metrics"] == metrics2["metrics"]
        assert metrics1["num_failed"] == metrics2["num_failed"] == 0
    manifest = orjson.loads((run1 / "manifest.json").read_bytes())
    assert manifest["provider"]["kind"] == "vllm"
