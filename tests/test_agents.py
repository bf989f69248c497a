"""Agent tasks: episodes batched, journaled turn by turn, resumed mid-episode,
replayed without a model or the tools; limits and raising agents fail items."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from agent_project import AGENT, CONFTEST, INI

from pytest_evalreplay import EvalTask, Generation
from pytest_evalreplay.agent import LLM
from pytest_evalreplay.model import EvalReplayError


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(test_sums=AGENT)
    return pytester


def calls(pytester: pytest.Pytester) -> list[list[str]]:
    log = pytester.path / "calls.log"
    if not log.exists():
        return []
    lines = [line.split() for line in log.read_text().splitlines()]
    log.unlink()
    return lines


def asked(pytester: pytest.Pytester) -> list[str]:
    return [turn for batch in calls(pytester) for turn in batch]


def transcripts(run: Path) -> bytes:
    return (run / "sums-transcripts.jsonl").read_bytes()


def test_episodes_run_batched_with_tools_and_report_turns(project):
    result = project.runpytest("--evalreplay-output=run", "--junitxml=out.xml")
    result.assert_outcomes(passed=6)
    batches = calls(project)
    assert sorted(b for batch in batches for b in batch) == sorted(
        f"q{i}|r0|t{t}" for i in range(6) for t in (1, 2)
    )
    assert max(map(len, batches)) > 1  # the provider sees turns of many episodes at once
    xml = (project.path / "out.xml").read_text()
    assert 'name="agent.turns" value="2"' in xml and 'name="agent.tool_calls" value="1"' in xml
    rows = [orjson.loads(line) for line in transcripts(project.path / "run").splitlines()]
    assert [r["instance_id"] for r in rows] == [f"q{i}" for i in range(6)]
    assert rows[2]["tool_results"][0]["result"] == 6 and rows[2]["answer"] == "The answer is 6"
    assert [t["finish_reason"] for t in rows[2]["turns"]] == ["tool_calls", "stop"]
    pred = orjson.loads((project.path / "run" / "sums-predictions.jsonl").read_bytes().splitlines()[2])
    assert pred["generations"][0]["text"] == "The answer is 6"


def test_episodes_that_end_together_write_their_answers_in_one_write(project, monkeypatch):
    from pytest_evalreplay.journal import rows as journal_rows

    writes: list[tuple[str, bytes]] = []
    real = journal_rows.append_durably

    def counted(path, blob):
        writes.append((path.name, blob))
        return real(path, blob)

    monkeypatch.setattr(journal_rows, "append_durably", counted)
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    answers = [blob.count(b'"type":"gen"') for name, blob in writes if name == "sums-journal.jsonl"]
    assert sum(answers) == 6 and len([n for n in answers if n]) <= 2  # not a write per episode
    lines = (project.path / "run" / "sums-turns-journal.jsonl").read_bytes().splitlines()
    episodes = [n for n, line in enumerate(lines) if b"|episode" in line and b'"type":"gen"' in line]
    assert len(episodes) == 6  # every transcript is in the turns journal


def test_async_agents_run_in_one_loop(project):
    project.makepyfile(
        test_sums=AGENT.replace("def solve(", "async def solve(")
        .replace("llm.chat(", "await llm.chat(")
        .replace("llm.tool(", "await llm.tool(")
    )
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    assert max(map(len, calls(project))) > 1


def test_resume_answers_every_recorded_turn_and_tool_from_the_journal(project):
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    calls(project)
    before = transcripts(project.path / "run")
    project.makepyfile(test_sums=AGENT.replace("return a + b", "raise RuntimeError('tool ran')"))
    project.runpytest("--evalreplay-output=run", "--resume").assert_outcomes(passed=6)
    assert calls(project) == []
    assert transcripts(project.path / "run") == before


def test_a_run_without_resume_asks_the_model_and_the_tools_for_every_turn_again(project):
    project.makepyfile(
        test_sums=AGENT.replace(
            "    return a + b",
            "    with open('tools.log', 'a') as log:\n        log.write('add\\n')\n    return a + b",
        )
    )
    every_turn = sorted(f"q{i}|r0|t{t}" for i in range(6) for t in (1, 2))
    tools = project.path / "tools.log"
    for _ in range(2):
        project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
        assert sorted(asked(project)) == every_turn
        assert tools.read_text().splitlines() == ["add"] * 6
        tools.unlink()


def test_a_turns_newer_retryable_failure_overrides_its_older_answer_at_a_resume(project):
    project.makeconftest(
        CONFTEST.replace(
            "        for r in requests:\n",
            "        for r in requests:\n"
            "            if r.instance_id == 'q0|r0|t1' and (Path(__file__).parent / 'fail-q0').exists():\n"
            "                out.append(GenerationError('503 from the server', retryable=True))\n"
            "                continue\n",
        ).replace("import Generation", "import Generation, GenerationError")
    )
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    (project.path / "fail-q0").touch()
    run = project.runpytest("--evalreplay-output=run", "--evalreplay-max-attempts=1")
    run.assert_outcomes(passed=5, failed=1)
    (project.path / "fail-q0").unlink()
    calls(project)
    # The first run's answer to q0's turn 1 is older than the second run's
    # failure of it, which a higher attempt cap tries again. Its answer is the
    # same, so turn 2 sends what the first run's turn 2 sent: a turn is matched
    # by what was sent, and that one the journal answers.
    run = project.runpytest("--evalreplay-output=run", "--resume", "--evalreplay-max-attempts=3")
    run.assert_outcomes(passed=6)
    assert asked(project) == ["q0|r0|t1"]


def test_a_crash_after_turn_one_costs_only_the_turns_not_journaled(project):
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    calls(project)
    run = project.path / "run"
    before = transcripts(run)
    # Cut the turns journal back to what a kill during the second batch leaves:
    # every turn 1 and its tool result, nothing of turn 2 and no final answer.
    # (Rows are dropped by what they are, not at a line: under load one
    # episode's turn 2 can be journaled before another's turn 1.)
    turns = run / "sums-turns-journal.jsonl"
    rows = [orjson.loads(line) for line in turns.read_bytes().splitlines()]
    later = {
        r["digest"]
        for r in rows
        if r["type"] == "request"
        and (r["request"]["request_type"] == "episode" or b'"after":' in orjson.dumps(r["request"]))
    }
    assert len(later) == 12  # each episode's turn 2 and its final answer
    kept = [r for r in rows if r.get("digest", r.get("request")) not in later]
    turns.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in kept))
    main = run / "sums-journal.jsonl"
    main.write_bytes(
        b"".join(line for line in main.read_bytes().splitlines(keepends=True) if b'"gen"' not in line)
    )
    project.runpytest("--evalreplay-output=run", "--resume").assert_outcomes(passed=6)
    assert sorted(asked(project)) == sorted(f"q{i}|r0|t2" for i in range(6))
    assert transcripts(run) == before


def test_an_edited_agent_goes_live_from_the_first_turn_that_differs(project):
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    calls(project)
    edited = AGENT.replace(
        "messages.append(tool_message(call, llm.tool(call, add)))",
        "messages.append(tool_message(call, llm.tool(call, add)))\n"
        "            if instance['id'] in ('q2', 'q4'):\n"
        "                messages[-1]['content'] += ' '",
    )
    project.makepyfile(test_sums=edited)
    project.runpytest("--evalreplay-output=run", "--resume").assert_outcomes(passed=6)
    assert sorted(asked(project)) == ["q2|r0|t2", "q4|r0|t2"]


def test_replay_needs_neither_the_model_nor_the_tools(project):
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    project.makeconftest(
        "def pytest_evalreplay_make_provider(config, kind):\n"
        "    if kind != 'replay':\n"
        "        raise ImportError('no model here')\n"
    )
    project.makepyfile(test_sums=AGENT.replace("return a + b", "raise RuntimeError('tool ran')"))
    project.runpytest("--evalreplay-predictions=run", "--evalreplay-output=again").assert_outcomes(passed=6)
    metrics = [
        orjson.loads((project.path / d / "sums-metrics.json").read_bytes())["metrics"]
        for d in ("run", "again")
    ]
    assert metrics[0] == metrics[1]
    assert transcripts(project.path / "again") == transcripts(project.path / "run")


def test_replay_of_an_edited_agent_fails_the_episode_naming_turn_and_character(project):
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    edited = AGENT.replace("What is {instance['a']}", "What's {instance['a']}")
    project.makepyfile(test_sums=edited.replace("turn = llm.chat(", "turn = llm.chat("))
    result = project.runpytest("--evalreplay-predictions=run", "--evalreplay-output=again")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(
        [
            "*episode 'q0' rollout 0 (stage 1), turn 1: the agent sent what the saved episode "
            "never asked*first differs at character*"
        ]
    )


def test_max_turns_fails_the_item_and_keeps_the_transcript(project):
    project.makepyfile(test_sums=AGENT.replace("max_turns=4", "max_turns=1"))
    result = project.runpytest("--evalreplay-output=run")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(["*asked for turn 2, past max_turns=1*"])
    rows = [orjson.loads(line) for line in transcripts(project.path / "run").splitlines()]
    assert len(rows) == 6 and all(len(r["turns"]) == 1 and "max_turns=1" in r["error"] for r in rows)
    doc = orjson.loads((project.path / "run" / "sums-metrics.json").read_bytes())
    assert doc["num_failed"] == 6 and doc["metrics"] == {}


def test_an_episode_past_its_token_budget_fails_with_the_transcript_so_far(project):
    # Each episode: turn 1 costs 3 + 2 tokens, turn 2 costs 5 + 4: 14 in all.
    project.makepyfile(test_sums=AGENT.replace("max_turns=4", "max_turns=4, max_tokens_per_episode=10"))
    result = project.runpytest("--evalreplay-output=run")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(
        ["*episode 'q0' rollout 0, turn 2: 14 tokens so far, past max_tokens_per_episode=10*"]
    )
    rows = [orjson.loads(line) for line in transcripts(project.path / "run").splitlines()]
    assert len(rows) == 6 and all(len(r["turns"]) == 2 and r["answer"] is None for r in rows)
    assert all("max_tokens_per_episode=10" in r["error"] for r in rows)
    doc = orjson.loads((project.path / "run" / "sums-metrics.json").read_bytes())
    assert doc["num_failed"] == 6 and doc["metrics"] == {}


def test_an_episode_at_its_token_budget_passes(project):
    project.makepyfile(test_sums=AGENT.replace("max_turns=4", "max_turns=4, max_tokens_per_episode=14"))
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)


def test_an_agent_that_raises_fails_its_item(project):
    project.makepyfile(test_sums=AGENT.replace("return turn.text", "raise ValueError('confused')"))
    result = project.runpytest("--evalreplay-output=run")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(["*episode 'q0' rollout 0: the agent raised ValueError: confused*"])


@pytest.mark.parametrize("kwargs", [{}, {"prompt": "{q}", "agent": lambda i, llm: ""}])
def test_a_task_takes_exactly_one_of_prompt_and_agent(kwargs):
    with pytest.raises(EvalReplayError, match=r"exactly one of prompt=\.\.\. .* and agent=\.\.\."):
        EvalTask("t", [{"id": "a", "q": "x"}], scorer=lambda t, i: 1.0, **kwargs)


def test_evaluate_outside_pytest_refuses_an_agent_task():
    task = EvalTask("t", [{"id": "a"}], agent=lambda i, llm: "", scorer=lambda t, i: 1.0)
    with pytest.raises(
        EvalReplayError, match=r"task 't' is an agent task: EvalTask\.evaluate runs prompt tasks"
    ):
        task.evaluate(object())  # type: ignore[arg-type]


def test_an_elo_eval_refuses_an_agent_pool():
    from pytest_evalreplay import EloEval, Reference, Stage

    pool = EvalTask("p", [{"id": "a"}], agent=lambda i, llm: "", scorer=lambda t, i: 1.0)
    with pytest.raises(EvalReplayError, match="pool 'p' is an agent task"):
        EloEval("e", pool, {"r": Reference(1000.0, "x")}, [Stage()], judge=lambda i, c, r: 1.0)


STUB_AGENT = r"""
from pytest_evalreplay import EvalTask
from pytest_evalreplay.agent import tool_message

