"""`formats.saves.first_answer`: how an ELO eval reads a reference's answer
from its saved run, by the saved-run readers replay serves by (no provider)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pytest_evalreplay.formats import load
from pytest_evalreplay.formats.saves import first_answer
from pytest_evalreplay.model import EvalReplayError

REFS = Path(__file__).parent.parent / "examples" / "elo_references"


def saved_run(tmp_path: Path, predictions: list[dict[str, object]]) -> Path:
    request = {
        "instance_id": "q1",
        "request_type": "generate",
        "context": "Q?",
        "system_prompt": None,
        "num_samples": 1,
        "sampling": {},
    }
    (tmp_path / "r-requests.jsonl").write_bytes(b"".join(orjson.dumps(request) + b"\n" for _ in predictions))
    path = tmp_path / "r-predictions.jsonl"
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in predictions))
    return path


def row(texts: list[str], rollouts: list[int] | None = None) -> dict[str, object]:
    found: dict[str, object] = {
        "instance_id": "q1",
        "model": "m",
        "generations": [{"text": t} for t in texts],
    }
    if rollouts is not None:
        found["rollouts"] = rollouts
    return found


def test_a_reference_run_answers_each_saved_prompt_with_its_raw_text() -> None:
    index = load(REFS / "ref-800-predictions.jsonl")
    context = "What is 22 + 6? Think, then reply as 'Answer: <answer>'."
    answer = first_answer(index, (context, None), 1)
    assert answer is not None and answer.text == "Answer: 0"
    assert first_answer(index, ("a prompt nobody saved", None), 1) is None


def test_the_first_sample_answers_whatever_the_saved_sample_count(tmp_path: Path) -> None:
    index = load(saved_run(tmp_path, [row(["b"], [1]), row(["a"], [0])]))
    answer = first_answer(index, ("Q?", None), 1)
    assert answer is not None and answer.text == "a"


def test_saves_that_disagree_on_a_sample_are_refused_naming_both_lines(tmp_path: Path) -> None:
    path = saved_run(tmp_path, [row(["a"]), row(["b"])])
    with pytest.raises(
        EvalReplayError, match=rf"disagree \(sample 0 of instance q1 .*{path.name}:1 .*{path.name}:2\)"
    ):
        first_answer(load(path), ("Q?", None), 1)
