"""The vllm provider against a real vLLM engine running a tiny random Llama.

No mock engine: batching is checked with spies that record and forward the
real `LLM.enqueue` / `LLM.enqueue_chat` / `LLMEngine.step` calls, and time
limits with a clock that ticks once per engine step, so nothing depends on
how fast the machine is. The engine starts once per session (the
`vllm_provider` fixture); these tests skip where vLLM is not installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llm_fixtures import MAX_MODEL_LEN, make_request

from pytest_evalreplay.model import EvalReplayError, Generation, GenerationError, Request
from pytest_evalreplay.providers import vllm as vllm_mod
from pytest_evalreplay.settings import Settings

MAX_TOKENS = 8


def req(context: Any, *args: Any, **sampling: Any) -> Request:
    sampling.setdefault("max_tokens", MAX_TOKENS)
    return make_request(context, *args, **sampling)


class Spy:
    """Records each call of a real `LLM.enqueue*` method, then forwards it.
    `events` is shared by all spies (and the step counter), in call order."""

    def __init__(self, name: str, method: Callable[..., Any], events: list[str]) -> None:
        self.name = name
        self.method = method
        self.events = events
        self.calls: list[tuple[list[Any], list[Any]]] = []
        self.kwargs: list[dict[str, Any]] = []

    def __call__(self, prompts: Any, params: Any, **kwargs: Any) -> Any:
        self.calls.append((list(prompts), list(params)))
        self.kwargs.append(kwargs)
        self.events.append(self.name)
        return self.method(prompts, params, **kwargs)


class Steps:
    """Counts real `LLMEngine.step` calls: the tick of the test clock."""

    def __init__(self, method: Callable[[], Any], events: list[str]) -> None:
        self.method = method
        self.events = events
        self.count = 0

    def __call__(self) -> Any:
        self.count += 1
        self.events.append("step")
        return self.method()

    def clock(self) -> float:
        return float(self.count)


@pytest.fixture
def events() -> list[str]:
    return []


@pytest.fixture
def spies(vllm_provider: Any, monkeypatch: pytest.MonkeyPatch, events: list[str]) -> dict[str, Spy]:
    llm = vllm_provider.llm
    out = {}
    for name in ("enqueue", "enqueue_chat"):
        spy = Spy(name, getattr(llm, name), events)
        monkeypatch.setattr(llm, name, spy)
        out[name] = spy
    return out


@pytest.fixture
def steps(vllm_provider: Any, monkeypatch: pytest.MonkeyPatch, events: list[str]) -> Steps:
    engine = vllm_provider.llm.llm_engine
    counter = Steps(engine.step, events)
    monkeypatch.setattr(engine, "step", counter)
    return counter


@pytest.fixture(autouse=True)
def clean_engine(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every real-engine test must leave no request of its own in the engine."""
    yield
    if "vllm_provider" in request.fixturenames:
        provider = request.getfixturevalue("vllm_provider")
        engine = provider.llm.llm_engine
        assert engine.get_num_unfinished_requests() == 0
        assert not engine.has_unfinished_requests()
        assert provider._in_flight == {}


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


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_from_settings_hands_over_the_timeout() -> None:
    provider = vllm_mod.from_settings(Settings(provider="vllm", model="m", timeout=2.5))
    assert provider.request_timeout == 2.5
    assert vllm_mod.from_settings(Settings(provider="vllm", model="m")).request_timeout is None
    assert provider._llm is None


@pytest.mark.parametrize("bad", [0, -1.0])
def test_timeout_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        vllm_mod.VllmProvider("m", request_timeout=bad)


@pytest.mark.parametrize(
    ("engine_id", "output_id"),
    [("12-3f9a0c1e", "12"), ("0-abcdefgh", "0"), ("7", "7"), ("mine-1-abc", "mine-1-abc"), ("-x", "-x")],
)
def test_output_id_of_an_enqueued_id(engine_id: str, output_id: str) -> None:
    assert vllm_mod._output_id(engine_id) == output_id


def test_provider_is_lazy_and_close_is_idempotent() -> None:
    provider = vllm_mod.VllmProvider("some/model", {"dtype": "float32"})
    assert (provider.kind, provider.model, provider.batch_size) == ("vllm", "some/model", None)
    assert provider.request_timeout is None
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
    streamed = list(provider.generate_stream([Request(task="t", instance_id="a", context="x", tools=("f",))]))
    assert [i for i, _ in streamed] == [0] and provider._llm is None


# -- real engine ---------------------------------------------------------------


def test_the_whole_batch_is_in_the_engine_before_the_first_step(
    vllm_provider: Any, spies: dict[str, Spy], steps: Steps, events: list[str]
) -> None:
    requests = [req(f"Question {i}: what is {i} plus {i}?", iid=f"q{i}", seed=i) for i in range(6)]
    requests += [req("Unseeded sampling", iid="u", num_samples=3, temperature=1.0)]
    requests += [req([{"role": "user", "content": "hi"}], iid="c", seed=3)]
    out = vllm_provider.generate(requests)
    # One enqueue per request, all of them before the engine's first step.
    assert events[:8] == ["enqueue"] * 7 + ["enqueue_chat"]
    assert set(events[8:]) == {"step"}
    params = [p for _, ps in spies["enqueue"].calls for p in ps]
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
    ((_, params),) = spies["enqueue"].calls
    assert len(params) == 1 and params[0].n == 4 and params[0].seed is None
    assert len({g.text for g in gens}) > 1  # real samples, not one text repeated
    assert all(g.completion_tokens == MAX_TOKENS and g.finish_reason == "length" for g in gens)


