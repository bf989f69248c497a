"""pytest-evalreplay: LLM evaluations as pytest suites, resumable, replayable
and gate-able in CI.

The public names are imported on first use (PEP 562), so that pytest loading
the plugin in an environment where it is installed costs next to nothing
when no evaluation runs.
"""

from __future__ import annotations

import sys
import warnings
from importlib import import_module
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_evalreplay import judges, scorers
    from pytest_evalreplay.gate import Gate
    from pytest_evalreplay.model import (
        EvalReplayError,
        Generation,
        GenerationError,
        LoglikelihoodProvider,
        Provider,
        Request,
        StreamingProvider,
    )
    from pytest_evalreplay.providers.replay import ReplayProvider
    from pytest_evalreplay.run.execution import RolloutResult
    from pytest_evalreplay.run.offline import EvalResult
    from pytest_evalreplay.stages import EloEval, Reference, Stage
    from pytest_evalreplay.task import EvalTask

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "EloEval": "pytest_evalreplay.stages",
    "EvalReplayError": "pytest_evalreplay.model",
    "EvalResult": "pytest_evalreplay.run.offline",
    "EvalTask": "pytest_evalreplay.task",
    "Gate": "pytest_evalreplay.gate",
    "Generation": "pytest_evalreplay.model",
    "GenerationError": "pytest_evalreplay.model",
    "LoglikelihoodProvider": "pytest_evalreplay.model",
    "Provider": "pytest_evalreplay.model",
    "Reference": "pytest_evalreplay.stages",
    "ReplayProvider": "pytest_evalreplay.providers.replay",
    "Request": "pytest_evalreplay.model",
    "RolloutResult": "pytest_evalreplay.run.execution",
    "Stage": "pytest_evalreplay.stages",
    "StreamingProvider": "pytest_evalreplay.model",
}
_SUBMODULES = ("judges", "scorers")

# Documented module paths from before the package was split by role
# (docs/api.md): old path -> where it lives now. Importing an old path
# gives the new module and a DeprecationWarning.
_MOVED: dict[str, str] = {
    "pytest_evalreplay.compare": "pytest_evalreplay.report.compare",
    "pytest_evalreplay.compare_render": "pytest_evalreplay.report.compare_render",
    "pytest_evalreplay.snapshot": "pytest_evalreplay.rundir.snapshot",
    "pytest_evalreplay.stats": "pytest_evalreplay.numbers.stats",
    "pytest_evalreplay.runschema": "pytest_evalreplay.storage.runschema",
    "pytest_evalreplay.fingerprint": "pytest_evalreplay.values.fingerprint",
    "pytest_evalreplay.shard": "pytest_evalreplay.values.shard",
    "pytest_evalreplay.snippets": "pytest_evalreplay.values.snippets",
    "pytest_evalreplay.credentials": "pytest_evalreplay.values.credentials",
}


class _MovedModule:
    """Finder and loader of a moved path: the module is the new one, not a copy,
    so `isinstance` checks and monkeypatches see one object."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        return ModuleSpec(fullname, _MovedModule) if fullname in _MOVED else None

    @staticmethod
    def create_module(spec: ModuleSpec) -> ModuleType:
        new = _MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new} (docs/api.md); import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return import_module(new)

    @staticmethod
    def exec_module(module: ModuleType) -> None:
        """The new module ran when it was imported."""


sys.meta_path.append(_MovedModule)  # type: ignore[arg-type]

__all__ = [
    "EloEval",
    "EvalReplayError",
    "EvalResult",
    "EvalTask",
    "Gate",
    "Generation",
    "GenerationError",
    "LoglikelihoodProvider",
    "Provider",
    "Reference",
    "ReplayProvider",
    "Request",
    "RolloutResult",
    "Stage",
    "StreamingProvider",
    "judges",
    "scorers",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = import_module(f"pytest_evalreplay.{name}")
    else:
        raise AttributeError(f"module 'pytest_evalreplay' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
