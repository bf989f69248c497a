"""The replay provider: serve saved generations again, so that a task can be
rescored (new scorer, fixed extraction, edited gold answers) without a model.

A request is answered by the saved rows whose prompt key (context plus system
prompt, `model.prompt_key`) equals its own; from the plugin's own run dir,
by those of the request's task's own file when it has one (two tasks may
share a prompt). A loglikelihood request (a multiple-choice task's) is
answered only by a loglikelihood save of the same prompt whose continuations
equal its own, and a generate request only by a generation. The raw text is served
(`original_text` when the save has one), so the task extracts, strips and
scores again exactly as it would a live answer. Everything that cannot be
answered faithfully is a non-retryable `GenerationError`, never a score of 0.
"""

from __future__ import annotations

from pathlib import Path

from pytest_evalreplay.formats import load
from pytest_evalreplay.formats.closest import closest, describe
from pytest_evalreplay.formats.saved import SavedIndex, SavedRow, key_of
from pytest_evalreplay.formats.saves import Save, choose, first_difference, merge, served
from pytest_evalreplay.model import (
    EvalReplayError,
    GenerateResult,
    GenerationError,
    LoglikelihoodResult,
    PromptKey,
    Request,
)
from pytest_evalreplay.settings import Settings
from pytest_evalreplay.storage.rowfields import show


class ReplayProvider:
    """Serves the generations saved in a run dir, a predictions file, an
    olmo-eval results dir or lm-evaluation-harness samples files."""

    kind = "replay"
    batch_size: int | None = None

    def __init__(self, index: SavedIndex) -> None:
        self.index = index
        self.model: str | None = index.model
        self.served_requests = 0
        self.other_sampling = 0  # served requests whose saved sampling differs from the asked one
        self.first_other: str | None = None  # the first of them, for the note

    @classmethod
    def from_path(cls, path: str | Path) -> ReplayProvider:
        """Load and index `path` in one pass; EvalReplayError names what is wrong."""
        return cls(load(path))

    def __repr__(self) -> str:
        return f"ReplayProvider({str(self.index.source)!r}, {len(self.index)} prompts, model={self.model!r})"

    def generate(self, requests: list[Request]) -> list[GenerateResult]:
        return [self.answer(r) for r in requests]

    def loglikelihood(self, requests: list[Request]) -> list[LoglikelihoodResult]:
        """The saved (log-probability, is_greedy) pairs of each request's
        continuations (a rolling request's saved `RollingLoglikelihood`), by
        the same rules as `generate`."""
        out: list[LoglikelihoodResult] = []
        for request in requests:
            result = self.answer(request)
            if isinstance(result, GenerationError):
                out.append(result)
            elif request.request_type == "loglikelihood_rolling":
                assert result[0].rolling is not None  # only rolling saves serve a rolling request
                out.append(result[0].rolling)
            else:
                out.append(list(result[0].loglikelihoods))
        return out

    def close(self) -> None:
        """Nothing to release: the index is plain memory."""

    @property
    def notes(self) -> list[str]:
        """What the summary should say (`ProviderHost.close` copies it): how
        many served requests asked for other sampling than their saved
        generations were made with (those are served all the same, since the
        prompt is the key, and the run dir records the saved sampling)."""
        if not self.other_sampling:
            return []
        return [
            f"replay: {self.other_sampling} of {self.served_requests} served requests asked for other "
            f"sampling than their saved generations were made with (first: {self.first_other}); the "
            "saved generations were served, and the run dir's requests rows record the saved sampling"
        ]

    def answer(self, request: Request) -> GenerateResult:
        where = f"task {request.task}, instance {request.instance_id}"
        if request.images or request.tools:
            what = "images" if request.images else "tools"
            return GenerationError(
                f"replay: requests with {what} cannot be replayed ({where}); the replay key is "
                "the text prompt only: score this task with a live provider"
            )
        try:
            prompt = request.prompt_key
        except TypeError as exc:  # chat messages orjson cannot encode (a lone surrogate, a set...)
            return GenerationError(
                f"replay: this request's context cannot be written as JSON ({exc}; {where})"
            )
        try:
            rows = self.index.task_rows(self.index.rows(prompt), request.task)
        except EvalReplayError as exc:
            return GenerationError(f"replay: {exc} ({where})")
        if not rows:
            return GenerationError(self._no_match(request, prompt, where))
        if request.request_type == "loglikelihood":
            matching = _same_continuations(rows, request, where)
            if isinstance(matching, GenerationError):
                return matching
            rows = matching
        elif request.request_type == "loglikelihood_rolling":
            rows = [row for row in rows if not row.continuations and _rolling(row)]
            if not rows:
                return GenerationError(
                    f"replay: this text ({where}) was not saved with its rolling log-likelihood (a "
                    "loglikelihood_rolling answer): replay a run that scored it, or score this task with a "
                    "live provider that serves loglikelihood_rolling"
                )
        else:
            rows = [row for row in rows if not row.continuations and not _rolling(row)]
            if not rows:
                return GenerationError(
                    f"replay: this prompt ({where}) was saved with log-likelihoods of answer choices "
                    "only, and this request asks for a generation: give the task its choices=..., or "
                    "replay a run that generated for it"
                )
        saves = merge(rows)
        chosen = choose(saves, request.stage)
        if chosen is None:
            listing = ", ".join(
                f"{s.where[0]} (instance {s.instance_id}" + (f", stage {s.stage})" if s.stage != 1 else ")")
                for s in saves[:4]
            )
            more = f" and {len(saves) - 4} more" if len(saves) > 4 else ""
            return GenerationError(
                f"replay: this prompt ({where}) was saved {len(saves)} times with different "
                f"generations ({first_difference(saves)}): {listing}{more}; replay cannot tell which to "
                "serve: give those instances distinct prompts, or delete the saves you do not want"
            )
        conflicts = [c for s in chosen for c in s.conflicts]
        if conflicts:
            more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
            return GenerationError(
                f"replay: conflicting saves of this prompt ({where}): {conflicts[0]}{more}; replay "
                "cannot tell which is right: delete the row you do not want"
            )
        save = chosen[0]
        want = request.num_samples
        if len(save.samples) != want:
            return GenerationError(
                f"replay: the saved sample count {len(save.samples)} differs from num_samples "
                f"{want} ({where}; saved at {save.where[-1]}); rescore with "
                f"num_samples={len(save.samples)}, or regenerate with a live provider"
            )
        missing = [r for r in request.rollouts if r not in save.samples]
        if missing:
            return GenerationError(
                f"replay: the saved rollouts {sorted(save.samples)} do not include {missing} "
                f"({where}; saved at {save.where[-1]}); regenerate with a live provider"
            )
        return self._serve(request, save, where)

    def _serve(self, request: Request, save: Save, where: str) -> GenerateResult:
        """The wanted samples, each carrying its saved sampling where that
        differs from the request's (and counted for the summary's note)."""
        wrong = [
            r for r in request.rollouts if len(save.samples[r].loglikelihoods) != len(request.continuations)
        ]
        if wrong:
            count = len(save.samples[wrong[0]].loglikelihoods)
            return GenerationError(
                f"replay: the save at {save.where[-1]} holds {count} log-likelihoods for "
                f"{len(request.continuations)} continuations ({where}); fix or delete that row"
            )
        self.served_requests += 1
        asked = dict(request.sampling)
        differs = {
            r: save.samplings[r]
            for r in request.rollouts
            if save.samplings.get(r) is not None and save.samplings[r] != asked
        }
        if differs:
            self.other_sampling += 1
            if self.first_other is None:
                saved = next(iter(differs.values()))
                self.first_other = f"{where}: saved {show(saved, 80)}, asked {show(asked, 80)}"
        return [served(save.samples[r], differs.get(r)) for r in request.rollouts]

    def _no_match(self, request: Request, prompt: PromptKey, where: str) -> str:
        skipped = (
            f" ({self.index.skipped} loglikelihood, image or tool saves were skipped)"
            if self.index.skipped
            else ""
        )
        hint = ""
        try:
            near = closest(self.index, prompt, request.stage, request.instance_id)
        except EvalReplayError:
            near = None
        if near is not None:
            whose = "this instance" if near.same_instance else f"instance {near.instance or '?'}"
            hint = f" Nearest save: {near.where} ({whose}), where {describe(near.key, key_of(prompt))}."
        return (
            f"replay: no saved generation matches this prompt ({where}); "
            f"{self.index.source} holds {len(self.index)} saved prompts{skipped}.{hint} "
            "Check that the task renders the same context and system prompt as the saved run"
        )


