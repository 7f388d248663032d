"""Build a paper table from its finished runs: summaries per cell, the rendered table
beside the reported numbers, plain-language comparison notes and the curve figure."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence
from dataclasses import replace
import html
import math
import re

from .papers import PaperTable, TableRun
from ..io import atomic_path
from ..metrics import _curve, summarise
from ..provenance import other_code_runs, other_code_text
from ..tables import load_reported, render
from ..tables.curves import curve_stats

def _run_rule(tr: TableRun, rule):
    """The metric's summary rule for one run: limited to the method's reported stages."""

    # lazy: imports torch; fnlcore.app.build_table imports without it (envs/labels.yaml)
    from ..methods import METHODS

    stages = getattr(METHODS[tr.run.method.name], "reported_stages", None)
    return rule if rule.stages is not None or stages is None else replace(rule, stages=tuple(stages))


def summarise_run(pt: PaperTable, tr: TableRun, metrics_df) -> list[dict]:
    """One value per table metric for one finished run (rounds limited to the method's reported stages)."""

    out = []
    for name, mr in pt.metrics.items():
        out.append({"row": tr.row, "column": tr.column, "metric": name, "seed": tr.run.seed,
                    "value": summarise(metrics_df, mr.source, _run_rule(tr, mr.rule))})
    return out


def rounds_averaged(pt: PaperTable, tr: TableRun, metrics_df) -> dict[str, int]:
    """For each ``last_mean`` metric: how many rounds its value of this run averages (its ``n``,
    or fewer when the run, or the stages that count, has fewer evaluated rounds)."""

    out = {}
    for name, mr in pt.metrics.items():
        if mr.rule.kind == "last_mean":
            rule = _run_rule(tr, mr.rule)
            out[name] = min(rule.n, len(_curve(metrics_df, mr.source, None, rule.stages)))
    return out


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def metric_definition(source: str, rule, averaged=None) -> str:
    """A metric in words, at the rounds actually run: ``averaged`` = the rounds each run's
    ``last_mean`` value averages (``None``: not known yet, the rule's ``n``)."""
    stages = f" of stage {'/'.join(rule.stages)}" if rule.stages else ""
    if rule.kind == "best":
        return f"the highest test {source} over the rounds{stages} (best round)"
    if rule.kind == "final":
        return f"test {source} at the last round"
    if not averaged or min(averaged) >= rule.n:
        return f"mean test {source} of the last {rule.n} rounds{stages}"
    return (f"mean test {source} of the last {_span(averaged)} rounds{stages}: every round this run has "
            f"(the table's definition averages the last {rule.n})")


def title_at_rounds(title: str, n: int, averaged) -> str:
    """``title`` with its "last <n> rounds" at the rounds actually averaged (a smoke run of 4
    rounds has no last 10: its title says "last 4 rounds (of the table's 10)")."""

    if not averaged or min(averaged) >= n:
        return title
    return re.sub(rf"\blast {n} rounds\b", f"last {_span(averaged)} rounds (of the table's {n})", title)


def spec_at_rounds(pt: PaperTable, averaged: Mapping[str, Sequence[int]] | None = None):
    """The table's spec with its metrics defined in words and its title at the rounds run.

    ``averaged``: metric name -> the rounds each run's value averages (:func:`rounds_averaged`);
    ``None``: the rounds the runs are set to train (before any has run, for ``fnl tables``).
    """

    if averaged is None:
        planned = [tr.run.training.rounds for tr in pt.runs]
        averaged = {name: [min(mr.rule.n, r) for r in planned]
                    for name, mr in pt.metrics.items() if mr.rule.kind == "last_mean"}
    metrics = []
    title = pt.spec.title
    for m in pt.spec.metrics:
        mr = pt.metrics.get(m.name)
        if mr is None:
            metrics.append(m)
            continue
        got = averaged.get(m.name)
        if not m.definition:
            m = replace(m, definition=metric_definition(mr.source, mr.rule, got))
        if mr.rule.kind == "last_mean":
            title = title_at_rounds(title, mr.rule.n, got)
        metrics.append(m)
    return replace(pt.spec, metrics=tuple(metrics), title=title)


def build_table(pt: PaperTable, metrics_files: Sequence[str], outputs: Mapping[str, str], read_metrics) -> Any:
    """Render a table from its runs' metrics files; ``read_metrics(path) -> DataFrame``.

    ``metrics_files`` are in the order of ``pt.runs`` (the rule's inputs); ``outputs`` maps
    csv, md, html and curves to their paths. Writes csv, md, html (reproduced beside
    reported, delta, tolerance flags, "n.i." rows) and a figure of the test-metric curves
    (one panel per column).
    """

    import pandas as pd  # lazy: pandas only where a table is built


    if len(metrics_files) != len(pt.runs):
        raise ValueError(f"table {pt.name}: {len(metrics_files)} metrics files for {len(pt.runs)} runs")
    rows, curves, averaged = [], {}, {}
    for tr, path in zip(pt.runs, metrics_files):
        df = read_metrics(path)
        rows += summarise_run(pt, tr, df)
        for name, k in rounds_averaged(pt, tr, df).items():
            averaged.setdefault(name, []).append(k)
        curves.setdefault(tr.column, {}).setdefault(tr.row, []).append(df.assign(seed=tr.run.seed))
    runs = pd.DataFrame(rows, columns=["row", "column", "metric", "seed", "value"])
    reported = load_reported(pt.reported) if pt.reported is not None else None
    rendered = render(spec_at_rounds(pt, averaged), runs, reported)
    rendered = replace(rendered, code_note=_code_note(pt, metrics_files))
    notes = comparison_notes(pt, runs)
    source = next(iter(pt.metrics.values())).source if pt.metrics else "acc"
    with _written_together(outputs) as tmp:
        rendered.to_csv(tmp["csv"])
        _write_with_notes(rendered.markdown(), notes, tmp["md"], markdown=True)
        _write_with_notes(rendered.html(), notes, tmp["html"], markdown=False)
        plot_curve_grid({c: {r: pd.concat(v) for r, v in rows_.items()} for c, rows_ in curves.items()}, source,
                        tmp["curves"], title=curves_title(pt, source))
    return rendered


# The csv is the table's data (what scripts read): it is renamed into place last.
_LAST = "csv"


@contextlib.contextmanager
def _written_together(outputs: Mapping[str, str]) -> Iterator[dict[str, Path]]:
    """Temporary paths for every file of a table, renamed onto ``outputs`` only once all are
    written, the csv last: a job killed while writing leaves no csv, so a table never looks
    finished with its Markdown, HTML or figure missing (or with those of an older build)."""

    order = sorted(outputs, key=lambda k: k != _LAST)  # entered first, so renamed last (LIFO exit)
    with contextlib.ExitStack() as stack:
        tmp = {k: stack.enter_context(atomic_path(outputs[k])) for k in order}
        yield tmp
        # All written. The last good table stays in place until here (the rule's outputs are
        # update(): a failed job keeps it); its csv goes first, so a kill during the renames
        # leaves no csv, never a csv beside another build's Markdown.
        Path(outputs[_LAST]).unlink(missing_ok=True)


def _code_note(pt: PaperTable, metrics_files: Sequence[str]) -> str:
    """The footer naming the runs made by another code version than the one building the table."""

    labels = {str(p): f"{tr.row} / {tr.column} / seed {tr.run.seed}" for tr, p in zip(pt.runs, metrics_files)}
    return other_code_text(other_code_runs(metrics_files), labels, total=len(metrics_files),
                           this="the one that built this table")


def curves_title(pt: PaperTable, source: str) -> str:
    """The figure's title: the table, the metric and the scale (the demo is no paper: no "paper scale")."""
    scale = "the table's own settings" if pt.scale == "paper" else f"{pt.scale} scale"
    return f"{pt.paper} table {pt.table}: test {source} per round ({scale})"


def comparison_notes(pt: PaperTable, runs) -> list[str]:
    """Plain statements for the table's ``compare`` entries, true whatever the outcome.

    Each entry: {row: A, against: B, metric: name, columns: [...] (default all)}.
    """
    notes = []
    for c in pt.compare:
        metric, a, b = c["metric"], c["row"], c["against"]
        label = next((m.label for m in pt.spec.metrics if m.name == metric), metric)
        for col in c.get("columns") or [x.label for x in pt.spec.columns]:
            sel = runs[(runs.metric == metric) & (runs.column == col)]
            va = sel[sel.row == a].value.mean()
            vb = sel[sel.row == b].value.mean()
            if sel.empty or va != va or vb != vb:
                notes.append(f"{col}: {a} vs {b} ({label}) — not computed yet.")
                continue
            verdict = "beats" if va > vb else ("ties with" if va == vb else "does NOT beat")
            notes.append(f"{col}: {a} {verdict} {b} on {label} ({100 * va:.2f} vs {100 * vb:.2f}).")
    return notes


def _write_with_notes(text: str, notes: list[str], path: str, markdown: bool) -> None:
    if notes:
        if markdown:
            text = text.rstrip("\n") + "\n\n**Observations**\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
        else:
            items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
            block = f'<div class="fnl-observations"><strong>Observations</strong><ul>{items}</ul></div>'
            text = text.replace("</body>", block + "</body>") if "</body>" in text else text + block
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def plot_curve_grid(curves: Mapping[str, Mapping[str, Any]], metric: str, path: str, title: str = "") -> None:
    """One panel per table column, one line (mean over seeds) per row."""

    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib only where a figure is drawn
    from matplotlib.figure import Figure  # lazy: matplotlib only where a figure is drawn


    cols = list(curves)
    n = max(len(cols), 1)
    ncol = min(n, 3)
    nrow = math.ceil(n / ncol)
    fig = Figure(figsize=(4.2 * ncol, 3.2 * nrow), dpi=100)
    FigureCanvasAgg(fig)
    for i, col in enumerate(cols):
        ax = fig.add_subplot(nrow, ncol, i + 1)
        for row, df in curves[col].items():
            st = curve_stats(df, metric, f"{col}/{row}")
            ax.plot(st["round"], 100 * st["mean"], label=row, linewidth=1.3)
        ax.set_title(col, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(f"{metric} (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