ECHO = {"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}


def echo(text):
    return text.upper()


def solve(instance, llm):
    messages = [{"role": "user", "content": instance["q"]}]
    for _ in range(3):
        turn = llm.chat(messages, tools=[ECHO], temperature=0)
        messages.append(turn.message)
        if not turn.tool_calls:
            return turn.text
        for call in turn.tool_calls:
            messages.append(tool_message(call, llm.tool(call, echo)))
    return turn.text


agent = EvalTask("agent", [{"id": f"q{i}", "q": f"word{i}"} for i in range(4)], agent=solve,
                 scorer=lambda text, inst: inst["q"].upper() in text)
"""


def test_an_agent_over_the_openai_provider_sends_tools_and_reads_tool_calls(pytester):
    from http_stub import StubServer

    pytester.makepyfile(test_agent=STUB_AGENT)
    with StubServer("stub-model") as stub:
        args = [
            "--evalreplay-provider=openai",
            "--evalreplay-model=stub-model",
            f"--evalreplay-base-url={stub.url}",
        ]
        pytester.runpytest(*args, "--evalreplay-output=run").assert_outcomes(passed=4)
        assert stub.answered == 8  # two turns per episode: a tool call, then the answer
        rows = [
            orjson.loads(line)
            for line in (pytester.path / "run" / "agent-transcripts.jsonl").read_bytes().splitlines()
        ]
        first = rows[0]["turns"][0]["reply"]["tool_calls"][0]["function"]
        assert first == {"name": "echo", "arguments": '{"text": "word0"}'}
        assert rows[0]["tool_results"][0]["result"] == "WORD0"
        pytester.runpytest(*args, "--evalreplay-output=run", "--resume").assert_outcomes(passed=4)
        assert stub.answered == 8  # every turn came from the journal


def test_the_summary_counts_episodes_answered_from_the_journal_as_reused(project):
    result = project.runpytest("--evalreplay-output=run")
    result.stdout.fnmatch_lines(
        ["sums: * | 6 generated, 0 reused | *| tokens: 48 prompt + 36 completion generated"]
    )
    result = project.runpytest("--evalreplay-output=run", "--resume")
    result.stdout.fnmatch_lines(
        ["sums: * | 0 generated, 6 reused | *| tokens: 48 prompt + 36 completion reused"]
    )
    edited = AGENT.replace("What is {instance['a']}", "What is {instance['a']}{'?' * (instance['a'] == 3)}")
    project.makepyfile(test_sums=edited)
    result = project.runpytest("--evalreplay-output=run", "--resume")
    result.stdout.fnmatch_lines(["sums: * | 1 generated, 5 reused | *"])
    doc = orjson.loads((project.path / "run" / "sums-metrics.json").read_bytes())
    assert (doc["session"]["generated"], doc["session"]["reused"]) == (1, 5)


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        (
            """+ {instance['b']}?"}]""",
            """+ {instance['b']}?", "x": object()}]""",
            "llm.chat: the messages are not JSON (Type is not JSON serializable: *)*",
        ),
        (
            "tools=[ADD]",
            "tools=[ADD, object()]",
            "llm.chat: tools are not JSON (*); give OpenAI tool schemas*",
        ),
    ],
    ids=["messages", "tools"],
)
def test_a_turn_that_is_not_json_fails_the_episode_naming_llm_chat(project, old, new, line):
    project.makepyfile(test_sums=AGENT.replace(old, new))
    result = project.runpytest("--evalreplay-output=run")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines([f"*episode 'q0' rollout 0: {line}"])
    assert "llm.tool raised" not in result.stdout.str()


