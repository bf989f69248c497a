"""What the HTML report shows, as one JSON-able dict built from a run dir alone.

The report is read from the files replay reads (manifest, requests,
predictions, metrics, transcripts, an LLM judge's files), through the run
dir's own checks (`storage.runschema`), so a month-old run dir, a merged one
and the one a session just wrote render the same. Nothing here renders: the
page (`report/html.py` and its template) turns this dict into views, and a
test can assert on the dict without a browser. Text from models, tools and
datasets is kept as data; the page only ever sets it as text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.journal import transcripts
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.stats import ALPHA
from pytest_evalreplay.storage.files import read_bytes
from pytest_evalreplay.storage.lines import jsonl_lines
from pytest_evalreplay.storage.runschema import (
    JOURNAL_SUFFIX,
    JUDGE_SUFFIX,
    MANIFEST,
    PREDICTIONS_SUFFIX,
    REQUESTS_SUFFIX,
    TURNS_SUFFIX,
    doc_of,
    prediction_fields,
    read_manifest,
    request_fields,
    rollouts_of,
    task_files,
)

FORMAT = "evalreplay-html/1"
_ITEM = re.compile(r"^(?P<iid>.*)\[s(?P<stage>\d+)-r(?P<rollout>\d+)\]$")
_SAMPLE_METRIC = re.compile(r"^(?P<family>pass|maj)@(?P<k>\d+)(?P<of>:.+)?$")
Gates = Mapping[str, tuple[bool, str]]


def build(
    run_dir: Path, base: Path | None = None, gates: Gates | None = None, alpha: float = ALPHA
) -> dict[str, Any]:
    """The report's data for `run_dir` (and its comparison with `base`).

    `gates`: the session's verdicts ({task: (passed, text)}), which the run
    dir does not keep; a report made later from the run dir alone has none.
    Every unreadable or malformed file is an EvalReplayError naming it.
    """
    run_dir = Path(run_dir)
    manifest = _manifest(run_dir)
    tasks = [_task(run_dir, name, (gates or {}).get(name)) for name in manifest["tasks"]]
    data: dict[str, Any] = {
        "format": FORMAT,
        "run_dir": str(run_dir),
        "manifest": manifest,
        "tasks": tasks,
        "compare": None,
    }
    if base is not None:
        data["compare"] = comparison(Path(base), run_dir, alpha, {t["name"]: t for t in tasks})
    return data


def _manifest(run_dir: Path) -> dict[str, Any]:
    """manifest.json checked, plus what the run dir says of when and which run."""
    if not run_dir.is_dir():
        what = "no such run dir" if not run_dir.exists() else "not a directory"
        raise EvalReplayError(
            f"{run_dir}: {what}; pass the run dir a run wrote (its --evalreplay-output, "
            "the folder holding manifest.json)"
        )
    checked = read_manifest(run_dir / MANIFEST)
    if checked is None:
        raise EvalReplayError(
            f"{run_dir}: has no manifest.json, so it is not a pytest-evalreplay run dir; for another "
            "harness's saves, rescore them into one first: pytest --evalreplay-predictions=SAVES "
            "--evalreplay-output=RUN_DIR"
        )
    if checked.tasks is None:
        raise EvalReplayError(
            f"{checked.path}: 'tasks' must be a list of task names; a run that ends writes it, "
            "so rerun with pytest --resume"
        )
    doc = orjson.loads(read_bytes(checked.path).removeprefix(b"\xef\xbb\xbf"))
    when = datetime.fromtimestamp(checked.path.stat().st_mtime, tz=timezone.utc)
    return {
        "model": checked.model,
        "provider": doc.get("provider"),
        "tasks": sorted(set(checked.tasks)),
        "written": when.isoformat(timespec="seconds"),
        "extra": {k: v for k, v in doc.items() if k not in ("format", "model", "provider", "tasks")},
    }


def _task(run_dir: Path, name: str, gate: tuple[bool, str] | None) -> dict[str, Any]:
    files = task_files(run_dir, name)
    doc = _metrics_doc(files["metrics"], name)
    failed = _failed_items(doc.get("failed"))
    samples, sampling = _samples(files["requests"], files["predictions"], failed)
    episodes = _episodes(run_dir, name)
    elo = doc.get("elo") if isinstance(doc.get("elo"), dict) else None
    ci95 = doc.get("ci95") if isinstance(doc.get("ci95"), dict) else {}
    metrics = [
        {"name": m, "value": v, "ci95": ci95.get(m) if isinstance(ci95.get(m), list) else None}
        for m, v in (doc.get("metrics") or {}).items()
    ]
    session = doc.get("session") if isinstance(doc.get("session"), dict) else {}
    kind = "elo" if elo else "agent" if episodes else "choices" if _has_choices(samples) else "task"
    return {
        "name": name,
        "kind": kind,
        "metrics": metrics,
        "counts": {
            "instances": doc.get("num_instances"),
            "items": doc.get("num_items"),
            "failed": doc.get("num_failed"),
            "missing": doc.get("num_missing"),
            "generated": session.get("generated"),
            "reused": session.get("reused"),
        },
        "complete": doc.get("complete"),
        "tokens": doc.get("tokens"),
        "run": session.get("run"),
        "sampling": sampling,
        "gate": None if gate is None else {"passed": gate[0], "verdict": gate[1]},
        "samples": samples,
        "episodes": episodes,
        "elo": _elo_view(elo) if elo else None,
        "curves": _curves(metrics),
        "judge": _judge_rows(run_dir, name),
    }


def _metrics_doc(path: Path, task: str) -> dict[str, Any]:
    if not path.is_file():
        raise EvalReplayError(
            f"{path}: missing; manifest.json lists task {task!r}, but its run never finished "
            "(finish it with pytest --resume, then make the report again)"
        )
    try:
        doc = orjson.loads(read_bytes(path))
    except orjson.JSONDecodeError as exc:
        raise EvalReplayError(f"{path}: not valid JSON ({exc}); fix the file or run the task again") from None
    if type(doc) is not dict or type(doc.get("metrics")) is not dict:
        raise EvalReplayError(f"{path}: must be a JSON object with 'metrics'; run the task again")
    return doc


def _failed_items(names: Any) -> dict[tuple[int, str], set[int]]:
    """metrics.json's `failed` item names, as (stage, instance) -> rollouts."""
    out: dict[tuple[int, str], set[int]] = {}
    for name in names if isinstance(names, list) else ():
        match = _ITEM.match(name) if isinstance(name, str) else None
        if match is not None:
            key = (int(match["stage"]), match["iid"])
            out.setdefault(key, set()).add(int(match["rollout"]))
    return out


