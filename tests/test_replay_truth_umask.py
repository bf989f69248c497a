"""Issue 18 case 20: importing the plugin leaves the process umask alone (it
reads it, on Linux from /proc/self/status, instead of setting it to 0 and back:
a thread that creates a file during that toggle would get mode 0666/0777)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import os
calls = []
real = os.umask
os.umask = lambda mask: calls.append(mask) or real(mask)
import pytest_evalreplay.storage.files, pytest_evalreplay.plugin.hooks
print(calls)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")
def test_importing_the_plugin_does_not_toggle_the_umask() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
