"""Saved runs, read into one index: prompt key -> the saved rows that answer it.

Every reader (our run dir, olmo-eval, lm-evaluation-harness) fills the same
`IndexBuilder`, so replay has one set of rules whatever wrote the files.
Loading is one streaming pass: each line is parsed once with orjson, and a
saved row is kept as its raw bytes in one flat list (`blobs`), the index
holding only positions in it; a row is decoded into `SavedRow` when a request
asks for its prompt. A million saved rows then cost little more than their
bytes in memory.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import EvalReplayError, Generation, PromptKey

# A prompt key's saves: one position in `blobs`, or (a prompt saved twice) several.
Slot = int | list[int]

WHAT_CAN_BE_READ = (
    "a run dir (<task>-predictions.jsonl beside <task>-requests.jsonl), one "
    "<task>-predictions.jsonl file, an olmo-eval results dir (predictions/<model>/ "
    "beside requests/<model>/), or lm-evaluation-harness samples_<task>_<date>.jsonl files"
)


@dataclass(frozen=True)
class SavedRow:
    """One saved answer to one prompt, decoded on demand.

    `rollouts[i]` is the sample index of `generations[i]`; a row that holds all
    of an instance's samples has rollouts 0..n-1.
    """

    instance_id: str
    stage: int
    rollouts: tuple[int, ...]
    generations: tuple[Generation, ...]
    where: str  # "file:line", for messages
    file: Path


Decoder = Callable[[bytes, str, Path], SavedRow]


@dataclass(frozen=True)
class SavedFile:
    """A predictions file: where its blobs start and how to decode them.

    `linenos` is None when the file's every line went into `blobs` (line
    number = position - start + 1), else the line number of each blob.
    """

    path: Path
    task: str
    layout: str  # "evalreplay" | "olmo-eval" | "lm-eval"
    decode: Decoder
    start: int
    linenos: list[int] | None = None


@dataclass(frozen=True)
class SavedIndex:
    """Every saved prompt of a loaded path, ready for lookups."""

    source: Path
    files: tuple[SavedFile, ...]
    keys: dict[PromptKey, Slot]
    blobs: list[bytes]
    model: str | None
    skipped: int  # loglikelihood, image and tool saves left out at load

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self, key: PromptKey) -> list[SavedRow]:
        """The saved rows for a prompt key, in file order (empty if none).

        Raises EvalReplayError naming file:line when a saved row is malformed.
        """
        slot = self.keys.get(key)
        if slot is None:
            return []
        return [self.decode(pos) for pos in ([slot] if type(slot) is int else slot)]

    def decode(self, pos: int) -> SavedRow:
        return decode_at(self.files, self.blobs, pos)


def locate(files: list[SavedFile] | tuple[SavedFile, ...], pos: int) -> tuple[SavedFile, int]:
    """The file of a blob position, and the blob's line number in it."""
    source = files[bisect_right(files, pos, key=_start) - 1]
    offset = pos - source.start
    return source, (offset + 1 if source.linenos is None else source.linenos[offset])


def _start(saved: SavedFile) -> int:
    return saved.start


def decode_at(files: list[SavedFile] | tuple[SavedFile, ...], blobs: list[bytes], pos: int) -> SavedRow:
    source, lineno = locate(files, pos)
    return source.decode(blobs[pos], f"{source.path}:{lineno}", source.path)