def _samples(
    requests_path: Path, predictions_path: Path, failed: Mapping[tuple[int, str], set[int]]
) -> tuple[list[dict[str, Any]], Any]:
    """One sample per (stage, instance): its request, every saved rollout with
    its scores, and the rollouts that failed (which saved nothing); and the
    sampling of the first request (the task's, shown once, not per sample)."""
    requests: dict[tuple[int, str], dict[str, Any]] = {}
    sampling = None
    if requests_path.exists():
        for lineno, _, row in jsonl_lines(requests_path, read_bytes(requests_path)):
            fields = request_fields(row, f"{requests_path}:{lineno}")
            requests[(fields.stage, fields.instance_id)] = {
                "prompt": fields.context,
                "system": fields.system_prompt,
                "choices": list(fields.continuations) or None,
            }
            if sampling is None:
                sampling = row.get("sampling")
    samples: list[dict[str, Any]] = []
    seen: set[tuple[int, str]] = set()
    rows = jsonl_lines(predictions_path, read_bytes(predictions_path)) if predictions_path.exists() else ()
    for lineno, _, row in rows:
        where = f"{predictions_path}:{lineno}"
        fields = prediction_fields(row, where)
        key = (fields.stage, fields.instance_id)
        seen.add(key)
        rollouts = rollouts_of(row.get("rollouts"), len(fields.generations), where)
        per_sample = row.get("sample_scores")
        if not (isinstance(per_sample, list) and len(per_sample) == len(rollouts)):
            per_sample = [None] * len(rollouts)
        gens = [
            _generation(g, r, s, where)
            for g, r, s in zip(fields.generations, rollouts, per_sample, strict=True)
        ]
        scores = row.get("scores") if isinstance(row.get("scores"), dict) else {}
        sample = _sample(key, requests.get(key, {}), gens, scores, failed.get(key, set()))
        if (doc := doc_of(row, where)) is not None:
            sample["doc"] = doc  # an lm-eval task's document: what was asked
        samples.append(sample)
    for key in sorted(set(failed) - seen, key=lambda k: (k[1], k[0])):
        samples.append(_sample(key, requests.get(key, {}), [], {}, failed[key]))
    return samples, sampling


