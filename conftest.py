"""Root conftest: plugin tests drive pytest in a sandbox through `pytester`;
tests marked `slow` are skipped unless asked for.

This is pytest's documented `--runslow` recipe, not `addopts = -m "not
slow"`: a user's own `-m` (say `-m vllm`) replaces the ini's, and the slow
tests would silently come back. They are skipped, not deselected, so that
the count shows under pytest-xdist too (whose summary leaves deselected
tests out) and `-rs` says how to run them. `pytest --run-slow` runs
everything; a `-m` expression that names `slow` (`-m slow`, `-m "slow and
not vllm"`) decides on its own. CI (.ci/run) runs them once."""

from __future__ import annotations

import re

# Imported here, once, so the in-process pytester runs find hypothesis in
# sys.modules instead of re-importing (and assertion-rewriting) it on every
# run through its pytest plugin's terminal summary: about 1 s per run.
import hypothesis  # noqa: F401
import pytest

pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow",
        action="store_true",
        help="also run the tests marked slow (skipped by default; `-m slow` runs only them)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markexpr = config.getoption("markexpr", default="") or ""
    if config.getoption("run_slow") or re.search(r"\bslow\b", markexpr):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow (or -m slow for only these)")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)
