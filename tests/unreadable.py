"""Unreadable paths for tests that must run as root too (CI runs as root,
where chmod 000 alone stops nobody)."""

from __future__ import annotations

import builtins
import errno
import io
import os
import pathlib
from pathlib import Path
from typing import Any

import pytest


class Unreadable:
    """Makes paths unreadable with chmod 000. Where this user reads them
    anyway (root has CAP_DAC_OVERRIDE, as in CI's containers), every open,
    listing or stat that would then fail for anyone else fails here too,
    with the same EACCES: the tests run as root instead of skipping."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.paths: list[Path] = []
        self.denied: set[str] = set()
        self.dirs: set[str] = set()

    def __call__(self, path: Path) -> None:
        path.chmod(0)
        self.paths.append(path)
        if not os.access(path, os.R_OK):
            return  # the OS refuses: nothing to simulate
        if not self.denied:
            self._patch()
        self.denied.add(os.path.abspath(path))
        if path.is_dir():
            self.dirs.add(os.path.abspath(path))

    def _refused(self, arg: Any, below_only: bool = False) -> bool:
        if isinstance(arg, int):
            return False
        name = os.path.abspath(os.fsdecode(arg))
        if not below_only and name in self.denied:
            return True
        return any(name.startswith(d + os.sep) for d in self.dirs)  # no search permission on a parent

    def _patch(self) -> None:
        def deny(fn: Any, below_only: bool = False) -> Any:
            def wrapper(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
                if self._refused(path, below_only):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
                return fn(path, *args, **kwargs)

            return wrapper

        real_open = io.open
        for module, name in ((builtins, "open"), (io, "open")):
            self.monkeypatch.setattr(module, name, deny(real_open))
        for name in ("open", "scandir", "listdir"):
            self.monkeypatch.setattr(os, name, deny(getattr(os, name)))
        for name in ("stat", "lstat"):  # a stat needs search permission on the parent only
            self.monkeypatch.setattr(os, name, deny(getattr(os, name), below_only=True))
        accessor = getattr(pathlib, "_NormalAccessor", None)  # Python 3.10's pathlib bound these at import
        if accessor is not None:
            for name, below_only in (("open", False), ("listdir", False), ("scandir", False), ("stat", True)):
                patched = staticmethod(deny(getattr(accessor, name), below_only))
                self.monkeypatch.setattr(accessor, name, patched)

    def restore(self) -> None:
        self.monkeypatch.undo()
        for p in self.paths:
            p.chmod(0o755)
