"""Credentials hidden from every text the plugin saves or prints.

A server may echo the API key or the `Authorization` header in an error
body, and a user's provider or scorer may put either into an exception: the
journal, the run dir, the report and the terminal take every failure
message and note through `redact`, with the keys `configured_secrets` finds
(docs/providers.md, "Credentials"). Pure: the edges pass the environment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Where the API key is configured, in the order the openai provider reads them.
API_KEY_ENV = ("EVALREPLAY_API_KEY", "OPENAI_API_KEY")
# A configured key shorter than this is not looked for in texts (`EMPTY`, `x`):
# hiding every occurrence of a common word would garble messages, not protect a secret.
MIN_SECRET = 6
HIDDEN = "***"

# `scheme://user:password@` or `scheme://user@` (also inside a longer text).
_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://|^|\s)(?P<user>[^\s/@:]*)(?P<password>:[^\s/@]*)?@"
)
# An Authorization value as a header or a JSON/Python mapping shows it, and a
# bearer token anywhere: the scheme word is kept, the credential hidden.
_AUTHORIZATION = re.compile(
    r"""(?P<lead>authorization["']?\s*[:=]\s*["']?)(?P<scheme>(?:bearer|basic|token)\s+)?[^\s"',;]+""",
    re.IGNORECASE,
)
_BEARER = re.compile(r"""(?P<lead>\bbearer\s+)(?!\*\*\*)[^\s"',;]+""", re.IGNORECASE)


def configured_secrets(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The API keys set in `environ` that are long enough to look for."""
    return tuple(v for name in API_KEY_ENV if len(v := environ.get(name, "")) >= MIN_SECRET)


def redact_url(text: str) -> str:
    """`text` with the credentials of each URL in it hidden: `user:password@`
    becomes `user:***@`, and a URL's bare `user@` (often a token) `***@`
    (an e-mail address outside a URL stays)."""

    def hide(m: re.Match[str]) -> str:
        if m["password"] is not None:
            return f"{m['scheme']}{m['user']}:{HIDDEN}@"
        return f"{m['scheme']}{HIDDEN}@" if "://" in m["scheme"] else m[0]

    return _USERINFO.sub(hide, text)


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` with every credential in it hidden: each configured secret (the
    API key), Authorization values and bearer tokens, and URL passwords."""
    for secret in secrets:
        if len(secret) >= MIN_SECRET:
            text = text.replace(secret, HIDDEN)
    text = _AUTHORIZATION.sub(lambda m: f"{m['lead']}{m['scheme'] or ''}{HIDDEN}", text)
    text = _BEARER.sub(lambda m: f"{m['lead']}{HIDDEN}", text)
    return redact_url(text)
