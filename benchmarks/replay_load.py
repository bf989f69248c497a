"""How fast and how lean `ReplayProvider.from_path` loads a large run dir.

Writes a synthetic run dir (FILES tasks, ROWS rows in all, short texts) to a
temp dir, then compares in this process, the median of --repeats runs of each,
interleaved so that both see the same machine:

- load: `ReplayProvider.from_path(dir)`
- bare: reading the same files and `orjson.loads` of every line, nothing kept
- floor: the least the load's work requires, written as tightly as the load
  (C-level passes, the collector paused): each requests row decoded (its
  prompt is the key, compared exactly), each prompt a dict key, the
  predictions' line ends found and each predictions row's beginning compared
  with its request's id (the join); no checks, no sampling, nothing else kept.
  Printed as the RESULT line's `floor` key (issue #34's rule for a goal that
  cannot be met): the speed of the floor against the bare parse, the bound
  on what the load can reach.

and, in fresh subprocesses, the peak memory (VmHWM growth) of each against
the files' total size. Goals (issue #22): load >= 0.90x the speed of the
bare parse, peak memory <= 1.3x the files' size; the exit status is 1 when
either is missed. Both ratios are printed, a JSON line and a RESULT line
(benchmarks/results.py).

    python benchmarks/replay_load.py              # 1,000,000 rows
    python benchmarks/replay_load.py --rows 1000  # a quick check
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import repeat
from operator import itemgetter
from pathlib import Path

import orjson

from pytest_evalreplay.model import Generation, Request
from pytest_evalreplay.providers.replay import ReplayProvider
from pytest_evalreplay.storage.runschema import request_row_of


def write_run_dir(directory: Path, rows: int, files: int) -> int:
    """A run dir like the plugin writes; returns the predictions/requests bytes."""
    per_file = -(-rows // files)
    total = 0
    for f in range(files):
        task = f"task{f}"
        n = min(per_file, rows - f * per_file)
        requests, predictions = [], []
        for i in range(max(n, 0)):
            iid = f"q{i:07d}"
            req = Request(
                task=task,
                instance_id=iid,
                context=f"{task} question {i}: what is {i} + {i % 13}?",
                system_prompt="Answer with a number." if i % 2 else None,
            )
            gen = Generation(
                text=f"The answer is {i + i % 13}.",
                finish_reason="stop",
                prompt_tokens=14,
                completion_tokens=6,
            )
            requests.append(orjson.dumps(request_row_of(req)))
            predictions.append(
                orjson.dumps(
                    {
                        "instance_id": iid,
                        "model": "bench-model",
                        "generations": [gen.to_row()],
                        "scores": {"exact_match": float(i % 2)},
                    }
                )
            )
        for name, lines in ((f"{task}-requests.jsonl", requests), (f"{task}-predictions.jsonl", predictions)):
            data = b"\n".join(lines) + b"\n" if lines else b""
            (directory / name).write_bytes(data)
            total += len(data)
    manifest = {"format": "evalreplay/1", "model": "bench-model"}
    (directory / "manifest.json").write_bytes(orjson.dumps(manifest))
    return total


def bare_parse(directory: Path) -> int:
    n = 0
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            orjson.loads(line)
            n += 1
    return n


def load(directory: Path) -> int:
    return len(ReplayProvider.from_path(directory).index)


_JOIN = itemgetter("instance_id", "context", "system_prompt")
FLOOR_BLOCK = 256  # rows, as the load's blocks


def floor(directory: Path) -> int:
    """The least the load's work requires (see the module's docstring)."""
    import numpy as np

    from pytest_evalreplay.formats import promote_to_oldest
    from pytest_evalreplay.storage.lines import paused_gc

    keys: dict[tuple[str, str | None], int] = {}
    with paused_gc():
        try:
            for requests in sorted(directory.glob("*-requests.jsonl")):
                data = requests.with_name(requests.name.replace("-requests.", "-predictions.")).read_bytes()
                ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
                starts = [0, *(ends[:-1] + 1).tolist()]
                lines = requests.read_bytes().splitlines()
                for a in range(0, len(lines), FLOOR_BLOCK):  # a block at a time: its rows stay in the cache
                    block = lines[a : a + FLOOR_BLOCK]
                    ids, contexts, systems = zip(*map(_JOIN, map(orjson.loads, block)), strict=True)
                    heads = map(
                        b"".join, zip(repeat(b'{"instance_id":"'), map(str.encode, ids), repeat(b'"'))
                    )
                    if not all(map(bytes.startswith, repeat(data), heads, starts[a : a + FLOOR_BLOCK])):
                        raise ValueError(f"{requests}: not in step with its predictions")
                    base = len(keys)
                    keys.update(
                        zip(zip(contexts, systems, strict=True), range(base, base + len(ids)), strict=True)
                    )
        finally:
            promote_to_oldest()
    return len(keys)


def median_times(directory: Path, repeats: int) -> tuple[float, float, float, float]:
    """Median CPU times (this thread's: the machine is shared) of the bare
    parse, the load and the floor, run in turns so that all see the same
    machine (other processes, caches), and the median of the per-turn
    ratios (bare / load), which slow spells of the machine move less."""
    bare: list[float] = []
    loaded: list[float] = []
    floors: list[float] = []
    for _ in range(repeats):
        for fn, times in ((bare_parse, bare), (load, loaded), (floor, floors)):
            gc.collect()
            start = time.thread_time()
            fn(directory)
            times.append(time.thread_time() - start)
    ratios = [b / x for b, x in zip(bare, loaded, strict=True)]
    return (
        statistics.median(bare),
        statistics.median(loaded),
        statistics.median(ratios),
        statistics.median(floors),
    )


_MEASURE = """
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[3])
import benchmarks.replay_load as b

