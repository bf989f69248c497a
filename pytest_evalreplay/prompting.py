"""A task's prompt: the task's name, sample count and sampling checked, and an instance's
prompt rendered (a template filled, or a prompt callable's answer checked),
each bad value an error naming the task, the instance and the field."""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from pytest_evalreplay.model import TASK_NAME, Context, EvalReplayError, Instance, non_finite, to_json

MAX_TASK_NAME = 100  # "<name>-predictions.jsonl" and its temporary files must fit a file name
# Each rollout is a pytest item: 10**9 of them was a session that planned for
# minutes and ran out of memory before its first item. pass@k papers sample
# up to a few hundred per problem; this leaves room for far more.
MAX_NUM_SAMPLES = 10_000


def validate_task_name(name: Any) -> str:
    """Task names become file names: keep them to a safe alphabet and length."""
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name) or name in (".", ".."):
        raise EvalReplayError(
            f"invalid task name {name!r}: use only letters, digits, '_', '.' and '-' "
            "(the name becomes a file name in the run dir)"
        )
    if len(name) > MAX_TASK_NAME:
        raise EvalReplayError(
            f"task name {name[:40]!r}... is {len(name)} characters; use at most {MAX_TASK_NAME} "
            "(the name becomes a file name in the run dir)"
        )
    return name


def validate_num_samples(num_samples: Any, name: str) -> int:
    """A positive integer, at most `MAX_NUM_SAMPLES` (each rollout is an item)."""
    if type(num_samples) is not int or num_samples < 1:
        raise EvalReplayError(f"task {name!r}: num_samples must be a positive integer, got {num_samples!r}")
    if num_samples > MAX_NUM_SAMPLES:
        raise EvalReplayError(
            f"task {name!r}: num_samples={num_samples} is over the limit of {MAX_NUM_SAMPLES} rollouts per "
            f"instance (each rollout is a pytest item); ask for at most {MAX_NUM_SAMPLES}"
        )
    return num_samples


def validate_sampling(sampling: Any, where: str) -> dict[str, Any]:
    """Sampling is a dict of JSON values (it is saved and compared as JSON),
    with finite numbers: a typo like `sampling="hot"` fails when the task is built."""
    if sampling is None:
        return {}
    if not isinstance(sampling, Mapping):
        raise EvalReplayError(
            f"{where}: sampling must be a dict such as {{'temperature': 0.7, 'max_tokens': 256}}, "
            f"got {type(sampling).__name__}"
        )
    out: dict[str, Any] = {}
    for key, value in sampling.items():
        if not isinstance(key, str):
            raise EvalReplayError(f"{where}: sampling keys must be strings, got {key!r}")
        try:
            to_json(value)
        except TypeError:
            what = "a finite number" if non_finite(value) else "a JSON value (it is saved with the run)"
            raise EvalReplayError(f"{where}: sampling[{key!r}] = {value!r:.60} is not {what}") from None
        out[key] = value
    return out


class _CheckedFormatter(string.Formatter):
    """str.format, except that a field resolving to a method or function (a
    typo like `{question.upper}`) is an error rather than its repr."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        if callable(value):
            raise ValueError(
                f"resolves to {type(value).__name__} {getattr(value, '__name__', '')!r}, not a value"
            )
        return super().format_field(value, format_spec)


_FORMATTER = _CheckedFormatter()


def render_template(template: str, instance: Mapping[str, Any], where: str) -> str:
    """Fill a `str.format` template from an instance, with errors that name the field."""
    try:
        return _FORMATTER.vformat(template, (), instance)
    except KeyError as exc:
        raise EvalReplayError(
            f"{where}: the prompt template needs field {exc} that the instance lacks "
            f"(it has: {', '.join(sorted(map(str, instance))) or 'nothing'})"
        ) from None
    except IndexError:
        raise EvalReplayError(
            f"{where}: the prompt template has a positional field ({{}} or {{0}}); name the instance field, "
            "e.g. {question}"
        ) from None
    except (ValueError, AttributeError, TypeError) as exc:
        raise EvalReplayError(f"{where}: the prompt template cannot be rendered: {exc}") from None


def render_prompt(
    prompt: str | Callable[[Instance], Context] | None, instance: Instance, where: str
) -> Context:
    """The instance's prompt. Raises EvalReplayError naming `where` (the task
    and the instance) and the field for a template that does not fit the
    instance, and for a prompt callable that raises or returns something
    else than a string or a list of chat messages. No prompt: an agent
    task, whose episodes start from the instance itself (as JSON)."""
    if prompt is None:
        # An agent task: its episodes start from the instance itself.
        try:
            return to_json(instance, orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
        except TypeError as exc:
            raise EvalReplayError(
                f"{where}: an agent task's instance is saved as its request, and it is not JSON "
                f"({exc}); give the instance JSON values"
            ) from None
    if isinstance(prompt, str):
        return render_template(prompt, instance, where)
    try:
        context = prompt(instance)
    except Exception as exc:
        raise EvalReplayError(f"{where}: the prompt callable raised {type(exc).__name__}: {exc}") from None
    if isinstance(context, str):
        return context
    if isinstance(context, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in context
    ):
        for n, message in enumerate(context):
            try:
                to_json(message)
            except TypeError as exc:  # a set, an object, NaN: the request is saved and digested as JSON
                raise EvalReplayError(
                    f"{where}: the prompt callable returned chat messages, and message {n} "
                    f"({message!r:.80}) is not JSON ({exc}); give each message JSON values, "
                    "a string 'content' or a list of content parts"
                ) from None
        return context
    raise EvalReplayError(
        f"{where}: the prompt callable returned {type(context).__name__}; return a string or a "
        "list of chat messages ({'role': ..., 'content': ...})"
    )
