"""The HTML report: one self-contained file rendered from `html_data.build`.

jinja2 (the `html` extra) renders the page shell with autoescaping; the
report's data is embedded once, as JSON in a `<script type="application/json">`
with every `<` written `\\u003c` (so no text can close the script or open a
comment), and the page's own inline script renders each view from it on
demand: 20,000 samples are one JSON parse, not 20,000 rows of markup. No
network is needed or used to open it (no CDN, font or remote script).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.stats import ALPHA
from pytest_evalreplay.report.html_data import Gates, build
from pytest_evalreplay.storage.files import atomic_write

TEMPLATES = Path(__file__).parent / "templates"
INSTALL = "pip install 'pytest-evalreplay[html]'"


def embedded_json(data: Mapping[str, Any]) -> str:
    """`data` as JSON that is safe inside a script element: `<` never appears
    raw (JSON.parse reads `\\u003c` back as `<`)."""
    return orjson.dumps(data).decode().replace("<", "\\u003c")


def render(data: Mapping[str, Any]) -> str:
    """The page for `data` (what `html_data.build` returns)."""
    try:
        import jinja2
    except ImportError:
        raise EvalReplayError(f"the HTML report needs jinja2, which is not installed: {INSTALL}") from None
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    template = env.get_template("report.html.j2")
    manifest = data["manifest"]
    title = f"evalreplay: {manifest.get('model') or 'run'} ({data['run_dir']})"
    return template.render(
        title=title,
        data=data,
        style=(TEMPLATES / "report.css").read_text(encoding="utf-8"),
        script=(TEMPLATES / "report.js").read_text(encoding="utf-8"),
        payload=embedded_json(data),
    )


def check_target(path: Path, option: str) -> None:
    """A report path must name a file in a folder we can create."""
    if path.is_dir():
        raise EvalReplayError(f"{option} {path} is a directory; name a file such as report.html")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvalReplayError(f"{option} {path}: cannot create its folder ({exc.strerror})") from None


def write_report(
    path: Path,
    run_dir: Path,
    base: Path | None = None,
    gates: Gates | None = None,
    alpha: float = ALPHA,
    option: str = "-o",
) -> int:
    """Write the report of `run_dir` (compared with `base`) to `path`; its size in bytes."""
    check_target(path, option)
    page = render(build(run_dir, base, gates, alpha)).encode()
    atomic_write(path, page)
    return len(page)
