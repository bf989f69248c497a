"""An `EvalSession` built from what pytest knows: the config's cache or
output dir, xdist's `workerinput`, the terminal, and our provider hook.

The session itself (`run/session.py`) knows nothing of pytest; this module
is the one place that hands it pytest's objects as plain values.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_evalreplay.run.session import EvalSession
    from pytest_evalreplay.settings import Settings


def make_session(config: pytest.Config, settings: Settings) -> EvalSession:
    """The eval session of this pytest process (a worker's gets its id,
    count, run id, snapshot and seed from the controller's workerinput)."""
    from pytest_evalreplay.plugin.items import SESSION_KEY
    from pytest_evalreplay.providers import ProviderHost
    from pytest_evalreplay.report.progress import FileProgress, TerminalProgress
    from pytest_evalreplay.run.context import WorkerInfo
    from pytest_evalreplay.run.session import EvalSession

    workerinput = getattr(config, "workerinput", None)
    worker = None
    if workerinput is not None:
        number = int(workerinput.get("workerid", "gw0")[2:] or 0)
        worker = WorkerInfo(number, workerinput.get("workercount", 1))
    session = EvalSession(
        settings=settings,
        output=lambda: output_dir(config, settings),
        run_id=(workerinput or {}).get("evalreplay_run_id"),
        host=ProviderHost(
            settings, lambda kind: config.hook.pytest_evalreplay_make_provider(config=config, kind=kind)
        ),
        progress=(
            FileProgress(lambda: session.output, workerinput["workerid"], settings.progress_interval)
            if workerinput is not None
            else TerminalProgress(
                config, settings.quiet, settings.provider == "replay", settings.progress_interval
            )
        ),
        worker=worker,
        snapshot=(workerinput or {}).get("evalreplay_snapshot"),
        seed=(workerinput or {}).get("evalreplay_seed"),
        rootdir=Path(config.rootpath),
        invocation=(config.invocation_params.args, Path(config.invocation_params.dir), config.inipath),
    )
    config.stash[SESSION_KEY] = session
    return session


def output_dir(config: pytest.Config, settings: Settings) -> Path:
    """--evalreplay-output, else pytest's cache dir (as cacheprovider keeps its own)."""
    from pytest_evalreplay.model import EvalReplayError

    if settings.output is not None:
        return settings.output
    cache = getattr(config, "cache", None)
    if cache is None:
        raise EvalReplayError(
            "pytest's cache is disabled (-p no:cacheprovider): pass --evalreplay-output=DIR "
            "(ini evalreplay_output) for the run dir and journal"
        )
    return Path(cache.mkdir("evalreplay"))


def failures_left(session: pytest.Session) -> int | None:
    """How many more failed items pytest takes before it stops (0: stopping
    now; None: no --maxfail/-x)."""
    if session.shouldstop or session.shouldfail:
        return 0
    maxfail = session.config.option.maxfail
    return max(0, maxfail - session.testsfailed) if maxfail else None
