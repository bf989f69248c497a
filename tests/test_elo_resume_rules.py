"""Two resume rules of an EloEval, run in process with pytester: a bare
`--resume-stage` starts at the first stage whose recorded fingerprint no
longer matches (it does not keep, or refuse, a stage whose configuration
changed), and an LLM judge request that failed in an earlier run is asked
again in a new one (only this run's final failure stops a request)."""

from __future__ import annotations

import pytest
from elo_project import CONFTEST, REFERENCES, evals_source, write_reference


def write_project(pytester: pytest.Pytester, **fields: str) -> None:
    """The ELO project's test module, with two stages (and a fixed seed) unless `fields` say otherwise."""
    values = {"stages": "[Stage(tasks=4), Stage(tasks=4, references=1)]", "seed": "3", **fields}
    pytester.makepyfile(test_elo=evals_source(**values))


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    for name, (_, accuracy) in REFERENCES.items():
        write_reference(pytester.path / "refs", name, accuracy)
    for log in ("CALL_LOG", "JUDGE_LOG", "JUDGE_MODEL_LOG"):
        monkeypatch.setenv(log, str(pytester.path / f"{log.lower()}.jsonl"))
    for name in ("JUDGE_REPLY", "JUDGE_MODEL", "KILL_AT_JUDGE", "INTERRUPT_AT_CALL"):
        monkeypatch.delenv(name, raising=False)
    write_project(pytester)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(
        "-p", "no:cacheprovider", "--evalreplay-provider=cand", "--evalreplay-output=out", *args
    )


def asked(pytester: pytest.Pytester) -> int:
    path = pytester.path / "judge_model_log.jsonl"
    return len(path.read_bytes().splitlines()) if path.exists() else 0


# A reference's rating: stage 1's fingerprint (and every later one's) changes.
RATED_AGAIN = (
    "{"
    + ", ".join(
        f"{n!r}: Reference({e + 50}, 'refs/{n}-predictions.jsonl')" for n, (e, _) in REFERENCES.items()
    )
    + "}"
)


@pytest.mark.parametrize(("stage", "edit"), [(1, RATED_AGAIN), (2, None)], ids=["stage-1", "stage-2"])
def test_a_bare_resume_stage_plans_afresh_from_the_first_stage_whose_configuration_changed(
    project: pytest.Pytester, stage: int, edit: str | None
) -> None:
    assert run(project).ret == 0
    if edit is not None:  # the references' ratings: stage 1's fingerprint (and every later one's) changes
        write_project(project, references=edit)
    else:  # stage 2's references: only its fingerprint changes
        write_project(project, stages="[Stage(tasks=4), Stage(tasks=4, references=2)]")
    result = run(project, "--resume-stage")
    assert result.ret == 0, result.outlines + result.errlines
    result.stdout.fnmatch_lines([f"*memo: stage {stage}/2 planned afresh (--resume-stage={stage})*"])
    assert "nothing to run again" not in result.stdout.str()
    if stage == 2:
        result.stdout.fnmatch_lines(["*memo: stage 1/2 kept from the journal*"])


def test_an_llm_judge_request_that_failed_in_an_earlier_run_is_asked_again(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_project(project, judge="judges.llm('judgemodel')")
    monkeypatch.setenv("JUDGE_REPLY", "I cannot decide.")
    failed = run(project, "--evalreplay-max-attempts=1")
    assert failed.ret == 1, failed.outlines
    before = asked(project)
    assert before > 0
    monkeypatch.delenv("JUDGE_REPLY")
    result = run(project, "--evalreplay-max-attempts=1")
    assert result.ret == 0, result.outlines + result.errlines
    assert asked(project) - before == 4 * 3 * 2 + 4 * 1 * 2  # every request of both stages, asked again