def _rolling(row: SavedRow) -> bool:
    """Whether a save holds rolling log-likelihoods (a loglikelihood_rolling answer)."""
    return any(g.rolling is not None for g in row.generations)


def _same_continuations(
    rows: list[SavedRow], request: Request, where: str
) -> list[SavedRow] | GenerationError:
    """Of a prompt's saves, the loglikelihood ones with the request's continuations."""
    saved = [row for row in rows if row.continuations]
    if not saved:
        return GenerationError(
            f"replay: this prompt ({where}) was saved as a generation (at {rows[0].where}), and this "
            "request asks for the log-likelihoods of answer choices: replay a run that scored the "
            "choices, or score this task with a live provider that serves loglikelihood"
        )
    matching = [row for row in saved if row.continuations == request.continuations]
    if matching:
        return matching
    first = saved[0]
    return GenerationError(
        f"replay: no save of this prompt ({where}) has this request's continuations: the save at "
        f"{first.where} differs, {continuation_difference(first.continuations, request.continuations)}; "
        "check the task's choices and choice_delimiter against the saved run"
    )


def continuation_difference(saved: tuple[str, ...], asked: tuple[str, ...]) -> str:
    """The first difference between saved and asked continuations, in words."""
    for n, (a, b) in enumerate(zip(saved, asked, strict=False)):
        if a != b:
            return f"continuation {n} is {show(a)} there and {show(b)} here"
    return f"it has {len(saved)} continuations and this request {len(asked)}"


def from_settings(settings: Settings) -> ReplayProvider:
    """The provider factory `providers.make_builtin("replay", ...)` calls."""
    if settings.predictions is None:
        raise EvalReplayError(
            "the replay provider needs saved predictions: pass --evalreplay-predictions=PATH "
            "(or set the ini key evalreplay_predictions) to a run dir, a predictions file, "
            "an olmo-eval results dir or lm-evaluation-harness samples files"
        )
    return ReplayProvider.from_path(settings.predictions)
