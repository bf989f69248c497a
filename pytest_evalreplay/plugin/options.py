"""Command-line options, their ini twins, and the resolved `Settings`.

Each option `--evalreplay-foo` has an ini key `evalreplay_foo`; the command
line wins. Ini values are typed by pytest (`bool`, `int`, `float`, `paths`:
a path relative to the ini file's directory, as pytest resolves its own);
command-line paths are relative to where pytest was started. Every value is
checked here, once, so a bad one is a usage error naming the option and its
ini key. `Settings` (settings.py) is plain frozen data: the rest of the
package never touches `pytest.Config`.

Every pytest session where the plugin is installed imports this module, so
it holds the option table and what reads it, and imports the settings (and
orjson) only when a session resolves them: when an option is given or an
eval task is collected. The defaults the help texts name are settings.py's
(tests/test_imports.py holds them equal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_evalreplay.settings import Settings
    from pytest_evalreplay.values.shard import Shard


@dataclass(frozen=True)
class Option:
    """One option: `--evalreplay-<name>` (or `flag`) and its ini twin."""

    name: str
    kind: str  # "str", "path", "int", "float", "bool", "lines", "stage"
    help: str
    metavar: str | None = None
    flag: str | None = None  # a command-line name other than --evalreplay-<name>
    ini: str | None = None  # an ini key other than evalreplay_<name>

    @property
    def dest(self) -> str:
        return "evalreplay_" + self.name.replace("-", "_")

    @property
    def ini_key(self) -> str:
        return self.ini or self.dest

    @property
    def cli(self) -> str:
        return self.flag or f"--evalreplay-{self.name}"

    def label(self) -> str:
        return f"{self.cli} (ini {self.ini_key})"


_INI_TYPES = {
    "str": "string",
    "path": "paths",
    "int": "int",
    "float": "float",
    "bool": "bool",
    "lines": "linelist",
}

OPTIONS: tuple[Option, ...] = (
    Option(
        "predictions",
        "path",
        "rescore saved generations from PATH (a run dir, a predictions file, or an "
        "olmo-eval / lm-evaluation-harness layout) with the replay provider; also what the replay_provider "
        "fixture serves",
        "PATH",
    ),
    Option("provider", "str", "provider kind: replay, vllm, openai, or one a conftest registers", "KIND"),
    Option("model", "str", "model name or path for the vllm / openai providers", "NAME"),
    Option(
        "base-url",
        "lines",
        "OpenAI-compatible server URL for the openai provider (repeatable: requests "
        "are spread over several servers serving the same model)",
        "URL",
    ),
    Option(
        "engine-arg",
        "lines",
        "vLLM engine argument KEY=VALUE (repeatable; VALUE parsed as JSON where it parses)",
        "KEY=VALUE",
        ini="evalreplay_engine_args",
    ),
    Option(
        "concurrency",
        "int",
        "requests in flight for the openai provider (default 32)",
        "N",
    ),
    Option(
        "timeout",
        "float",
        "per-request time limit in seconds; past it, a retryable failure (default: "
        "none, the openai provider's own 600)",
        "SECONDS",
    ),
    Option(
        "batch-size",
        "int",
        "requests per provider call (default: what the provider prefers; the whole task for most)",
        "N",
    ),
    Option(
        "max-attempts",
        "int",
        "attempts per item before a retryable failure is final (default 3)",
        "N",
    ),
    Option(
        "output",
        "path",
        "directory for the run dir and its journal (default: under pytest's cache dir)",
        "DIR",
    ),
    Option("report", "path", "also write the summary, gates and comparison as Markdown to FILE", "FILE"),
    Option(
        "html",
        "path",
        "also write the run dir as one self-contained HTML report to FILE (with --evalreplay-compare: "
        "the comparison too; needs pytest-evalreplay[html])",
        "FILE",
    ),
    Option(
        "compare",
        "path",
        "compare this run with a saved run dir: metric differences with paired "
        "intervals, and the instances that flipped",
        "RUN_DIR",
    ),
    Option(
        "failure-budget",
        "float",
        "fraction of a task's items allowed to fail before its gate fails (default 0)",
        "F",
    ),
    Option("baseline", "path", "baseline file that gated metrics are compared with", "FILE"),
    Option(
        "update-baseline", "bool", "write the baseline file (--evalreplay-baseline) from this run's results"
    ),
    Option(
        "resume",
        "bool",
        "reuse every rollout whose request and provider the journal holds unchanged "
        "(rescored with the current scorer); generate only the rest",
        flag="--resume",
    ),
    Option(
        "resume-stage",
        "stage",
        "multi-stage evals: keep stages before N from the journal and run N "
        "onward afresh; without N, continue at the first incomplete stage",
        "N",
        flag="--resume-stage",
    ),
    Option(
        "reset",
        "bool",
        "discard the saved results (journal and run dir files) of every task this run "
        "selects, then run them afresh (like --sw-reset)",
    ),
    Option(
        "report-reused",
        "bool",
        "with --resume (or a replay), report reused items as skipped (with their scores, in "
        "the terminal and JUnit XML) instead of deselecting them; costs pytest's per-item overhead",
    ),
    Option(
        "reuse-scores",
        "bool",
        "with --resume, keep the saved scores of reused rollouts instead of "
        "scoring them again (for expensive scorers; a changed scorer is then not noticed)",
    ),
    Option(
        "shard",
        "str",
        "run shard K (1-based) of N: a stable, balanced slice of every task's rollouts, into this "
        "run's output dir (give each shard its own); python -m pytest_evalreplay merge joins them",
        "K/N",
    ),
    Option(
        "no-generate",
        "bool",
        "resume from the journal and generate nothing: items that need a generation are deselected "
        "and stay missing (the run dir says complete: false), no provider is needed; the merge of "
        "shard dirs finishes its run dir this way",
    ),
    Option(
        "progress-interval",
        "float",
        "seconds between generation progress lines in a non-terminal log (default 15)",
        "SECONDS",
    ),
)
BY_NAME = {o.name: o for o in OPTIONS}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("evalreplay", "LLM evaluations (pytest-evalreplay)")
    for o in OPTIONS:
        if o.kind == "bool":
            group.addoption(o.cli, action="store_true", default=False, dest=o.dest, help=o.help)
        elif o.kind == "stage":
            group.addoption(
                o.cli, nargs="?", const="first", default=None, dest=o.dest, metavar=o.metavar, help=o.help
            )
        elif o.kind == "lines":
            group.addoption(o.cli, action="append", default=None, dest=o.dest, metavar=o.metavar, help=o.help)
        else:
            group.addoption(o.cli, default=None, dest=o.dest, metavar=o.metavar, help=o.help)
        ini_type = _INI_TYPES.get(o.kind, "string")
        default: Any = False if o.kind == "bool" else ([] if ini_type in ("paths", "linelist") else None)
        parser.addini(
            o.ini_key,
            o.help + (" (one per line)" if o.kind == "lines" else ""),
            type=ini_type,
            default=default,
        )


def _given(value: Any) -> Any:
    """A value that was set (0 and 0.0 are), or None."""
    return None if value is None or value is False or value == "" or value == [] else value


class _Reader:
    """Reads one option: the command line first, else the ini file."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def cli(self, o: Option) -> Any:
        return _given(self.config.getoption(o.dest))

    def ini(self, o: Option) -> Any:
        try:
            value = self.config.getini(o.ini_key)
        except (ValueError, pytest.UsageError) as exc:  # pytest's int/float conversion of the ini text
            raise pytest.UsageError(f"ini {o.ini_key}: {exc}; see {o.cli}") from None
        return _given(value)

    def raw(self, name: str) -> Any:
        o = BY_NAME[name]
        value = self.cli(o)
        return value if value is not None else self.ini(o)

    def path(self, name: str) -> Path | None:
        o = BY_NAME[name]
        value = self.cli(o)
        if value is not None:  # relative to where pytest was started
            p = Path(str(value)).expanduser()
            return p if p.is_absolute() else Path(self.config.invocation_params.dir) / p
        paths = self.ini(o)
        if paths is None:
            return None
        if len(paths) != 1:
            raise pytest.UsageError(
                f"ini {o.ini_key} takes one path, got {len(paths)}: {' '.join(map(str, paths))}"
            )
        return Path(paths[0]).expanduser()

    def number(self, name: str, kind: type, low: float, default: Any, high: float = math.inf) -> Any:
        o = BY_NAME[name]
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            value = None
        if isinstance(raw, bool) or value is None or not (low <= value <= high) or not math.isfinite(value):
            span = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
            what = "a number" if kind is float else "a whole number"
            raise pytest.UsageError(f"{o.label()} must be {what} {span}, got {raw!r}")
        return value

    def flag(self, name: str) -> bool:
        return bool(self.raw(name))


