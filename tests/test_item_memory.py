"""What a finished item leaves behind for the rest of the session (issue #34):
pytest keeps every report, each with a copy of its item's user_properties,
so equal properties are one tuple, and the `evalreplay` mark sits on the
task's collector, not on each item."""

from __future__ import annotations

import pytest

from pytest_evalreplay.plugin.items import _property

CONFTEST = """
from pytest_evalreplay import Generation


class Echo:
    kind, model = "echo", "echo-1"

    def generate(self, requests):
        return [[Generation("ok", finish_reason="stop") for _ in r.rollouts] for r in requests]


def pytest_evalreplay_make_provider(config, kind):
    return Echo()
"""

TASK = """
from pytest_evalreplay import EvalTask



def exact(text, instance):
    return 1.0


t = EvalTask("t", [{"id": f"q{i}"} for i in range(4)], prompt="{id}", scorer=exact)
"""


def test_equal_properties_are_one_tuple_and_unequal_ones_stay_apart():
    assert _property("score.x", 1.0) is _property("score.x", 1.0)
    assert _property("evalreplay.task", "gsm8k") is _property("evalreplay.task", "gsm8k")
    # Equal in Python, written differently in JUnit XML: never conflated.
    values = [1.0, 1, True, 0.0, -0.0, 0, False]
    kept = [_property("score.y", v) for v in values]
    for (name, value), given in zip(kept, values, strict=True):
        assert name == "score.y" and type(value) is type(given) and repr(value) == repr(given)
    nan = float("nan")
    assert repr(_property("score.z", nan)[1]) == "nan"
    assert _property("agent.turns", [1, 2]) == ("agent.turns", [1, 2])  # unhashable: a tuple of its own


def test_items_of_a_task_share_their_properties_and_mark(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_t=TASK)
    reports: list[pytest.TestReport] = []

    class Keep:
        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            if report.when == "call":
                reports.append(report)

        def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
            assert all(not item.own_markers and item.get_closest_marker("evalreplay") for item in items)

    result = pytester.runpytest_inprocess("--evalreplay-provider=echo", "-p", "no:randomly", plugins=[Keep()])
    result.assert_outcomes(passed=4)
    first, *rest = (dict((k, id(p)) for p in r.user_properties for k in [p[0]]) for r in reports)
    assert {"evalreplay.task", "score.exact", "finish_reason"} <= first.keys()
    for other in rest:
        for name in ("evalreplay.task", "evalreplay.stage", "score.exact", "finish_reason"):
            assert other[name] == first[name], name
        assert other["evalreplay.instance"] != first["evalreplay.instance"]
