"""Reporting: the terminal summary and the Markdown report (live progress is
in `progress`).

The summary prints each task's `TaskDoc` (its metrics.json, computed once by
`metrics.task_outcome`; on the pytest-xdist controller, shipped from the
workers), so the terminal, the Markdown report, metrics.json and the gates
show the same numbers.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_evalreplay.journal import transcripts
from pytest_evalreplay.model import EvalReplayError
from pytest_evalreplay.numbers.metrics import item_name
from pytest_evalreplay.storage.files import atomic_write
from pytest_evalreplay.values.credentials import configured_secrets, redact
from pytest_evalreplay.values.snippets import printable

# Re-exported: the plugin and distributed import live progress from here (its home is `progress`).

__all__ = [
    "Summary",
    "elo_lines",
    "github_step_summary",
    "plural",
    "stage_rows",
    "task_line",
]


SHOWN_EPISODES = 20  # transcripts embedded per task; the rest are counted


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def _metric_text(doc: Mapping[str, Any]) -> str:
    metrics: Mapping[str, float] = doc.get("metrics") or {}
    cis: Mapping[str, Sequence[float]] = doc.get("ci95") or {}
    parts = []
    for name, value in metrics.items():
        ci = cis.get(name)
        parts.append(f"{name}={value:.4f}" + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""))
    return ", ".join(parts) or "no scores"


def _tokens_text(doc: Mapping[str, Any]) -> str | None:
    session = doc.get("session") or {}
    tokens = session.get("tokens") or {}
    parts = []
    for kind in ("generated", "reused"):
        t = tokens.get(kind) or {}
        if t.get("prompt") or t.get("completion"):
            shown = "replayed" if kind == "generated" and session.get("replayed") else kind
            parts.append(f"{t.get('prompt', 0):,} prompt + {t.get('completion', 0):,} completion {shown}")
    return "tokens: " + "; ".join(parts) if parts else None


def task_line(doc: Mapping[str, Any], extra: Mapping[str, int] | None = None) -> str:
    """One task's summary line (plurals right, nothing that is not there)."""
    items, failed, missing = doc.get("num_items", 0), doc.get("num_failed", 0), doc.get("num_missing", 0)
    counts = [plural(doc.get("num_instances", 0), "instance"), plural(items, "item"), f"{failed:,} failed"]
    if missing:
        counts.append(f"{missing:,} missing")
    session = doc.get("session") or {}
    made = "replayed" if session.get("replayed") else "generated"  # from a saved run, or by the model
    done = [f"{session.get('generated', 0):,} {made}", f"{session.get('reused', 0):,} reused"]
    extra = extra or {}
    if extra.get("changed_request"):
        done.append(f"{extra['changed_request']:,} regenerated (request changed)")
    if extra.get("changed_provider"):
        done.append(f"{extra['changed_provider']:,} regenerated (provider changed)")
    line = f"{doc['task']}: {', '.join(counts)} | {', '.join(done)} | {_metric_text(doc)}"
    tokens = _tokens_text(doc)
    return line + (f" | {tokens}" if tokens else "")


def _num(value: Any, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value, fmt)


def stage_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    """An ELO eval's per-stage table: references, tasks, judged pairs,
    wins/ties/losses, rating +- SE (cumulative over the stages so far), interval;
    judge replies that could not be read are counted beside the judged pairs."""
    rows = []
    for st in (doc.get("elo") or {}).get("stages", []):
        lo, hi = (st.get("ci95") or [None, None])[:2]
        rows.append(
            [
                str(st["stage"]) + ("" if st.get("complete") else " (incomplete)"),
                ", ".join(st.get("references", [])) or "-",
                str(len(st.get("task_ids", []))),
                str(st.get("judged", 0))
                + (f" ({st['no_answer']} without a reference answer)" if st.get("no_answer") else "")
                + (f" ({st['unreadable']} unreadable replies)" if st.get("unreadable") else ""),
                f"{st.get('wins', 0)}/{st.get('ties', 0)}/{st.get('losses', 0)}",
                f"{_num(st.get('rating'))} +- {_num(st.get('se'))}",
                f"[{_num(lo)}, {_num(hi)}]",
            ]
        )
    return rows


