"""Text renderings of a :class:`~fnlcore.tables.render.RenderedTable`: wide Markdown and HTML.

Both put one line per table row and a column group per (column x metric).
A cell reads ``68.92 ± 0.31 (rep 69.34, Δ −0.42) ⚠``: reproduced mean ± std
over seeds, the reported value, the difference, and a flag when the difference
exceeds the tolerance. Output depends only on the table (no timestamps), so the
same results give the same bytes.
"""

from __future__ import annotations

import html
import math
from typing import Any

# The functions here take a fnlcore.tables.render.RenderedTable; render imports this module
# (not the other way round), so the type is named in annotations only.
RenderedTable = Any

FLAG = "⚠"
DASH = "–"
MINUS = "−"

_CSS = """
.fnl-table{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;margin:1em 0}
.fnl-table h2{font-size:1.15em;margin:0 0 .3em}
.fnl-table .meta{color:#666;font-size:.85em;margin:0 0 .6em}
.fnl-table table{border-collapse:collapse;font-size:.85em}
.fnl-table th,.fnl-table td{border:1px solid #ccc;padding:3px 7px;text-align:center;vertical-align:top}
.fnl-table thead th{background:#f2f2f2}
.fnl-table tbody th{text-align:left;background:#fafafa;white-space:nowrap}
.fnl-table td.ok{background:#e7f5ea}
.fnl-table td.flag{background:#fbd9d7;font-weight:600}
.fnl-table td.pending{color:#888;font-style:italic}
.fnl-table td.ni{color:#999;background:#f4f4f4}
.fnl-table td.nr{color:#666}
.fnl-table .sub{display:block;font-size:.8em;font-weight:400;color:#555;white-space:nowrap}
.fnl-table .legend,.fnl-table .notes{font-size:.85em;color:#444;max-width:70em}
.fnl-table .swatch{display:inline-block;width:.9em;height:.9em;vertical-align:middle;border:1px solid #bbb}
""".strip()


# ----------------------------------------------------------------------------- numbers


def _num(x: float, decimals: int) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "NaN"
    s = f"{x:.{decimals}f}"
    return s.replace("-", MINUS)


def _signed(x: float, decimals: int) -> str:
    return f"{x:+.{decimals}f}".replace("-", MINUS)


def _isnan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


# ----------------------------------------------------------------------------- cell parts


def _cell_parts(rt: "RenderedTable", line: Any) -> dict[str, str]:
    """Pieces of one cell's text: main (value or status word), sub (reported/delta), flag, partial."""
    metric = rt.spec.metric(line.metric)
    d = metric.decimals
    rep = DASH
    if not _isnan(line.reported):
        rep = _num(line.reported, d)
        if not _isnan(line.reported_std):
            rep += f" ± {_num(line.reported_std, d)}"
    repro = ""
    if line.n_seeds > 0:
        repro = _num(line.reproduced_mean, d)
        if line.n_seeds >= 2 and not _isnan(line.reproduced_std):  # one seed has no spread to show
            repro += f" ± {_num(line.reproduced_std, d)}"
    partial = ""
    exp = rt.spec.expected_seeds
    if exp is not None and 0 < line.n_seeds < exp:
        partial = f"[{line.n_seeds}/{exp} seeds]"
    flag = FLAG if line.status == "done" and not bool(line.within_tolerance) else ""
    if line.status == "done":
        main, sub = repro, f"rep {rep}, Δ {_signed(line.delta, d)}"
    elif line.status == "pending":
        main, sub = "pending", f"rep {rep}"
    elif line.status == "not_implemented":
        main, sub = "n.i.", (f"rep {rep}" if rep != DASH else "")
    else:  # not_reported: nothing to compare with, so no 'rep' part
        main, sub = (repro, "") if repro else (DASH, "")
    return {"main": main, "sub": sub, "flag": flag, "partial": partial}


