"""Hooks the plugin adds to pytest, so a conftest can extend it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_evalreplay.model import Provider


@pytest.hookspec(firstresult=True)
def pytest_evalreplay_make_provider(config: pytest.Config, kind: str) -> Provider | Any | None:
    """Return a provider for `kind` (the value of --evalreplay-provider), or
    None to leave it to other plugins and the built-ins. The first non-None
    result wins; conftest implementations are asked before the built-ins."""