def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(field)

base = kib("VmRSS")
path = Path(sys.argv[2])
kept = b.ReplayProvider.from_path(path) if sys.argv[1] == "load" else b.bare_parse(path)
print(kib("VmHWM") - base)
"""


def peak_memory_growth(mode: str, directory: Path) -> int | None:
    """Peak RSS (VmHWM) minus the RSS after imports, in bytes, measured in a
    fresh interpreter; None where /proc is missing (not Linux)."""
    if not Path("/proc/self/status").exists():
        return None
    root = str(Path(__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, mode, str(directory), root],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(out.strip()) * 1024


SPEED_GOAL = 0.90  # of a bare orjson parse of the same lines
MEMORY_GOAL = 1.3  # peak memory growth over the files' size


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="skip the subprocess memory runs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="evalreplay-bench-") as tmp:
        directory = Path(tmp)
        size = write_run_dir(directory, args.rows, args.files)
        bare, loaded, ratio, least = median_times(directory, args.repeats)
        result = {
            "rows": args.rows,
            "files_mb": size / 1e6,
            "repeats": args.repeats,
            "bare_parse_s": bare,
            "load_s": loaded,
            "speed_vs_bare": bare / loaded,
            "speed_vs_bare_per_turn": ratio,
            "floor_s": least,
            "floor_vs_bare": bare / least,
        }
        mem_load = None if args.no_memory else peak_memory_growth("load", directory)
        if mem_load is not None:
            mem_bare = peak_memory_growth("bare", directory) or 0
            result.update(
                {
                    "load_peak_mb": mem_load / 1e6,
                    "bare_peak_mb": mem_bare / 1e6,
                    "load_peak_vs_files": mem_load / size,
                }
            )
    print(f"rows {args.rows:,} in {args.files} tasks, {size / 1e6:.1f} MB of requests + predictions")
    print(
        f"CPU, median of {args.repeats}: bare orjson parse {bare:.3f} s   "
        f"ReplayProvider.from_path {loaded:.3f} s"
    )
    print(f"speed: {bare / loaded:.2f}x of bare (goal >= {SPEED_GOAL}x); median per-turn ratio {ratio:.2f}x")
    print(
        f"floor (decode each requests row, key its prompt, join each predictions row by its id): "
        f"{least:.3f} s = {bare / least:.2f}x of bare; the load is {least / loaded:.2f}x of the floor's speed"
    )
    if "load_peak_mb" in result:
        print(
            f"peak memory: {result['load_peak_vs_files']:.2f}x the files (goal <= {MEMORY_GOAL}x): load "
            f"{result['load_peak_mb']:.1f} MB for {size / 1e6:.1f} MB of files; bare parse "
            f"{result['bare_peak_mb']:.1f} MB"
        )
    print(json.dumps(result))
    return result


def met(result: dict[str, float]) -> bool:
    return result["speed_vs_bare"] >= SPEED_GOAL and result.get("load_peak_vs_files", 0.0) <= MEMORY_GOAL


def report_row(result: dict[str, float]) -> None:
    """The RESULT line of the issue's row (benchmarks/results.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import report

    memory = f"; memory {result['load_peak_vs_files']:.2f}x" if "load_peak_vs_files" in result else ""
    report(
        "replay-load",
        f"{result['bare_parse_s']:.2f} s ({result['rows']:,} rows)",
        f"{result['load_s']:.2f} s",
        f"{result['speed_vs_bare']:.2f}x{memory}",
        f">= {SPEED_GOAL}x; memory <= {MEMORY_GOAL}x",
        met(result),
        floor=f"{result['floor_vs_bare']:.2f}x of bare ({result['floor_s']:.2f} s)",
    )


if __name__ == "__main__":
    outcome = main()
    report_row(outcome)
    sys.exit(0 if met(outcome) else 1)