class Recording:
    """An episode backend that keeps what each `llm.chat` sent."""

    def __init__(self) -> None:
        self.sent: list[list[dict]] = []

    def chat(self, messages, tools, sampling):
        self.sent.append(messages)
        return Generation(f"reply {len(self.sent)}")


def test_each_turn_copies_only_the_messages_it_added():
    backend = Recording()
    llm = LLM(backend)
    messages = [{"role": "user", "content": "hi"}]
    messages.append(llm.chat(messages).message)
    messages.append({"role": "user", "content": "and?"})
    llm.chat(messages)
    first, second = backend.sent
    assert second[0] is first[0]  # unchanged since the first call: that call's copy
    assert second == messages and all(a is not b for a, b in zip(second, messages, strict=True))


def test_a_message_changed_in_place_after_it_was_sent_is_sent_as_changed():
    backend = Recording()
    llm = LLM(backend)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    llm.chat(messages)
    messages[0]["content"] = "be verbose"
    llm.chat(messages)
    first, second = backend.sent
    assert first[0]["content"] == "be brief" and second[0]["content"] == "be verbose"
    llm.chat(tuple(messages))  # any sequence of messages will do
    assert backend.sent[2] == messages


OVERLAP_CONFTEST = r"""
import threading

from pytest_evalreplay import Generation

TOOL_SAVED = threading.Event()  # set by episode b once llm.tool returned (its result is journaled)


class Model:
    kind, model, batch_size = "overlap", "overlap-v1", None

    def generate(self, requests):
        out = []
        for r in requests:
            turn = int(r.instance_id.rsplit("|t", 1)[1])
            if r.instance_id.startswith("a|") and turn == 2:
                # a's second turn takes until b's tool result is saved (or 5 s)
                text = "overlapped" if TOOL_SAVED.wait(5) else "waited for the model"
                out.append([Generation(text, finish_reason="stop")])
            elif r.instance_id.startswith("b|") and turn == 1:
                call = {"id": "c1", "type": "function", "function": {"name": "slow", "arguments": "{}"}}
                out.append([Generation("", finish_reason="tool_calls", tool_calls=(call,))])
            else:
                out.append([Generation("next" if turn == 1 else "done", finish_reason="stop")])
        return out


def pytest_evalreplay_make_provider(config, kind):
    return Model() if kind == "overlap" else None
"""

