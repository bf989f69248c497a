"""What a missed prompt most likely meant, and where it differs from it.

A replay miss is nearly always a small edit to the task (a space in the
template, a changed system prompt), and the message is only useful if it
shows the edit. The saved prompt of the same instance is the best guess;
failing that, the saved prompt sharing the longest prefix (found by
bisecting the sorted contexts). Both tables are built on the first miss, so a
replay that matches everything pays nothing for them.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from pytest_evalreplay.formats.saved import IndexKey, SavedIndex, context_text, key_of, split_key
from pytest_evalreplay.model import PromptKey
from pytest_evalreplay.storage.rowfields import show

EXCERPT = 24  # characters shown on each side of the first difference


@dataclass(frozen=True)
class Closest:
    key: IndexKey
    where: str  # file:line of its (first) save
    instance: str | None
    same_instance: bool


def closest(index: SavedIndex, prompt: PromptKey, stage: int, instance_id: str) -> Closest | None:
    """The saved prompt nearest to `prompt`; None for an empty index."""
    if not index.keys:
        return None
    wanted = key_of(prompt)
    text = context_text(wanted)
    table = index.by_instance()
    same = table.get((stage, instance_id)) or table.get((1, instance_id))
    if same:
        return _found(index, max(same, key=lambda k: _score(k, wanted, text)), True)
    texts, keys = index.sorted_contexts()
    i = bisect_left(texts, text)
    near = [j for j in (i - 1, i) if 0 <= j < len(keys)]
    # Equal texts (the same context with other system prompts) sit side by side.
    for j in list(near):
        k = j + 1
        while k < len(keys) and texts[k] == texts[j] and len(near) < 16:
            near.append(k)
            k += 1
    best = max(near, key=lambda j: _score(keys[j], wanted, text))
    return _found(index, keys[best], False)


def _score(key: IndexKey, wanted: IndexKey, text: str) -> tuple[int, bool]:
    return common_prefix(context_text(key), text), split_key(key)[1] == split_key(wanted)[1]


def _found(index: SavedIndex, key: IndexKey, same_instance: bool) -> Closest:
    slot = index.keys[key]
    pos = slot if type(slot) is int else slot[0]
    found = index.identify(pos)
    return Closest(key, index.where(pos), None if found is None else found[1], same_instance)


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix (binary search on slices: C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def describe(saved: IndexKey, wanted: IndexKey) -> str:
    """How a saved prompt differs from the wanted one, in a sentence or two."""
    saved_context, saved_system = split_key(saved)
    wanted_context, wanted_system = split_key(wanted)
    parts = []
    if type(saved_context) is not type(wanted_context):
        kinds = {str: "a string", bytes: "chat messages"}
        parts.append(
            f"its context is {kinds[type(saved_context)]} and this request's is {kinds[type(wanted_context)]}"
        )
    elif saved_context != wanted_context:
        a, b = context_text(saved), context_text(wanted)
        what = "context" if type(saved_context) is str else "messages (as canonical JSON)"
        parts.append(f"the {what} {difference(a, b)}")
    if saved_system != wanted_system:
        same = "the context is the same but " if not parts else ""
        parts.append(f"{same}the system prompt is {show(saved_system)} there and {show(wanted_system)} here")
    return "; ".join(parts) if parts else "it is the same prompt"


def difference(saved: str, wanted: str) -> str:
    p = common_prefix(saved, wanted)
    line = saved.count("\n", 0, p) + 1
    column = p - (saved.rfind("\n", 0, p) + 1) + 1
    where = f"first differs at character {p + 1} (line {line}, column {column})"
    if p:
        start = max(0, p - EXCERPT)
        where += f", after {('...' if start else '') + saved[start:p]!r}"
    if p == len(saved):
        return f"{where}: this request's goes on with {_after(wanted, p)} where the saved one ends"
    if p == len(wanted):
        return f"{where}: the saved one goes on with {_after(saved, p)} where this request's ends"
    return f"{where}: saved {_after(saved, p)}, this request {_after(wanted, p)}"


def _after(text: str, p: int) -> str:
    return repr(text[p : p + EXCERPT] + ("..." if p + EXCERPT < len(text) else ""))
