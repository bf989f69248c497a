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


def canonical(config: Mapping[str, Any]) -> Any:
    """The config as it reads back from JSON, so stored and fresh configs compare equal."""
    return orjson.loads(orjson.dumps(config, option=_OPTS, default=repr))


def fingerprint(config: Mapping[str, Any]) -> str:
    """sha256 over canonical (sorted-key) orjson bytes."""
    return hashlib.sha256(orjson.dumps(config, option=_OPTS, default=repr)).hexdigest()


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key, sub in value.items():
            _flatten(sub, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Dotted paths whose values differ (added and removed keys included)."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(canonical(old), "", a)
    _flatten(canonical(new), "", b)
    return sorted(k for k in a.keys() | b.keys() if a.get(k, _MISSING) != b.get(k, _MISSING))


_MISSING = object()


def describe_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    fields = changed_fields(old, new)
    if not fields:
        return "config changed"
    shown = ", ".join(fields[:3])
    more = f" and {len(fields) - 3} more" if len(fields) > 3 else ""
    return f"config changed: {shown}{more}"
