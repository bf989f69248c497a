"""Issue 30's ELO and judge cases: a judge's BaseException and bad
Generation fail that item like a scorer's and a provider's; `-x` stops
before a later stage is generated; references are checked at collection;
and the status lines say what happened, once."""

from __future__ import annotations

import re

from elo_project import Project

BAD_JUDGE_PROVIDER = """

class NoText:
    kind, batch_size, model = "notext", None, "nt-1"

    def generate(self, requests):
        return [[Generation(text=None)] for _ in requests]

_plain = pytest_evalreplay_make_provider

def pytest_evalreplay_make_provider(config, kind):
    return NoText() if kind == "notext" else _plain(config, kind)
"""


def counted(out: str, word: str) -> int:
    found = re.search(rf"(\d+) {word}", out)
    return int(found.group(1)) if found else 0


def test_a_function_judge_raising_systemexit_fails_that_item_naming_the_judge(pytester):
    project = Project(pytester, seed="2", bad_value="None", judge="judge_exits")
    path = project.path / "test_elo.py"
    path.write_text(
        path.read_text().replace(
            "memo = EloEval",
            "def judge_exits(instance, candidate, reference):\n"
            "    if instance['id'] == 't001':\n"
            "        raise SystemExit(3)\n"
            "    return judge(instance, candidate, reference)\n\n"
            "memo = EloEval",
        )
    )
    result = project.run()
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "the judge raised SystemExit judging against" in out
    assert "site-packages" not in out and out.count("\n") < 400
    failed = project.metrics()["num_failed"]
    assert failed == counted(result.stdout, "failed") and failed > 0
    assert project.metrics()["num_missing"] == 0


def test_a_judge_provider_returning_text_none_fails_the_item_naming_the_bad_generation(pytester):
    project = Project(pytester, seed="4", judge="judges.llm('notext')")
    (project.path / "conftest.py").write_text((project.path / "conftest.py").read_text() + BAD_JUDGE_PROVIDER)
    result = project.run()
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "provider raised TypeError" not in out
    assert "the judge failed on" in out and "provider returned a bad Generation for rollout 0" in out


GRADED_CONFTEST = """
from pytest_evalreplay import Generation

class Sampler:
    kind, model = "sampler", "sampler-1"

    def generate(self, requests):
        return [[Generation(text="4") for _ in r.rollouts] for r in requests]

class NoText:
    kind, model = "notext", "nt-1"

    def generate(self, requests):
        return [[Generation(text=None)] for _ in requests]

def pytest_evalreplay_make_provider(config, kind):
    return {"sampler": Sampler, "notext": NoText}.get(kind, lambda: None)()
"""


def test_a_grader_returning_text_none_fails_the_item_naming_the_bad_generation(pytester):
    pytester.makeconftest(GRADED_CONFTEST)
    pytester.makepyfile(
        test_evals="from pytest_evalreplay import EvalTask, judges, scorers\n"
        "math = EvalTask('math', [{'id': 'q0'}], prompt='2+2? {id}',\n"
        "    scorer=scorers.graded(rubric=['says 4'], judge=judges.llm('notext', trials=1)))\n"
    )
    result = pytester.runpytest("--evalreplay-provider=sampler", "--evalreplay-output=run", "-p", "no:xdist")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "provider raised TypeError" not in out
    result.stdout.fnmatch_lines(
        ["*the grader on criterion 'says 4' failed: provider returned a bad Generation*"]
    )
