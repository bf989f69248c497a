"""pytest-evalreplay: LLM evaluations as pytest suites, resumable, replayable
and gate-able in CI."""

from pytest_evalreplay import judges, scorers
from pytest_evalreplay.gates import Gate
from pytest_evalreplay.model import (
    EvalReplayError,
    EvalResult,
    Generation,
    GenerationError,
    Provider,
    Request,
    RolloutResult,
)
from pytest_evalreplay.stages import EloEval, Reference, Stage
from pytest_evalreplay.task import EvalTask

__all__ = [
    "EloEval",
    "EvalReplayError",
    "EvalResult",
    "EvalTask",
    "Gate",
    "Generation",
    "GenerationError",
    "Provider",
    "Reference",
    "ReplayProvider",
    "Request",
    "RolloutResult",
    "Stage",
    "judges",
    "scorers",
]


def __getattr__(name: str) -> object:
    # The replay provider is imported on first use, keeping `import pytest_evalreplay` light.
    if name == "ReplayProvider":
        from pytest_evalreplay.providers.replay import ReplayProvider

        return ReplayProvider
    raise AttributeError(f"module 'pytest_evalreplay' has no attribute {name!r}")