@dataclass
class IndexBuilder:
    """Collects blobs and keys from readers; `finish` checks the whole-path rules.

    Readers insert on the hot path with `keys.setdefault(key, pos)` and call
    `collide` only when that returns an older position.
    """

    source: Path
    files: list[SavedFile] = field(default_factory=list)
    keys: dict[PromptKey, Slot] = field(default_factory=dict)
    blobs: list[bytes] = field(default_factory=list)
    models: dict[str, list[Path]] = field(default_factory=dict)
    fallback_model: str | None = None
    skipped: int = 0

    def add_file(
        self, path: Path, task: str, layout: str, decode: Decoder, linenos: list[int] | None = None
    ) -> SavedFile:
        """Start a file; its blobs are appended to `blobs` from now on."""
        saved = SavedFile(path, task, layout, decode, len(self.blobs), linenos)
        self.files.append(saved)
        return saved

    def note_model(self, model: object, path: Path) -> None:
        """Record that `path` holds predictions of `model` (None: unknown)."""
        if model is None:
            return
        paths = self.models.setdefault(str(model), [])
        if path not in paths:
            paths.append(path)

    def collide(self, key: PromptKey, prev: Slot, pos: int) -> None:
        """A prompt saved twice: fine within one file (replay compares the
        saves when asked), refused across files, where the choice of which
        run to trust belongs to the user."""
        first = prev if type(prev) is int else prev[0]
        (a, la), (b, lb) = locate(self.files, first), locate(self.files, pos)
        if a is not b:
            raise EvalReplayError(
                f"{a.path}:{la} and {b.path}:{lb} both save the same prompt "
                f"(instances {self._instance(first)!r} and {self._instance(pos)!r}); "
                f"replay cannot tell which run to serve: pass the file instead, "
                f"e.g. --evalreplay-predictions={a.path}"
            )
        if type(prev) is int:
            self.keys[key] = [prev, pos]
        else:
            prev.append(pos)

    def _instance(self, pos: int) -> str:
        try:
            return decode_at(self.files, self.blobs, pos).instance_id
        except EvalReplayError:
            return "?"

    def check_one_model(self) -> None:
        """Refuse predictions of several models (checked as soon as they are known)."""
        if len(self.models) > 1:
            listing = "; ".join(
                f"{model!r} in {', '.join(str(p) for p in paths[:3])}"
                + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
                for model, paths in sorted(self.models.items())
            )
            raise EvalReplayError(
                f"{self.source} holds predictions of {len(self.models)} models ({listing}); "
                "replay serves one model's generations: pass one model's directory or file"
            )

    def finish(self) -> SavedIndex:
        self.check_one_model()
        model = next(iter(self.models), None) or self.fallback_model
        return SavedIndex(
            source=self.source,
            files=tuple(self.files),
            keys=self.keys,
            blobs=self.blobs,
            model=model,
            skipped=self.skipped,
        )


def read_lines(path: Path) -> list[bytes]:
    """A JSONL file's lines, as bytes (one read, one split)."""
    try:
        return path.read_bytes().splitlines()
    except OSError as exc:
        raise EvalReplayError(f"{path}: cannot read: {exc.strerror or exc}") from None


def parse_lines(path: Path) -> Iterator[tuple[int, bytes, Any]]:
    """Each non-blank line of a JSONL file: its number, its bytes and its row.
    A line that does not parse is an error naming the file and line."""
    loads = orjson.loads
    for lineno, line in enumerate(read_lines(path), 1):
        try:
            row = loads(line)
        except orjson.JSONDecodeError as exc:
            if line.strip():
                raise malformed(path, lineno, exc) from None
            continue
        yield lineno, line, row


def malformed(path: Path, lineno: int, exc: Exception) -> EvalReplayError:
    return EvalReplayError(
        f"{path}:{lineno}: malformed JSON ({exc}); fix or delete that line, "
        "or point --evalreplay-predictions elsewhere"
    )


def bad_row(path: Path, lineno: int, expected: str) -> EvalReplayError:
    return EvalReplayError(f"{path}:{lineno}: not a row this reader understands: {expected}")


def first_row(path: Path) -> object:
    """The first non-blank row of a JSONL file (None if empty), for sniffing layouts."""
    try:
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        return orjson.loads(line)
                    except orjson.JSONDecodeError as exc:
                        raise malformed(path, lineno, exc) from None
    except OSError as exc:
        raise EvalReplayError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return None


def load(path: str | Path) -> SavedIndex:
    """Read whatever layout `path` is into one index (see WHAT_CAN_BE_READ)."""
    from pytest_evalreplay.formats import lm_eval, native, olmo_eval

    path = Path(path).expanduser()
    builder = IndexBuilder(source=path)
    if path.is_file():
        if lm_eval.is_samples_file(path):
            lm_eval.load_files(builder, [path])
        elif path.name.endswith(native.PREDICTIONS_SUFFIX):
            if olmo_eval.is_olmo_predictions(path):
                olmo_eval.load_file(builder, path)
            else:
                native.load_file(builder, path)
        else:
            raise EvalReplayError(f"{path}: not a predictions file; expected {WHAT_CAN_BE_READ}")
    elif path.is_dir():
        if olmo_eval.is_results_dir(path):
            olmo_eval.load_results_dir(builder, path)
        elif olmo_eval.is_model_dir(path):
            olmo_eval.load_dir(builder, path)
        elif files := native.prediction_files(path):
            if olmo_eval.is_olmo_predictions(files[0]):
                olmo_eval.load_dir(builder, path)
            else:
                native.load_dir(builder, path)
        elif samples := lm_eval.samples_files(path):
            lm_eval.load_files(builder, samples)
        else:
            raise EvalReplayError(f"{path}: no saved predictions here; expected {WHAT_CAN_BE_READ}")
    else:
        raise EvalReplayError(
            f"{path}: no such file or directory; --evalreplay-predictions "
            f"(ini evalreplay_predictions) must name {WHAT_CAN_BE_READ}"
        )
    return builder.finish()
