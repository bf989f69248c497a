"""Saved runs: `load` reads whatever layout a path is into one `SavedIndex`.

The index and the helpers every reader shares live in `formats.saved`; each
layout has its reader module (native: our run dir, olmo_eval, lm_eval,
inspect_ai), and
this module only tells the layouts apart, so the readers never import it.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

from pytest_evalreplay.formats.saved import IndexBuilder, SavedIndex, listable
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.storage.files import os_error
from pytest_evalreplay.storage.lines import paused_gc

WHAT_CAN_BE_READ = (
    "a run dir (<task>-predictions.jsonl beside <task>-requests.jsonl), one "
    "<task>-predictions.jsonl file, an olmo-eval results dir (predictions/<model>/ "
    "beside requests/<model>/), lm-evaluation-harness samples_<task>_<date>.jsonl(.gz) files, "
    "or inspect_ai .eval logs (one, or a log dir)"
)


def load(path: str | Path) -> SavedIndex:
    """Read whatever layout `path` is into one index (see WHAT_CAN_BE_READ)."""
    path = Path(path).expanduser()
    # The index is a million small objects that all live on: collecting
    # while it grows would walk them again and again for nothing.
    with paused_gc():
        try:
            return _load(path)
        except OSError as exc:  # a stat or a listing the checks above did not see coming
            raise os_error(Path(exc.filename or path), exc, "read") from None
        except RecursionError:
            raise EvalReplayError(f"{path}: saved data nested too deeply to read") from None
        finally:
            promote_to_oldest()


def promote_to_oldest() -> None:
    """Move every object the collector tracks into its oldest generation, where
    the index would end up anyway. Left young, the index's keys (a tuple per
    prompt with a system prompt) would be walked by the first young
    collection after the load and again by the next one: 0.25 s for a
    million rows, to find nothing. `gc.freeze` then `gc.unfreeze` moves them
    without a walk; skipped where something else keeps objects frozen (its
    unfreeze would release those too)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


def _load(path: Path) -> SavedIndex:
    # Imported here: a reader of one file (replay's `closest`, the readers
    # themselves) imports `formats.saved`, which runs this module first.
    from pytest_evalreplay.formats import inspect_ai, lm_eval, native, olmo_eval

    builder = IndexBuilder(source=path)
    if path.is_file():
        if lm_eval.is_samples_file(path):
            lm_eval.load_files(builder, [path])
        elif inspect_ai.is_log(path):
            inspect_ai.load_files(builder, [path])
        elif path.name.endswith(native.PREDICTIONS_SUFFIX):
            if olmo_eval.is_olmo_predictions(path):
                olmo_eval.load_file(builder, path)
            else:
                native.load_file(builder, path)
        else:
            raise EvalReplayError(f"{path}: not a predictions file; expected {WHAT_CAN_BE_READ}")
    elif path.is_dir():
        listable(path)
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
        elif logs := inspect_ai.log_files(path):
            inspect_ai.load_files(builder, logs)
        else:
            raise EvalReplayError(f"{path}: no saved predictions here; expected {WHAT_CAN_BE_READ}")
    elif os.path.lexists(path):
        raise EvalReplayError(
            f"{path}: not a file or a directory (a broken link?); expected {WHAT_CAN_BE_READ}"
        )
    else:
        raise EvalReplayError(
            f"{path}: no such file or directory; --evalreplay-predictions "
            f"(ini evalreplay_predictions) must name {WHAT_CAN_BE_READ}"
        )
    return builder.finish()
