"""A prompt's saves, merged and chosen: the rules replay serves by and an
ELO eval reads its references' answers by, so both read a saved run alike.

A prompt's rows are grouped into one `Save` per (file, stage, instance); a
sample saved twice with different texts is a conflict, never last-wins; the
saves that answer are all of the prompt's when they agree, else those of the
asked stage, else none (the caller says why).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.formats.saved import SavedIndex, SavedRow
from pytest_evalreplay.model import EvalReplayError, Generation, PromptKey
from pytest_evalreplay.storage.rowfields import show
from pytest_evalreplay.storage.runschema import SAVED_SAMPLING


@dataclass(frozen=True)
class Save:
    """One instance's saved samples (the rows of one file for one instance and
    stage, merged: a resumed run appends rows that each hold some rollouts).
    `conflicts` says where two rows give one sample different texts."""

    instance_id: str
    stage: int
    samples: dict[int, Generation]
    where: tuple[str, ...]
    conflicts: tuple[str, ...] = ()
    samplings: dict[int, dict[str, Any] | None] = field(default_factory=dict)  # each sample's saved sampling

    @property
    def answers(self) -> tuple[Answer, ...]:
        return tuple(answer_of(self.samples[r]) for r in sorted(self.samples))


Answer = tuple[Any, ...]
# What replay serves of a sample besides its text and log-likelihoods: two
# saves of one sample must agree on all of it, or neither is served.
_SERVED_FIELDS = ("finish_reason", "prompt_tokens", "completion_tokens", "metadata")


def answer_of(generation: Generation) -> Answer:
    """What two saves of one sample must agree on: everything `served` hands
    on (the raw text, a loglikelihood answer's pairs, the finish reason, the
    token counts and the metadata)."""
    return (
        generation.raw_text,
        tuple(generation.loglikelihoods),
        generation.rolling,
        *(getattr(generation, f) for f in _SERVED_FIELDS[:3]),
        orjson.dumps(generation.metadata, option=orjson.OPT_SORT_KEYS),
    )


def _shown(first: Generation, other: Generation) -> tuple[str, str]:
    """How two saves of one sample differ, each side as shown in a message."""
    if first.loglikelihoods != other.loglikelihoods:
        return tuple(  # type: ignore[return-value]
            f"log-likelihoods {show([ll for ll, _ in g.loglikelihoods], 40)}" for g in (first, other)
        )
    if first.rolling != other.rolling:
        return tuple(  # type: ignore[return-value]
            f"rolling {show(g.rolling and g.rolling.to_row(), 60)}" for g in (first, other)
        )
    if first.raw_text != other.raw_text:
        return show(first.raw_text, 40), show(other.raw_text, 40)
    for name in _SERVED_FIELDS:
        a, b = getattr(first, name), getattr(other, name)
        if a != b:
            return f"{show(first.raw_text, 40)} with {name} {show(a, 40)}", f"{name} {show(b, 40)}"
    return show(first.raw_text, 40), show(other.raw_text, 40)


def merge(rows: Sequence[SavedRow]) -> list[Save]:
    """Group rows by (file, stage, instance). A sample saved twice with the same
    text is one sample; with different texts, a conflict (never last-wins)."""
    groups: dict[tuple[Path, int, str], list[SavedRow]] = {}
    for row in rows:
        groups.setdefault((row.file, row.stage, row.instance_id), []).append(row)
    saves = []
    for (_, stage, iid), group in groups.items():
        samples: dict[int, Generation] = {}
        samplings: dict[int, dict[str, Any] | None] = {}
        found_at: dict[int, str] = {}
        conflicts: list[str] = []
        for row in group:
            for r, generation in zip(row.rollouts, row.generations, strict=True):
                first = samples.setdefault(r, generation)
                if first is generation:
                    found_at[r] = row.where
                    samplings[r] = row.sampling
                elif answer_of(first) != answer_of(generation):
                    was, now = _shown(first, generation)
                    conflicts.append(
                        f"sample {r} of instance {iid} is {was} at {found_at[r]} but {now} at {row.where}"
                    )
        saves.append(Save(iid, stage, samples, tuple(r.where for r in group), tuple(conflicts), samplings))
    return saves


def first_difference(saves: Sequence[Save]) -> str:
    """The first way two saves of a prompt differ, as a message says it."""
    base = saves[0]
    for other in saves[1:]:
        for r in sorted(base.samples.keys() & other.samples.keys()):
            if answer_of(base.samples[r]) != answer_of(other.samples[r]):
                was, now = _shown(base.samples[r], other.samples[r])
                return f"sample {r} is {was} in one, {now} in another"
    return "their sample counts differ"


def choose(saves: Sequence[Save], stage: int) -> list[Save] | None:
    """The saves that serve a request: all saves of the prompt when they agree,
    failing that all saves of the request's stage. None when they disagree."""
    if saves and _agree(saves):
        return list(saves)
    staged = [s for s in saves if s.stage == stage]  # made only when the prompt's saves disagree
    return staged if staged and _agree(staged) else None


def _agree(saves: Sequence[Save]) -> bool:
    return all(s.answers == saves[0].answers for s in saves[1:])


def served(generation: Generation, saved_sampling: Mapping[str, Any] | None = None) -> Generation:
    """The raw text, so the task strips and extracts again; the rest carries
    over. `saved_sampling`, where given, joins the metadata (`SAVED_SAMPLING`)."""
    metadata = generation.metadata
    if saved_sampling is not None:
        metadata = {**metadata, SAVED_SAMPLING: dict(saved_sampling)}
    return Generation(
        text=generation.raw_text,
        original_text=None,
        finish_reason=generation.finish_reason,
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
        metadata=metadata,
        loglikelihoods=generation.loglikelihoods,
        rolling=generation.rolling,
    )


def first_answer(index: SavedIndex, prompt: PromptKey, stage: int) -> Generation | None:
    """The first saved sample answering `prompt`, whatever the saved sample
    count (a reference's answer in a pairwise judgment), served as replay
    serves it; None when the prompt is not saved. Saves that disagree raise
    EvalReplayError naming where."""
    rows = index.rows(prompt)
    if not rows:
        return None
    saves = merge(rows)
    chosen = choose(saves, stage)
    conflicts = [c for save in chosen or () for c in save.conflicts]
    if chosen is None or conflicts or not chosen[0].samples:
        where = conflicts[0] if conflicts else ", ".join(s.where[0] for s in saves[:3])
        raise EvalReplayError(
            f"the saved answers to this prompt disagree ({where}); delete the one you do not want"
        )
    save = chosen[0]
    return served(save.samples[min(save.samples)])
