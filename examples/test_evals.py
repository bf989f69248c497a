"""The example evaluation suite: two small tasks, collected as pytest items.

Run it with the rule-based model (the default in pytest.ini), or rescore the
saved run without any model:

    pytest examples
    pytest examples --evalreplay-predictions=examples/saved_run
"""

from pytest_evalreplay import EvalTask, scorers

arithmetic = EvalTask(
    name="arithmetic",
    instances="data/arithmetic.jsonl",
    prompt="Question: {question}\nThink, then give the final number.",
    scorer=scorers.numeric_match(),
    target="answer",
    num_samples=2,
    sampling={"temperature": 0.7, "max_tokens": 64, "seed": 1234},
    strip_reasoning=True,
)

capitals = EvalTask(
    name="capitals",
    instances="data/capitals.jsonl",
    prompt="What is the capital of {country}? Reply as 'Answer: <city>'.",
    system_prompt="You are a concise geography assistant.",
    scorer=scorers.exact_match(extract=r"Answer:\s*(.+)"),
    target="capital",
    sampling={"temperature": 0.0, "max_tokens": 32},
    strip_reasoning=True,
)


def test_instances_have_answers():
    """Plain tests live beside eval tasks in the same module."""
    assert all("answer" in inst for inst in arithmetic.instances)
