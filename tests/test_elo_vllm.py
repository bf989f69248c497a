"""An ELO eval whose candidate and LLM judge run on the real vLLM engine (the
CPU build and the tiny random Llama the provider tests use), then replayed
with vLLM made unimportable: identical verdicts and rating. The tiny model's
judge replies are mostly unreadable, which is the tie path, recorded as such."""

from __future__ import annotations

import orjson
import pytest

POOL = [{"id": f"t{n}", "q": f"count to {n}"} for n in range(6)]

EVALS = f"""
from pytest_evalreplay import EloEval, EvalTask, Reference, Stage, judges

pool = EvalTask("pool", {POOL!r}, prompt="Q: {{q}}", sampling={{"temperature": 0.0, "max_tokens": 8}})

duel = EloEval(
    "duel",
    pool=pool,
    references={{"low": Reference(900, "refs/low-predictions.jsonl"),
                 "high": Reference(1300, "refs/high-predictions.jsonl")}},
    stages=[Stage(tasks=3), Stage(tasks=3, references=1)],
    # The tiny test model does not answer in the judge's format: its replies
    # are kept as ties (and counted as unreadable) rather than failing items.
    judge=judges.llm(sampling={{"temperature": 0.0, "max_tokens": 12}}, unreadable="tie"),
    seed=5,
)
"""


def write_reference(path, name: str) -> None:
    path.mkdir(exist_ok=True)
    req = [
        {
            "instance_id": p["id"],
            "request_type": "generate",
            "context": f"Q: {p['q']}",
            "system_prompt": None,
            "num_samples": 1,
            "sampling": {},
        }
        for p in POOL
    ]
    pred = [
        {"instance_id": p["id"], "model": name, "generations": [{"text": f"{name} says {p['q']}"}]}
        for p in POOL
    ]
    (path / f"{name}-requests.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in req))
    (path / f"{name}-predictions.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in pred))


def test_an_llm_judge_on_the_real_engine_replays_without_it(
    pytester: pytest.Pytester, vllm_options: list[str]
) -> None:
    for name in ("low", "high"):
        write_reference(pytester.path / "refs", name)
    pytester.makepyfile(test_duel=EVALS)
    generated = pytester.runpytest_subprocess(
        *vllm_options,
        "--evalreplay-output=run1",
        "-p",
        "no:cacheprovider",
        "-q",
        timeout=600,
    )
    generated.assert_outcomes(passed=6)
    run1, run2 = pytester.path / "run1", pytester.path / "run2"
    judged = [orjson.loads(x) for x in (run1 / "duel-judge-predictions.jsonl").read_bytes().splitlines()]
    assert len(judged) == (3 * 2 + 3 * 1) * 2  # items x references x two position-swapped trials
    pytester.makeconftest("import sys\nsys.modules['vllm'] = None\n")  # the replay must not touch vLLM
    replayed = pytester.runpytest_subprocess(
        "--evalreplay-predictions=run1", "--evalreplay-output=run2", "-p", "no:cacheprovider", "-q"
    )
    replayed.assert_outcomes(passed=6)
    first = orjson.loads((run1 / "duel-metrics.json").read_bytes())["elo"]
    again = orjson.loads((run2 / "duel-metrics.json").read_bytes())["elo"]
    assert again["rating"] == first["rating"] and again["stages"] == first["stages"]

    def verdicts(run):
        return [orjson.loads(x)["scores"] for x in (run / "duel-predictions.jsonl").read_bytes().splitlines()]

    assert verdicts(run2) == verdicts(run1)
