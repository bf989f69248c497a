"""A multi-stage ELO evaluation: the rule-based model, judged pairwise against
four reference models of known rating whose answers were saved earlier
(`elo_references/`), by a deterministic judge. Runs with no model:

    pytest examples/test_elo.py
    pytest examples/test_elo.py --resume             # after a crash
    pytest examples/test_elo.py --resume-stage=2     # keep stage 1, redo 2 onward
"""

from pytest_evalreplay import EloEval, EvalTask, Gate, Reference, Stage, scorers

quiz = EvalTask(
    name="quiz",
    instances="data/quiz.jsonl",
    prompt="{question} Think, then reply as 'Answer: <answer>'.",
    sampling={"temperature": 0.0, "max_tokens": 64},
    strip_reasoning=True,
)


def correct(instance: dict, answer: str) -> bool:
    return scorers.normalize(str(instance["answer"])) in scorers.normalize(answer)


def judge(instance: dict, candidate: str, reference: str) -> float:
    """1 if only the candidate is right, 0 if only the reference is, else a tie."""
    mine, theirs = correct(instance, candidate), correct(instance, reference)
    return 0.5 if mine == theirs else float(mine)


quiz_elo = EloEval(
    name="quiz_elo",
    pool=quiz,
    references={
        "ref-800": Reference(800, "elo_references/ref-800-predictions.jsonl"),
        "ref-1000": Reference(1000, "elo_references/ref-1000-predictions.jsonl"),
        "ref-1200": Reference(1200, "elo_references/ref-1200-predictions.jsonl"),
        "ref-1400": Reference(1400, "elo_references/ref-1400-predictions.jsonl"),
    },
    stages=[Stage(tasks=8), Stage(tasks=8, references=2), Stage(tasks=8, references=2)],
    judge=judge,
    seed=7,
    gate=Gate("elo", min=900),
)
