"""How much the vllm provider and the plugin add on top of bare vLLM.

The same prompts, the same sampling, the same engine, four ways:

1. bare:     one `LLM.generate(prompts, params)` call, as a vLLM script would;
2. provider: `VllmProvider.generate_stream(requests)` consumed to the end, the
             path the plugin takes (request planning, the length pre-check,
             one `LLM.enqueue` per request, the provider's own step loop
             handing back each request as it finishes, the mapping back to
             Generations); also when its first result came;
3. pytest:   a whole `pytest` session of an `EvalTask` with
             `--evalreplay-provider=vllm` (collection, one item per rollout,
             the journal, the run dir, the report), served by the same engine;
4. floor:    for scale, a plain pytest session of as many no-op tests: what
             pytest itself costs per item, with no model and no plugin work.

Each is run `--repeats` times after a warm-up, bare and provider side by side
and each first in every other round. The median time of each is reported
with its ratio to bare's median, and for the provider also the median of
its per-round ratios to bare, the best times, and this process's CPU time
(the engine runs in processes of its own, so that is the caller's side, and
other load on the machine disturbs it less than wall time). Every request
here generates the same number of tokens, so they all finish together and
the first streamed result comes near the end; with mixed lengths it comes as
soon as the shortest request is done. Nothing is asserted: timings belong
in a report, not in a test.

    python benchmarks/vllm_overhead.py                  # a tiny random Llama, CPU-friendly
    python benchmarks/vllm_overhead.py --model Qwen/Qwen3-0.6B --prompts 512 --max-tokens 256

With the tiny model a step of the engine takes a millisecond or so, which
makes fixed per-item costs look large; a real model's steps are far longer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

EVALS = """
import orjson
from pytest_evalreplay import EvalTask

