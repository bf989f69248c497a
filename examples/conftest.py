"""Registers the example's rule-based model as provider kind `rulebased`."""

from __future__ import annotations

from rulebased_model import RuleBasedModel


def pytest_evalreplay_make_provider(config, kind):
    return RuleBasedModel() if kind == "rulebased" else None
