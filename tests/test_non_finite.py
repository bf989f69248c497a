"""`model.non_finite`: the first NaN or infinity in a value JSON would save
as null, named by its path, for any nesting of the containers a request,
a generation's metadata or a tool result holds."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay.model import check_finite, non_finite, to_json

leaves = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats()
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=3), inner, max_size=4)
        | st.dictionaries(st.text(max_size=3), inner, max_size=4).map(MappingProxyType)
    ),
    max_leaves=20,
)


def first_bad(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity in a depth-first, in-order walk."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} at {path}" if path else repr(value)
    children = (
        value.items()
        if isinstance(value, Mapping)
        else enumerate(value)
        if isinstance(value, (list, tuple))
        else ()
    )
    for key, item in children:
        if (found := first_bad(item, f"{path}[{key!r}]")) is not None:
            return found
    return None


@given(values, st.sampled_from(["", "messages"]))
def test_names_the_first_non_finite_value_by_its_path(value: Any, path: str) -> None:
    assert non_finite(value, path) == first_bad(value, path)


def test_a_nested_nan_is_named_and_refused_by_to_json() -> None:
    value = {"context": [{"role": "user"}, {"score": [1.0, float("-inf")]}]}
    assert non_finite(value) == "-inf at ['context'][1]['score'][1]"
    with pytest.raises(TypeError, match=r"-inf at \['context'\]\[1\]\['score'\]\[1\]; JSON has no NaN"):
        to_json(value)
    check_finite({"system_prompt": None, "sampling": {"temperature": 0.0}})  # nulls alone pass


def test_float_subclasses_are_checked_and_other_scalars_pass() -> None:
    class Score(float):
        pass

    assert non_finite([True, 3, "x", Score("nan")]) == "nan at [3]"
    assert non_finite(float("inf")) == "inf"