OVERLAP_AGENT = r"""
import time

import conftest
from pytest_evalreplay import EvalTask
from pytest_evalreplay.agent import tool_message


def slow():
    time.sleep(0.3)  # a's second turn is asked meanwhile, and goes alone
    return "ok"


def solve(instance, llm):
    messages = [{"role": "user", "content": "go"}]
    turn = llm.chat(messages)
    messages.append(turn.message)
    for call in turn.tool_calls:
        messages.append(tool_message(call, llm.tool(call, slow)))
        conftest.TOOL_SAVED.set()
    messages.append({"role": "user", "content": "again"})
    return llm.chat(messages).text


overlap = EvalTask("overlap", [{"id": "a"}, {"id": "b"}], agent=solve, scorer=lambda text, i: 1.0)
"""


def test_a_tool_result_is_saved_while_the_model_generates_another_episodes_turn(pytester):
    pytester.makeconftest(OVERLAP_CONFTEST)
    pytester.makepyfile(test_overlap=OVERLAP_AGENT)
    pytester.runpytest("--evalreplay-provider=overlap", "--evalreplay-output=run").assert_outcomes(passed=2)
    rows = [
        orjson.loads(line)
        for line in (pytester.path / "run" / "overlap-transcripts.jsonl").read_bytes().splitlines()
    ]
    assert {r["instance_id"]: r["answer"] for r in rows} == {"a": "overlapped", "b": "done"}


