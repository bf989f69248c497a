"""The OpenAI-compatible endpoint per episode: agents written with the real
openai SDK, journaled turn by turn, resumed and replayed without a model."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.error
import urllib.request

import pytest
from endpoint_project import (
    AGENTS_SDK,
    ASYNC,
    COMMAND,
    CONCURRENT,
    CONCURRENT_CONFTEST,
    PROGRAM,
    SYNC,
    openai_args,
    transcripts,
)
from http_stub import StubServer

from pytest_evalreplay import Generation
from pytest_evalreplay.run.endpoint import Endpoint

pytest.importorskip("openai", reason="the endpoint tests use the real openai SDK (a test extra)")


@pytest.fixture
def stub():
    with StubServer("stub-model") as server:
        yield server


@pytest.mark.parametrize("source", [SYNC, ASYNC], ids=["sync", "async-streaming"])
def test_an_openai_sdk_agent_runs_resumes_and_replays_through_the_endpoint(pytester, stub, source):
    pytester.makepyfile(test_agent=source)
    pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run")).assert_outcomes(passed=6)
    assert stub.answered == 3 * 2 + 3 * 4  # even episodes: 2 turns, odd ones: 4
    first = transcripts(pytester.path / "run")
    assert first[1]["answer"] == "WORD1-AGAIN|seed=None|i=0"
    assert [t["finish_reason"] for t in first[1]["turns"]] == ["tool_calls", "stop"] * 2

    stub.answered = 0  # a resume answers every turn from the journal
    done = pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run", "--resume"))
    done.assert_outcomes(passed=6)
    assert stub.answered == 0
    assert transcripts(pytester.path / "run") == first

    # Replay: no model at all (the openai provider is not even configured).
    done = pytester.runpytest(
        "-p", "no:randomly", "--evalreplay-predictions=run", "--evalreplay-output=again"
    )
    done.assert_outcomes(passed=6)
    assert stub.answered == 0
    assert [r["answer"] for r in transcripts(pytester.path / "again")] == [r["answer"] for r in first]


def test_a_command_agent_runs_the_program_per_episode_and_replays(pytester, stub):
    pytester.makepyfile(test_agent=COMMAND)
    (pytester.path / "my_agent.py").write_text(PROGRAM)
    pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run")).assert_outcomes(passed=6)
    assert stub.answered == 3 * 2 + 3 * 4
    assert transcripts(pytester.path / "run")[3]["answer"] == "WORD3-AGAIN|seed=None|i=0"
    stub.answered = 0
    done = pytester.runpytest(
        "-p", "no:randomly", "--evalreplay-predictions=run", "--evalreplay-output=again"
    )
    done.assert_outcomes(passed=6)
    assert stub.answered == 0


def test_a_failing_program_fails_its_item_with_its_last_stderr_lines(pytester, stub):
    pytester.makepyfile(test_agent=COMMAND)
    (pytester.path / "my_agent.py").write_text(
        "import json, sys\nn = json.load(sys.stdin)['n']\nif n == 2:\n"
        "    print('it broke here', file=sys.stderr)\n    sys.exit(3)\nprint('WORD%d' % n)\n"
    )
    result = pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run"))
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["*exited with status 3; its last stderr lines:*", "*it broke here*"])


def test_an_agents_sdk_agent_runs_resumes_and_replays_through_chat_and_responses(pytester, stub):
    pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents, a test extra)")
    pytester.makepyfile(test_agent=AGENTS_SDK)
    pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run")).assert_outcomes(passed=8)
    assert stub.answered == 8 * 2  # a tool call, then the answer
    first = transcripts(pytester.path / "run")
    assert {r["answer"] for r in first} == {"WORD0|seed=None|i=0", "WORD1|seed=None|i=0"}
    # The Responses API's function call and its output reach the provider as chat messages.
    responses = next(r for r in first if r["instance_id"] == "q0-responses")
    assert [m["role"] for m in responses["messages"]] == ["system", "user", "assistant", "tool", "assistant"]

    stub.answered = 0
    done = pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run", "--resume"))
    done.assert_outcomes(passed=8)
    assert stub.answered == 0
    assert transcripts(pytester.path / "run") == first
    done = pytester.runpytest(
        "-p", "no:randomly", "--evalreplay-predictions=run", "--evalreplay-output=again"
    )
    done.assert_outcomes(passed=8)
    assert transcripts(pytester.path / "again") == first


def test_an_episodes_concurrent_calls_resume_exactly(pytester):
    pytester.makeconftest(CONCURRENT_CONFTEST)
    pytester.makepyfile(test_agent=CONCURRENT)
    args = ("-p", "no:randomly", "--evalreplay-provider=echo", "--evalreplay-output=run")
    pytester.runpytest(*args).assert_outcomes(passed=3)
    log = pytester.path / "calls.log"
    assert sorted(log.read_text().split("\n")[:-1]).count("q0-same") == 2
    log.unlink()
    answers = [r["answer"] for r in transcripts(pytester.path / "run")]
    # A kill while q0's "-b" call and one of its two "-same" calls were in flight:
    # their answers, and every final answer, never reached the journal.
    run = pytester.path / "run"
    turns = run / "agent-turns-journal.jsonl"
    kept, dropped_same = [], False
    for line in turns.read_bytes().splitlines(keepends=True):
        if b'"type":"gen"' in line and (b'"text":"echo:q0-b"' in line or b"|episode" in line):
            continue
        if b'"type":"gen"' in line and b'"text":"echo:q0-same"' in line and not dropped_same:
            dropped_same = True
            continue
        kept.append(line)
    assert dropped_same
    turns.write_bytes(b"".join(kept))
    main = run / "agent-journal.jsonl"
    main.write_bytes(b"".join(x for x in main.read_bytes().splitlines(keepends=True) if b'"gen"' not in x))
    (run / "agent-transcripts.jsonl").unlink()

    pytester.runpytest(*args, "--resume").assert_outcomes(passed=3)
    # Whatever order the calls arrived in, only the two never answered are asked again.
    assert sorted(log.read_text().split()) == ["q0-b", "q0-same"]
    assert [r["answer"] for r in transcripts(run)] == answers


class _Turns:
    """An episode for the endpoint alone: answers every turn "ok", keeps what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def serve(self, messages, tools, sampling):
        self.sent.append((messages, tools, sampling))
        return Generation("ok", finish_reason="stop", prompt_tokens=1, completion_tokens=1)


