"""Command-line options, their ini twins, and the resolved `Settings`.

Each option `--evalreplay-foo` has an ini key `evalreplay_foo`; the command
line wins. `Settings` is plain frozen data so the rest of the package never
touches `pytest.Config` directly.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from pytest_evalreplay.model import EvalReplayError

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
    in_play: bool = False  # any evalreplay option or ini key is set


# (name, ini type, help, command-line kwargs)
_OPTIONS: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "predictions",
        "string",
        "rescore saved generations from PATH (a run dir or predictions file) "
        "with the replay provider; also what the replay_provider fixture serves",
        {"metavar": "PATH"},
    ),
    (
        "provider",
        "string",
        "provider kind: replay, vllm, openai, or one a conftest registers",
        {"metavar": "KIND"},
    ),
    ("model", "string", "model name or path for the vllm / openai providers", {"metavar": "NAME"}),
    (
        "base-url",
        "linelist",
        "OpenAI-compatible server URL for the openai provider (repeatable: requests are spread "
        "over several servers serving the same model)",
        {"action": "append", "metavar": "URL"},
    ),
    (
        "timeout",
        "string",
        "per-request time limit in seconds; past it, a retryable failure (default: none)",
        {"metavar": "SECONDS"},
    ),
    (
        "engine-arg",
        "linelist",
        "vLLM engine argument KEY=VALUE (repeatable; VALUE parsed as JSON where it parses)",
        {"action": "append", "metavar": "KEY=VALUE"},
    ),
    (
        "concurrency",
        "string",
        f"requests in flight for the openai provider (default {DEFAULT_CONCURRENCY})",
        {"metavar": "N"},
    ),
    ("report", "string", "also write the summary as Markdown to FILE", {"metavar": "FILE"}),
    (
        "output",
        "string",
        "directory for the run dir and its journal (default: under pytest's cache dir)",
        {"metavar": "DIR"},
    ),
    (
        "max-attempts",
        "string",
        f"attempts per item before a retryable failure is final (default {DEFAULT_MAX_ATTEMPTS})",
        {"metavar": "N"},
    ),
    (
        "failure-budget",
        "string",
        "fraction of a task's items allowed to fail before its gate fails (default 0)",
        {"metavar": "F"},
    ),
    (
        "baseline",
        "string",
        "baseline file that gated metrics are compared with",
        {"metavar": "FILE"},
    ),
    (
        "batch-size",
        "string",
        "requests per provider call (default: what the provider prefers; the whole task for most)",
        {"metavar": "N"},
    ),
]


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("evalreplay", "LLM evaluations (pytest-evalreplay)")
    for name, ini_type, help_text, kwargs in _OPTIONS:
        dest = "evalreplay_" + name.replace("-", "_")
        group.addoption(f"--evalreplay-{name}", dest=dest, default=None, help=help_text, **kwargs)
        ini_help = help_text if ini_type != "linelist" else help_text + " (one per line)"
        parser.addini(
            dest if name != "engine-arg" else "evalreplay_engine_args", ini_help, type=ini_type, default=None
        )
    group.addoption(
        "--resume",
        action="store_true",
        default=False,
        dest="evalreplay_resume",
        help="reuse every item the fingerprinted journal holds as done; run only the rest",
    )
    parser.addini("evalreplay_resume", "always resume (bool)", type="bool", default=False)
    group.addoption(
        "--resume-stage",
        nargs="?",
        const="first",
        default=None,
        dest="evalreplay_resume_stage",
        metavar="N",
        help="multi-stage evals: keep stages before N from the journal and plan N onward afresh; "
        "without N, continue at the first incomplete stage",
    )
    parser.addini(
        "evalreplay_resume_stage", "resume multi-stage evals from this stage ('first': the first incomplete)"
    )
    group.addoption(
        "--evalreplay-update-baseline",
        action="store_true",
        default=False,
        dest="evalreplay_update_baseline",
        help="write the baseline file (--evalreplay-baseline) from this run's results",
    )
    parser.addini(
        "evalreplay_update_baseline", "write the baseline from this run (bool)", type="bool", default=False
    )
    group.addoption(
        "--evalreplay-reset",
        action="store_true",
        default=False,
        dest="evalreplay_reset",
        help="discard the saved results (journal and run dir files) of every task this run selects, "
        "then run them afresh",
    )
    group.addoption(
        "--evalreplay-report-reused",
        action="store_true",
        default=False,
        dest="evalreplay_report_reused",
        help="with --resume, keep reused items in the run (reported skipped, with their scores, in "
        "the terminal and JUnit XML) instead of deselecting them; costs pytest's per-item overhead",
    )
    parser.addini(
        "evalreplay_report_reused",
        "report reused items instead of deselecting them (bool)",
        type="bool",
        default=False,
    )
    group.addoption(
        "--evalreplay-reuse-scores",
        action="store_true",
        default=False,
        dest="evalreplay_reuse_scores",
        help="with --resume, keep the saved scores of reused rollouts instead of scoring them again "
        "(for expensive scorers; a changed scorer is then not noticed)",
    )
    parser.addini(
        "evalreplay_reuse_scores", "keep saved scores of reused rollouts (bool)", type="bool", default=False
    )
    parser.addini(
        "evalreplay_progress_interval",
        f"seconds between generation progress lines in a non-terminal log (default {DEFAULT_PROGRESS_INTERVAL:g})",
        default=None,
    )


def _raw(config: pytest.Config, name: str) -> Any:
    dest = "evalreplay_" + name.replace("-", "_")
    value = config.getoption(dest)
    if value is None or value == []:
        ini_name = dest if name != "engine-arg" else "evalreplay_engine_args"
        value = config.getini(ini_name)
    return value if value not in ("", []) else None


def _number(config: pytest.Config, name: str, kind: type, low: float, default: Any) -> Any:
    raw = _raw(config, name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value < low:
        raise pytest.UsageError(
            f"--evalreplay-{name} (ini evalreplay_{name.replace('-', '_')}) must be a "
            f"{'number' if kind is float else 'whole number'} >= {low}, got {raw!r}"
        )
    return value


def _resume_stage(config: pytest.Config) -> int | None:
    raw = config.getoption("evalreplay_resume_stage") or config.getini("evalreplay_resume_stage") or None
    if raw is None:
        return None
    if str(raw).strip().lower() == "first":
        return 0
    try:
        value = int(str(raw))
    except ValueError:
        value = 0
    if value < 1:
        raise pytest.UsageError(f"--resume-stage takes a stage number >= 1 (or nothing), got {raw!r}")
    return value


def _progress_interval(config: pytest.Config) -> float:
    raw = config.getini("evalreplay_progress_interval")
    if not raw:
        return DEFAULT_PROGRESS_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (0 <= value < float("inf")):
        raise pytest.UsageError(
            f"ini evalreplay_progress_interval must be a number of seconds >= 0, got {raw!r}"
        )
    return value


def _in_play(config: pytest.Config) -> bool:
    """Whether this session asked for anything of the plugin (an option or ini key)."""
    for name, _, _, _ in _OPTIONS:
        if _raw(config, name) is not None:
            return True
    flags = ("evalreplay_resume", "evalreplay_update_baseline", "evalreplay_reset", "evalreplay_resume_stage")
    return any(config.getoption(f) for f in flags) or bool(config.getini("evalreplay_resume"))


def _timeout(config: pytest.Config) -> float | None:
    value = _number(config, "timeout", float, 0.0, None)
    if value is not None and not (0 < value < float("inf")):
        raise pytest.UsageError(f"--evalreplay-timeout must be a positive number of seconds, got {value!r}")
    return value


def parse_engine_args(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; VALUE is JSON where it parses (so 0.1, true, [1,2] keep their types)."""
    args: dict[str, Any] = {}
    for item in items:
        for part in shlex.split(item) if " " in item.strip() else [item]:
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise EvalReplayError(f"engine argument {part!r} is not KEY=VALUE")
            try:
                args[key.strip()] = orjson.loads(value)
            except orjson.JSONDecodeError:
                args[key.strip()] = value
    return args


