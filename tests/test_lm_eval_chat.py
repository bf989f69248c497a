"""`EvalTask.from_lm_eval(..., apply_chat_template=True)` side by side with
`lm_eval --model local-chat-completions --apply_chat_template` against one
stub (docs/lm_eval.md): the same chat requests (messages, few-shot turns,
system instruction, max_tokens, stop, seed) and identical metrics."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from http_stub import StubServer
from lm_eval_tasks import as_ours, needs_lm_eval, our_metrics, run_plugin, their_metrics, write_arith

SYSTEM = "Add the two numbers."
CASES = {
    # lm_eval's CLI turns fewshot_as_multiturn on with --apply_chat_template; so does from_lm_eval
    "few-shot as turns, system instruction": (
        f', apply_chat_template=True, system_instruction="{SYSTEM}"',
        ["--apply_chat_template", "--system_instruction", SYSTEM],
        ["system", "user", "assistant", "user", "assistant", "user"],
    ),
    "few-shot in one message": (
        ", apply_chat_template=True, fewshot_as_multiturn=False",
        ["--apply_chat_template", "--fewshot_as_multiturn", "false"],
        ["user"],
    ),
}
SENT = ("messages", "max_tokens", "temperature", "stop", "seed")


def sent(bodies: list[dict]) -> list[bytes]:
    """What decides the answer in each chat body, comparable across clients."""
    return sorted(orjson.dumps({k: b.get(k) for k in SENT}, option=orjson.OPT_SORT_KEYS) for b in bodies)


@needs_lm_eval
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_apply_chat_template_matches_lm_eval_local_chat_completions(
    tmp_path: Path, stub: StubServer, case: str
) -> None:
    extra, flags, roles = CASES[case]
    write_arith(tmp_path / "tasks", n=6)
    done = run_plugin(tmp_path, stub, extra=extra)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ours_sent = stub.bodies()
    assert len(ours_sent) == 6
    assert [m["role"] for m in ours_sent[0]["messages"]] == roles
    theirs = as_ours(their_metrics(tmp_path, "arith", stub, "local-chat-completions", flags))
    theirs_sent = stub.bodies()[len(ours_sent) :]
    assert sent(ours_sent) == sent(theirs_sent)
    ours = our_metrics(tmp_path, "arith")
    assert set(ours) == {"exact_match,strict", "exact_match,flexible"}
    assert ours == theirs


@needs_lm_eval
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (", apply_chat_template=1", "apply_chat_template must be True or False"),
        (", fewshot_as_multiturn='no'", "fewshot_as_multiturn must be True or False"),
        (", system_instruction=3", "system_instruction must be a str or None"),
    ],
)
def test_bad_chat_options_are_collection_errors(
    tmp_path: Path, stub: StubServer, extra: str, message: str
) -> None:
    write_arith(tmp_path / "tasks", n=2)
    done = run_plugin(tmp_path, stub, "--collect-only", extra=extra)
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.INTERRUPTED, out
    assert f"lm-eval task 'arith': {message}" in out, out
    assert "test_lm.py:3" in out, out