def test_the_endpoint_requires_the_sessions_token_and_listens_on_loopback_only():
    import openai

    endpoint = Endpoint("m")
    episode = _Turns()
    try:
        url = endpoint.open(episode)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        messages = [{"role": "user", "content": "hi"}]
        bad = openai.OpenAI(base_url=url, api_key="not-the-token", max_retries=0)
        with bad, pytest.raises(openai.AuthenticationError, match="missing or wrong API key"):
            bad.chat.completions.create(model="m", messages=messages)
        assert episode.sent == []
        request = urllib.request.Request(url + "/chat/completions", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as no_key:
            urllib.request.urlopen(request, timeout=10)
        assert no_key.value.code == 401
        no_key.value.close()
        with openai.OpenAI(base_url=url, api_key=endpoint.token, max_retries=0) as good:
            assert (
                good.chat.completions.create(model="m", messages=messages).choices[0].message.content == "ok"
            )
            assert [m.id for m in good.models.list()] == ["m"]
        # Bound to 127.0.0.1: the machine's other addresses refuse it.
        assert endpoint.address == ("127.0.0.1", endpoint.port)
        port = endpoint.port
        for address in _other_addresses():
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
                pass
    finally:
        endpoint.stop()


def _other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (none in some sandboxes):
    its host name's, and the one a route out would leave from (no packet is sent)."""
    found = set()
    with contextlib.suppress(OSError):
        found |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.254.254.254", 9))
            found.add(probe.getsockname()[0])
        except OSError:
            pass
    return sorted(a for a in found if not a.startswith("127.") and a != "0.0.0.0")


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"n": 2}, "n", "n=2 is not served: an agent turn is one sample (n=1)"),
        ({"logprobs": True}, "logprobs", "'logprobs' is not served by the evalreplay endpoint"),
        ({"audio": {"voice": "x"}}, "audio", "'audio' is not served by the evalreplay endpoint"),
        ({"frobnicate": 1}, "frobnicate", "the field 'frobnicate' is not served by the evalreplay endpoint"),
    ],
)
def test_a_request_the_endpoint_cannot_serve_is_a_400_naming_the_field(body, param, message):
    import openai

    endpoint = Endpoint("m")
    episode = _Turns()
    try:
        url = endpoint.open(episode)
        client = openai.OpenAI(base_url=url, api_key=endpoint.token, max_retries=0)
        with client, pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], extra_body=body
            )
        assert err.value.body["param"] == param and err.value.body["message"] == message
        assert episode.sent == []
        endpoint.close(url)
        client = openai.OpenAI(base_url=url, api_key=endpoint.token, max_retries=0)
        with client, pytest.raises(openai.NotFoundError, match="this episode has ended"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        endpoint.stop()


def test_a_program_past_its_timeout_is_killed_and_fails_its_item(pytester, stub):
    pytester.makepyfile(test_agent=COMMAND.replace("timeout=60", "timeout=3"))
    (pytester.path / "my_agent.py").write_text(
        "import json, sys, time\nn = json.load(sys.stdin)['n']\nif n == 4:\n"
        "    print('thinking', file=sys.stderr, flush=True)\n    time.sleep(600)\nprint('WORD%d' % n)\n"
    )
    result = pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run"))
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["*my_agent.py: no answer within timeout=3s (killed); its last stderr*"])