def _cell_markdown(parts: dict[str, str]) -> str:
    text = parts["main"]
    if parts["sub"]:
        text += f" ({parts['sub']})"
    if parts["partial"]:
        text += f" {parts['partial']}"
    if parts["flag"]:
        text += f" {parts['flag']}"
    return text


def cell_text(rt: "RenderedTable", line: Any) -> str:
    """One cell as the Markdown table prints it (``line``: a row of ``rt.long``)."""
    return _cell_markdown(_cell_parts(rt, line))


def number_text(x: float, decimals: int) -> str:
    """A number as the tables print it (``NaN``, and a true minus sign)."""
    return _num(x, decimals)


def _grid(rt: "RenderedTable") -> dict[tuple[str, str, str], Any]:
    return {(ln.row, ln.column, ln.metric): ln for ln in rt.long.itertuples(index=False)}


def _legend_text(rt: "RenderedTable") -> str:
    """Only what applies to this table: tolerances only where a number is compared, etc."""
    spec = rt.spec
    status = set(rt.long["status"])
    parts = [_value_legend(rt)]
    defined = _definitions(rt)
    if defined:
        parts.append(defined)
    if status & {"done", "pending"} or ("not_implemented" in status and rt.long["reported"].notna().any()):
        parts.append("rep = reported value (± reported std); Δ = reproduced − reported.")
    if "done" in status:
        tols = ", ".join(f"{m.label} {_num(spec.tolerance_of(m), m.decimals)}" for m in spec.metrics)
        parts.append(f"{FLAG} = |Δ| above the tolerance ({tols}).")
    words = []
    if "not_implemented" in status:
        words.append("n.i. = method not implemented")
    if (rt.long["n_seeds"] == 0).any() and status & {"pending"}:
        words.append("pending = no runs yet")
    if (rt.long["status"].eq("not_reported") & rt.long["n_seeds"].eq(0)).any():
        words.append(f"{DASH} = no run and no reported number")
    if words:
        parts.append("; ".join(words) + ".")
    if spec.expected_seeds is not None and (rt.long["n_seeds"].between(1, spec.expected_seeds - 1)).any():
        parts.append(f"[k/{spec.expected_seeds} seeds] = only k of the {spec.expected_seeds} seeds are done.")
    return " ".join(parts)


def _definitions(rt: "RenderedTable") -> str:
    """Each metric in words ("Best = ...; Last = ..."), the header labels being short."""
    items = [f"{m.label} = {m.definition}" for m in rt.spec.metrics if m.definition]
    return ("; ".join(items) + ".") if items else ""


def has_reported(rt: "RenderedTable") -> bool:
    """Whether the table sets any reported number beside its cells (the demo and tables at a scale
    not compared with the paper have none: no paper scale, tolerance or rep words apply)."""
    return bool(rt.long["reported"].notna().any()) or len(rt.unmatched_reported) > 0


def _value_legend(rt: "RenderedTable") -> str:
    """What a reproduced number is: a std is claimed only where a cell has one (two seeds or more)."""
    std_kind = "sample std, ddof=1" if rt.spec.std_ddof == 1 else "population std, ddof=0"
    seeds = rt.long["n_seeds"]
    has_std = rt.long["reproduced_std"].notna() & seeds.ge(2)
    if not has_std.any() and (rt.spec.expected_seeds == 1 or (seeds.gt(0).any() and seeds[seeds > 0].eq(1).all())):
        return "Each cell: the reproduced value of one seed, in table units."
    if seeds.eq(1).any():
        return f"Each cell: reproduced mean ± std over seeds ({std_kind}; no std where one seed is done), in table units."
    return f"Each cell: reproduced mean ± std over seeds ({std_kind}), in table units."


def _scale_text(rt: "RenderedTable") -> str:
    """The scale line; none for a table at its own settings with no reported numbers (the demo
    is no paper's table, so "scale paper" would say nothing true)."""
    if rt.spec.scale == "paper" and not has_reported(rt):
        return " No paper reports these numbers: the table shows what its own runs give."
    if not rt.spec.scale_note:
        return ""
    return f" {rt.spec.scale_note[0].upper()}{rt.spec.scale_note[1:]}."


