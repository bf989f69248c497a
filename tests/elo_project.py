"""The ELO test project: a pool, three references of known rating, a
candidate and a judge model from a conftest. Shared by the ELO plugin tests.
Given a `pytester`, a project runs in process (seconds faster a run); a run
that SIGKILLs itself or starts xdist workers, and a project without one, is a
real `python -m pytest` process."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from subprocess_pytest import OUTER, PYTEST, child_env

POOL = [{"id": f"t{n:03d}", "q": f"question {n}", "gold": f"gold {n}"} for n in range(12)]
PROMPT = "Q: {q}"
REFERENCES = {"weak": (900, 0.2), "mid": (1100, 0.5), "strong": (1300, 0.8)}

CONFTEST = """
import os, signal, orjson
from pytest_evalreplay import Generation

def log(name, row):
    with open(os.environ[name], "ab") as fh:
        fh.write(orjson.dumps(row) + b"\\n")

class Candidate:
    kind, batch_size = "cand", None

    def __init__(self, model):
        self.model = model

    def generate(self, requests):
        out = []
        for r in requests:
            log("CALL_LOG", [r.instance_id, r.stage, list(r.rollouts)])
            with open(os.environ["CALL_LOG"], "rb") as fh:
                asked = len(fh.readlines())
            if asked == int(os.environ.get("INTERRUPT_AT_CALL", "0")):
                raise KeyboardInterrupt
            n = int(r.instance_id[1:])
            right = (n % 3 != 0) if self.model == "good" else False
            out.append([Generation(text=("gold " if right else "wrong ") + str(n)) for _ in r.rollouts])
        return out

class JudgeModel:
    kind, batch_size = "judgemodel", None
    model = os.environ.get("JUDGE_MODEL", "judge-1")

    def generate(self, requests):
        out = []
        for r in requests:
            log("JUDGE_MODEL_LOG", r.instance_id)
            if os.environ.get("JUDGE_REPLY"):
                out.append([Generation(text=os.environ["JUDGE_REPLY"])])
                continue
            a = r.context.split("[Answer A]")[1].split("[Answer B]")[0]
            b = r.context.split("[Answer B]")[1].split("Which answer")[0]
            va, vb = "gold" in a, "gold" in b
            out.append([Generation(text="[[TIE]]" if va == vb else ("[[A]]" if va else "[[B]]"))])
        return out

def pytest_evalreplay_make_provider(config, kind):
    if kind == "cand":
        return Candidate(config.getoption("evalreplay_model") or "good")
    if kind == "judgemodel":
        return JudgeModel()
    return None
"""

EVALS = """
import os, signal, orjson
from pytest_evalreplay import EloEval, EvalTask, Gate, Reference, Stage, judges

pool = EvalTask("pool", {pool!r}, prompt={prompt!r})
calls = 0

