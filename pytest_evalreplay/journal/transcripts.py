"""`<task>-transcripts.jsonl`: one row per agent episode, written into the
run dir and read back to replay episodes without a model or the tools.

A row: `instance_id`, `stage`, `rollout`, `answer` (the final answer, or
null when the episode failed), `error` (why it failed, or null), `turns`
(per model turn: what was sent, `messages`, `tools`, `sampling`; what came
back, `reply`, `finish_reason`, `prompt_tokens`, `completion_tokens`),
`tool_results` (per tool call, in order: the `turn` it followed, the `call`
and its `result`) and `messages` (the last messages sent, then the last
reply). A turn that sent the first messages of that list says how many,
`sent`, instead of repeating them (so a row grows with the conversation,
not with its square); one that sent anything else (an agent that rewrote
its history) holds its `messages`. Replay matches each turn by what was
sent, exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.formats.closest import difference
from pytest_evalreplay.journal.rows import RolloutKey
from pytest_evalreplay.model import EvalReplayError, Generation, tool_calls_problem
from pytest_evalreplay.storage.files import atomic_write
from pytest_evalreplay.storage.lines import read_jsonl
from pytest_evalreplay.storage.runschema import TRANSCRIPTS_SUFFIX
from pytest_evalreplay.values.snippets import one_line, shorten

_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
SHOWN_CHARS = 400  # of each message, in the Markdown report


def transcripts_path(directory: Path, task: str) -> Path:
    return directory / f"{task}{TRANSCRIPTS_SUFFIX}"


def write(directory: Path, task: str, rows: Iterable[Mapping[str, Any] | orjson.Fragment]) -> None:
    """Write the task's transcripts file (the caller holds the task lock)."""
    atomic_write(
        transcripts_path(directory, task),
        (orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE) for row in rows),
    )


def numbered_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """A transcripts file's rows with their line numbers (the report links
    each line); a line that is not a transcript row is left out."""
    rows = []
    for lineno, line in enumerate(read_jsonl(path).splitlines(), 1):
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("instance_id"), str):
            rows.append((lineno, row))
    return rows


def markdown(row: Mapping[str, Any]) -> list[str]:
    """An episode as Markdown list lines for the report: each message of its
    last request and its last reply (tool calls as `name(arguments)`), each
    clipped to SHOWN_CHARS, then its error."""
    out = []
    for message in row.get("messages") or []:
        if not isinstance(message, Mapping):
            continue
        text = message.get("content")
        parts = [text if isinstance(text, str) else ""]
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                parts.append(f"calls {function.get('name')}({function.get('arguments') or ''})")
        shown = shorten(one_line(" ".join(p for p in parts if p)), SHOWN_CHARS, keep_end=True)
        out.append(f"- **{one_line(str(message.get('role')))}**: {_code(shown)}")
    if row.get("error"):
        out.append(f"- **error**: {_code(shorten(one_line(str(row['error'])), SHOWN_CHARS, keep_end=True))}")
    return out


def _code(text: str) -> str:
    """`text` as inline code that no backtick in it can close (nor Markdown or HTML in it render)."""
    if not text:
        return "(empty)"
    ticks = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    return f"{ticks} {text} {ticks}"


def compact_turn(turn: dict[str, Any], messages: list[Any]) -> dict[str, Any]:
    """A transcript turn as the row holds it: `sent` (how many of the
    episode's last `messages` it sent) in place of the messages, when they
    are the first of those."""
    sent_messages = turn["messages"]
    n = len(sent_messages)
    if messages[:n] != sent_messages:
        return turn
    return {("sent" if k == "messages" else k): (n if k == "messages" else v) for k, v in turn.items()}


def turn_messages(row: Mapping[str, Any], turn: Mapping[str, Any]) -> Any:
    """The messages a transcript turn sent (read checked them: `SavedEpisodes.read`)."""
    return row["messages"][: turn["sent"]] if "sent" in turn else turn.get("messages")


def _turn_problem(row: Mapping[str, Any], turn: Any) -> str | None:
    if not isinstance(turn, dict):
        return "is not an object"
    if "sent" not in turn:
        return None
    sent_count, messages = turn["sent"], row.get("messages")
    total = len(messages) if isinstance(messages, list) else 0
    if type(sent_count) is not int or not 0 <= sent_count <= total:
        return f"'sent' must count the row's first 'messages' (0 to {total}), not {sent_count!r:.40}"
    return None


def sent(messages: Any, tools: Any, sampling: Any) -> str:
    """What a turn sent, as the canonical JSON text replay compares."""
    return orjson.dumps({"messages": messages, "tools": tools, "sampling": sampling}, option=_SORTED).decode()


