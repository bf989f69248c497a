"""Providers: one module per kind. This module maps a kind to its factory and
hosts the session's provider (built when first needed, named, closed).

Each built-in factory takes the resolved `Settings` and returns a provider;
heavy imports (vllm, HTTP) happen inside the factory, so choosing `replay`
never imports vllm. A conftest adds kinds through the
`pytest_evalreplay_make_provider` hook, asked before the built-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from pytest_evalreplay.model import EvalReplayError, Provider
from pytest_evalreplay.settings import Settings
from pytest_evalreplay.storage.rowfields import type_name
from pytest_evalreplay.values.fingerprint import path_signature

# kind -> "module:factory"; the module is imported only when the kind is chosen.
BUILTIN_KINDS: dict[str, str] = {
    "replay": "pytest_evalreplay.providers.replay:from_settings",
    "vllm": "pytest_evalreplay.providers.vllm:from_settings",
    "openai": "pytest_evalreplay.providers.openai:from_settings",
}

NO_PROVIDER = (
    "no provider chosen: pass --evalreplay-provider=KIND (ini evalreplay_provider) "
    "or --evalreplay-predictions=PATH to rescore a saved run"
)


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


HookMaker = Callable[[str], Any]


@dataclass
class ProviderHost:
    """The session's provider: its identity (what the journal keys reuse on)
    known without building a built-in, the provider built only when something
    must be generated (a fully reused session starts no engine and loads no
    saved run), and closed once at the end."""

    settings: Settings
    from_hook: HookMaker  # asks the conftest hook; None if no plugin makes this kind
    _provider: Any = None
    _hooked: bool | None = None
    _closed: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.settings.provider is None:
            raise EvalReplayError(NO_PROVIDER)
        return self.settings.provider

    def _ask_hook(self) -> None:
        if self._hooked is None:
            made = self.from_hook(self.kind)
            if made is not None and not callable(getattr(made, "generate", None)):
                raise EvalReplayError(
                    f"the pytest_evalreplay_make_provider hook returned {type_name(made)} {made!r:.40} for "
                    f"provider kind {self.kind!r}: return a provider (an object with generate(requests)), "
                    "or None for kinds it does not make"
                )
            self._hooked = made is not None
            if made is not None:
                self._provider = made

    def identity(self) -> dict[str, Any]:
        """What makes generations of this provider interchangeable: its kind,
        its model and what else picks the weights. A conftest provider is built
        here (its `model` attribute names it); built-ins are named from settings."""
        kind = self.kind
        self._ask_hook()
        s = self.settings
        if self._hooked:
            model = getattr(self._provider, "model", None)
            return {"kind": kind, "model": model if isinstance(model, str) else None}
        if kind == "replay":
            if s.predictions is None:
                return {"kind": kind}
            return {"kind": kind, "predictions": str(s.predictions), "files": path_signature(s.predictions)}
        if kind == "vllm":
            return {"kind": kind, "model": s.model, "engine_args": dict(s.engine_args)}
        if kind in BUILTIN_KINDS:
            return {"kind": kind, "model": s.model}
        # An unknown kind: building it raises the clear error.
        self.get()
        return {"kind": kind}

    @property
    def built(self) -> bool:
        return self._provider is not None

    def get(self) -> Provider:
        """The provider, built on first call (a bad setting raises EvalReplayError)."""
        if self._provider is None:
            if self._closed:
                raise EvalReplayError("the provider was closed at the end of the session")
            self._ask_hook()
            if self._provider is None:
                self._provider = make_builtin(self.kind, self.settings)
        return self._provider  # type: ignore[no-any-return]

    def model(self) -> str | None:
        """The model name for the manifest and metrics, without building a built-in."""
        if self._provider is not None:
            model = getattr(self._provider, "model", None)
            if isinstance(model, str):
                return model
        return self.settings.model

    def close(self) -> None:
        """Close the provider once; a `close()` that raises becomes a note, not a traceback.
        A provider's `notes` (strings: a check it skipped, why it gave up) join the host's."""
        provider, self._provider = self._provider, None
        self._closed = True
        notes = getattr(provider, "notes", None)
        if isinstance(notes, (list, tuple)):
            self.notes.extend(n for n in notes if isinstance(n, str) and n not in self.notes)
        close = getattr(provider, "close", None)
        if callable(close):
            try:
                close()
            except Exception as exc:
                self.notes.append(f"the provider's close() raised {type(exc).__name__}: {exc}")
