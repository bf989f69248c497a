"""The echo provider's conftest, shared by the pytester projects that need
a provider answering every prompt the same way ("answer <instance id>")."""

from __future__ import annotations

CONFTEST = """
from pytest_evalreplay import Generation

class Echo:
    kind, model, batch_size = "echo", "echo-1", None

    def generate(self, requests):
        return [[Generation(text="answer " + r.instance_id) for _ in r.rollouts] for r in requests]

def pytest_evalreplay_make_provider(config, kind):
    return Echo() if kind == "echo" else None
"""