bench = EvalTask(
    "bench",
    orjson.loads(open({instances!r}, "rb").read()),
    prompt="{{text}}",
    scorer=lambda text, instance: float(bool(text)),
    num_samples={num_samples},
    sampling=orjson.loads({sampling!r}),
)
"""


class _Shared:
    """The benchmark's provider, handed to the pytest session through the
    provider hook; `close` is a no-op so the engine outlives the session."""

    def __init__(self, provider: Any) -> None:
        self._provider = provider
        self.kind = provider.kind
        self.model = provider.model
        self.batch_size = None

    def generate(self, requests: list[Any]) -> list[Any]:
        return self._provider.generate(requests)

    def generate_stream(self, requests: list[Any]) -> Any:
        return self._provider.generate_stream(requests)

    def close(self) -> None:
        pass


class _LoopTimer:
    """Times a session's run loop alone (every item's setup, call and
    teardown), leaving out start-up and collection, which a session pays once
    whatever the model."""

    def __init__(self, into: list[float]) -> None:
        self.into = into

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: Any) -> Any:
        start = time.perf_counter()
        try:
            return (yield)
        finally:
            self.into.append(time.perf_counter() - start)


class _HookPlugin:
    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def pytest_evalreplay_make_provider(self, config: Any, kind: str) -> Any:
        return _Shared(self.provider) if kind == "vllm" else None


def _prompts(n: int) -> list[str]:
    topics = ["arithmetic", "geography", "history", "chemistry", "poetry", "physics", "music"]
    return [
        f"Question {i}: tell me something about {topics[i % len(topics)]} "
        f"and the number {i * 7 % 101}.\nAnswer:"
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model name or path (default: build a tiny random Llama)")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-samples", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--timeout", type=float, help="the provider's request_timeout (the per-step time-limit checks cost)"
    )
    parser.add_argument("--no-pytest", action="store_true", help="skip the pytest-session measurement")
    args = parser.parse_args()

    import orjson
    from vllm import SamplingParams

    from pytest_evalreplay.model import Request
    from pytest_evalreplay.plugin.options import parse_engine_args
    from pytest_evalreplay.providers.vllm import VllmProvider

    work = Path(tempfile.mkdtemp(prefix="evalreplay-bench-"))
    engine_args = parse_engine_args(args.engine_arg)
    model = args.model
    if model is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from llm_fixtures import ENGINE_ARGS, build_tiny_llama

        model = str(build_tiny_llama(work / "tiny-llama"))
        engine_args = {**ENGINE_ARGS, **engine_args}

    prompts = _prompts(args.prompts)
    seeded = args.num_samples == 1 and args.temperature > 0
    sampling: dict[str, Any] = {
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
        "ignore_eos": True,  # the same token count every way
    }
    if seeded:
        sampling["seed"] = 0
    requests = [
        Request(task="bench", instance_id=f"i{i}", context=p, num_samples=args.num_samples, sampling=sampling)
        for i, p in enumerate(prompts)
    ]

    provider = VllmProvider(model, engine_args, quiet=True, request_timeout=args.timeout)
    llm = provider.llm
    # Bare vLLM with exactly the work the provider plans: one seeded n=1
    # request per prompt, or one n=num_samples request per prompt.
    if seeded:
        bare_params: Any = SamplingParams(**sampling)
    else:
        bare_params = SamplingParams(n=args.num_samples, **sampling)

    def bare() -> int:
        outs = llm.generate(prompts, bare_params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    first_results: list[float] = []

    def through_provider() -> int:
        start = time.perf_counter()
        tokens = 0
        for i, (_, result) in enumerate(provider.generate_stream(requests)):
            if i == 0:
                first_results.append(time.perf_counter() - start)
            tokens += sum(g.completion_tokens for g in result)  # type: ignore[union-attr,misc]
        return tokens

    (work / "instances.json").write_bytes(
        orjson.dumps([{"id": f"i{i}", "text": p} for i, p in enumerate(prompts)])
    )
    (work / "test_bench.py").write_text(
        EVALS.format(
            instances=str(work / "instances.json"),
            num_samples=args.num_samples,
            sampling=orjson.dumps(sampling).decode(),
        )
    )
    (work / "test_floor.py").write_text(
        "import pytest\n\n"
        f"@pytest.mark.parametrize('i', range({args.prompts * args.num_samples}))\n"
        "def test_noop(i):\n    pass\n"
    )
    runs = iter(range(10**6))
    loops: dict[str, list[float]] = {"pytest": [], "floor": []}

    def through_pytest() -> int:
        out = work / f"run{next(runs)}"
        rc = pytest.main(
            [
                str(work / "test_bench.py"),
                "-q",
                "-p",
                "no:cacheprovider",
                "--evalreplay-provider=vllm",
                f"--evalreplay-model={model}",
                f"--evalreplay-output={out}",
                f"--rootdir={work}",
            ],
            plugins=[_HookPlugin(provider), _LoopTimer(loops["pytest"])],
        )
        if rc != 0:
            raise SystemExit(f"the pytest session failed with exit code {rc}")
        rows = (out / "bench-predictions.jsonl").read_bytes().splitlines()
        return sum(g["completion_tokens"] for row in rows for g in orjson.loads(row)["generations"])

    def floor() -> int:
        rc = pytest.main(
            [str(work / "test_floor.py"), "-q", "-p", "no:cacheprovider", f"--rootdir={work}"],
            plugins=[_LoopTimer(loops["floor"])],
        )
        if rc != 0:
            raise SystemExit(f"the plain pytest session failed with exit code {rc}")
        return 0

    ways = {"bare": bare, "provider": through_provider}
    if not args.no_pytest:
        ways["pytest"] = through_pytest
        ways["floor"] = floor
    times: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}  # this process's CPU time
    tokens: dict[str, int] = {}
    bare()  # warm-up: first-batch costs belong to nobody
    through_provider()
    first_results.clear()
    pair = [(name, ways[name]) for name in ("bare", "provider")]
    sessions = [(name, fn) for name, fn in ways.items() if name not in ("bare", "provider")]
    for round_ in range(args.repeats):
        # bare and provider side by side, each first in every other round, so
        # each follows the other as often as it follows a pytest session.
        flip = round_ % 2 == 1
        order = [*pair[::-1], *sessions[::-1]] if flip else [*pair, *sessions]
        for name, fn in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    provider.close()

    print(
        f"\nmodel {model}: {args.prompts} prompts x {args.num_samples} samples x {args.max_tokens} tokens, "
        f"{args.repeats} runs each"
    )
    base, base_best = statistics.median(times["bare"]), min(times["bare"])
    items = args.prompts * args.num_samples
    for name in ways:
        best, median = min(times[name]), statistics.median(times[name])
        extra_ms = (median - base) / items * 1000
        print(
            f"  {name:9s} median {median:7.3f} s  ratio {median / base:6.3f}  "
            f"(best {best:7.3f} s, ratio {best / base_best:6.3f})  "
            f"tokens {tokens[name]:7d}  ({extra_ms:+.3f} ms per rollout vs bare)"
        )
    provider_median = statistics.median(times["provider"])
    paired = statistics.median(p / b for p, b in zip(times["provider"], times["bare"], strict=True))
    print(
        f"  provider (generate_stream) overhead: {100 * (provider_median / base - 1):+.1f}% of bare vLLM "
        f"(medians; median of the per-round ratios: {100 * (paired - 1):+.1f}%; "
        f"best times: {100 * (min(times['provider']) / base_best - 1):+.1f}%)"
    )
    # The engine runs in its own processes (vLLM's default), so this process's
    # CPU time is the work on the caller's side (vLLM's own output processing
    # included): a view of the provider's cost that other load disturbs less.
    print(
        f"  CPU time in this process (median): bare {statistics.median(cpu['bare']):.3f} s, "
        f"provider {statistics.median(cpu['provider']):.3f} s"
    )
    print(
        f"  first streamed result after {statistics.median(first_results):.3f} s (median); "
        f"bare vLLM hands back nothing before {base:.3f} s"
    )
    if "pytest" in times:
        pytest_med, floor_med = statistics.median(times["pytest"]), statistics.median(times["floor"])
        print(f"  pytest-session overhead: {100 * (pytest_med / base - 1):+.1f}% of bare vLLM (medians)")
        print(
            f"  of which pytest's own per-item cost (floor): {floor_med:.3f} s; "
            f"the rest, {pytest_med - base - floor_med:+.3f} s, is the plugin's"
        )
        loop_med, floor_loop = statistics.median(loops["pytest"]), statistics.median(loops["floor"])
        print(
            f"  run loop alone (no start-up, no collection): {loop_med:.3f} s, "
            f"{100 * (loop_med / base - 1):+.1f}% of bare vLLM; a no-op test loop of as many items: "
            f"{floor_loop:.3f} s"
        )


if __name__ == "__main__":
    main()