def _sample(
    key: tuple[int, str],
    request: Mapping[str, Any],
    gens: list[dict[str, Any]],
    scores: Any,
    failed: set[int],
) -> dict[str, Any]:
    unscored = [g["r"] for g in gens if g["scores"] is None]
    return {
        "id": key[1],
        "stage": key[0],
        **request,
        "gens": gens,
        "scores": scores,
        "failed": sorted(failed | set(unscored)),
    }


def _generation(gen: Any, rollout: int, scores: Any, where: str) -> dict[str, Any]:
    if type(gen) is not dict or type(gen.get("text")) is not str:
        raise EvalReplayError(f"{where}: a generation must be an object with a string 'text'; fix that line")
    out: dict[str, Any] = {
        "r": rollout,
        "text": gen["text"],
        "raw": gen.get("original_text") if isinstance(gen.get("original_text"), str) else None,
        "finish": gen.get("finish_reason"),
        "pt": gen.get("prompt_tokens"),
        "ct": gen.get("completion_tokens"),
        "scores": scores if isinstance(scores, dict) else None,
    }
    if isinstance(gen.get("loglikelihoods"), list):
        out["ll"] = gen["loglikelihoods"]
    if gen.get("tool_calls"):
        out["tool_calls"] = gen["tool_calls"]
    return out


def _has_choices(samples: list[dict[str, Any]]) -> bool:
    return any(s.get("choices") for s in samples)


def _episodes(run_dir: Path, task: str) -> list[dict[str, Any]]:
    """An agent task's episodes as conversations: the messages, and per model
    turn where its reply sits in them, its finish reason and tokens."""
    path = transcripts.transcripts_path(run_dir, task)
    if not path.is_file():
        return []
    out = []
    runs = _turn_runs(run_dir / f"{task}{TURNS_SUFFIX}{JOURNAL_SUFFIX}")
    for _, row in transcripts.SavedEpisodes.read(run_dir, task).episodes.items():
        turns = []
        for n, turn in enumerate(row["turns"], 1):
            if not isinstance(turn, dict):
                continue
            sent = turn.get("sent")
            at = sent if type(sent) is int else len(turn.get("messages") or ())
            turns.append(
                {
                    "turn": turn.get("turn", n),
                    "at": at,
                    "finish": turn.get("finish_reason"),
                    "pt": turn.get("prompt_tokens"),
                    "ct": turn.get("completion_tokens"),
                }
            )
        made = (
            runs.get((row["stage"], row["instance_id"], row["rollout"]), [])[-len(turns) :] if turns else []
        )
        if len(made) == len(turns):
            for turn, run in zip(turns, made, strict=True):
                turn["run"] = run
        out.append(
            {
                "id": row["instance_id"],
                "stage": row["stage"],
                "rollout": row["rollout"],
                "live_from": _live_from(made) if len(made) == len(turns) else None,
                "answer": row.get("answer"),
                "error": row.get("error"),
                "messages": row.get("messages") if isinstance(row.get("messages"), list) else [],
                "turns": turns,
                "tool_results": row["tool_results"],
            }
        )
    return out


def _turn_runs(path: Path) -> dict[tuple[int, str, int], list[str]]:
    """Which run answered each model turn of each episode, from the agent
    task's turns journal when the run dir keeps it: per (stage, instance,
    rollout), the run of each distinct turn request (a row keyed by its own
    request digest), in the order of the row that stands for it (the newest).
    A line that is not a whole row (a torn last line) is left out: this only
    labels turns, it decides nothing."""
    if not path.is_file():
        return {}
    newest: dict[tuple[int, str, int], dict[str, tuple[int, str]]] = {}
    for n, line in enumerate(read_bytes(path).split(b"\n")):
        if b'"gen"' not in line:
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        key = row.get("instance_id") if type(row) is dict and row.get("type") == "gen" else None
        parts = key.split("|") if isinstance(key, str) else []
        if len(parts) != 3 or parts[2] != row.get("request") or type(row.get("stage")) is not int:
            continue  # not a model turn: a tool call's row (`c<N>`), the episode's own (`episode`)
        if type(row.get("rollout")) is not int:
            continue
        episode = (row["stage"], parts[0], row["rollout"])
        newest.setdefault(episode, {})[parts[2]] = (n, str(row.get("run")))
    return {ep: [run for _, run in sorted(turns.values())] for ep, turns in newest.items()}


