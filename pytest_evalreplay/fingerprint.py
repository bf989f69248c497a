"""Config fingerprints: a stable hash of everything that changes results.

The journal stores the config beside its hash, so a changed configuration is
not only detected but named ("config changed: sampling.temperature").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
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
