"""An agent turn's request digest hashes only what the turn added to its
conversation (`model.chat_digest`): always `digest` of the whole content."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_evalreplay.model import Request, chat_digest, content_tail, digest, request_content

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"])}, optional={"content": JSON, "x": JSON}
)


def content_of(messages: list[Any], tools: tuple[Any, ...], sampling: dict[str, Any]) -> dict[str, Any]:
    return request_content(
        Request(task="t", instance_id="i", context=messages, sampling=sampling, tools=tools)
    )


@given(
    st.lists(MESSAGE, min_size=1, max_size=6),
    st.integers(0, 6),
    st.lists(MESSAGE, max_size=2),
    st.lists(st.dictionaries(st.text(max_size=3), JSON, max_size=2), max_size=2),
    st.dictionaries(st.sampled_from(["temperature", "max_tokens"]), st.integers(0, 9)),
)
def test_the_digest_of_a_continued_conversation_is_the_digest_of_the_whole(
    messages: list[Any], cut: int, other: list[Any], tools: list[Any], sampling: dict[str, Any]
) -> None:
    content = content_of(messages, tuple(tools), sampling)
    tail = content_tail(content)
    whole, _ = chat_digest(messages, tail, None)
    assert whole == digest(content)
    _, before = chat_digest(messages[:cut], b"]}", None)  # a turn before, continued now
    assert chat_digest(messages, tail, before)[0] == digest(content)
    _, unrelated = chat_digest(other, b"]}", None)  # a conversation this one does not continue
    assert chat_digest(messages, tail, unrelated)[0] == digest(content)


def test_a_nan_in_a_new_message_is_named() -> None:
    known = [{"role": "user", "content": "hi"}]
    _, before = chat_digest(known, b"]}", None)
    with pytest.raises(TypeError, match=r"nan at \['context'\]\[1\]\['content'\]\[0\]"):
        chat_digest([*known, {"role": "tool", "content": [math.nan]}], b"]}", before)


def test_a_nan_in_the_tools_is_named() -> None:
    content = content_of([{"role": "user", "content": "hi"}], ({"f": math.inf},), {})
    with pytest.raises(TypeError, match=r"inf at \['tools'\]\[0\]\['f'\]"):
        content_tail(content)
