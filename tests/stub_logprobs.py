"""The stub server's answer to an echo request (`echo: true`, `logprobs`,
`max_tokens: 0`), as `vllm serve` gives it: per prompt its tokens, each
token's log-probability (null for the first), the top-1 alternative at each
position and the tokens' character offsets.

Tokens are words with their leading whitespace; a token's log-probability is
a fixed function of the token and its position, and a token is the greedy
one at its position when `is_top(token, position)`; otherwise a better
alternative `"<top>"` is shown. Tests compute expected values with
`token_logprob`, `is_top` and `tokenize` from here.

For lm-evaluation-harness's `local-completions` model with
`tokenizer_backend=remote`, the stub also tokenizes as `vllm serve` does
(`/tokenizer_info`, `/tokenize`, `/detokenize`): token ids are handed out in
the order tokens are first seen, and a prompt given as token ids is echoed
token by token. A request with `max_tokens: 1` (lm-eval's) gets one generated
token after the echo, as a server appends it. A stub made with `bos=True`
tokenizes text prompts as a model with a start token does: `<s>` first
(`/tokenizer_info` names it), as `vllm serve` adds it to a completions prompt.
"""

from __future__ import annotations

import re
import threading
import zlib
from typing import Any

_TOKEN = re.compile(r"\s*\S+|\s+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


def token_logprob(token: str, position: int) -> float:
    return -((zlib.crc32(f"{position}:{token}".encode()) % 1000) / 250.0 + 0.01)


def is_top(token: str, position: int) -> bool:
    return zlib.crc32(f"top:{token}".encode()) % 3 == 0


GENERATED = "<gen>"  # the token a max_tokens >= 1 echo appends
BOS = "<s>"  # a bos=True stub's start token
# Id 0 is a token no text holds: lm-eval's remote tokenizer takes a start token
# of id 0 for none (`bos_token_id or eos_token_id`).
_VOCAB: dict[str, int] = {"<unk>": 0}
_WORDS: list[str] = ["<unk>"]
_VOCAB_LOCK = threading.Lock()


def token_ids(text: str) -> list[int]:
    with _VOCAB_LOCK:
        out = []
        for token in tokenize(text):
            if token not in _VOCAB:
                _VOCAB[token] = len(_WORDS)
                _WORDS.append(token)
            out.append(_VOCAB[token])
        return out


def detokenize(ids: list[int]) -> list[str]:
    with _VOCAB_LOCK:
        return [_WORDS[i] for i in ids]


def echo_logprobs(prompt: str | list[str], generate: int = 0) -> dict[str, Any]:
    """`prompt`: a text, or its tokens; `generate`: tokens to append after the echo."""
    tokens = tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    tokens += [GENERATED] * generate
    offsets, values, tops = [], [], []
    at = 0
    for p, token in enumerate(tokens):
        offsets.append(at)
        at += len(token)
        if p == 0:
            values.append(None)
            tops.append(None)
            continue
        value = token_logprob(token, p)
        values.append(value)
        tops.append({token: value} if is_top(token, p) else {token: value, "<top>": value / 2})
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _prompts(value: Any, bos: bool) -> list[str | list[str]]:
    """A completions body's prompts: a text, texts, token ids, or lists of them
    (token ids are the model's own: no start token is added to them)."""
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [detokenize(value)]
    texts = [value] if isinstance(value, str) else value
    return [detokenize(v) if isinstance(v, list) else ([BOS, *tokenize(v)] if bos else v) for v in texts]


def echo_completion(body: dict[str, Any], bos: bool = False) -> dict[str, Any]:
    prompts = _prompts(body.get("prompt"), bos)
    generate = min(int(body.get("max_tokens") or 0), 1)
    choices = [
        {
            "index": k,
            "text": prompt if isinstance(prompt, str) else "".join(prompt),
            "logprobs": echo_logprobs(prompt, generate),
            "finish_reason": "length",
        }
        for k, prompt in enumerate(prompts)
    ]
    choices.reverse()  # a client must order them by "index"
    n_tokens = sum(len(tokenize(p) if isinstance(p, str) else p) for p in prompts)
    usage = {"prompt_tokens": n_tokens, "completion_tokens": 0, "total_tokens": n_tokens}
    return {
        "id": "stub",
        "object": "text_completion",
        "model": body.get("model"),
        "choices": choices,
        "usage": usage,
    }
