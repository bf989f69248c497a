"""Request semantics shared by the engine-backed providers (vllm, openai).

Both must agree on how a request becomes prompts and engine calls, so that a
run through `vllm serve` and the in-process engine ask the model the same
thing, and so that any single rollout can be generated again alone (which
`--resume` and retries rely on).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_evalreplay.model import GenerationError, Message, Request

# A text context with a system prompt becomes "<system>\n\n<context>", the
# same join lm-evaluation-harness uses for a system instruction without a
# chat template: base models have no roles, so the instruction is prefixed.
SYSTEM_SEPARATOR = "\n\n"

# Greedy below this temperature; vLLM's own threshold (_SAMPLING_EPS).
GREEDY_EPS = 1e-5

_HINTS = {
    "n": "set EvalTask(num_samples=...) instead; the provider decides n",
    "max_new_tokens": "did you mean 'max_tokens'?",
    "max_gen_toks": "did you mean 'max_tokens'?",
    "until": "did you mean 'stop'?",
    "do_sample": "set 'temperature' (0 is greedy)",
}


def text_prompt(context: str, system_prompt: str | None) -> str:
    """The raw prompt for a text context (see SYSTEM_SEPARATOR)."""
    if system_prompt:
        return system_prompt + SYSTEM_SEPARATOR + context
    return context


def chat_messages(context: list[Message], system_prompt: str | None) -> list[dict[str, Any]]:
    """A conversation with the system prompt as a leading system message.

    The message dicts are copied so the engine cannot mutate the request.
    """
    messages = [dict(m) for m in context]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def key_hint(key: str) -> str:
    hint = _HINTS.get(key)
    return f" ({hint})" if hint else ""


def request_seed(sampling: Mapping[str, Any]) -> int | None:
    """The task's base seed, or None. Raises ValueError if it is not an int."""
    seed = sampling.get("seed")
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"sampling 'seed' must be an integer, got {seed!r}")
    return seed


@dataclass(frozen=True)
class Draw:
    """One engine call: `len(rollouts)` samples answering those rollouts in
    order, with `seed` (None: unseeded)."""

    rollouts: tuple[int, ...]
    seed: int | None

    @property
    def n(self) -> int:
        return len(self.rollouts)


def plan_draws(request: Request, greedy: bool) -> list[Draw]:
    """How to ask for a request's rollouts so each one reproduces alone.

    - seeded: rollout r is its own call with n=1 and seed + r, so asking for
      rollout 3 alone (a resume) gives the text a full run gave;
    - greedy: one n=1 call per rollout (vLLM refuses n > 1 when greedy);
    - unseeded sampling: one call with n = the rollouts wanted (all
      `num_samples` in a fresh run); nothing reproduces anyway.
    """
    seed = request_seed(request.sampling)
    if seed is not None:
        return [Draw((r,), seed + r) for r in request.rollouts]
    if greedy:
        return [Draw((r,), None) for r in request.rollouts]
    return [Draw(tuple(request.rollouts), None)]


def unsupported(request: Request, kind: str, tools: bool = False) -> GenerationError | None:
    """A terminal error for what a generating provider cannot serve (`tools`:
    it sends chat requests' tools and reads the calls back)."""
    if request.request_type != "generate":
        what = f"{request.request_type!r} requests"
    elif request.images:
        what = "image requests"
    elif request.tools and not (tools and isinstance(request.context, list)):
        what = "tool requests" + (" with a text prompt (give chat messages)" if tools else "")
    elif not isinstance(request.context, (str, list)):
        what = f"a context of type {type(request.context).__name__}"
    else:
        return None
    return GenerationError(f"the {kind} provider does not support {what}", retryable=False)
