"""Config fingerprints and the names of what changed, called directly."""

from __future__ import annotations

import hashlib
import importlib.util
import random
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay.values.fingerprint import (
    callable_identity,
    canonical,
    changed_fields,
    describe_change,
    fingerprint,
)

keys = st.text(min_size=1, max_size=6)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
configs = st.dictionaries(keys, values, min_size=1, max_size=6)


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same data with every dict's keys in another insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


@given(configs, st.randoms(use_true_random=False))
def test_fingerprint_is_stable_under_key_order(config, rng):
    other = shuffled(config, rng)
    assert fingerprint(other) == fingerprint(config)
    assert canonical(other) == canonical(config)
    assert changed_fields(config, other) == []


@given(configs)
def test_fingerprint_survives_the_journal_round_trip(config):
    # The journal stores canonical(config); reading it back must give the same hash.
    assert fingerprint(canonical(config)) == fingerprint(config)


def test_fingerprint_is_sha256_over_sorted_key_orjson_bytes():
    config = {"sampling": {"top_p": 0.9, "temperature": 0.0}, "num_samples": 2}
    want = hashlib.sha256(orjson.dumps(config, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert fingerprint(config) == want


def _paths(value: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every path that can be changed: each key, at every depth."""
    out: list[tuple[str, ...]] = []
    if isinstance(value, dict):
        for key, sub in value.items():
            out.append((*path, key))
            out += _paths(sub, (*path, key))
    return out


def _set(value: dict[str, Any], path: tuple[str, ...], new: Any) -> dict[str, Any]:
    out = dict(value)
    if len(path) == 1:
        out[path[0]] = new
    else:
        out[path[0]] = _set(value[path[0]], path[1:], new)
    return out


def _drop(value: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    out = dict(value)
    if len(path) == 1:
        del out[path[0]]
    else:
        out[path[0]] = _drop(value[path[0]], path[1:])
    return out


@given(configs, st.data())
def test_changed_fields_names_the_dotted_path_of_a_changed_value(config, data):
    path = data.draw(st.sampled_from(_paths(config)))
    changed = _set(config, path, "\x00changed")
    assert changed_fields(config, changed) == [".".join(path)]
    assert fingerprint(changed) != fingerprint(config)


@given(configs, st.data())
def test_changed_fields_names_an_added_or_removed_key(config, data):
    path = data.draw(st.sampled_from(_paths(config)))
    dropped = _drop(config, path)
    assert changed_fields(config, dropped) == [".".join(path)]
    assert changed_fields(dropped, config) == [".".join(path)]


def test_a_key_added_to_an_empty_dict_is_named_by_its_own_path():
    assert changed_fields({"sampling": {}}, {"sampling": {"temperature": 0.7}}) == ["sampling.temperature"]
    assert changed_fields({"sampling": None}, {"sampling": {"temperature": 0.7}}) == ["sampling"]


def test_an_int_and_an_equal_float_differ_as_the_fingerprint_sees_them():
    assert fingerprint({"t": 1}) != fingerprint({"t": 1.0})
    assert changed_fields({"t": [1]}, {"t": [1.0]}) == ["t"]


def test_sets_hash_the_same_whatever_their_order():
    words = [f"w{i}" for i in range(20)]
    a, b = set(words), set(reversed(words))
    assert fingerprint({"stop": a}) == fingerprint({"stop": b}) == fingerprint({"stop": sorted(words)})


def test_describe_change_is_one_line_naming_the_fields():
    old = {"sampling": {"temperature": 0.0}, "num_samples": 1}
    assert describe_change(old, {**old, "sampling": {"temperature": 0.7}}) == (
        "config changed: sampling.temperature"
    )
    many = {f"k{i}": i for i in range(5)}
    assert describe_change({}, many) == "config changed: k0, k1, k2 and 2 more"
    assert describe_change(old, old) == "config changed"


SCORERS = """
import functools

def score(text, instance, weight=1.0):
    return weight

class Scorer:
    def __call__(self, text, instance):
        return 1.0

partial_scorer = functools.partial(score, weight=2.0)
object_scorer = Scorer()
"""


@pytest.mark.parametrize("name", ["partial_scorer", "object_scorer"])
def test_a_callable_without_source_of_its_own_is_identified_the_same_in_every_process(tmp_path, name):
    # Importing the same file twice stands in for two processes importing it.
    (tmp_path / "scorers_mod.py").write_text(SCORERS)
    configs = []
    for _ in range(2):
        spec = importlib.util.spec_from_file_location("scorers_mod", tmp_path / "scorers_mod.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        configs.append({"judge": callable_identity(getattr(module, name))})
    assert changed_fields(configs[0], configs[1]) == []