@pytest.mark.slow
def test_the_overhead_benchmark_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("benchmarks.agent_overhead")
    from benchmarks.agent_overhead import main

    main(["--episodes", "20", "--turns", "3", "--no-inspect"])
    out = capsys.readouterr().out
    assert "20 episodes x 3 turns = 60 model turns" in out
    assert "per turn : harness CPU through llm.chat" in out and "harness CPU through the endpoint" in out
    assert "goal     : llm.chat <= 100 us" in out and "goal     : endpoint <= 1000 us" in out
    assert "floor    : each turn digested, each turn and tool result a journal line as it exists" in out


def test_a_malformed_turns_journal_line_is_a_usage_error_before_any_item(project):
    """Issue #30 case 14: it failed every item, each with the message, and the
    summary said the run dir was not written; a task journal's is refused up front."""
    project.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    path = project.path / "run" / "sums-turns-journal.jsonl"
    rows = path.read_bytes().splitlines()
    rows[3] = rows[3][:-5]
    path.write_bytes(b"\n".join(rows) + b"\n")
    calls(project)
    for args in (["--resume"], []):
        result = project.runpytest("--evalreplay-output=run", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(
            ["*sums-turns-journal.jsonl:4: malformed journal line*--evalreplay-reset*"]
        )
        assert calls(project) == []
    project.runpytest("--evalreplay-output=run", "--evalreplay-reset").assert_outcomes(passed=6)


ON_DISK_CONFTEST = CONFTEST.replace(
    "    def generate(self, requests):\n",
    """    def generate(self, requests):
        # Every tool result an asking episode sent must be on disk before its turn reaches the model.
        journal = Path(__file__).parent / "run" / "sums-turns-journal.jsonl"
        saved = journal.read_bytes() if journal.exists() else b""
        for r in requests:
            episode = r.instance_id.split("|t")[0]
            for n in range(1, sum(m["role"] == "tool" for m in r.context) + 1):
                if f'"instance_id":"{episode}|c{n}"'.encode() not in saved:
                    with open(Path(__file__).parent / "unsaved.log", "a") as log:
                        log.write(f"{episode}|c{n}\\n")
""",
)


def test_each_tool_result_is_on_disk_before_its_episodes_next_turn_reaches_the_model(pytester):
    """Tool results wait to be written with the next batch of turns (one
    write for the batch, not one per tool), but never past its provider call."""
    pytester.makeconftest(ON_DISK_CONFTEST)
    pytester.makeini(INI)
    pytester.makepyfile(test_sums=AGENT)
    pytester.runpytest("--evalreplay-output=run").assert_outcomes(passed=6)
    assert len(asked(pytester)) == 12  # each episode's second turn followed a tool result
    assert not (pytester.path / "unsaved.log").exists()