def _paper_text_applies(rt: "RenderedTable") -> bool:
    """Whether the table's and its rows' notes (written for the paper's table: its settings, its
    '-' cells) describe what this table shows: not at a scale that changes the settings."""
    return rt.spec.compared_with_paper


def _header_note(rt: "RenderedTable") -> str:
    """The table's note under its title, where it describes this table (see :func:`_notes`)."""
    return rt.spec.note if _paper_text_applies(rt) else ""


def status_text(rt: "RenderedTable") -> str:
    c = rt.cell_counts()
    text = f"{c['done']} of {c['cells']} cells reproduced, {c['pending']} pending, {c['not_implemented']} not implemented"
    if c["compared"]:
        text += f"; {c['compared']} numbers compared with the paper, {rt.n_flagged()} outside tolerance"
    if not rt.spec.compared_with_paper:
        text += f"; not compared with the paper at {rt.spec.scale or 'this'} scale"
    elif c["no_reported"]:
        text += f"; {c['no_reported']} cells have no reported number"
    text += "."
    if len(rt.unmatched_reported):
        text += f" {len(rt.unmatched_reported)} reported number(s) match no cell of this table."
    return text


def _notes(rt: "RenderedTable") -> list[str]:
    """Row and column notes; at a scale that changes the paper's settings (rounds, warm-up,
    clients) they, and the table's own note, describe the paper's table, not this one: each
    is then marked "paper:" (kept, not dropped: they say which settings the scale shrinks)."""
    out = [f"Row {r.label}: {r.note}" for r in rt.spec.rows if r.note]
    out += [f"Column {c.label}: {c.note}" for c in rt.spec.columns if c.note]
    if _paper_text_applies(rt):
        return out
    table = [f"Table: {rt.spec.note}"] if rt.spec.note else []
    return [f"paper: {n}" for n in table + out]


def _notes_heading(rt: "RenderedTable") -> str:
    if _paper_text_applies(rt):
        return "Notes."
    return (f"Notes on the paper's table (its settings, not this {rt.spec.scale or 'scale'} run's: "
            "the scale line above says what it changes).")


def _header_label(rt: "RenderedTable", column: str, metric_label: str) -> str:
    return column if len(rt.spec.metrics) == 1 else f"{column} · {metric_label}"


# ----------------------------------------------------------------------------- markdown


