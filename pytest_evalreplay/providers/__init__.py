"""Providers: one module per kind. This module maps a kind to its factory.

Each built-in factory takes the resolved `Settings` and returns a provider;
heavy imports (vllm, HTTP) happen inside the factory, so choosing `replay`
never imports vllm. A conftest adds kinds through the
`pytest_evalreplay_make_provider` hook, asked before the built-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.options import Settings

# kind -> "module:factory"; the module is imported only when the kind is chosen.
BUILTIN_KINDS: dict[str, str] = {
    "replay": "pytest_evalreplay.providers.replay:from_settings",
    "vllm": "pytest_evalreplay.providers.vllm:from_settings",
    "openai": "pytest_evalreplay.providers.openai:from_settings",
}


def make_builtin(kind: str, settings: Settings) -> Any:
    """The built-in provider of `kind`, or a usage error listing the kinds."""
    target = BUILTIN_KINDS.get(kind)
    if target is None:
        raise EvalReplayError(
            f"unknown provider kind {kind!r}: built-in kinds are {sorted(BUILTIN_KINDS)}; "
            "a conftest can add one with the pytest_evalreplay_make_provider hook"
        )
    module_name, _, attr = target.partition(":")
    factory: Callable[[Settings], Any] = getattr(import_module(module_name), attr)
    return factory(settings)
