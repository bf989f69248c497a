"""The catalogue of bad inputs (docs/errors.md), plugin side: options, task
definitions, providers, journals, baselines and files in the output dir.
Each case runs pytest (pytester, in process) and asserts the message names
what is wrong and where, that no INTERNALERROR and no traceback of the
plugin's own code reaches the user, and that nothing saved was lost.
The readers' own cases (run dirs, foreign layouts, instances files) are in
tests/test_bad_inputs.py and tests/test_fuzz_readers.py; an openai server's
(no model list, credentials in a URL, answers without text, failing every
POST) in tests/test_openai_faults.py, against a local HTTP server; a replay
that asks other sampling than was saved in tests/test_replay_truth.py."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

PROVIDER = """
import asyncio
import os
from pytest_evalreplay import Generation

class Echo:
    kind, model = "echo", "echo-1"
    batch_size = {batch_size}

    def generate(self, requests):
        with open("calls.log", "a") as fh:
            fh.write("call\\n")
        out = []
        for r in requests:
            if r.instance_id == "exit":
                raise SystemExit(3)
            if r.instance_id == "cancel":
                raise asyncio.CancelledError("the event loop went away")
            meta = {{"when": object()}} if r.instance_id == "meta" else {{}}
            meta = {{"logprob": [float("nan")]}} if r.instance_id == "nanmeta" else meta
            text = "\\ud800" if r.instance_id == "surrogate" else "answer " + r.instance_id
            out.append([Generation(text=text, metadata=meta) for _ in r.rollouts])
        return out

    def close(self):
        if {close_raises}:
            raise RuntimeError("the engine would not stop")

class EchoLL(Echo):
    kind = "echo-ll"

    def loglikelihood(self, requests):
        out = []
        for r in requests:
            if r.instance_id == "short":
                out.append([(-1.0, True)])
            elif r.instance_id == "nan":
                out.append([(float("nan"), False) for _ in r.continuations])
            else:
                out.append([(-1.0, False) for _ in r.continuations])
        return out

def pytest_evalreplay_make_provider(config, kind):
    if kind == "echo-ll":
        return EchoLL()
    return Echo() if kind == "echo" else (42 if kind == "forty-two" else None)
"""

TASK = """
from pytest_evalreplay import EvalTask, Gate, scorers
t = EvalTask({name}, {instances}, prompt={prompt}, scorer={scorer}, num_samples={num_samples},
             sampling={sampling}, gate={gate}, system_prompt={system_prompt},
             strip_reasoning={strip_reasoning}, agent={agent}, max_turns={max_turns},
             max_tokens_per_episode={max_tokens_per_episode}, metrics={metrics},
             choices={choices}, target={target}, choice_delimiter={choice_delimiter})