STAGE_HEADER = ["stage", "references", "tasks", "judged pairs", "W/T/L", "rating +- SE", "95% interval"]


def elo_lines(doc: Mapping[str, Any]) -> list[str]:
    elo = doc.get("elo")
    if not elo:
        return []
    rows = stage_rows(doc)
    widths = [max(len(r[i]) for r in [STAGE_HEADER, *rows]) for i in range(len(STAGE_HEADER))]
    out = ["  " + "  ".join(h.ljust(w) for h, w in zip(STAGE_HEADER, widths, strict=True))]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    final = f"  rating {_num(elo.get('rating'))}"
    if elo.get("se") is not None:
        final += f" +- {_num(elo.get('se'))}"
    lo, hi = (elo.get("ci95") or [None, None])[:2]
    final += f", 95% interval [{_num(lo)}, {_num(hi)}] ({elo.get('interval')}), seed {elo.get('seed')}"
    out.append(final)
    if elo.get("note"):
        out.append(f"  note: {elo['note']}")
    return out


@dataclass
class Summary:
    """What the summary and the report show, gathered as the session goes."""

    docs: dict[str, tuple[int, dict[str, Any], dict[str, int]]] = field(default_factory=dict)
    gates: dict[str, tuple[bool, str]] = field(default_factory=dict)  # task -> (passed, verdict)
    notes: list[str] = field(default_factory=list)
    run_dir: str | None = None
    comparison: tuple[list[str], str] | None = None  # terminal lines, Markdown
    flipped: dict[str, set[str]] = field(default_factory=dict)  # task -> instances flipped vs --compare
    # The API keys hidden from every line printed and the report (failure texts quote servers).
    secrets: tuple[str, ...] = field(default_factory=lambda: configured_secrets(os.environ), repr=False)

    def compare_with(self, saved: Path, top: int = 20) -> None:
        """Compare this run's tasks (as its run dir holds them) with a saved run dir."""
        from pytest_evalreplay.report.compare import compare_runs
        from pytest_evalreplay.report.compare_render import render_markdown, render_text
        from pytest_evalreplay.rundir.snapshot import RunSnapshot, load_run_dir

        if not self.docs or self.run_dir is None:
            return
        try:
            base, new = load_run_dir(saved), load_run_dir(Path(self.run_dir))
        except EvalReplayError as exc:
            self.add_note(f"comparison with {saved} not made: {exc}")
            return
        names = set(self.docs)
        cmp = compare_runs(
            RunSnapshot(base.label, {t: v for t, v in base.tasks.items() if t in names}, base.model),
            RunSnapshot("this run", {t: v for t, v in new.tasks.items() if t in names}, new.model),
        )
        self.comparison = (render_text(cmp, top=top), render_markdown(cmp))
        self.flipped = {t.task: {f.instance_id for f in t.flips} for t in cmp.tasks if t.flips and not t.elo}

    def add_doc(self, task: str, seen: int, doc: dict[str, Any], extra: dict[str, int]) -> None:
        """Keep the fullest view of a task (xdist workers each send theirs)."""
        known = self.docs.get(task)
        if known is None or seen >= known[0]:
            self.docs[task] = (seen, doc, extra)

    def add_note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def add_report(self, report: pytest.TestReport) -> None:
        props: Mapping[str, Any] = dict(report.user_properties)
        gated = props.get("evalreplay.gate")
        if gated is None or not (report.when == "call" or report.failed):
            return
        text = props.get("gate.summary") or f"FAIL {report.longreprtext.strip()}"
        self.gates[str(gated)] = (report.passed, str(text))

    def lines(self) -> list[str]:
        out = [f"run dir: {self.run_dir}"] if self.run_dir and self.docs else []
        for _, (_, doc, extra) in sorted(self.docs.items()):
            out.append(task_line(doc, extra))
            out.extend(elo_lines(doc))
        out += [f"gate {name}: {verdict}" for name, (_, verdict) in sorted(self.gates.items())]
        if self.comparison is not None:
            out += self.comparison[0]
        out += [f"note: {note}" for note in self.notes]
        return [printable(redact(line, self.secrets), keep_newlines=True) for line in out]  # quoting answers

    def terminal(self, tr: pytest.TerminalReporter) -> None:
        lines = self.lines()
        if not lines:
            return
        tr.write_sep("=", "evalreplay summary")
        for line in lines:
            tr.write_line(line)

    def markdown(self) -> str:
        lines = ["# evalreplay summary", ""]
        if self.run_dir:
            lines += [f"Run dir: `{self.run_dir}`", ""]
        lines += [
            "| task | items | failed | missing | generated | reused | metrics |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for _, (_, d, _) in sorted(self.docs.items()):
            lines.append(
                f"| {d['task']} | {d.get('num_items', 0)} | {d.get('num_failed', 0)} "
                f"| {d.get('num_missing', 0)} "
                f"| {d.get('session', {}).get('generated', 0)} | {d.get('session', {}).get('reused', 0)} "
                f"| {_metric_text(d)} |"
            )
        for _, (_, d, _) in sorted(self.docs.items()):
            rows = stage_rows(d)
            if rows:
                lines += ["", f"## {d['task']}: stages", "", "| " + " | ".join(STAGE_HEADER) + " |"]
                lines.append("|" + "---|" * len(STAGE_HEADER))
                lines += ["| " + " | ".join(r) + " |" for r in rows]
        if self.gates:
            lines += ["", "| gate | verdict | details |", "|---|---|---|"]
            for name, (passed, verdict) in sorted(self.gates.items()):
                details = verdict.split(" ", 1)[1] if " " in verdict else verdict
                details = details.replace("|", "\\|").replace("\n", "<br>")
                lines.append(f"| {name} | {'pass' if passed else '**FAIL**'} | {details} |")
        if self.comparison is not None:
            lines += ["", self.comparison[1].rstrip()]
        for _, (_, d, _) in sorted(self.docs.items()):
            lines += self._transcripts(d)
        if self.notes:
            lines += ["", *[f"- {note}" for note in self.notes]]
        return "\n".join(printable(redact(line, self.secrets), keep_newlines=True) for line in lines) + "\n"

    def _transcripts(self, doc: Mapping[str, Any]) -> list[str]:
        """An agent task's failed and flipped episodes, each embedded (in a
        collapsed block) and linked to its line of the run dir's transcripts."""
        if self.run_dir is None:
            return []
        task = doc["task"]
        path = transcripts.transcripts_path(Path(self.run_dir), task)
        failed, flipped = set(doc.get("failed") or ()), self.flipped.get(task, set())
        if not (failed or flipped) or not path.is_file():
            return []
        try:
            rows = transcripts.numbered_rows(path)
        except OSError as exc:
            return ["", f"{task}: transcripts not shown, {path} cannot be read ({exc.strerror})"]
        shown = []
        for lineno, row in rows:
            name = item_name((row.get("stage"), row.get("instance_id"), row.get("rollout")))
            why = [
                w
                for w, hit in (("failed", name in failed), ("flipped", row.get("instance_id") in flipped))
                if hit
            ]
            if why:
                shown.append((lineno, name, " and ".join(why), row))
        if not shown:
            return []
        out = ["", f"## {task}: transcripts of failed and flipped episodes", ""]
        out.append(f"{plural(len(shown), 'episode')}, from [{path.name}]({path.as_uri()})")
        for lineno, name, why, row in shown[:SHOWN_EPISODES]:
            out += ["", f"<details><summary>{html.escape(name)}: {why} (line {lineno})</summary>", ""]
            out += transcripts.markdown(row)
            out += ["", "</details>"]
        if len(shown) > SHOWN_EPISODES:
            out += ["", f"{len(shown) - SHOWN_EPISODES:,} more in {path}"]
        return out

    def write_markdown(self, path: Path) -> str:
        if path.is_dir():
            raise EvalReplayError(f"--evalreplay-report {path} is a directory; name a file such as report.md")
        markdown = self.markdown()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EvalReplayError(
                f"--evalreplay-report {path}: cannot create its folder ({exc.strerror})"
            ) from None
        atomic_write(path, markdown.encode())
        return markdown


def github_step_summary(markdown: str) -> Path | None:
    """Append the report to $GITHUB_STEP_SUMMARY when GitHub Actions sets it."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(markdown)
    return path