def judge(instance, candidate, reference):
    global calls
    calls += 1
    with open(os.environ["JUDGE_LOG"], "ab") as fh:
        fh.write(orjson.dumps([instance["id"], candidate, reference]) + b"\\n")
    if calls == int(os.environ.get("KILL_AT_JUDGE", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
    value = {bad_value}
    if value is not None and instance["id"] == "t001":
        return value
    mine, theirs = "gold" in candidate, "gold" in reference
    if {judge_helper}:
        import judgehelp

        return judgehelp.verdict(mine, theirs)
    return 0.5 if mine == theirs else float(mine)

memo = EloEval(
    "memo",
    pool=pool,
    references={references},
    stages={stages},
    judge={judge},
    seed={seed},
    gate={gate},
)
"""


def write_reference(directory: Path, name: str, accuracy: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    req, pred = [], []
    for n, inst in enumerate(POOL):
        if name == "empty":
            continue
        req.append(
            {
                "instance_id": inst["id"],
                "request_type": "generate",
                "context": PROMPT.format(**inst),
                "system_prompt": None,
                "num_samples": 1,
                "sampling": {},
            }
        )
        right = (n * 7 % 10) / 10 < accuracy
        pred.append(
            {
                "instance_id": inst["id"],
                "model": name,
                "generations": [{"text": ("gold " if right else "nope ") + str(n)}],
            }
        )
    (directory / f"{name}-requests.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in req))
    (directory / f"{name}-predictions.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in pred))
    return directory / f"{name}-predictions.jsonl"


# A test's own knobs: an outer value (from another run) is never inherited.
KNOBS = ("KILL_", "INTERRUPT_", "JUDGE_")


@dataclass(frozen=True)
class Ran:
    """What a run left, in process or not: subprocess.CompletedProcess's fields."""

    returncode: int
    stdout: str
    stderr: str


def evals_source(**fields: str) -> str:
    """The test module of the ELO project, with `fields` in place of its defaults."""
    refs = (
        "{"
        + ", ".join(
            f"{name!r}: Reference({elo}, 'refs/{name}-predictions.jsonl')"
            for name, (elo, _) in REFERENCES.items()
        )
        + "}"
    )
    values = {
        "pool": POOL,
        "prompt": PROMPT,
        "references": refs,
        "stages": "[Stage(tasks=4), Stage(tasks=4, references=2), Stage(tasks=4, references=1)]",
        "judge": "judge",
        "seed": "None",
        "gate": "None",
        "bad_value": "None",
        "judge_helper": "False",
        **fields,
    }
    return EVALS.format(**values)


class Project:
    def __init__(self, where: Path | pytest.Pytester, at: str = "", **fields: str) -> None:
        """`where`: a directory (every run a child process) or a pytester (runs
        in process where they can be); `at`: a subdirectory of it."""
        self.pytester = where if isinstance(where, pytest.Pytester) else None
        base = where.path if isinstance(where, pytest.Pytester) else where
        self.path = path = base / at if at else base
        path.mkdir(parents=True, exist_ok=True)
        (path / "conftest.py").write_text(CONFTEST)
        for name, (_, accuracy) in REFERENCES.items():
            write_reference(path / "refs", name, accuracy)
        self.out = path / "out"
        self.write(**fields)

    def write(self, **fields: str) -> None:
        (self.path / "test_elo.py").write_text(evals_source(**fields))

    def run(self, *args: str, **env: str) -> Ran:
        logs = {
            "CALL_LOG": str(self.path / "calls.jsonl"),
            "JUDGE_LOG": str(self.path / "judge.jsonl"),
            "JUDGE_MODEL_LOG": str(self.path / "judge-model.jsonl"),
        }
        env = logs | env
        options = []
        if not any(a.startswith("--evalreplay-predictions") for a in args):
            options.append("--evalreplay-provider=cand")
        options += [f"--evalreplay-output={self.out}", "-q", "-rs", *args]
        if self.pytester is None or "-n" in args or "KILL_AT_JUDGE" in env:
            cmd = [*PYTEST, *(["-p", "xdist"] if "-n" in args else []), *options]
            done = subprocess.run(
                cmd, cwd=self.path, env=child_env(KNOBS, **env), capture_output=True, text=True, timeout=300
            )
            return Ran(done.returncode, done.stdout, done.stderr)
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(self.path)
            for name in list(os.environ):  # as child_env drops them for a child
                if name.startswith((*OUTER, *KNOBS)):
                    patch.delenv(name)
            for name, value in env.items():
                patch.setenv(name, value)
            result = self.pytester.runpytest_inprocess(*options, no_reraise_ctrlc=True)
        return Ran(result.ret, "\n".join(result.outlines), "\n".join(result.errlines))

    def log(self, name: str) -> list:
        path = self.path / name
        return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []

    def metrics(self) -> dict:
        return orjson.loads((self.out / "memo-metrics.json").read_bytes())

    def elo(self) -> dict:
        return self.metrics()["elo"]

    def journal_rows(self, name: str) -> list[dict]:
        return [orjson.loads(x) for x in (self.out / f"{name}-journal.jsonl").read_bytes().splitlines() if x]

    def stage_records(self) -> list[dict]:
        return [r for r in self.journal_rows("memo") if r.get("type") == "stage"]


def same_metrics(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "session"} == {k: v for k, v in b.items() if k != "session"}
