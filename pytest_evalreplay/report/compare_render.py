"""A `RunComparison` as terminal lines (`render_text`) or Markdown (`render_markdown`).

Each metric's paired test is printed by `PairedTest.describe`, the line the
gate's message shows too, so the two read the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_evalreplay.numbers.stats import Interval, PairedTest
from pytest_evalreplay.report.compare import MetricDiff, RunComparison, TaskComparison
from pytest_evalreplay.values.snippets import one_line, printable, shorten


def _value(x: float | None, decimals: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{decimals}f}"


def _signed(x: float | None, decimals: int = 4) -> str:
    return "n/a" if x is None else f"{x:+.{decimals}f}"


def _score(x: float) -> str:
    return f"{x:.4g}"


def _spread(interval: Interval, decimals: int, symmetric: bool) -> str:
    """A run's interval after its value: "+-h" for a t interval, "[lo, hi]" for
    a rating's (asymmetric, an end may be missing); "" when there is none."""
    if symmetric:
        half = interval.half_width
        return "" if half is None else f" +-{half:.{decimals}f}"
    if interval.lo is None and interval.hi is None:
        return ""
    lo = "-inf" if interval.lo is None else _value(interval.lo, decimals)
    hi = "+inf" if interval.hi is None else _value(interval.hi, decimals)
    return f" [{lo}, {hi}]"


def _verdict(p: PairedTest) -> str:
    if p.significant_drop:
        return "significant drop"
    if p.significant_gain:
        return "significant gain"
    return ""


def _paired_text(p: PairedTest) -> str:
    verdict = _verdict(p)
    return p.describe() + (f", {verdict}" if verdict else "")


def _run_name(label: str, model: str | None) -> str:
    return f"{label} ({model})" if model else label


def _counts(t: TaskComparison) -> str:
    what = "tasks judged" if t.elo else "instances scored"
    text = f"{t.num_both} {what} in both runs"
    if t.num_base != t.num_both or t.num_new != t.num_both:
        text += f" (base {t.num_base}, new {t.num_new})"
    return text


def _metric_line(m: MetricDiff, elo: bool) -> str:
    d = m.paired.decimals
    if m.base is None or m.new is None:
        side, value = ("new", m.new) if m.base is None else ("base", m.base)
        return f"  {m.metric}: only in the {side} run ({_value(value, d)})"
    return (
        f"  {m.metric}: {_value(m.base, d)}{_spread(m.base_interval, d, not elo)}"
        f" -> {_value(m.new, d)}{_spread(m.new_interval, d, not elo)}"
        f"  diff {_signed(m.delta, d)}; {_paired_text(m.paired)}"
    )


def render_text(cmp: RunComparison, top: int = 20) -> list[str]:
    """Terminal lines: per task, each metric's change and paired test, then its
    first `top` flips (two lines each: the prompt, then both answers); control
    characters escaped, so no saved text acts on the terminal."""
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    lines = [
        f"evalreplay compare: base {_run_name(cmp.base_label, cmp.base_model)}",
        f"                     new {_run_name(cmp.new_label, cmp.new_model)}",
    ]
    for t in cmp.tasks:
        lines.append(f"{t.task}: {_counts(t)}")
        lines += [_metric_line(m, t.elo) for m in t.metrics]
        what = "verdict flips (mean verdict vs the references both runs used)" if t.elo else "flips"
        lines.append(f"  {what}: {len(t.regressed)} regressed, {len(t.improved)} improved")
        for f in t.flips[:top]:
            sign = "-" if f.regressed else "+"
            lines.append(
                f"    {sign} {f.instance_id} [{f.metric} {_score(f.base)} -> {_score(f.new)}]"
                f" {shorten(f.prompt, 70)}"
            )
            lines.append(
                f'        base: "{shorten(f.base_answer, 50, keep_end=True)}"'
                f'  new: "{shorten(f.new_answer, 50, keep_end=True)}"'
            )
        if len(t.flips) > top:
            lines.append(f"    ... {len(t.flips) - top} more flips not shown")
    if cmp.only_base:
        lines.append(f"only in base: {', '.join(cmp.only_base)}")
    if cmp.only_new:
        lines.append(f"only in new: {', '.join(cmp.only_new)}")
    if not cmp.tasks and not cmp.only_base and not cmp.only_new:
        lines.append("no tasks in either run")
    return [printable(line) for line in lines]  # ids and names from saved files too


def md_escape(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, `|` escaped, and
    `<` escaped so that answer text is never read as HTML."""
    text = one_line(text).replace("\\", "\\\\").replace("|", "\\|")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _md_interval(value: float | None, interval: Interval, decimals: int) -> str:
    if value is None:
        return "n/a"
    if interval.lo is None and interval.hi is None:
        return _value(value, decimals)
    lo = "-inf" if interval.lo is None else _value(interval.lo, decimals)
    hi = "+inf" if interval.hi is None else _value(interval.hi, decimals)
    return f"{_value(value, decimals)} [{lo}, {hi}]"


def render_markdown(cmp: RunComparison) -> str:
    """The whole comparison as Markdown: a metrics table and every flip, per task."""
    out = [
        "# evalreplay comparison",
        "",
        f"- base: {md_escape(_run_name(cmp.base_label, cmp.base_model))}",
        f"- new: {md_escape(_run_name(cmp.new_label, cmp.new_model))}",
        "",
        "Each run's interval is 95%, with the instance as the unit; the paired test is over the "
        "instances both runs scored (an EloEval's: the tasks both judged), the test a gate's "
        "max_drop decides with.",
    ]
    for t in cmp.tasks:
        out += ["", f"## {md_escape(t.task)}", "", f"{_counts(t)}.", ""]
        out.append(_row(["metric", "base [95% CI]", "new [95% CI]", "new - base", "paired test"]))
        out.append(_row(["---"] * 5))
        for m in t.metrics:
            d = m.paired.decimals
            paired = md_escape(_paired_text(m.paired))
            if _verdict(m.paired):
                paired = f"**{paired}**"
            out.append(
                _row(
                    [
                        md_escape(m.metric),
                        _md_interval(m.base, m.base_interval, d),
                        _md_interval(m.new, m.new_interval, d),
                        _signed(m.delta, d),
                        paired,
                    ]
                )
            )
        what = "Verdict flips" if t.elo else "Flips"
        out += ["", f"{what}: {len(t.regressed)} regressed, {len(t.improved)} improved."]
        if t.flips:
            out += [
                "",
                _row(["", "instance", "metric", "base", "new", "prompt", "base answer", "new answer"]),
            ]
            out.append(_row(["---"] * 8))
            for f in t.flips:
                out.append(
                    _row(
                        [
                            "regressed" if f.regressed else "improved",
                            md_escape(f.instance_id),
                            md_escape(f.metric),
                            _score(f.base),
                            _score(f.new),
                            md_escape(shorten(f.prompt, 120)),
                            md_escape(shorten(f.base_answer, 200, keep_end=True)),
                            md_escape(shorten(f.new_answer, 200, keep_end=True)),
                        ]
                    )
                )
    if cmp.only_base or cmp.only_new:
        out += ["", "## Tasks in one run only", ""]
        if cmp.only_base:
            out.append(f"- only in base: {', '.join(md_escape(t) for t in cmp.only_base)}")
        if cmp.only_new:
            out.append(f"- only in new: {', '.join(md_escape(t) for t in cmp.only_new)}")
    return "\n".join(printable(line) for line in out) + "\n"
