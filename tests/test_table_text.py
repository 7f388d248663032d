"""Tables and tools that explain themselves (issue: the smoke table fedgr/1 and the demo):
every metric defined in words in every format, no paper scale or tolerance legend on a table
without reported numbers, '± std' only with two seeds or more, titles at the rounds actually
run, one cell count in the table and in `fnl tables`, notes on the paper's settings marked as
the paper's at a scale that changes them, and round lines that read right."""

from __future__ import annotations

import logging
import math

import pandas as pd
import pytest

from fnlcore import cli
from fnlcore.app.build_table import build_table, spec_at_rounds
from fnlcore.app.papers import Scale, load_paper
from fnlcore.io import read_parquet, write_parquet
from fnlcore.progress import ROUND_LINE, console_filter, round_line
from fnlcore.tables import ColumnSpec, MetricSpec, RowSpec, TableSpec, render


def _table(paper: str, table: str, scale: str):
    return next(t for t in load_paper(paper, Scale.load(scale)) if t.table == table)


def _build(pt, tmp_path, rounds: int):
    """Build ``pt`` from fake metrics files of ``rounds`` rounds each (every round in the stage the table counts)."""
    from fnlcore.methods import METHODS

    files = []
    for i, tr in enumerate(pt.runs):
        path = tmp_path / f"run{i}.parquet"
        acc = [0.5 + 0.01 * r + 0.001 * i for r in range(rounds)]
        stage = (getattr(METHODS[tr.run.method.name], "reported_stages", None) or ["main"])[-1]
        write_parquet(pd.DataFrame({"round": range(rounds), "stage": stage, "bacc": acc, "acc": acc}), str(path))
        files.append(str(path))
    outputs = {k: str(tmp_path / f"t{s}") for k, s in
               {"csv": ".csv", "md": ".md", "html": ".html", "curves": ".curves.png"}.items()}
    rendered = build_table(pt, files, outputs, read_parquet)
    out = {k: open(v, encoding="utf-8").read() for k, v in outputs.items() if k != "curves"}
    return rendered, {**out, "csv_path": outputs["csv"]}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return _build(_table("demo", "demo", "paper"), tmp_path_factory.mktemp("demo"), rounds=30)


@pytest.fixture(scope="module")
def fedgr_smoke(tmp_path_factory):
    pt = _table("fedgr", "1", "smoke")
    return pt, *_build(pt, tmp_path_factory.mktemp("fedgr"), rounds=4)


# -- Best and Last in words, in every format ---------------------------------------------


def test_best_and_last_are_defined_in_every_format(demo):
    rendered, out = demo
    best = "Best = the highest test bacc over the rounds (best round)"
    last = "Last = mean test bacc of the last 10 rounds"
    assert best in out["md"] and last in out["md"]
    assert best in out["html"] and last in out["html"]
    csv = pd.read_csv(out["csv_path"])
    defs = dict(zip(csv["metric"], csv["metric_definition"]))
    assert defs["bacc_mean_last10_rounds"] == "mean test bacc of the last 10 rounds"
    assert set(csv.loc[csv["metric"] == "bacc_best_round", "metric_label"]) == {"Best"}


# -- a table without reported numbers ------------------------------------------------------


def test_a_table_without_reported_numbers_has_no_paper_scale_and_no_tolerance_legend(demo):
    rendered, out = demo
    assert not rendered.long["reported"].notna().any()
    for text in (out["md"], out["html"]):
        assert "Scale paper" not in text and "scale paper" not in text
        assert "tolerance" not in text
        assert "No paper reports these numbers" in text


# -- std only with two seeds or more ---------------------------------------------------------


def _small(ddof: int, seeds: int) -> TableSpec:
    return TableSpec(paper="P", table="1", title="t", rows=(RowSpec("A"),), columns=(ColumnSpec("c"),),
                     metrics=(MetricSpec("m", "Last"),), std_ddof=ddof, expected_seeds=seeds)


@pytest.mark.parametrize("ddof", [0, 1])
def test_one_seed_prints_no_std(ddof):
    runs = pd.DataFrame({"row": ["A"], "column": ["c"], "metric": ["m"], "seed": [0], "value": [0.105]})
    rt = render(_small(ddof, 1), runs, None)
    assert math.isnan(rt.long["reproduced_std"].iloc[0])
    assert "| A | 10.50 |" in rt.markdown() and "±" not in rt.markdown().split("**Legend.**")[0]
    assert ">10.50<" in rt.html() and "± 0.00" not in rt.html()


