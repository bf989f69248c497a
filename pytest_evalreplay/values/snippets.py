"""Prompts and answers cut to one line, for listings of flipped instances.

A comparison shows each flip as a line of its prompt and a line of each
run's answer: long texts keep their start and their end (a final answer
usually ends a text), and a chat prompt shows its last user message.
Model output may hold terminal control sequences (`\x1b[2J` clears the
screen): every line made here shows them escaped, so what is printed or
written as Markdown never acts on the terminal that reads it.
"""

from __future__ import annotations

import re
from typing import Any

# Prompts and answers are kept as one line of at most this many characters.
KEEP_CHARS = 400
# From the first non-space character to the end of its line (the breaks str.splitlines knows).
_FIRST_LINE = re.compile(r"[^\s][^\n\r\v\f\x1c-\x1e\x85\u2028\u2029]*")
# C0 and C1 control characters and DEL: escape, CSI and OSC sequences start with them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(text: str, keep_newlines: bool = False) -> str:
    """`text` with every control character written as its escape (`\\x1b`);
    with `keep_newlines`, a multi-line message keeps its "\\n"."""
    pattern = _CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def prompt_line(context: Any) -> str:
    """The first non-blank line of a prompt, whitespace collapsed. For chat
    messages, of the last user message: the question, after any few-shot turns."""
    if isinstance(context, list):
        users = [m for m in context if isinstance(m, dict) and m.get("role") == "user"]
        pick = users[-1] if users else (context[-1] if context else None)
        text = _content_text(pick.get("content") if isinstance(pick, dict) else None)
    elif isinstance(context, str):
        text = context
    else:
        text = ""
    line = _FIRST_LINE.search(text)
    return "" if line is None else one_line(line.group())


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style content parts
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def one_line(text: str) -> str:
    """All of `text` on one line: every run of whitespace, newlines included,
    becomes one space, and any other control character is escaped."""
    return printable(" ".join(text.split()))


def shorten(text: str, width: int, keep_end: bool = False) -> str:
    """`text` in at most `width` characters, marking a cut with "...". With
    `keep_end`, the middle is cut (an answer's end holds its final answer)."""
    if len(text) <= width:
        return text
    if width <= 3:
        return text[:width]
    if not keep_end:
        return text[: width - 3].rstrip() + "..."
    head = (width - 5) * 2 // 5
    tail = width - 5 - head
    return text[:head].rstrip() + " ... " + text[len(text) - tail :].lstrip()


def clip(text: str) -> str:
    """`text` as it is kept for a flip: one line of at most KEEP_CHARS, both ends kept."""
    return shorten(one_line(text), KEEP_CHARS, keep_end=True)


def trim(text: str) -> str:
    """A long answer cut to its start and end before it is kept for every
    instance (cheap slicing; `clip` makes it one line for the few that flip)."""
    if len(text) <= 4 * KEEP_CHARS:
        return text
    return text[: 2 * KEEP_CHARS] + " ... " + text[-2 * KEEP_CHARS :]