def test_an_endpoint_turn_past_max_turns_fails_the_item_even_if_the_agent_carries_on(pytester, stub):
    """The agent sees a 400 it swallows; the episode fails all the same."""
    swallowing = SYNC.replace(
        """            reply = client.chat.completions.create(
                model="any", messages=messages, tools=[ECHO], temperature=0)""",
        """            try:
                reply = client.chat.completions.create(
                    model="any", messages=messages, tools=[ECHO], temperature=0)
            except openai.BadRequestError as exc:
                assert exc.body["type"] == "evalreplay_turn_failed"
                return instance["q"].upper()  # an answer the scorer would pass""",
    )
    assert swallowing != SYNC
    pytester.makepyfile(test_agent=swallowing.replace("max_turns=6", "max_turns=1"))
    result = pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run"))
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(["*episode 'q0' rollout 0: the agent asked for turn 2, past max_turns=1*"])
    assert stub.answered == 6  # turn 1 of each episode; no turn 2 reached the model


def test_llm_tool_beside_the_endpoint_is_journaled_and_not_run_again(pytester, stub, monkeypatch):
    """docs/agents.md: a tool inside an endpoint agent, wrapped with llm.tool,
    is served from the journal on --resume and from the run dir on replay."""
    old = 'messages.append({"role": "tool", "tool_call_id": call.id, "content": text.upper()})'
    new = (
        'messages.append({"role": "tool", "tool_call_id": call.id,\n'
        '                                     "content": llm.tool(call.model_dump(), shout)})'
    )
    assert old in SYNC
    source = SYNC.replace(old, new).replace(
        "def solve(instance, llm):",
        "def shout(text):\n"
        "    assert not os.environ.get('NO_TOOLS'), 'the tool ran'\n"
        "    with open('tools.log', 'a') as log:\n"
        "        log.write(text + '\\n')\n"
        "    return text.upper()\n\n\n"
        "def solve(instance, llm):",
    )
    pytester.makepyfile(test_agent="import os\n" + source)
    log = pytester.path / "tools.log"
    pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run")).assert_outcomes(passed=6)
    assert len(log.read_text().split()) == 3 * 1 + 3 * 2
    first = transcripts(pytester.path / "run")
    log.unlink()
    stub.answered = 0
    done = pytester.runpytest(*openai_args(stub.url, "--evalreplay-output=run", "--resume"))
    done.assert_outcomes(passed=6)
    assert stub.answered == 0 and not log.exists()
    assert transcripts(pytester.path / "run") == first
    monkeypatch.setenv("NO_TOOLS", "1")  # pytester runs in process: the replay's tool would raise
    replay = ("-p", "no:randomly", "--evalreplay-predictions=run", "--evalreplay-output=again")
    pytester.runpytest(*replay).assert_outcomes(passed=6)
    assert transcripts(pytester.path / "again") == first and not log.exists()


def test_episodes_connecting_at_once_are_all_served():
    """64 clients connecting together (concurrency 32 opens as many at the
    start): socketserver's listen backlog of 5 reset some on a busy machine."""
    import openai

    endpoint = Endpoint("m")
    errors: list[BaseException] = []
    base = openai.OpenAI(base_url="http://unused.invalid/v1", api_key="k", max_retries=0)

    def ask(url: str) -> None:
        try:
            client = base.with_options(base_url=url, api_key=endpoint.token)
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        except Exception as exc:  # collected for the assertion
            errors.append(exc.__cause__ or exc)

    try:
        threads = [threading.Thread(target=ask, args=(endpoint.open(_Turns()),)) for _ in range(64)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        endpoint.stop()
        base.close()
    assert errors == []