def test_seeded_rollouts_reproduce_alone(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    full = ok(vllm_provider.generate([req("Seeded", num_samples=3, seed=7, ignore_eos=True)])[0])
    ((_, params),) = spies["enqueue"].calls
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
    ((_, params),) = spies["enqueue"].calls
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
    # The text one is caught before vLLM sees it; the chat one is rejected
    # by vLLM while adding it, alone.
    assert len(spies["enqueue"].calls) == 2
    assert all(len(p["prompt_token_ids"]) < 256 for prompts, _ in spies["enqueue"].calls for p in prompts)
    assert len(spies["enqueue_chat"].calls) == 3


def test_chat_uses_the_chat_template(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    messages = [{"role": "user", "content": "What is two plus two?"}]
    out = vllm_provider.generate(
        [
            req(messages, iid="plain"),
            req(messages, iid="sys", system_prompt="Answer briefly."),
            req("text too", iid="text"),
        ]
    )
    assert len(spies["enqueue_chat"].calls) == 2 and len(spies["enqueue"].calls) == 1
    conversations = [conv for convs, _ in spies["enqueue_chat"].calls for conv in convs]
    assert conversations[0] == messages
    assert conversations[1] == [{"role": "system", "content": "Answer briefly."}, *messages]
    tok = vllm_provider.llm.get_tokenizer()
    for conv, result in zip(conversations, out[:2], strict=True):
        expected = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert expected.endswith("<|assistant|>")
        (g,) = ok(result)
        assert g.prompt_tokens == len(tok.encode(expected, add_special_tokens=False))


def test_tools_are_rendered_by_the_chat_template(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    messages = [{"role": "user", "content": "2+2?"}]
    tools = [{"type": "function", "function": {"name": "add"}}]
    with_tools = dataclasses.replace(req(messages, iid="tools"), tools=tuple(tools))
    out = vllm_provider.generate([with_tools, req(messages, iid="none")])
    assert [kw.get("tools") for kw in spies["enqueue_chat"].kwargs] == [tools, None]
    tok = vllm_provider.llm.get_tokenizer()
    expected = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert expected.startswith('<|tools|>[{"type"')
    (g,), (plain,) = ok(out[0]), ok(out[1])
    assert g.prompt_tokens == len(tok.encode(expected, add_special_tokens=False))
    assert g.prompt_tokens > plain.prompt_tokens


def test_text_system_prompt_is_prefixed(vllm_provider: Any, spies: dict[str, Spy]) -> None:
    out = vllm_provider.generate([req("What is 2+2?", system_prompt="Answer briefly.")])
    (g,) = ok(out[0])
    ids = vllm_provider.llm.get_tokenizer().encode("Answer briefly.\n\nWhat is 2+2?")
    assert spies["enqueue"].calls[0][0] == [{"prompt_token_ids": ids}]
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


# -- streaming -------------------------------------------------------------------

# A request that generates to the end of the context, token by token: it is
# still running long after short ones (a few tokens) have finished.
LONG_TOKENS = MAX_MODEL_LEN - 16


def long_req(iid: str = "long", **sampling: Any) -> Request:
    return req("Tell me a long story.", iid=iid, max_tokens=LONG_TOKENS, ignore_eos=True, **sampling)


def short_reqs(n: int) -> list[Request]:
    return [req(f"Short question {i}?", iid=f"s{i}", seed=i, max_tokens=3) for i in range(n)]


def test_stream_yields_each_request_as_it_finishes(vllm_provider: Any) -> None:
    engine = vllm_provider.llm.llm_engine
    # The long request goes in last, so it cannot run ahead of the short ones.
    requests = [*short_reqs(4), long_req(seed=5)]
    seen: list[tuple[int, int]] = []  # (index, engine requests unfinished when it came)
    results = {}
    for index, result in vllm_provider.generate_stream(requests):
        results[index] = ok(result)
        seen.append((index, engine.get_num_unfinished_requests()))
    assert sorted(results) == [0, 1, 2, 3, 4]
    assert seen[-1] == (4, 0)
    # Every short result came out while the long request was still running.
    assert all(unfinished >= 1 for _, unfinished in seen[:-1])
    assert results[4][0].completion_tokens == LONG_TOKENS


def test_stream_and_generate_give_the_same_results(vllm_provider: Any) -> None:
    from vllm import SamplingParams

    requests = [
        req("Seeded text", iid="a", num_samples=3, seed=4, temperature=0.9),
        req("Greedy text", iid="b", num_samples=2, temperature=0, system_prompt="Be brief."),
        req([{"role": "user", "content": "Seeded chat"}], iid="c", num_samples=2, seed=9),
        req("typo", iid="d", temprature=0.5),
        Request(task="t", instance_id="e", context="x", request_type="loglikelihood"),
    ]
    streamed = list(vllm_provider.generate_stream(requests))
    assert sorted(i for i, _ in streamed) == list(range(len(requests)))
    assert [r for _, r in sorted(streamed, key=lambda x: x[0])] == vllm_provider.generate(requests)
    # ... and the same as bare vLLM asked the same thing.
    llm = vllm_provider.llm
    ids = llm.get_tokenizer().encode("Seeded text")
    bare = llm.generate(
        [{"prompt_token_ids": ids}] * 3,
        [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, seed=4 + r) for r in range(3)],
        use_tqdm=False,
    )
    assert [g.text for g in ok(dict(streamed)[0])] == [o.outputs[0].text for o in bare]


def test_closing_the_stream_aborts_what_is_in_flight(vllm_provider: Any) -> None:
    engine = vllm_provider.llm.llm_engine
    requests = [*short_reqs(2), long_req("l1", seed=1), long_req("l2", num_samples=3, temperature=1.0)]
    stream = vllm_provider.generate_stream(requests)
    index, result = next(stream)
    assert index in (0, 1)
    ok(result)
    assert engine.get_num_unfinished_requests() >= 2  # both long ones, at least
    stream.close()
    assert engine.get_num_unfinished_requests() == 0
    assert not engine.has_unfinished_requests()
    assert vllm_provider._in_flight == {}
    # The engine serves the next call as usual.
    assert len(ok(vllm_provider.generate(short_reqs(1))[0])) == 1


def test_streams_can_nest(vllm_provider: Any) -> None:
    """A judge may generate with the same engine while a stream is open: each
    stream gets its own results, whichever of them steps the engine."""
    outer = vllm_provider.generate_stream([*short_reqs(2), long_req(seed=3)])
    first = next(outer)
    inner = vllm_provider.generate([req("Judge this.", iid="j", seed=1), req("And this.", iid="k", seed=2)])
    assert all(len(ok(r)) == 1 for r in inner)
    rest = list(outer)
    assert sorted(i for i, _ in [first, *rest]) == [0, 1, 2]
    assert ok(dict(rest)[2])[0].completion_tokens == LONG_TOKENS


def test_a_request_past_the_time_limit_fails_retryably(
    vllm_provider: Any, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Time is counted in engine steps here: a short request finishes a few
    # steps after its first token, the long ones need LONG_TOKENS steps.
    monkeypatch.setattr(vllm_provider, "request_timeout", 20.0)
    monkeypatch.setattr(vllm_provider, "_clock", steps.clock)
    requests = [*short_reqs(3), long_req("l1", seed=1), long_req("l2", num_samples=2, seed=2)]
    out = dict(vllm_provider.generate_stream(requests))
    for i in (0, 1, 2):
        assert len(ok(out[i])) == 1
    for i in (3, 4):
        err = out[i]
        assert isinstance(err, GenerationError) and err.retryable, err
        assert "20 s time limit" in err.message
    assert steps.count < LONG_TOKENS  # aborted, not run to the end
    # The clean_engine fixture checks that both draws of l2 were aborted.


def test_time_limit_on_the_real_clock(vllm_provider: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_provider, "request_timeout", 0.01)
    (err,) = vllm_provider.generate([long_req(seed=1)])
    assert isinstance(err, GenerationError) and err.retryable, err
    assert "0.01 s time limit" in err.message


def test_the_clock_starts_at_the_first_token(vllm_provider: Any) -> None:
    """The private engine state the time limit reads is there in this vLLM:
    a request counts as generating once its first token is out, not while
    it waits."""
    from vllm import SamplingParams

    llm = vllm_provider.llm
    engine = llm.llm_engine
    generating = vllm_mod._first_token_probe(engine)
    assert generating is not None
    (engine_id,) = llm.enqueue(
        ["Once upon a time"], SamplingParams(max_tokens=LONG_TOKENS, ignore_eos=True), use_tqdm=False
    )
    output_id = vllm_mod._output_id(engine_id)
    try:
        assert not generating(output_id)  # the engine has not been stepped yet
        finished = []
        while not generating(output_id) and engine.has_unfinished_requests():
            finished += [o.request_id for o in engine.step() if o.finished]
        assert generating(output_id) and output_id not in finished
    finally:
        engine.abort_request([engine_id], internal=True)
    assert not generating(output_id)


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
    pytester: pytest.Pytester, vllm_options: list[str]
) -> None:
    """Real generation through the plugin writes a run dir that the replay
    provider serves back with identical texts and metrics, no engine needed."""
    import orjson

    pytester.makepyfile(test_evals=ROUND_TRIP_EVALS)
    generated = pytester.runpytest_subprocess(
        *vllm_options,
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
    replayed.assert_outcomes(deselected=5 * 3 + 5)  # every item answered by the saved run, as by --resume
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
