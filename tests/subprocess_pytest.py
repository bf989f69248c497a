"""How the tests start pytest in a child process (for SIGKILLs, real engines
and xdist): the plugin loaded explicitly, no cache, no bytecode written into
the project, and an environment without what belongs to the outer session."""

from __future__ import annotations

import os
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