def _live_from(runs: list[str]) -> int | None:
    """The turn (1-based) from which an episode was answered by its last run,
    when earlier turns came from another (a resumed episode went live there)."""
    if len(set(runs)) < 2:
        return None
    first = len(runs)
    while first > 1 and runs[first - 2] == runs[-1]:
        first -= 1
    return first


def _elo_view(elo: Mapping[str, Any]) -> dict[str, Any]:
    """An EloEval's rating per stage, references and judged pairs: each
    (task, reference) cell of the judgments' table, as wins, ties, losses
    over both positions."""
    table = elo.get("table") if isinstance(elo.get("table"), dict) else {}
    pairs = [
        {"task": task, "reference": ref, "wtl": cell}
        for task, cells in sorted((table.get("tasks") or {}).items())
        for ref, cell in sorted(cells.items())
    ]
    keep = ("rating", "se", "ci95", "bound", "interval", "num_tasks", "num_judgments", "references", "note")
    return {**{k: elo.get(k) for k in keep}, "stages": elo.get("stages") or [], "pairs": pairs}


def _curves(metrics: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """pass@k and maj@k by family ("pass@k", "maj@k:right"), k ascending."""
    families: dict[str, list[dict[str, Any]]] = {}
    for m in metrics:
        match = _SAMPLE_METRIC.match(m["name"])
        if match is not None:
            point = {"k": int(match["k"]), "name": m["name"], "value": m["value"], "ci95": m["ci95"]}
            families.setdefault(f"{match['family']}@k{match['of'] or ''}", []).append(point)
    return {f: sorted(ps, key=lambda p: p["k"]) for f, ps in families.items() if ps}


def _judge_rows(run_dir: Path, task: str) -> list[dict[str, Any]]:
    """An LLM judge's requests and replies (an EloEval's, or `scorers.graded`'s),
    when the run dir keeps them: what it was asked and every reply."""
    name = f"{task}{JUDGE_SUFFIX}"
    predictions = run_dir / f"{name}{PREDICTIONS_SUFFIX}"
    if not predictions.is_file():
        return []
    asked: dict[tuple[int, str], Any] = {}
    requests = run_dir / f"{name}{REQUESTS_SUFFIX}"
    if requests.is_file():
        for lineno, _, row in jsonl_lines(requests, read_bytes(requests)):
            fields = request_fields(row, f"{requests}:{lineno}")
            asked[(fields.stage, fields.instance_id)] = fields.context
    out = []
    for lineno, _, row in jsonl_lines(predictions, read_bytes(predictions)):
        fields = prediction_fields(row, f"{predictions}:{lineno}")
        replies = [g.get("text") for g in fields.generations if isinstance(g, dict)]
        out.append(
            {
                "id": fields.instance_id,
                "stage": fields.stage,
                "asked": asked.get((fields.stage, fields.instance_id)),
                "replies": replies,
            }
        )
    return out


def comparison(base: Path, new: Path, alpha: float, tasks: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """`compare`'s numbers (the one paired test, the flips, regressions first),
    each flip with every rollout's text of both runs side by side."""
    from pytest_evalreplay.report.compare import compare_run_dirs

    cmp = compare_run_dirs(base, new, alpha).to_dict()
    for task in cmp["tasks"]:
        flipped = {f["instance_id"] for f in task["flips"]}
        old = _rollout_texts(base, task["task"], flipped)
        now = {
            s["id"]: [g["text"] for g in s["gens"]]
            for s in tasks[task["task"]]["samples"]
            if s["id"] in flipped
        }
        for flip in task["flips"]:
            flip["base_rollouts"] = old.get(flip["instance_id"], [])
            flip["new_rollouts"] = now.get(flip["instance_id"], [])
    return cmp


def _rollout_texts(run_dir: Path, task: str, ids: set[str]) -> dict[str, list[str]]:
    path = task_files(run_dir, task)["predictions"]
    out: dict[str, list[str]] = {}
    if not ids or not path.is_file():
        return out
    for lineno, _, row in jsonl_lines(path, read_bytes(path)):
        fields = prediction_fields(row, f"{path}:{lineno}")
        if fields.instance_id in ids:
            texts = [g["text"] for g in fields.generations if type(g) is dict and type(g.get("text")) is str]
            out.setdefault(fields.instance_id, []).extend(texts)
    return out
