"""`formats.saves`: a prompt's saves merged and chosen, and `first_answer`,
how an ELO eval reads a reference's answer from its saved run, by the
saved-run readers replay serves by (no provider)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay.formats import load
from pytest_evalreplay.formats.saved import SavedRow
from pytest_evalreplay.formats.saves import choose, first_answer, merge
from pytest_evalreplay.model import EvalReplayError, Generation

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


@given(
    rollouts=st.lists(st.integers(0, 20), min_size=0, max_size=6, unique=True),
    sampling=st.one_of(st.none(), st.fixed_dictionaries({"temperature": st.floats(0, 2)})),
    stage=st.integers(1, 3),
)
def test_a_row_merged_alone_or_beside_its_copy_is_one_save_of_its_samples(
    rollouts: list[int], sampling: dict[str, float] | None, stage: int
) -> None:
    """A sample saved twice alike is one sample: a prompt saved once (nearly
    every prompt) and saved twice merge to the same save, but for where."""
    generations = tuple(Generation(text=f"answer {r}", finish_reason="stop") for r in rollouts)
    alone = SavedRow("q1", stage, tuple(rollouts), generations, "f:1", Path("f"), sampling)
    (one,) = merge([alone])
    (both,) = merge([alone, dataclasses.replace(alone, where="f:2")])
    assert (one.instance_id, one.stage, one.samples, one.samplings, one.conflicts) == (
        both.instance_id,
        both.stage,
        both.samples,
        both.samplings,
        both.conflicts,
    )
    assert list(one.samples) == list(both.samples) == rollouts
    assert one.where == ("f:1",) and both.where == ("f:1", "f:2")
    assert choose([one], stage) == [one]
