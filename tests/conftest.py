"""Shared fixtures. The real-vLLM ones skip when vLLM is not installed.

numpy and scipy are imported here, in the outer session: the plugin imports
them lazily, and pytester's in-process runs drop modules first imported inside
them, so each inner run would import numpy again (which numpy warns about).
The plugin's item modules likewise: the package caches `EvalTask` on first
use, and an inner run that dropped `pytest_evalreplay.task` from sys.modules
would collect no task (the plugin looks there before anything else)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy  # noqa: F401
import pytest
import scipy.special
import scipy.stats  # noqa: F401

import pytest_evalreplay.plugin.items  # noqa: F401

sys.path.insert(0, str(Path(__file__).parent))

from http_stub import STUB_MODEL, StubServer
from llm_fixtures import ENGINE_ARGS, build_tiny_llama
from unreadable import Unreadable

from pytest_evalreplay.providers.openai import API_KEY_ENV


def _need_vllm() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'pytest-evalreplay[vllm]')")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a chat template, built once per session."""
    _need_vllm()
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def engine_args() -> dict[str, Any]:
    return dict(ENGINE_ARGS)


@pytest.fixture(scope="session")
def vllm_options(tiny_llama: Path, engine_args: dict[str, Any]) -> list[str]:
    """The command-line options that run the plugin's vllm provider on the tiny model."""
    import orjson

    engine = [f"--evalreplay-engine-arg={k}={orjson.dumps(v).decode()}" for k, v in engine_args.items()]
    return ["--evalreplay-provider=vllm", f"--evalreplay-model={tiny_llama}", *engine]


@pytest.fixture(scope="session")
def vllm_provider(tiny_llama: Path, engine_args: dict[str, Any]) -> Iterator[Any]:
    """One real vLLM engine for the whole session (start-up is ~20-50 s on CPU)."""
    from pytest_evalreplay.providers.vllm import VllmProvider

    provider = VllmProvider(str(tiny_llama), engine_args, quiet=True)
    provider.llm  # noqa: B018 - start now, so a broken engine errors in setup
    try:
        yield provider
    finally:
        provider.close()


@pytest.fixture(autouse=True)
def _no_bytecode_in_projects(request: pytest.FixtureRequest) -> Iterator[None]:
    """No .pyc written for a pytester project's modules. Tests rewrite a
    project's test module between in-process runs, and pytest before 9 keys its
    rewritten-module cache on mtime (whole seconds) and size: a same-size edit
    within the second would be served the old module. Child pytests get -B."""
    if "pytester" not in request.fixturenames:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "dont_write_bytecode", True)
        yield


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch) -> Iterator[Unreadable]:
    """`unreadable(path)`: that path cannot be read, listed or entered, for root too."""
    made = Unreadable(monkeypatch)
    yield made
    made.restore()


@pytest.fixture
def no_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """No API key in the environment, so the openai provider sends only the
    key a test gives it (a module of provider tests uses it for every test)."""
    for name in API_KEY_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def stub() -> Iterator[StubServer]:
    """An in-process OpenAI-compatible stub server (tests/http_stub.py) serving `STUB_MODEL`."""
    with StubServer(STUB_MODEL) as server:
        yield server