def _md_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def to_markdown_text(rt: "RenderedTable") -> str:
    """The wide Markdown table with title, legend, status line and notes."""
    spec = rt.spec
    grid = _grid(rt)
    lines = [f"# {_md_escape(spec.title or 'Table ' + spec.table)}", ""]
    lines.append(f"Paper: {_md_escape(spec.paper)}, table {_md_escape(spec.table)}.{_md_escape(_scale_text(rt))}")
    if _header_note(rt):
        lines += ["", _md_escape(_header_note(rt))]
    lines.append("")
    header = ["Method"] + [_header_label(rt, c.label, m.label) for c in spec.columns for m in spec.metrics]
    lines.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    lines.append("|" + "|".join(["---"] + [":---:"] * (len(header) - 1)) + "|")
    for r in spec.rows:
        cells = [_md_escape(r.label)]
        for c in spec.columns:
            for m in spec.metrics:
                cells.append(_md_escape(_cell_markdown(_cell_parts(rt, grid[(r.label, c.label, m.name)]))))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"**Legend.** {_legend_text(rt)}", "", f"**Status.** {status_text(rt)}"]
    notes = _notes(rt)
    if notes:
        lines += ["", f"**{_notes_heading(rt)}**", ""] + [f"- {_md_escape(n)}" for n in notes]
    if rt.code_note:  # runs of other code: a warning, never silent
        lines += ["", f"**Code versions.** {_md_escape(rt.code_note)}"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- html

_STATUS_CLASS = {"pending": "pending", "not_implemented": "ni", "not_reported": "nr"}


def _td(rt: "RenderedTable", line: Any) -> str:
    parts = _cell_parts(rt, line)
    if line.status == "done":
        cls = "flag" if parts["flag"] else "ok"
    else:
        cls = _STATUS_CLASS[line.status]
    tip = f"status: {line.status}; seeds: {line.n_seeds}"
    if line.reported_note:
        tip += f"; reported note: {line.reported_note}"
    body = html.escape(parts["main"])
    if parts["flag"]:
        body += f" {parts['flag']}"
    for extra in (parts["sub"], parts["partial"]):
        if extra:
            body += f'<span class="sub">{html.escape(extra)}</span>'
    return f'<td class="{cls}" title="{html.escape(tip, quote=True)}">{body}</td>'


def _title_attr(note: str) -> str:
    return f' title="{html.escape(note, quote=True)}"' if note else ""


def html_fragment(rt: "RenderedTable") -> str:
    """The table as a ``<div class="fnl-table">`` with its own ``<style>`` (for embedding)."""
    spec = rt.spec
    grid = _grid(rt)
    e = html.escape
    multi = len(spec.metrics) > 1
    out = ['<div class="fnl-table">', f"<style>{_CSS}</style>"]
    out.append(f"<h2>{e(spec.title or 'Table ' + spec.table)}</h2>")
    note = f" {e(_header_note(rt))}" if _header_note(rt) else ""
    out.append(f'<p class="meta">Paper: {e(spec.paper)}, table {e(spec.table)}.{e(_scale_text(rt))}{note}</p>')
    out.append("<table>")
    out.append("<thead>")
    if multi:
        out.append('<tr><th rowspan="2">Method</th>')
        out += [f'<th colspan="{len(spec.metrics)}"{_title_attr(c.note)}>{e(c.label)}</th>' for c in spec.columns]
        out.append("</tr>")
        metric_heads = "".join(f"<th>{e(m.label)}</th>" for _ in spec.columns for m in spec.metrics)
        out.append(f"<tr>{metric_heads}</tr>")
    else:
        column_heads = "".join(f"<th{_title_attr(c.note)}>{e(c.label)}</th>" for c in spec.columns)
        out.append(f"<tr><th>Method</th>{column_heads}</tr>")
    out.append("</thead>")
    out.append("<tbody>")
    for r in spec.rows:
        title = _title_attr(r.note)
        tds = "".join(_td(rt, grid[(r.label, c.label, m.name)]) for c in spec.columns for m in spec.metrics)
        out.append(f"<tr><th{title}>{e(r.label)}</th>{tds}</tr>")
    out.append("</tbody>")
    out.append("</table>")
    swatches = ""
    if "done" in set(rt.long["status"]):  # colours only where a number is compared with the paper
        swatches = ('<span class="swatch" style="background:#e7f5ea"></span> within tolerance '
                    '<span class="swatch" style="background:#fbd9d7"></span> outside tolerance. ')
    out.append(f'<p class="legend">{swatches}{e(_legend_text(rt))}</p>')
    out.append(f'<p class="legend"><b>Status.</b> {e(status_text(rt))}</p>')
    notes = _notes(rt)
    if notes:
        out.append(f'<p class="legend"><b>{e(_notes_heading(rt))}</b></p>')
        out.append('<ul class="notes">' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    if rt.code_note:
        out.append(f'<p class="legend"><b>Code versions.</b> {e(rt.code_note)}</p>')
    out.append("</div>")
    return "\n".join(out) + "\n"


def to_html_text(rt: "RenderedTable") -> str:
    """A complete, self-contained HTML page holding :func:`html_fragment`."""
    scale = f" ({rt.spec.scale} scale)" if rt.spec.scale and rt.spec.scale != "paper" else ""
    title = html.escape(f"{rt.spec.paper} table {rt.spec.table}{scale}: {rt.spec.title}".rstrip(": "))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n</head>\n<body>\n" + html_fragment(rt) + "</body>\n</html>\n"
    )
