"""The resolved run settings: plain frozen data, free of pytest.

`options.py` builds a `Settings` from the command line and ini; providers,
the session and everything below them read this type only, so they can be
used (and tested) without a pytest config and never import the pytest-facing
layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_evalreplay.values.shard import Shard

DEFAULT_CONCURRENCY = 32
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_PROGRESS_INTERVAL = 15.0


@dataclass(frozen=True)
class Settings:
    provider: str | None = None
    predictions: Path | None = None
    model: str | None = None
    base_urls: tuple[str, ...] = ()
    engine_args: dict[str, Any] = field(default_factory=dict)
    concurrency: int = DEFAULT_CONCURRENCY
    output: Path | None = None
    report: Path | None = None
    html: Path | None = None  # --evalreplay-html: the HTML report written at the end
    compare: Path | None = None
    resume: bool = False
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    batch_size: int | None = None
    failure_budget: float = 0.0
    baseline: Path | None = None
    update_baseline: bool = False
    quiet: bool = False
    timeout: float | None = None
    reset: bool = False
    resume_stage: int | None = None  # 0: the first incomplete stage
    report_reused: bool = False
    reuse_scores: bool = False
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL
    shard: Shard | None = None  # --evalreplay-shard=K/N: this process runs shard K of N
    no_generate: bool = False  # write the run dir from the journal; what needs generating stays missing
    in_play: bool = False  # any evalreplay option or ini key is set
