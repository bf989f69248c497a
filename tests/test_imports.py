"""What a session costs the process: a session without evals imports only the
hooks and the option table, an eval run no numpy or scipy for its metrics
(pytester subprocess runs, so nothing the test process imported counts), and
an eval run's garbage collector settings are put back at its end."""

from __future__ import annotations

import pytest

DUMP = """
import sys

def pytest_unconfigure(config):
    with open("modules.txt", "w") as out:
        out.write("\\n".join(sorted(sys.modules)))
"""

CONFTEST = (
    DUMP
    + """
from pytest_evalreplay import Generation

class Yes:
    kind, batch_size, model = "yes", None, "yes-1"

    def generate(self, requests):
        return [[Generation(text="yes", finish_reason="stop") for _ in r.rollouts] for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Yes() if kind == "yes" else None
"""
)

EVALS = """
from pytest_evalreplay import EvalTask
t = EvalTask("t", [{"id": f"q{n}", "question": str(n)} for n in range(6)], prompt="{question}",
             scorer=lambda text, i: float(text == "yes" and int(i["question"]) % 2 == 0), num_samples=2)
"""


QUIET = ("-p", "no:randomly")


def _modules(pytester: pytest.Pytester) -> set[str]:
    return set((pytester.path / "modules.txt").read_text().split())


def test_an_eval_session_imports_neither_numpy_nor_scipy(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    result = pytester.runpytest_subprocess(*QUIET, "--evalreplay-provider=yes", "--evalreplay-output=run")
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(["t: 6 instances, 12 items, 0 failed | * | score=0.5000 [[]*]*"])
    loaded = _modules(pytester)
    assert "pytest_evalreplay.numbers.stats" in loaded  # the interval was computed
    assert not {m for m in loaded if m.split(".")[0] in ("numpy", "scipy")}
    # the agent machinery (episodes, the endpoint's HTTP server) waits for an agent task
    agents = {"pytest_evalreplay.run.episodes", "pytest_evalreplay.run.endpoint", "pytest_evalreplay.agent"}
    assert not agents & loaded


def test_a_session_without_evals_imports_only_the_hooks_and_the_option_table(
    pytester: pytest.Pytester,
) -> None:
    """Start-up (#34): the settings, the data model, xdist's hooks and orjson
    wait for a session that uses the plugin."""
    pytester.makeconftest(DUMP)
    pytester.makepyfile("def test_one():\n    assert 1 + 1 == 2\n")
    pytester.runpytest_subprocess(*QUIET).assert_outcomes(passed=1)
    loaded = _modules(pytester)
    ours = {m for m in loaded if m.startswith("pytest_evalreplay")}
    start_up = {"plugin", "plugin.hooks", "plugin.hookspecs", "plugin.options"}
    assert ours == {"pytest_evalreplay", *(f"pytest_evalreplay.{m}" for m in start_up)}
    assert not {m for m in loaded if m.split(".")[0] in ("filelock", "numpy", "scipy", "orjson")}


def test_an_eval_session_collects_garbage_in_full_rarely_and_restores_the_thresholds(
    pytester: pytest.Pytester,
) -> None:
    import gc

    pytester.makeconftest(
        CONFTEST
        + """
import gc

seen = []

def pytest_runtest_call(item):
    seen.append(gc.get_threshold())

def pytest_terminal_summary(terminalreporter):
    assert seen and all(t == seen[0] for t in seen)
    terminalreporter.write_line(f"thresholds during the run: {seen[0]}")
"""
    )
    pytester.makepyfile(test_evals=EVALS)
    before = gc.get_threshold()
    result = pytester.runpytest(
        "-p", "no:randomly", "-s", "--evalreplay-provider=yes", "--evalreplay-output=run"
    )
    result.assert_outcomes(passed=12)
    young, middle, old = before
    result.stdout.fnmatch_lines([f"thresholds during the run: ({young}, {middle}, {old * 10})"])
    assert gc.get_threshold() == before


def test_the_help_texts_name_the_defaults_the_settings_use() -> None:
    """options.py writes the defaults into its help texts rather than import
    settings.py at start-up: they must stay the same numbers."""
    from pytest_evalreplay import settings
    from pytest_evalreplay.plugin.options import BY_NAME

    for name, value in [
        ("concurrency", settings.DEFAULT_CONCURRENCY),
        ("max-attempts", settings.DEFAULT_MAX_ATTEMPTS),
        ("progress-interval", settings.DEFAULT_PROGRESS_INTERVAL),
    ]:
        assert f"(default {value:g})" in BY_NAME[name].help, name
