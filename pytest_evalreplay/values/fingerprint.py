"""Config fingerprints: a stable hash of a configuration, and the names of
what changed between two.

Plain tasks are reused by content (the request as sent, see planning.py);
fingerprints cover what content cannot show: a multi-stage eval's stage
configuration and its judge. The journal stores the config beside its hash,
so a change is not only detected but named ("config changed: stages.3.references").
A saved run on disk is fingerprinted by `path_signature`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _default(value: Any) -> Any:
    """Sets in sorted order (their iteration order varies between processes); else the repr."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=_bytes)
    return repr(value)


def _bytes(value: Any) -> bytes:
    return orjson.dumps(value, option=_OPTS, default=_default)


def canonical(config: Mapping[str, Any]) -> Any:
    """The config as it reads back from JSON, so stored and fresh configs compare equal."""
    return orjson.loads(_bytes(config))


def fingerprint(config: Mapping[str, Any]) -> str:
    """sha256 over canonical (sorted-key) orjson bytes."""
    return hashlib.sha256(_bytes(config)).hexdigest()


def _diff(old: Any, new: Any, path: tuple[str, ...], out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() | new.keys():
            if key not in old or key not in new:
                out.append(".".join((*path, key)))
            else:
                _diff(old[key], new[key], (*path, key), out)
    elif _bytes(old) != _bytes(new):  # by bytes, as the fingerprint sees them (1 != 1.0)
        out.append(".".join(path))


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Dotted paths of the leaves (or added and removed keys) whose values differ."""
    out: list[str] = []
    _diff(canonical(old), canonical(new), (), out)
    return sorted(out)


def describe_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    fields = changed_fields(old, new)
    if not fields:
        return "config changed"
    shown = ", ".join(fields[:3])
    more = f" and {len(fields) - 3} more" if len(fields) > 3 else ""
    return f"config changed: {shown}{more}"


def callable_identity(fn: Any) -> Any:
    """A stable identity for a callable: its name plus a hash of its source,
    so editing it changes the fingerprint. Partials and callable objects are
    named by what they wrap; nothing that prints a memory address is hashed,
    so the identity is the same in every process."""
    if isinstance(fn, functools.partial):
        return {
            "partial": callable_identity(fn.func),
            "args": stable(fn.args),
            "keywords": stable(fn.keywords),
        }
    if inspect.ismethod(fn):
        return {"method": callable_identity(fn.__func__), "self": callable_identity(fn.__self__)}
    if not (inspect.isfunction(fn) or inspect.isclass(fn) or inspect.isbuiltin(fn)):
        state = dataclasses.asdict(fn) if dataclasses.is_dataclass(fn) else getattr(fn, "__dict__", {})
        return {"object": callable_identity(type(fn)), "state": stable(state)}
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return {"callable": name}
    return {"callable": name, "source_sha256": hashlib.sha256(source.encode()).hexdigest()}


def stable(value: Any) -> Any:
    """Plain data as it is; callables by identity; anything else by type name."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): stable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [stable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((stable(v) for v in value), key=repr)
    if callable(value):
        return callable_identity(value)
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}"}


def path_signature(path: Path, content_limit: int = 0) -> str:
    """What a saved run looks like on disk, so a path whose files changed is
    not mistaken for the same one: its files' contents when they total at most
    `content_limit` bytes (so a copy or a clone matches), else their names,
    sizes and modification times (cheap for a large run)."""
    files: list[tuple[str, Path]] = []
    try:
        if path.is_file():
            files.append((path.name, path))
        else:
            for root, dirs, names in os.walk(path):
                dirs.sort()
                for name in sorted(names):
                    if not name.startswith("."):
                        full = Path(root) / name
                        files.append((str(full.relative_to(path)), full))
        stats = [(rel, full, full.stat()) for rel, full in files]
        by_content = sum(st.st_size for _, _, st in stats) <= content_limit
        h = hashlib.blake2b(digest_size=12)
        for rel, full, st in stats:
            h.update(rel.encode() + b"\0")
            h.update(full.read_bytes() if by_content else f"{st.st_size}:{st.st_mtime_ns}".encode())
            h.update(b"\n")
    except OSError:
        return "unreadable"
    return h.hexdigest()
