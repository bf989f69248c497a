"""The projects tests/test_chaos.py kills: a multi-task suite and a
multi-stage ELO suite, each run as a real `python -m pytest` process.

The project's conftest counts, per process, the events a kill can land on
(`call`: a plain provider call; `result`: a streamed result about to be
handed back; `append`: a journal append; `score`: a scorer call; `judge`: a
judge call; `write`: a run dir file write; `clock`: a delay after the
conftest is imported) and SIGKILLs its own process at the one that
`CHAOS_KILL` names. Every run logs what the provider was asked, and an
uninterrupted run logs its event totals, from which the kills' positions are
drawn.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from subprocess_pytest import PYTEST, child_env

CONFTEST = """
import os, signal, threading, time, orjson
from pytest_evalreplay import Generation, GenerationError
from pytest_evalreplay.journal import rows as journal
from pytest_evalreplay.rundir import writer as rundir

T0 = time.monotonic()
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
KILL = orjson.loads(os.environ.get("CHAOS_KILL") or "null")
COUNTS = {}

def log(row):
    with open(os.environ["CHAOS_LOG"], "ab") as fh:
        fh.write(orjson.dumps([WORKER, *row]) + b"\\n")

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def event(kind):
    \"\"\"Count one event of this process; True when it is the one to die at. Worker
    "*" is whichever xdist worker first gets there (it claims the kill with a file).\"\"\"
    COUNTS[kind] = COUNTS.get(kind, 0) + 1
    if not KILL or KILL["kind"] != kind or KILL["n"] != COUNTS[kind]:
        return False
    if KILL.get("worker") != "*":
        return KILL.get("worker", "") == WORKER
    if not WORKER:
        return False
    try:
        os.close(os.open(os.environ["CHAOS_LOG"] + ".claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    log(["killed", kind, COUNTS[kind]])
    return True

def text(r, k):
    return f"{r.task}:{r.instance_id}:s{r.stage}:r{k}"

def answer(r):
    if r.instance_id.startswith("bad"):
        return GenerationError("context too long", retryable=False)
    if r.instance_id.startswith("flaky"):
        return GenerationError("503 from the server", retryable=True)
    return [Generation(text=text(r, k), finish_reason="stop", prompt_tokens=len(str(r.context)),
                       completion_tokens=k + 1) for k in r.rollouts]

def asked(requests):
    log(["ask", [[r.task, r.stage, r.instance_id, list(r.rollouts)] for r in requests]])

class Plain:
    kind, model, batch_size = "plain", "m1", None

    def generate(self, requests):
        asked(requests)
        if event("call"):
            die()
        return [answer(r) for r in requests]

class Stream:
    \"\"\"Hands results back out of order; never yields a flaky request (a retryable failure).\"\"\"
    kind, model, batch_size = "stream", "m1", None

    def generate_stream(self, requests):
        asked(requests)
        order = list(range(len(requests)))[1::2] + list(range(len(requests)))[::2]
        for i in order:
            if requests[i].instance_id.startswith("flaky"):
                continue
            if event("result"):
                die()
            yield i, answer(requests[i])

    def generate(self, requests):
        results = dict(self.generate_stream(requests))
        return [results.get(i, GenerationError("not answered", retryable=True)) for i in range(len(requests))]

def pytest_evalreplay_make_provider(config, kind):
    return {"plain": Plain, "stream": Stream}.get(kind, lambda: None)()

_append = journal.append_durably

def append(path, blob):
    if blob and event("append"):
        if KILL.get("tear"):
            with open(path, "ab") as fh:
                fh.write(blob[: len(blob) // 2])
        die()
    return _append(path, blob)

journal.append_durably = append

_write = rundir.atomic_write

def atomic_write(path, data):
    data = data if isinstance(data, bytes) else b"".join(data)
    if not path.name.startswith(".") and event("write"):
        if KILL.get("tear"):
            path.with_name(f".{path.name}.torn.tmp").write_bytes(data[: len(data) // 2])
        die()
    _write(path, data)

rundir.atomic_write = atomic_write

if KILL and KILL["kind"] == "clock" and not WORKER:
    threading.Timer(max(0.0, KILL["n"] / 1000 - (time.monotonic() - T0)), die).start()

def pytest_unconfigure(config):
    if not WORKER:
        log(["totals", COUNTS, round((time.monotonic() - T0) * 1000)])
"""

# Provider calls with --evalreplay-batch-size=3. arith: 2 samples, a terminal
# failure (bad1); words: 3 samples, a retryable failure that never clears
# (flaky1, final at the third attempt) and a scorer that raises (crash1);
# chat: chat messages from a callable, a system prompt, one sample.
TASKS_MODULE = """
import os
from pytest_evalreplay import EvalTask
from conftest import event, die

def score(text, instance):
    if event("score"):
        die()
    if instance["id"].startswith("crash"):
        raise ValueError("the scorer cannot read " + text)
    digits = sum(int(c) for c in text if c.isdigit())
    return {"acc": float(digits % 2 == 0), "len": float(len(text))}

def chat(instance):
    return [{"role": "user", "content": "Say " + instance["id"]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "again"}]

arith = EvalTask("arith", [{"id": f"a{i}"} for i in range(4)] + [{"id": "bad1"}],
                 prompt="Add {id}", scorer=score, num_samples=2)
words = EvalTask("words", [{"id": "w0"}, {"id": "flaky1"}, {"id": "w2"}, {"id": "crash1"}],
                 prompt="Spell {id}", scorer=score, num_samples=3, sampling={"temperature": 0.7, "seed": 3})
chat = EvalTask("chat", [{"id": f"c{i}"} for i in range(3)], prompt=chat, scorer=score,
                system_prompt="Be brief.")
"""
TASK_NAMES = ("arith", "words", "chat")

POOL = [{"id": f"t{n:02d}", "q": f"question {n}"} for n in range(12)]
REFERENCES = {"weak": (900, 0.2), "mid": (1100, 0.5), "strong": (1300, 0.8)}

ELO_MODULE = """
from pytest_evalreplay import EloEval, EvalTask, Reference, Stage
from conftest import event, die, log

pool = EvalTask("pool", {pool!r}, prompt="Q: {{q}}", num_samples=2)

def judge(instance, candidate, reference):
    log(["judge", candidate, reference])
    if event("judge"):
        die()
    mine = sum(int(c) for c in candidate if c.isdigit()) % 3
    theirs = int(reference.startswith("gold"))
    return 0.5 if mine == 2 else float(mine > theirs)

memo = EloEval(
    "memo",
    pool=pool,
    references={{name: Reference(elo, f"refs/{{name}}-predictions.jsonl") for name, elo in {elos!r}.items()}},
    stages=[Stage(tasks=4), Stage(tasks=4, references=2), Stage(tasks=4, references=1)],
    judge=judge,
    seed=7,
)
"""

SUITES = {"tasks": TASK_NAMES, "elo": ("memo",)}
# What each suite's conftest counts (the kinds a kill can land on), by provider.
KINDS = {
    ("tasks", "plain"): ("call", "append", "score", "write", "clock"),
    ("tasks", "stream"): ("result", "append", "score", "write", "clock"),
    ("elo", "plain"): ("call", "append", "judge", "write", "clock"),
    ("elo", "stream"): ("result", "append", "judge", "write", "clock"),
}

Key = tuple[str, int, str, int]  # task, stage, instance id, rollout


def _write_references(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, (_, accuracy) in REFERENCES.items():
        requests, predictions = [], []
        for n, inst in enumerate(POOL):
            context = f"Q: {inst['q']}"
            requests.append(
                {
                    "instance_id": inst["id"],
                    "request_type": "generate",
                    "context": context,
                    "system_prompt": None,
                    "num_samples": 1,
                    "sampling": {},
                }
            )
            right = (n * 7 % 10) / 10 < accuracy
            text = ("gold " if right else "nope ") + str(n)
            predictions.append({"instance_id": inst["id"], "model": name, "generations": [{"text": text}]})
        (directory / f"{name}-requests.jsonl").write_bytes(
            b"".join(orjson.dumps(r) + b"\n" for r in requests)
        )
        (directory / f"{name}-predictions.jsonl").write_bytes(
            b"".join(orjson.dumps(r) + b"\n" for r in predictions)
        )


def rows(path: Path) -> list[dict[str, Any]]:
    """A journal's rows, a torn last line (a run died mid-write) left out."""
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.splitlines()
    if data and not data.endswith(b"\n"):
        lines = lines[:-1]
    return [orjson.loads(line) for line in lines if line]


@dataclass(frozen=True)
class Run:
    """One pytest process: its exit code, output and what its conftest logged."""

    args: tuple[str, ...]
    kill: dict[str, Any] | None
    returncode: int
    output: str
    log: tuple[tuple[Any, ...], ...]

    @property
    def killed(self) -> bool:
        return self.returncode == -9

    def asked(self) -> list[tuple[str, Key]]:
        """(worker, key) of every rollout the provider was asked for, in order."""
        return [
            (worker, (task, stage, iid, r))
            for worker, kind, *rest in self.log
            if kind == "ask"
            for task, stage, iid, rollouts in rest[0]
            for r in rollouts
        ]

    def judged(self) -> list[tuple[str, str, str]]:
        """(worker, candidate, reference answer) of every judge call, in order."""
        return [(worker, *rest) for worker, kind, *rest in self.log if kind == "judge"]

    def totals(self) -> tuple[dict[str, int], int]:
        """The event counts and milliseconds of an uninterrupted run."""
        (counts, ms) = next(tuple(rest) for _, kind, *rest in self.log if kind == "totals")
        return counts, ms


class Project:
    """A suite in a folder, run with one provider kind."""

    def __init__(self, path: Path, suite: str, provider: str) -> None:
        self.path, self.suite, self.provider = path, suite, provider
        path.mkdir(parents=True, exist_ok=True)
        (path / "conftest.py").write_text(CONFTEST)
        if suite == "elo":
            _write_references(path / "refs")
            elos = {name: elo for name, (elo, _) in REFERENCES.items()}
            (path / "test_elo.py").write_text(ELO_MODULE.format(pool=POOL, elos=elos))
        else:
            (path / "test_tasks.py").write_text(TASKS_MODULE)
        self.out = path / "out"
        self.runs: list[Run] = []

    def run(self, *args: str, kill: dict[str, Any] | None = None, workers: int = 0) -> Run:
        log = self.path / f"log-{len(self.runs)}.jsonl"
        env = child_env(("CHAOS_",), CHAOS_LOG=str(log), CHAOS_KILL=orjson.dumps(kill).decode())
        cmd = list(PYTEST)
        if workers:
            cmd += ["-p", "xdist", "-n", str(workers)]
        cmd += [f"--evalreplay-provider={self.provider}", f"--evalreplay-output={self.out}"]
        cmd += ["--evalreplay-batch-size=3", "-q", "-rs", "-p", "no:randomly", *args]
        done = subprocess.run(cmd, cwd=self.path, env=env, capture_output=True, text=True, timeout=180)
        logged = tuple(tuple(orjson.loads(x)) for x in log.read_bytes().splitlines()) if log.exists() else ()
        run = Run(tuple(args), kill, done.returncode, done.stdout + done.stderr, logged)
        self.runs.append(run)
        return run

    # -- what the output dir holds ------------------------------------------------

    def journal_names(self) -> list[str]:
        return sorted(p.name for p in self.out.glob("*-journal.jsonl"))

    def journal(self, name: str) -> list[dict[str, Any]]:
        return rows(self.out / name)

    def gen_rows(self) -> list[tuple[str, Key]]:
        """(run id, key) of every committed `gen` row of every task journal."""
        out = []
        for task in SUITES[self.suite]:
            for row in self.journal(f"{task}-journal.jsonl"):
                if row.get("type") == "gen":
                    out.append((row["run"], (task, row["stage"], row["instance_id"], row["rollout"])))
        return out

    def committed(self) -> set[Key]:
        """Rollouts the journals hold as generated or failed for good: never to be asked for again."""
        out = {key for _, key in self.gen_rows()}
        for task in SUITES[self.suite]:
            for row in self.journal(f"{task}-journal.jsonl"):
                if row.get("type") == "fail" and row.get("final"):
                    out.update((task, row["stage"], row["instance_id"], r) for r in row["rollouts"])
        return out

    def failures(self) -> Counter[tuple[Any, ...]]:
        out: Counter[tuple[Any, ...]] = Counter()
        for task in SUITES[self.suite]:
            for row in self.journal(f"{task}-journal.jsonl"):
                if row.get("type") == "fail":
                    key = (task, row["stage"], row["instance_id"], tuple(row["rollouts"]))
                    out[(*key, row["attempt"], row["failure_class"], row["final"], row["message"])] += 1
        return out

    def duplicate_rows(self) -> dict[str, list[bytes]]:
        """Per journal, the rows it holds more than once (same content, same run)."""
        out = {}
        for name in self.journal_names():
            counted = Counter(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in self.journal(name))
            twice = [row for row, n in counted.items() if n > 1]
            if twice:
                out[name] = twice
        return out

    def run_dir_files(self) -> dict[str, bytes]:
        """The run dir: every plain file of the output dir but the journals and dotfiles."""
        return {
            p.name: p.read_bytes()
            for p in sorted(self.out.iterdir())
            if p.is_file() and not p.name.startswith(".") and not p.name.endswith("-journal.jsonl")
        }


def without_session(name: str, data: bytes) -> Any:
    """A run dir file as compared: bytes, but a metrics file without its `session` block."""
    if name.endswith("-metrics.json"):
        return {k: v for k, v in orjson.loads(data).items() if k != "session"}
    return data
