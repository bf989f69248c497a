"""No credential in anything the plugin saves or prints (issue 30, case 6):
the configured API key ($EVALREPLAY_API_KEY / $OPENAI_API_KEY) and any
Authorization or bearer value, whoever put it into a message (a server's 400
body, a user's provider, a scorer, a provider's close), is hidden in the
journal, the run dir, the Markdown report and the terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from http_stub import STUB_MODEL, Action, StubServer

from pytest_evalreplay.values.credentials import configured_secrets, redact

KEY = "sk-test-0123456789abcdef"
TOKEN = "tok-9f8e7d6c5b4a"

CONFTEST = """
import os
from pytest_evalreplay import Generation, GenerationError

KEY = os.environ["OPENAI_API_KEY"]

class Leaky:
    kind, model, batch_size = "leaky", "leaky-1", 1

    def generate(self, requests):
        out = []
        for r in requests:
            if r.instance_id.split("|")[0] == "said":
                out.append(GenerationError(f"HTTP 400: bad key {KEY}; Authorization: Bearer %s" % "TOKEN"))
            elif r.instance_id == "raised":
                raise ValueError(f"the server said: invalid api key {KEY}")
            else:
                out.append([Generation(text="fine") for _ in r.rollouts])
        return out

    def close(self):
        raise RuntimeError(f"could not log out with bearer {KEY}")

def pytest_evalreplay_make_provider(config, kind):
    return Leaky() if kind == "leaky" else None
""".replace('"TOKEN"', repr(TOKEN))

EVALS = """
import os
from pytest_evalreplay import EvalTask

def scorer(text, instance):
    if instance["id"] == "scored":
        raise RuntimeError("grader refused key " + os.environ["OPENAI_API_KEY"])
    return 1.0

t = EvalTask("t", [{"id": "said"}, {"id": "raised"}, {"id": "scored"}, {"id": "ok"}],
             prompt="{id}", scorer=scorer)
a = EvalTask("a", [{"id": "said"}], agent=lambda i, llm: llm.chat([{"role": "user", "content": "hi"}]).text,
             scorer=scorer)
"""


def everything_saved(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def assert_hidden(blob: str | bytes) -> None:
    text = blob.decode() if isinstance(blob, bytes) else blob
    assert KEY not in text and TOKEN not in text


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_key_in_any_failure_or_note_is_never_saved_or_printed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: list[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_evals=EVALS)
    result = pytester.runpytest(
        *(workers or ["-p", "no:xdist"]), "--evalreplay-provider=leaky", "--evalreplay-output=run",
        "--evalreplay-report=report.md", "--junitxml=junit.xml", "-rA", "--evalreplay-max-attempts=1",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=4)
    shown = result.stdout.str() + result.stderr.str()
    assert "bad key ***" in shown and "Bearer ***" in shown
    assert "invalid api key ***" in shown and "grader refused key ***" in shown
    assert "could not log out with bearer ***" in shown
    assert_hidden(shown)
    assert_hidden(everything_saved(pytester.path / "run"))
    assert_hidden((pytester.path / "report.md").read_bytes())
    assert_hidden((pytester.path / "junit.xml").read_bytes())


class EchoKey(Action):
    """A 400 whose body repeats the request's Authorization header and the key."""

    name = "echo"

    def __call__(self, handler: Any, body: dict[str, Any]) -> None:
        handler.stub._event("failed", handler.path, body, status=400)
        said = handler.headers.get("Authorization")
        handler.reply(400, {"error": {"message": f"bad key {said[7:]}; Authorization: {said}"}})


def test_a_server_echoing_the_key_leaves_it_nowhere(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, stub: StubServer
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    stub.default = EchoKey()
    pytester.makepyfile(
        test_evals="from pytest_evalreplay import EvalTask\n"
        "t = EvalTask('t', [{'id': 'a'}], prompt='{id}', scorer=lambda text, instance: 1.0)\n"
    )
    result = pytester.runpytest(
        "-p", "no:xdist", "--evalreplay-provider=openai", f"--evalreplay-base-url={stub.url}",
        f"--evalreplay-model={STUB_MODEL}", "--evalreplay-output=run", "--evalreplay-report=report.md", "-rA",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    shown = result.stdout.str() + result.stderr.str()
    assert "HTTP 400" in shown and "bad key ***" in shown
    assert_hidden(shown)
    assert_hidden(everything_saved(pytester.path / "run"))
    assert_hidden((pytester.path / "report.md").read_bytes())


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"key {KEY} here", "key *** here"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer ***"),
        ("'authorization': 'Basic dXNlcjpwYXNz'", "'authorization': 'Basic ***'"),
        ("got bearer abc123def", "got bearer ***"),
        ("http://user:secret@h:1/v1", "http://user:***@h:1/v1"),
        ("nothing to hide", "nothing to hide"),
    ],
)
def test_redact_hides_the_key_authorization_values_and_url_passwords(text: str, shown: str) -> None:
    assert redact(text, (KEY,)) == shown


def test_the_configured_secrets_are_the_api_key_variables_long_enough_to_look_for() -> None:
    assert configured_secrets({"OPENAI_API_KEY": KEY, "EVALREPLAY_API_KEY": "EMPTY", "HOME": "/root"}) == (
        KEY,
    )
    assert configured_secrets({"EVALREPLAY_API_KEY": "k" * 8, "OPENAI_API_KEY": KEY}) == ("k" * 8, KEY)
    assert configured_secrets({}) == ()