class SavedEpisodes:
    """A saved run's episodes of one task, by (stage, instance id, rollout)."""

    def __init__(self, path: Path, episodes: dict[RolloutKey, dict[str, Any]]) -> None:
        self.path = path
        self.episodes = episodes
        self._sent: dict[RolloutKey, dict[str, list[int]]] = {}

    @classmethod
    def read(cls, source: Path, task: str) -> SavedEpisodes:
        """The transcripts of `task` in the run dir `source` (or `source` itself, a transcripts file)."""
        path = transcripts_path(source, task) if source.is_dir() else source
        if not path.is_file():
            raise EvalReplayError(
                f"{path}: the saved run has no transcripts for the agent task {task!r}, so its episodes "
                "cannot be replayed without a model; replay a run dir written by the plugin"
            )
        episodes: dict[RolloutKey, dict[str, Any]] = {}
        for lineno, line in enumerate(read_jsonl(path).splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise EvalReplayError(f"{where}: malformed transcript line ({exc})") from None
            ok = (
                isinstance(row, dict)
                and isinstance(row.get("instance_id"), str)
                and type(row.get("stage")) is int
                and type(row.get("rollout")) is int
                and isinstance(row.get("turns"), list)
                and isinstance(row.get("tool_results"), list)
                and all(isinstance(t, dict) and "call" in t for t in row["tool_results"])
            )
            if not ok:
                raise EvalReplayError(
                    f"{where}: not a transcript row (needs instance_id, stage, rollout, a list of turns and "
                    "of tool_results)"
                )
            for number, turn in enumerate(row["turns"], 1):
                if (problem := _turn_problem(row, turn)) is not None:
                    raise EvalReplayError(
                        f"{where}: turn {number} {problem}; this is not a transcript the plugin wrote, "
                        "replay the run dir as saved"
                    )
            episodes[(row["stage"], row["instance_id"], row["rollout"])] = row
        return cls(path, episodes)

    def turn(self, key: RolloutKey, number: int, now: str, occurrence: int = 0) -> Generation | str:
        """The saved reply to a turn of an episode, or why there is none
        (`now`: what the agent sends, as `sent` writes it; `number`: its
        arrival in the episode). The saved turn is the one that sent the same,
        the `occurrence`-th of those (so concurrent calls match whatever their
        order); none: the difference from the saved turn of the same number."""
        name = f"episode {key[1]!r} rollout {key[2]} (stage {key[0]})"
        row = self.episodes.get(key)
        if row is None:
            return f"replay: {self.path} holds no {name}"
        turns = row["turns"]
        matching = self._by_sent(key, row).get(now, [])
        if occurrence < len(matching):
            saved = turns[matching[occurrence]]
        elif number > len(turns):
            return (
                f"replay: {name}, turn {number}: the agent asked for another turn; the saved episode "
                f"ended after {len(turns)} turns ({self.path})"
            )
        else:
            closest = turns[number - 1]
            was = sent(turn_messages(row, closest), closest.get("tools"), closest.get("sampling"))
            said = (
                "the request (as canonical JSON) " + difference(was, now)
                if was != now
                else "that request again"
            )
            return (
                f"replay: {name}, turn {number}: the agent sent what the saved episode never asked: "
                f"{said} ({self.path})"
            )
        reply = saved.get("reply")
        calls = reply.get("tool_calls") or [] if isinstance(reply, dict) else None
        if not isinstance(reply, dict) or not isinstance(reply.get("content") or "", str) or calls is None:
            return f"replay: {name}, turn {number}: the saved reply is not an assistant message ({self.path})"
        if not isinstance(calls, list) or tool_calls_problem(calls) is not None:
            return f"replay: {name}, turn {number}: the saved reply's tool_calls are malformed ({self.path})"
        return Generation(
            text=reply.get("content") or "",
            finish_reason=saved.get("finish_reason"),
            prompt_tokens=_count(saved.get("prompt_tokens")),
            completion_tokens=_count(saved.get("completion_tokens")),
            tool_calls=tuple(calls),
        )

    def _by_sent(self, key: RolloutKey, row: Mapping[str, Any]) -> dict[str, list[int]]:
        """An episode's saved turns by what each sent (built once per episode)."""
        found = self._sent.get(key)
        if found is None:
            found = {}
            for n, turn in enumerate(row["turns"]):
                text = sent(turn_messages(row, turn), turn.get("tools"), turn.get("sampling"))
                found.setdefault(text, []).append(n)
            self._sent[key] = found
        return found

    def tool(self, key: RolloutKey, number: int, call: Mapping[str, Any]) -> tuple[bool, Any, str]:
        """The saved result of tool call `number` of an episode: (found, result, why not)."""
        name = f"episode {key[1]!r} rollout {key[2]} (stage {key[0]})"
        row = self.episodes.get(key)
        results = row["tool_results"] if row is not None else []
        if number > len(results):
            return False, None, f"replay: {name}: tool call {number} was never made in the saved episode"
        saved = results[number - 1]
        was, now = (orjson.dumps(c, option=_SORTED).decode() for c in (saved["call"], call))
        if was != now:
            return False, None, f"replay: {name}: tool call {number} {difference(was, now)} ({self.path})"
        return True, saved.get("result"), ""


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None