def parse_engine_args(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; VALUE is JSON where it parses (so 0.1, true, [1,2] keep their types).
    Raises ValueError naming what does not parse."""
    import shlex

    import orjson

    args: dict[str, Any] = {}
    for item in items:
        try:
            parts = shlex.split(item) if " " in item.strip() else [item]
        except ValueError as exc:  # an unclosed quote
            raise ValueError(f"{item!r} does not split into KEY=VALUE pairs ({exc})") from None
        for part in parts:
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{part!r} is not KEY=VALUE")
            try:
                args[key.strip()] = orjson.loads(value)
            except orjson.JSONDecodeError:
                args[key.strip()] = value
    return args


def _resume_stage(raw: Any) -> int | None:
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


def _shard(raw: Any) -> Shard | None:
    if raw is None:
        return None
    from pytest_evalreplay.values.shard import parse_shard

    try:
        return parse_shard(str(raw))
    except ValueError as exc:
        raise pytest.UsageError(f"{BY_NAME['shard'].label()} {exc}") from None


def _provider_kind(read: _Reader) -> str | None:
    """Saved predictions imply the replay provider, unless a provider is named
    at the same level: command line before ini, and on each level an explicit
    --evalreplay-provider before --evalreplay-predictions."""
    for source in (read.cli, read.ini):
        kind = source(BY_NAME["provider"])
        if kind:
            return str(kind)
        if source(BY_NAME["predictions"]):
            return "replay"
    return None


def in_play(config: pytest.Config) -> bool:
    """Whether any evalreplay option or ini key is set (cheap: nothing is
    checked or imported; a session where none is resolves its settings only
    if it collects an eval task)."""
    read = _Reader(config)
    return any(read.raw(o.name) not in (None, False) for o in OPTIONS)


def resolve(config: pytest.Config) -> Settings:
    """Read and check every option (command line first, then ini) into `Settings`."""
    from pytest_evalreplay.settings import (
        DEFAULT_CONCURRENCY,
        DEFAULT_MAX_ATTEMPTS,
        DEFAULT_PROGRESS_INTERVAL,
        Settings,
    )

    read = _Reader(config)
    update_baseline = read.flag("update-baseline")
    baseline = read.path("baseline")
    if update_baseline and baseline is None:
        raise pytest.UsageError(
            "--evalreplay-update-baseline needs --evalreplay-baseline=FILE (ini evalreplay_baseline) to write"
        )
    try:
        engine_args = parse_engine_args(read.raw("engine-arg") or [])
    except ValueError as exc:
        raise pytest.UsageError(f"{BY_NAME['engine-arg'].label()}: {exc}") from None
    timeout = read.number("timeout", float, 0.0, None)
    if timeout == 0:
        raise pytest.UsageError(f"{BY_NAME['timeout'].label()} must be a positive number of seconds, got 0")
    return Settings(
        provider=_provider_kind(read),
        predictions=read.path("predictions"),
        model=read.raw("model"),
        base_urls=tuple(read.raw("base-url") or ()),
        engine_args=engine_args,
        concurrency=read.number("concurrency", int, 1, DEFAULT_CONCURRENCY),
        output=read.path("output"),
        report=read.path("report"),
        html=read.path("html"),
        compare=read.path("compare"),
        resume=read.flag("resume") or read.flag("no-generate"),
        no_generate=read.flag("no-generate"),
        max_attempts=read.number("max-attempts", int, 1, DEFAULT_MAX_ATTEMPTS),
        batch_size=read.number("batch-size", int, 1, None),
        failure_budget=read.number("failure-budget", float, 0.0, 0.0, high=1.0),
        baseline=baseline,
        update_baseline=update_baseline,
        quiet=config.getoption("verbose") < 0,
        timeout=timeout,
        reset=read.flag("reset"),
        resume_stage=_resume_stage(read.raw("resume-stage")),
        report_reused=read.flag("report-reused"),
        reuse_scores=read.flag("reuse-scores"),
        shard=_shard(read.raw("shard")),
        progress_interval=read.number("progress-interval", float, 0.0, DEFAULT_PROGRESS_INTERVAL),
        in_play=in_play(config),  # an ini path that is not one path was refused above
    )
