"""How the tests start pytest in a child process (for SIGKILLs, real engines
and xdist): the plugin loaded explicitly, no cache, no bytecode written into
the project, and an environment without what belongs to the outer session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

PYTEST = [
    sys.executable,
    "-B",
    "-m",
    "pytest",
    "-p",
    "pytest_evalreplay.plugin.hooks",
    "-p",
    "no:cacheprovider",
]

# The outer session's options, its xdist worker id and GitHub's step summary.
OUTER = ("PYTEST_ADDOPTS", "PYTEST_XDIST_", "GITHUB_STEP_SUMMARY")


def child_env(drop: tuple[str, ...] = (), **values: str) -> dict[str, str]:
    """os.environ less the outer session's variables and those starting with
    `drop` (a test's own knobs left from another run), plus `values`; only
    the plugins a command names are loaded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith((*OUTER, *drop))}
    env.update(values, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return env


def openai_args(url: str, *extra: str) -> list[str]:
    """A child pytest of a project's agents against the openai provider at `url`
    (the local HTTP stub), writing its run dir to `run`."""
    return [
        *PYTEST,
        "-q",
        "-p",
        "no:randomly",
        "--evalreplay-output=run",
        *extra,
        "--evalreplay-provider=openai",
        "--evalreplay-model=stub-model",
        f"--evalreplay-base-url={url}",
    ]


def reap_group(child: subprocess.Popen[bytes]) -> None:
    """Kill whatever is left of `child` (started with `start_new_session`: its
    whole process group, engines and agent programs too), reap it and close
    its output pipe, so no test leaves a process or a ResourceWarning behind."""
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    assert child.stdout is not None
    child.stdout.close()