def _provider_kind(config: pytest.Config) -> str | None:
    """Saved predictions imply the replay provider, unless a provider is named
    at the same level: command line before ini, and on each level an explicit
    --evalreplay-provider before --evalreplay-predictions."""
    for source in (config.getoption, config.getini):
        kind = source("evalreplay_provider")
        if kind:
            return str(kind)
        if source("evalreplay_predictions"):
            return "replay"
    return None


def resolve(config: pytest.Config) -> Settings:
    """Read every option (command line first, then ini) into `Settings`."""

    def path(name: str) -> Path | None:
        raw = _raw(config, name)
        if raw is None:
            return None
        p = Path(raw).expanduser()
        return p if p.is_absolute() else Path(config.invocation_params.dir) / p

    budget = _number(config, "failure-budget", float, 0.0, 0.0)
    if budget > 1:
        raise pytest.UsageError(f"--evalreplay-failure-budget must be a fraction in [0, 1], got {budget}")
    update_baseline = bool(
        config.getoption("evalreplay_update_baseline") or config.getini("evalreplay_update_baseline")
    )
    if update_baseline and path("baseline") is None:
        raise pytest.UsageError(
            "--evalreplay-update-baseline needs --evalreplay-baseline=FILE (ini evalreplay_baseline) to write"
        )
    try:
        engine_args = parse_engine_args(_raw(config, "engine-arg") or [])
    except EvalReplayError as exc:
        raise pytest.UsageError(f"--evalreplay-engine-arg: {exc}") from None
    return Settings(
        provider=_provider_kind(config),
        predictions=path("predictions"),
        model=_raw(config, "model"),
        base_urls=tuple(_raw(config, "base-url") or ()),
        engine_args=engine_args,
        concurrency=_number(config, "concurrency", int, 1, DEFAULT_CONCURRENCY),
        output=path("output"),
        report=path("report"),
        resume=bool(config.getoption("evalreplay_resume") or config.getini("evalreplay_resume")),
        max_attempts=_number(config, "max-attempts", int, 1, DEFAULT_MAX_ATTEMPTS),
        batch_size=_number(config, "batch-size", int, 1, None),
        failure_budget=budget,
        baseline=path("baseline"),
        update_baseline=update_baseline,
        quiet=config.getoption("verbose") < 0,
        timeout=_timeout(config),
        reset=bool(config.getoption("evalreplay_reset")),
        resume_stage=_resume_stage(config),
        report_reused=bool(
            config.getoption("evalreplay_report_reused") or config.getini("evalreplay_report_reused")
        ),
        reuse_scores=bool(
            config.getoption("evalreplay_reuse_scores") or config.getini("evalreplay_reuse_scores")
        ),
        progress_interval=_progress_interval(config),
        in_play=_in_play(config),
    )