def test_two_seeds_print_their_std():
    runs = pd.DataFrame({"row": ["A", "A"], "column": ["c", "c"], "metric": ["m", "m"], "seed": [0, 1],
                         "value": [0.10, 0.12]})
    rt = render(_small(0, 2), runs, None)
    assert "| A | 11.00 ± 1.00 |" in rt.markdown()


def test_the_fedgr_smoke_table_has_no_zero_std(fedgr_smoke):
    _, rendered, out = fedgr_smoke
    assert "± 0.00" not in out["md"] and "± 0.00" not in out["html"]


# -- titles and definitions at the rounds run ---------------------------------------------------


def test_titles_and_definitions_say_the_rounds_actually_averaged(fedgr_smoke):
    pt, rendered, out = fedgr_smoke
    assert "last 10 rounds" in pt.spec.title  # the paper's title
    assert "mean of the last 4 rounds (of the table's 10)" in rendered.spec.title
    assert "last 10 rounds," not in out["md"].splitlines()[0]
    assert "Last10 = mean test acc of the last 4 rounds: every round this run has" in out["md"]
    # before any run, `fnl tables` says the same from the rounds the runs are set to
    assert spec_at_rounds(pt).title == rendered.spec.title
    # at the paper's 500 rounds the title is the paper's own
    paper = _table("fedgr", "1", "paper")
    assert spec_at_rounds(paper).title == paper.spec.title


# -- one cell count --------------------------------------------------------------------------


def test_the_table_and_fnl_tables_count_the_same_cells(fedgr_smoke, capsys, tmp_path):
    pt, rendered, out = fedgr_smoke
    counts = rendered.cell_counts()
    assert counts["cells"] == len(pt.spec.rows) * len(pt.spec.columns) == 144
    assert cli.table_cells(pt, str(tmp_path))["cells"] == counts["cells"]
    assert cli.main(["tables", "--scale", "smoke", "--results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("scale smoke")  # the scale, once
    header = lines[1].split()
    assert header[:6] == ["paper", "table", "cells", "done", "pending", "n.i."]
    fedgr1 = next(ln.split() for ln in lines if ln.split()[:2] == ["fedgr", "1"])
    assert fedgr1[2:6] == ["144", "0", "144", "0"]
    assert "of 144 cells reproduced" in out["md"]


def test_an_average_cell_is_done_when_the_cells_it_averages_are(tmp_path):
    pt = _table("fedgr", "1", "smoke")
    for tr in pt.runs:
        if tr.row == "FedAvg" and tr.column.startswith("IID"):
            path = tmp_path / tr.run.files(str(tmp_path))["metrics"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x")
    c = cli.table_cells(pt, str(tmp_path))
    iid = [col for col in pt.spec.columns if col.label.startswith("IID")]
    assert c["done"] == len(iid)  # the 7 measured IID cells and the IID Avg


# -- the paper's settings at a scale that changes them ---------------------------------------


def test_paper_notes_are_marked_as_the_papers_at_smoke_scale(fedgr_smoke):
    _, rendered, out = fedgr_smoke
    md = out["md"]
    head = md.split("| Method")[0]
    assert "stay empty" not in head  # no '-' cell at smoke: no reported numbers
    lines = [ln for ln in md.splitlines() if "263 fine-tuning" in ln or "100 warm-up rounds" in ln
             or "stay empty" in ln]
    assert lines and all(ln.startswith("- paper: ") for ln in lines)
    assert "Notes on the paper's table" in md and "Notes on the paper&#x27;s table" in out["html"]


def test_paper_notes_stay_plain_at_paper_scale():
    pt = _table("fedgr", "1", "paper")
    md = render(pt.spec, None, None).markdown()
    assert "stay empty" in md.split("| Method")[0] and "- paper: " not in md


# -- round lines -----------------------------------------------------------------------------


def test_the_last_round_line_reads_finished():
    line = round_line(29, 30, "[main] bacc=0.5000 (0.1s)")
    assert line == "round 29/29 (30 of 30) [main] bacc=0.5000 (0.1s)"
    assert round_line(0, 30, "x").startswith("round 0/29 (1 of 30)")  # 0-based, as metrics and curves
    m = ROUND_LINE.match(line)
    assert m and (m.group(1), m.group(2)) == ("29", "29")
    keep = console_filter()
    rec = lambda msg: logging.LogRecord("x", logging.INFO, "", 0, msg, None, None)  # noqa: E731
    assert keep(rec(line)) and keep(rec(round_line(0, 30, "x"))) and not keep(rec(round_line(1, 30, "x")))


def test_training_prints_its_rounds_with_round_line():
    import inspect

    from fnlcore.fl import simulation

    src = inspect.getsource(simulation)
    assert "round_line(r, total," in src and 'f"round {r}/{total - 1}' not in src
