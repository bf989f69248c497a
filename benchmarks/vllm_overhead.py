"""How much the vllm provider and the plugin add on top of bare vLLM.

The same prompts, the same sampling, the same engine, three ways:

1. bare:     one `LLM.generate(prompts, params)` call, as a vLLM script would;
2. provider: `VllmProvider.generate(requests)` (request planning, the length
             pre-check, the mapping back to Generations);
3. pytest:   a whole `pytest` session of an `EvalTask` with
             `--evalreplay-provider=vllm` (collection, one item per rollout,
             the journal, the run dir, the report), served by the same engine;
4. floor:    for scale, a plain pytest session of as many no-op tests: what
             pytest itself costs per item, with no model and no plugin work.

Each is run `--repeats` times, alternating, after a warm-up; the best time of
each is reported with its ratio to bare. Nothing is asserted: timings belong
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
    parser.add_argument("--no-pytest", action="store_true", help="skip the pytest-session measurement")
    args = parser.parse_args()

    import orjson
    from vllm import SamplingParams

    from pytest_evalreplay.model import Request
    from pytest_evalreplay.options import parse_engine_args
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

    provider = VllmProvider(model, engine_args, quiet=True)
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

    def through_provider() -> int:
        results = provider.generate(requests)
        return sum(g.completion_tokens for r in results for g in r)  # type: ignore[union-attr]

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
    tokens: dict[str, int] = {}
    bare()  # warm-up: first-batch costs belong to nobody
    order = list(ways.items())
    for _ in range(args.repeats):
        order.append(order.pop(0))  # rotate, so no way always runs first
        for name, fn in order:
            start = time.perf_counter()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - start)
    provider.close()

    print(f"\nmodel {model}: {args.prompts} prompts x {args.num_samples} samples x {args.max_tokens} tokens")
    base = min(times["bare"])
    for name in ways:
        best, median = min(times[name]), statistics.median(times[name])
        items = args.prompts * args.num_samples
        extra_ms = (best - base) / items * 1000
        print(
            f"  {name:9s} best {best:7.3f} s  median {median:7.3f} s  ratio {best / base:6.3f}  "
            f"tokens {tokens[name]:7d}  ({extra_ms:+.3f} ms per rollout vs bare)"
        )
    print(f"  provider overhead: {100 * (min(times['provider']) / base - 1):+.1f}% of bare vLLM")
    if "pytest" in times:
        pytest_best, floor_best = min(times["pytest"]), min(times["floor"])
        print(f"  pytest-session overhead: {100 * (pytest_best / base - 1):+.1f}% of bare vLLM")
        print(
            f"  of which pytest's own per-item cost (floor): {floor_best:.3f} s; "
            f"the rest, {pytest_best - base - floor_best:+.3f} s, is the plugin's"
        )
        loop_best, floor_loop = min(loops["pytest"]), min(loops["floor"])
        print(
            f"  run loop alone (no start-up, no collection): {loop_best:.3f} s, "
            f"{100 * (loop_best / base - 1):+.1f}% of bare vLLM; a no-op test loop of as many items: "
            f"{floor_loop:.3f} s"
        )


if __name__ == "__main__":
    main()