"""


@dataclass
class Case:
    args: tuple[str, ...] = ()
    fields: dict[str, str] = field(default_factory=dict)
    provider: dict[str, str] = field(default_factory=dict)
    ret: int = pytest.ExitCode.USAGE_ERROR
    message: str = ""
    prepare: str = ""  # "run": one good run first; "journal-dir", "manifest-dir", ... (see below)
    ini: str = ""


BASE_FIELDS = {
    "name": '"t"',
    "instances": '[{"id": "a", "q": "x"}, {"id": "b", "q": "y"}]',
    "prompt": '"Q {q}"',
    "scorer": "lambda text, i: 1.0",
    "num_samples": "1",
    "sampling": "None",
    "gate": "None",
    "system_prompt": "None",
    "strip_reasoning": "False",
    "agent": "None",
    "max_turns": "None",
    "max_tokens_per_episode": "None",
    "metrics": "None",
    "choices": "None",
    "target": "None",
    "choice_delimiter": '" "',
}

MC = {"choices": '"choices"', "target": '"gold"', "scorer": "None"}


def mc_instances(**first: object) -> str:
    """A choices task's instances, the first one's fields replaced by `first`."""
    rows = [
        {"id": "a", "q": "x", "choices": ["yes", "no"], "gold": 0},
        {"id": "b", "q": "y", "choices": ["p", "q"], "gold": 1},
    ]
    rows[0] = {**rows[0], **first}
    return repr([{k: v for k, v in row.items() if v is not DROP} for row in rows])


DROP = object()

U, C, F, OK, STOPPED = (  # usage error, collection error, failed items, passed, stopped
    pytest.ExitCode.USAGE_ERROR,
    pytest.ExitCode.INTERRUPTED,
    pytest.ExitCode.TESTS_FAILED,
    pytest.ExitCode.OK,
    pytest.ExitCode.INTERRUPTED,
)

CASES: dict[str, Case] = {
    # -- options -------------------------------------------------------------------------
    "engine arg with an unclosed quote": Case(
        ('--evalreplay-engine-arg=a=1 b="x',),
        message="--evalreplay-engine-arg (ini evalreplay_engine_args): 'a=1 b=\"x' does not split",
    ),
    "failure budget nan": Case(
        ("--evalreplay-failure-budget=nan",),
        message="--evalreplay-failure-budget (ini evalreplay_failure_budget) must be a number in [0, 1], "
        "got 'nan'",
    ),
    "failure budget above 1": Case(("--evalreplay-failure-budget=2",), message="must be a number in [0, 1]"),
    "provider hook returning no provider": Case(
        ("--evalreplay-provider=forty-two",),
        message="the pytest_evalreplay_make_provider hook returned a number 42 for provider kind 'forty-two'",
    ),
    "concurrency 0": Case(
        ("--evalreplay-concurrency=0",),
        message="--evalreplay-concurrency (ini evalreplay_concurrency) must be a whole number >= 1, got '0'",
    ),
    "max attempts not a number": Case(
        ("--evalreplay-max-attempts=x",),
        message="--evalreplay-max-attempts (ini evalreplay_max_attempts) must be a whole number",
    ),
    "negative timeout": Case(
        ("--evalreplay-timeout=-1",),
        message="--evalreplay-timeout (ini evalreplay_timeout) must be a number >= 0",
    ),
    "zero timeout": Case(("--evalreplay-timeout=0",), message="must be a positive number of seconds"),
    "ini int that is not a number": Case(
        ini="evalreplay_concurrency = abc\n", message="ini evalreplay_concurrency:"
    ),
    "ini batch size below 1": Case(
        ini="evalreplay_batch_size = 0\n",
        message="--evalreplay-batch-size (ini evalreplay_batch_size) must be a whole number >= 1",
    ),
    "resume stage 0": Case(("--resume-stage=0",), message="--resume-stage takes a stage number >= 1"),
    "resume stage with no EloEval": Case(
        ("--resume-stage=99",), message="--resume-stage=99: no multi-stage EloEval is selected"
    ),
    "replay into itself": Case(
        ("--evalreplay-predictions=run",),
        prepare="run",
        message="replaying a run into itself would overwrite what it replays",
    ),
    "report on the run dir's journal": Case(
        ("--evalreplay-report=run/t-journal.jsonl",),
        prepare="run",
        message="t-journal.jsonl is one of the output dir's own files",
    ),
    "compare with the output dir": Case(
        ("--evalreplay-compare=run",),
        prepare="run",
        message="run: this run overwrites what it would compare with. Copy the saved run elsewhere first",
    ),
    "output dir inside the replayed run": Case(
        ("--evalreplay-predictions=saved", "--evalreplay-output=saved/sub"),
        prepare="saved-run",
        message="/saved: a replay would write into what it replays",
    ),
    "shard beyond its count": Case(
        ("--evalreplay-shard=4/3",),
        message="--evalreplay-shard (ini evalreplay_shard) takes K/N, shard K (1-based) of N",
    ),
    "shard that is not K/N": Case(("--evalreplay-shard=x",), message="takes K/N"),
    "a dir another shard wrote": Case(
        ("--evalreplay-shard=2/2",),
        prepare="shard",
        message="/run holds shard 1/2's results",
    ),
    "update baseline without a file": Case(
        ("--evalreplay-update-baseline",),
        message="--evalreplay-update-baseline needs --evalreplay-baseline=FILE",
    ),
    "output under a file": Case(
        ("--evalreplay-output=/dev/null/x",),
        message="/dev/null/x: cannot create the output dir: Not a directory",
    ),
    "predictions that do not exist": Case(
        ("--evalreplay-predictions=nowhere",), message="nowhere: no such file or directory"
    ),
    "inspect log that is not a zip": Case(
        ("--evalreplay-predictions=log.eval",),
        prepare="foreign:eval-not-zip",
        message="log.eval: not a readable .eval log (File is not a zip file); an inspect_ai .eval log",
    ),
    "inspect log without samples": Case(
        ("--evalreplay-predictions=log.eval",),
        prepare="foreign:eval-no-samples",
        message="log.eval: this .eval log holds no samples (was it run with --no-log-samples?)",
    ),
    "inspect sample that is not JSON": Case(
        ("--evalreplay-predictions=log.eval",),
        prepare="foreign:eval-bad-sample",
        message="log.eval:samples/a_epoch_1.json: not valid JSON",
    ),
    "lm-eval choice with a log-likelihood that is no number": Case(
        ("--evalreplay-predictions=samples_t.jsonl",),
        prepare="foreign:lm-choice-nan",
        message="samples_t.jsonl:1: 'resps[1][0][0]' must be a finite log-likelihood (a number or its",
    ),
    "olmo-eval outputs fewer than the continuations": Case(
        ("--evalreplay-predictions=t-predictions.jsonl",),
        prepare="foreign:olmo-short",
        message="t-predictions.jsonl:1: 'model_output' has 1 entries, but",
    ),
    "oe-eval choice rows with a gap in idx": Case(
        ("--evalreplay-predictions=t-predictions.jsonl",),
        prepare="foreign:oe-gap",
        message="the loglikelihood rows of doc_id 0 have idx [0, 2], with no row for choice 1",
    ),
    "unknown provider kind": Case(("--evalreplay-provider=nope",), message="unknown provider kind 'nope'"),
    "no provider": Case(
        ("-o", "evalreplay_provider="), message="no provider chosen: pass --evalreplay-provider=KIND"
    ),
    # -- task definitions ------------------------------------------------------------------
    "gate min as a string": Case(
        ret=C,
        fields={"gate": 'Gate("contains", min="0.5")'},
        message="Gate(min='0.5') must be a finite number",
    ),
    "gate min nan": Case(
        ret=C,
        fields={"gate": 'Gate("contains", min=float("nan"))'},
        message="Gate(min=nan) must be a finite number",
    ),
    "a gate with no bound": Case(
        ret=C,
        fields={"gate": 'Gate("contains")'},
        message="Gate('contains') has no bound: give min=... (fail below it), max_drop=... (fail on a "
        "significant drop from the baseline) or both; to gate on failed items alone",
    ),
    "sampling a string": Case(
        ret=C, fields={"sampling": '"hot"'}, message="task 't': sampling must be a dict"
    ),
    "sampling a list": Case(ret=C, fields={"sampling": "[0.7]"}, message="task 't': sampling must be a dict"),
    "nan in sampling": Case(
        ret=C,
        fields={"sampling": '{"temperature": float("nan")}'},
        message="sampling['temperature'] = nan is not a finite number",
    ),
    "sampling value JSON cannot hold": Case(
        ret=C,
        fields={"sampling": '{"stop": {1, 2}}'},
        message="sampling['stop'] = {1, 2} is not a JSON value",
    ),
    "num_samples True": Case(
        ret=C, fields={"num_samples": "True"}, message="num_samples must be a positive integer, got True"
    ),
    "num_samples over the limit": Case(
        ret=C,
        fields={"num_samples": "10**9"},
        message="task 't': num_samples=1000000000 is over the limit of 10000 rollouts per instance "
        "(each rollout is a pytest item); ask for at most 10000",
    ),
    "an instances line with a key twice": Case(
        ret=C,
        fields={"instances": '"i.jsonl"'},
        prepare="dup-key-instances",
        message="i.jsonl:1: key 'q' appears twice in one object (only the last would be read, the first "
        "dropped without a word); keep one of them",
    ),
    "task name of 240 characters": Case(
        ret=C, fields={"name": '"t" * 240'}, message="is 240 characters; use at most 100"
    ),
    "task name with a slash": Case(ret=C, fields={"name": '"a/b"'}, message="invalid task name 'a/b'"),
    "template field missing": Case(
        ret=C,
        fields={"prompt": '"Q {bb}"'},
        message="task 't', instance 'a': the prompt template needs field 'bb' that the instance lacks",
    ),
    "template field that is a method": Case(
        ret=C,
        fields={"prompt": '"Q {q.upper}"'},
        message=(
            "task 't', instance 'a': the prompt template cannot be rendered: "
            "resolves to builtin_function_or_method 'upper'"
        ),
    ),
    "template with a positional field": Case(
        ret=C, fields={"prompt": '"Q {}"'}, message="the prompt template has a positional field"
    ),
    "prompt callable that raises": Case(
        ret=C,
        fields={"prompt": "lambda i: 1 / 0"},
        message="task 't', instance 'a': the prompt callable raised ZeroDivisionError",
    ),
    "a task with both prompt and agent": Case(
        ret=C,
        fields={"agent": "lambda i, llm: ''"},
        message="task 't': give exactly one of prompt=... (one request per rollout) and agent=...",
    ),
    "a task with neither prompt nor agent": Case(
        ret=C, fields={"prompt": "None"}, message="task 't': give exactly one of prompt=..."
    ),
    "an agent task with max_turns=0": Case(
        ret=C,
        fields={"prompt": "None", "agent": "lambda i, llm: ''", "max_turns": "0"},
        message="task 't': max_turns must be a positive integer or None, got 0",
    ),
    "an agent task with max_tokens_per_episode=0": Case(
        ret=C,
        fields={"prompt": "None", "agent": "lambda i, llm: ''", "max_tokens_per_episode": "0"},
        message="task 't': max_tokens_per_episode must be a positive integer or None, got 0",
    ),
    "a token budget on a task without an agent": Case(
        ret=C,
        fields={"max_tokens_per_episode": "100"},
        message="task 't': max_tokens_per_episode limits an agent's episode; give agent=... too",
    ),
    "an agent whose messages are not JSON": Case(
        ret=F,
        fields={
            "prompt": "None",
            "agent": "lambda i, llm: llm.chat([{'role': 'user', 'at': object()}]).text",
        },
        message="llm.chat: the messages are not JSON (Type is not JSON serializable: object); "
        "they are saved with the run",
    ),
    "a tool result of NaN": Case(
        ret=F,
        fields={
            "prompt": "None",
            "agent": "lambda i, llm: str(llm.tool({'id': 'c', 'type': 'function', 'function': "
            "{'name': 'f', 'arguments': '{}'}}, lambda: float('nan')))",
        },
        message="episode 'a' rollout 0: tool 'f' returned float, not JSON (nan; JSON has no NaN or "
        "infinity (it would be saved as null)); return JSON values (its result is saved with the run)",
    ),
    "an agent task's instance holding inf": Case(
        ret=C,
        fields={
            "prompt": "None",
            "agent": "lambda i, llm: ''",
            "instances": '[{"id": "a", "x": float("inf")}]',
        },
        message="task 't', instance 'a': an agent task's instance is saved as its request, and it is not "
        "JSON (inf at ['x']; JSON has no NaN or infinity (it would be saved as null)); "
        "give the instance JSON values",
    ),
    "a prompt callable's message holding NaN": Case(
        ret=C,
        fields={"prompt": "lambda i: [{'role': 'user', 'content': 'x', 'w': float('nan')}]"},
        message="the prompt callable returned chat messages, and message 0 ("
        "{'role': 'user', 'content': 'x', 'w': nan}) is not JSON (nan at ['w']; JSON has no NaN",
    ),
    "an agent task with a system prompt": Case(
        ret=C,
        fields={"prompt": "None", "agent": "lambda i, llm: ''", "system_prompt": "'be brief'"},
        message="task 't': an agent sends its own messages; put the system prompt in the messages",
    ),
    "prompt callable returning a number": Case(
        ret=C, fields={"prompt": "lambda i: 7"}, message="the prompt callable returned int"
    ),
    "instance id with a carriage return": Case(
        ret=C, fields={"instances": '[{"id": "a\\rb"}]'}, message="instance #0"
    ),
    "system_prompt a list": Case(
        ret=C,
        fields={"system_prompt": '["a", "b"]'},
        message="task 't': system_prompt must be a string or None, got list ['a', 'b']",
    ),
    "system_prompt a number": Case(
        ret=C, fields={"system_prompt": "5"}, message="system_prompt must be a string or None, got int 5"
    ),
    "strip_reasoning a string": Case(
        ret=C,
        fields={"strip_reasoning": "'no'"},
        message="task 't': strip_reasoning must be True or False, got 'no'",
    ),
    "instances an empty list": Case(
        ret=C, fields={"instances": "[]"}, message="task 't': no instances (instances=[] is empty)"
    ),
    "chat message content a set": Case(
        ret=C,
        fields={"prompt": 'lambda i: [{"role": "user", "content": {"x"}}]'},
        message="task 't', instance 'a': the prompt callable returned chat messages, and message 0",
    ),
    "two tasks with one name": Case(prepare="two-tasks", message="two different tasks are named 't'"),
    "empty instances file": Case(
        ret=C, fields={"instances": '"empty.jsonl"'}, prepare="empty-instances", message="empty.jsonl"
    ),
    # -- multiple choice ---------------------------------------------------------------------
    "a choices field the instance lacks": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(choices=DROP)},
        message="task 't', instance 'a': the instance has no choices field 'choices'",
    ),
    "choices that are not strings": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(choices=[1, 2])},
        message="task 't', instance 'a': choices field 'choices' must be a list of strings, got [1, 2]",
    ),
    "choices an empty list": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(choices=[])},
        message="task 't', instance 'a': choices field 'choices' is empty",
    ),
    "a gold index out of range": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(gold=2)},
        message="task 't', instance 'a': target field 'gold' = 2 is out of range for 2 choices",
    ),
    "a gold index that is not an int": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(gold=1.0)},
        message="target field 'gold' must be the gold choice's index (an int) or its text, got 1.0",
    ),
    "a gold text not among the choices": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(gold="maybe")},
        message="target field 'gold' = 'maybe' is not among the choices ['yes', 'no']",
    ),
    "a gold field the instance lacks": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(gold=DROP)},
        message="task 't': instance 'a' has no target field 'gold'",
    ),
    "a choices task with num_samples 2": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(), "num_samples": "2"},
        message="task 't': a choices task has one rollout per instance",
    ),
    "a choices task with an agent": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(), "prompt": "None", "agent": "lambda i, llm: ''"},
        message="task 't': choices=... scores each answer choice by its log-likelihood after the prompt",
    ),
    "a choices task with a chat prompt": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(), "prompt": 'lambda i: [{"role": "user", "content": "x"}]'},
        message="task 't', instance 'a': the prompt callable returned chat messages, and a choices task",
    ),
    "choices a number": Case(
        ret=C, fields={**MC, "choices": "3"}, message="task 't': choices must name the instance field"
    ),
    "a choice delimiter that is not a string": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(), "choice_delimiter": "None"},
        message="task 't': choice_delimiter must be a string",
    ),
    "a choices task with a text scorer": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(), "scorer": '"exact_match"'},
        message="task 't': a choices task is scored from its choices' log-likelihoods",
    ),
    "multiple_choice on a task without choices": Case(
        ret=C,
        fields={"scorer": "scorers.multiple_choice()"},
        message="task 't': scorers.multiple_choice(...) scores answer choices by log-likelihood",
    ),
    "multiple_choice with an unknown metric": Case(
        ret=C,
        fields={**MC, "instances": mc_instances(), "scorer": 'scorers.multiple_choice(metrics=("f1",))'},
        message="scorers.multiple_choice(metrics=('f1',)): give one or more distinct metrics of acc, "
        "acc_norm, bpb",
    ),
    "a provider without loglikelihood": Case(
        ret=F,
        fields={**MC, "instances": mc_instances()},
        message="task 't' scores answer choices by log-likelihood, and the 'echo' provider has no "
        "loglikelihood(requests)",
    ),
    "loglikelihood with too few pairs": Case(
        ("--evalreplay-provider=echo-ll",),
        ret=F,
        fields={**MC, "instances": mc_instances(id="short")},
        message="'echo-ll' provider: loglikelihood returned 1 entries for 2 continuations",
    ),
    "loglikelihood with a NaN": Case(
        ("--evalreplay-provider=echo-ll",),
        ret=F,
        fields={**MC, "instances": mc_instances(id="nan")},
        message="'echo-ll' provider: loglikelihood returned a bad answer: entry 0 ((nan, False)) is not a "
        "(finite log-probability",
    ),
    # -- providers -------------------------------------------------------------------------
    "provider batch size -1": Case(
        provider={"batch_size": "-1"},
        message="the provider's batch_size must be a positive int or None, got -1",
    ),
    "provider batch size a string": Case(
        provider={"batch_size": '"2"'},
        message="the provider's batch_size must be a positive int or None, got '2'",
    ),
    "provider close raises": Case(
        provider={"close_raises": "True"},
        ret=OK,
        message="note: the provider's close() raised RuntimeError: the engine would not stop",
    ),
    "metadata JSON cannot hold": Case(
        fields={"instances": '[{"id": "meta", "q": "x"}]'},
        ret=F,
        message="provider returned a bad Generation for rollout 0: cannot be saved as JSON",
    ),
    "metadata holding NaN": Case(
        fields={"instances": '[{"id": "nanmeta", "q": "x"}]'},
        ret=F,
        message="provider returned a bad Generation for rollout 0: cannot be saved as JSON (nan at "
        "['metadata']['logprob'][0]; JSON has no NaN or infinity (it would be saved as null))",
    ),
    "lone surrogate in the text": Case(
        fields={"instances": '[{"id": "surrogate", "q": "x"}]'},
        ret=F,
        message="cannot be saved as JSON (str is not valid UTF-8: surrogates not allowed)",
    ),
    "provider raises SystemExit": Case(
        fields={"instances": '[{"id": "exit", "q": "x"}, {"id": "b", "q": "y"}]'},
        ret=STOPPED,
        message="the provider raised SystemExit(3); stopping the session",
    ),
    "provider raises CancelledError": Case(
        fields={"instances": '[{"id": "cancel", "q": "x"}, {"id": "b", "q": "y"}]'},
        ret=F,
        message="provider raised CancelledError: the event loop went away",
    ),
    "scorer raises SystemExit": Case(
        fields={"scorer": "lambda text, i: exit(3)"}, ret=F, message="scorer raised SystemExit: 3"
    ),
    "scorer returns an empty dict": Case(
        fields={"scorer": "lambda text, i: {}"},
        ret=F,
        message="scorer 'score' returned no scores (an empty dict)",
    ),
    "scorer returns colliding keys": Case(
        fields={"scorer": 'lambda text, i: {1: 1.0, "1": 0.0}'},
        ret=F,
        message="scorer 'score' returned keys 1 and '1', both named '1' once saved",
    ),
    "a graded scorer with an empty rubric": Case(
        ret=C,
        fields={"scorer": 'scorers.graded({}, __import__("pytest_evalreplay").judges.llm())'},
        message="scorers.graded(rubric=...) is empty: give at least one criterion",
    ),
    "a graded scorer whose judge is a function": Case(
        ret=C,
        fields={"scorer": 'scorers.graded({"ok": "is right"}, lambda i, a, b: 1.0)'},
        message="scorers.graded(judge=...) must be judges.llm(...) (a judge model on a provider), "
        "got function",
    ),
    "pass@k with k above num_samples": Case(
        ret=C,
        fields={"num_samples": "2", "metrics": '["pass@4"]'},
        message="task 't': metric 'pass@4' needs num_samples >= 4 (the task has num_samples=2); "
        "raise num_samples or lower k",
    ),
    "a gate naming maj@k with k above num_samples": Case(
        ret=C,
        fields={"gate": 'Gate("maj@3", min=0.5)'},
        message="task 't': the gate's metric 'maj@3' needs num_samples >= 3 (the task has num_samples=1)",
    ),
    "an unknown sample metric": Case(
        ret=C,
        fields={"metrics": '["best@4"]'},
        message="task 't': unknown metric 'best@4' in metrics=: the sample metrics are 'pass@k' and 'maj@k'",
    ),
    "metrics as a string": Case(
        ret=C,
        fields={"metrics": '"pass@1"'},
        message="task 't': metrics must be a list of names such as ['pass@4', 'maj@4'], got 'pass@1'",
    ),
    "pass@k over a score that is not 0 or 1": Case(
        fields={"scorer": "lambda text, i: 0.5", "num_samples": "2", "metrics": '["pass@2"]'},
        ret=F,
        message="task 't': pass@2 needs score 'score' to be 0 or 1 (wrong or right), got 0.5",
    ),
    "pass@k over a scorer with several scores": Case(
        fields={
            "scorer": 'lambda text, i: {"a": 1.0, "b": 0.0}',
            "num_samples": "2",
            "metrics": '["pass@2"]',
        },
        ret=F,
        message="pass@2 judges a sample by its one score, and the scorer returned several scores ['a', 'b']; "
        "name the one that says correct, e.g. 'pass@2:a'",
    ),
    "scorer returns a string": Case(
        fields={"scorer": 'lambda text, i: "yes"'}, ret=F, message="scorer returned str for 'score'"
    ),
    # -- journals, baselines, files in the output dir -----------------------------------------
    "journal path is a directory": Case(
        ("--resume",), prepare="journal-dir", message="t-journal.jsonl: cannot read the journal"
    ),
    "journal of another format": Case(
        ("--resume",), prepare="journal-v1", message="a journal of another format ('evalreplay-journal/1'"
    ),
    "journal failure row with a negative attempt": Case(
        ("--resume",), prepare="journal-bad-fail", message="not a valid failure row"
    ),
    "journal failure row of an unknown class": Case(
        ("--resume",), prepare="journal-unknown-class", message="not a valid failure row"
    ),
    "journal request rows deleted by hand": Case(
        ("--resume",),
        prepare="journal-no-requests",
        ret=OK,
        message="and the journal has no request row of that digest (were rows deleted by hand?)",
    ),
    "report path is a directory": Case(
        ("--evalreplay-report=run",),
        prepare="report-dir",
        ret=OK,
        message="report not written: --evalreplay-report",
    ),
    "baseline path is a directory": Case(
        ("--evalreplay-baseline=bdir",),
        fields={"gate": 'Gate("contains", max_drop=0.1)'},
        prepare="baseline-dir",
        ret=F,
        message="bdir",
    ),
    "malformed baseline while updating it": Case(
        ("--evalreplay-baseline=base.json", "--evalreplay-update-baseline"),
        prepare="baseline-bad",
        ret=OK,
        message="note: baseline not updated: ",
    ),
    "manifest.json is a directory": Case(prepare="manifest-dir", ret=OK, message="manifest.json"),
    # Links planted at the plugin's own names (#18 case 12): refused, their targets untouched
    # (the test checks the target: see `prepare`).
    "a link at a task's lock file": Case(
        prepare="link:.t.lock", message="run/.t.lock is a symbolic link (to "
    ),
    "a link at the session lock": Case(
        prepare="link:.evalreplay-session.lock",
        message="the plugin never follows a link inside its output dir, so it neither writes nor deletes",
    ),
    "a link at the manifest lock": Case(prepare="link:.manifest.lock", message="remove the link (rm "),
    "a link at the chunk locks folder": Case(
        prepare="dirlink:.evalreplay-locks", message="run/.evalreplay-locks is a symbolic link"
    ),
    "a link inside the chunk locks folder": Case(
        prepare="link:.evalreplay-locks/t.0.lock", message="run/.evalreplay-locks/t.0.lock is a symbolic link"
    ),
    "a link at the progress folder": Case(
        prepare="dirlink:.evalreplay-progress", message="run/.evalreplay-progress is a symbolic link"
    ),
    "a file at the chunk locks folder": Case(
        prepare="file:.evalreplay-locks",
        message="run/.evalreplay-locks: expected a folder of the plugin's here, found a file; remove it",
    ),
}


def write_project(pytester: pytest.Pytester, case: Case) -> None:
    provider = {"batch_size": "None", "close_raises": "False", **case.provider}
    pytester.makeconftest(PROVIDER.format(**provider))
    pytester.makeini("[pytest]\nevalreplay_provider = echo\n" + case.ini)
    fields = {**BASE_FIELDS, **case.fields}
    source = TASK.format(**fields)
    if case.prepare == "two-tasks":
        source += "u = EvalTask('t', [{'id': 'z'}], prompt='Q', scorer='contains')\n"
    pytester.makepyfile(test_evals=source)


def prepare(pytester: pytest.Pytester, case: Case) -> None:
    out = pytester.path / "run"
    what = case.prepare
    if what == "empty-instances":
        (pytester.path / "empty.jsonl").write_text("")
    elif what == "dup-key-instances":
        (pytester.path / "i.jsonl").write_text('{"id": "a", "q": "x", "q": "y"}\n')
    elif what in ("run", "saved-run"):
        pytester.runpytest(f"--evalreplay-output={'run' if what == 'run' else 'saved'}")
    elif what.startswith("journal"):
        pytester.runpytest("--evalreplay-output=run", "-k", "a")
        journal = out / "t-journal.jsonl"
        if what == "journal-no-requests":
            rows = journal.read_bytes().splitlines(keepends=True)
            journal.write_bytes(b"".join(r for r in rows if orjson.loads(r)["type"] != "request"))
        elif what == "journal-dir":
            journal.unlink()
            journal.mkdir()
        elif what == "journal-v1":
            journal.write_bytes(b'{"type": "header", "format": "evalreplay-journal/1"}\n')
        else:
            cls, attempt = ("retryable", -1) if what == "journal-bad-fail" else ("mystery", 1)
            row = {
                "type": "fail",
                "stage": 1,
                "instance_id": "a",
                "rollouts": [0],
                "attempt": attempt,
                "failure_class": cls,
                "message": "x",
                "final": True,
                "request": "r",
                "provider": "p",
                "run": "x",
            }
            with journal.open("ab") as fh:
                fh.write(orjson.dumps(row) + b"\n")
    elif what.startswith("foreign:"):
        write_foreign(pytester.path, what.split(":")[1])
    elif what == "shard":
        pytester.runpytest("--evalreplay-output=run", "--evalreplay-shard=1/2")
    elif what == "report-dir":
        out.mkdir()
    elif what == "baseline-dir":
        (pytester.path / "bdir").mkdir()
    elif what == "baseline-bad":
        (pytester.path / "base.json").write_text('{"format": "evalreplay-baseline/1", "tasks": []}')
    elif what == "manifest-dir":
        (out / "manifest.json").mkdir(parents=True)
    elif what.startswith(("link:", "dirlink:", "file:")):
        kind, name = what.split(":")
        out.mkdir()
        target = pytester.path / "precious"
        if kind == "dirlink":
            target.mkdir()
            (target / "keep.json").write_text("{}")
            (target / "t.1.lock").write_text("not a lock")
        else:
            target.write_text("do not touch")
        if kind == "file":
            (out / name).write_text("not a folder")
        else:
            (out / name).parent.mkdir(exist_ok=True)
            (out / name).symlink_to(target, target_is_directory=kind == "dirlink")


def write_foreign(root: Path, what: str) -> None:
    """Another harness's save with one thing wrong (see the "foreign:" cases)."""
    if what.startswith("eval-"):
        if what == "eval-not-zip":
            (root / "log.eval").write_text("not a zip")
            return
        with zipfile.ZipFile(root / "log.eval", "w") as archive:
            archive.writestr("header.json", orjson.dumps({"eval": {"model": "m"}}))
            if what == "eval-bad-sample":
                archive.writestr("samples/a_epoch_1.json", b'{"id": "a",')
        return
    if what == "lm-choice-nan":
        args = {f"gen_args_{i}": {"arg_0": "Q a", "arg_1": c} for i, c in enumerate((" x", " y"))}
        row = {"doc_id": 0, "arguments": args, "resps": [[["-1.5", "False"]], [["nan?", "False"]]]}
        (root / "samples_t.jsonl").write_bytes(orjson.dumps(row) + b"\n")
        return
    base = {"request_type": "loglikelihood", "doc_id": 0, "native_id": "a"}
    if what == "olmo-short":
        requests = [{**base, "idx": 0, "request": {"context": "Q a", "continuations": [" x", " y"]}}]
    else:
        requests = [{**base, "idx": i, "request": {"context": "Q a", "continuation": " x"}} for i in (0, 2)]
    prediction = {"doc_id": 0, "native_id": "a", "model_output": [{"sum_logits": -1.0, "is_greedy": True}]}
    (root / "t-requests.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    (root / "t-predictions.jsonl").write_bytes(orjson.dumps(prediction) + b"\n")


def precious(pytester: pytest.Pytester) -> dict[str, bytes]:
    """What a planted link points to (see `prepare`): it must stay as it was."""
    target = pytester.path / "precious"
    if target.is_dir():
        return {p.name: p.read_bytes() for p in sorted(target.iterdir())}
    return {target.name: target.read_bytes()} if target.exists() else {}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_gets_a_message_naming_it(pytester: pytest.Pytester, name: str) -> None:
    case = CASES[name]
    write_project(pytester, case)
    prepare(pytester, case)
    saved = (
        {p.name: p.read_bytes() for p in (pytester.path / "run").glob("*") if p.is_file()}
        if (pytester.path / "run").is_dir()
        else {}
    )
    targets = precious(pytester)
    result = pytester.runpytest("--evalreplay-output=run", *case.args, no_reraise_ctrlc=True)
    assert precious(pytester) == targets, "a link's target was changed"
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == case.ret, text
    assert case.message in text, text
    assert "INTERNALERROR" not in text
    assert "pytest_evalreplay/" not in text.replace(str(pytester.path), ""), (
        "a traceback from the plugin's code"
    )
    journal = pytester.path / "run" / "t-journal.jsonl"
    if "t-journal.jsonl" in saved and journal.is_file() and case.ret in (U,):
        assert journal.read_bytes() == saved["t-journal.jsonl"], "a refused run changed the journal"


def test_a_provider_raising_a_base_exception_is_asked_once_and_reported_once(
    pytester: pytest.Pytester,
) -> None:
    """asyncio.CancelledError is no Exception: it fails the requests in flight
    for good, once, instead of escaping each item (a traceback per item and a
    provider call per item, with the summary counting them missing)."""
    ids = [{"id": "cancel", "q": "x"}] + [{"id": f"i{n}", "q": "y"} for n in range(20)]
    write_project(pytester, Case(fields={"instances": repr(ids)}))
    result = pytester.runpytest("--evalreplay-output=run")
    text = result.stdout.str()
    assert result.ret == F, text
    assert (pytester.path / "calls.log").read_text().count("call") == 1, text
    assert "21 failed" in text and "missing" not in text.split("evalreplay summary")[-1], text
    assert text.count("Traceback") == 0 and len(result.outlines) < 120, text
