"""Tables: reported CSVs, aggregation over seeds, rendering beside reported, writers and curves."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fnlcore.app.runs import REPORTED_DIR
from fnlcore.errors import ConfigError, DataError
from fnlcore.tables import (
    ColumnSpec,
    MetricSpec,
    RowSpec,
    TableSpec,
    aggregate_runs,
    copy_reported,
    load_reported,
    place_reported,
    plot_curves,
    render,
)

HEADER = "paper,table,dataset,partition,noise_setting,method,metric,value,std,rho,note\n"


def _write_reported(path, lines):
    path.write_text(HEADER + "".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def reported_csv(tmp_path):
    """A FedNoRo-like table: 3 methods x 2 noise settings x {best, last}; FedX clean is a '-' cell."""
    lines = []
    values = {
        ("FedAvg", "clean"): (69.34, 68.92),
        ("FedAvg", "rho0.4"): (60.52, 60.05),
        ("FedNoRo", "clean"): (71.00, 70.50),
        ("FedNoRo", "rho0.4"): (70.69, 70.14),
        ("FedX", "rho0.4"): (55.00, 54.00),
    }
    for (method, noise), (b, l) in values.items():
        lines.append(f"P,1,ICH,bd,{noise},{method},bacc_best,{b},0.50,0.4,")
        lines.append(f"P,1,ICH,bd,{noise},{method},bacc_last,{l},,0.4,")
    lines.append("P,1,ICH,bd,clean,FedX,bacc_best,,,0.0,denoising method at rho=0")
    lines.append("P,1,ICH,bd,clean,FedX,bacc_last,,,0.0,denoising method at rho=0")
    lines.append("P,1,ICH,bd,clean,FedOther,bacc_best,50.00,,0.0,")  # a method the spec leaves out
    return _write_reported(tmp_path / "p_table1.csv", lines)


@pytest.fixture
def spec():
    return TableSpec(
        paper="P",
        table="1",
        title="BACC on ICH",
        rows=(RowSpec("FedAvg"), RowSpec("FedNoRo", note="ours"), RowSpec("FedX", status="not_implemented")),
        columns=(ColumnSpec("Clean", key=("clean",)), ColumnSpec("ρ=0.4", key=("rho0.4",), note="H-IDN")),
        metrics=(MetricSpec("bacc_best", "Best"), MetricSpec("bacc_last", "Last", tolerance=0.5)),
        tolerance=1.0,
        std_ddof=1,
        expected_seeds=3,
    )


def _runs(cells):
    """cells: {(row, column, metric): [values per seed]} -> runs table."""
    rows = [(r, c, m, s, v) for (r, c, m), vals in cells.items() for s, v in enumerate(vals)]
    return pd.DataFrame(rows, columns=["row", "column", "metric", "seed", "value"])


# --------------------------------------------------------------------------- reported CSVs


def test_load_reported_types_and_dash_cells(reported_csv):
    rep = load_reported(reported_csv)
    assert rep["value"].dtype == np.float64 and rep["std"].dtype == np.float64
    dash = rep[(rep["method"] == "FedX") & (rep["noise_setting"] == "clean")]
    assert dash["value"].isna().all() and (dash["note"] == "denoising method at rho=0").all()
    assert rep.loc[0, "std"] == 0.5 and math.isnan(rep.loc[1, "std"])
    assert rep.loc[0, "rho"] == "0.4"  # key columns keep their spelling


def test_load_reported_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_reported(tmp_path / "nope.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match="empty"):
        load_reported(tmp_path / "empty.csv")
    (tmp_path / "cols.csv").write_text("paper,table,method,value\nP,1,A,1.0\n")
    with pytest.raises(DataError, match=r"lacks column\(s\) \['dataset'"):
        load_reported(tmp_path / "cols.csv")
    bad = _write_reported(tmp_path / "bad.csv", ["P,1,D,p,n,A,m,1.0,,,", "P,1,D,p,n,B,m,abc,,,"])
    with pytest.raises(DataError, match=r"line\(s\) \[3\]"):
        load_reported(bad)


def test_copy_reported_validates_before_copying(reported_csv, tmp_path):
    dest = copy_reported(reported_csv, tmp_path / "config" / "papers" / "reported")
    assert dest.read_bytes() == reported_csv.read_bytes()
    bad = _write_reported(tmp_path / "bad.csv", ["P,1,D,p,n,A,m,x,,,"])
    with pytest.raises(DataError):
        copy_reported(bad, tmp_path / "out")
    assert not (tmp_path / "out" / "bad.csv").exists()


def test_place_reported_keys_and_unmatched(spec, reported_csv):
    cells, unmatched = place_reported(spec, load_reported(reported_csv))
    assert len(cells) == 12 and len(unmatched) == 1
    assert unmatched.iloc[0]["method"] == "FedOther"
    c = cells.set_index(["row", "column", "metric"])
    assert c.loc[("FedNoRo", "ρ=0.4", "bacc_last"), "reported"] == 70.14
    assert c.loc[("FedAvg", "Clean", "bacc_best"), "reported_std"] == 0.5


def test_place_reported_duplicate_cell_names_lines(spec, tmp_path):
    csv = _write_reported(
        tmp_path / "dup.csv",
        ["P,1,ICH,bd,clean,FedAvg,bacc_best,1.0,,,", "P,1,ICH,bd,clean,FedAvg,bacc_best,2.0,,,"],
    )
    with pytest.raises(DataError, match=r"lines \[2, 3\].*row_order"):
        place_reported(spec, load_reported(csv))


def test_multi_field_keys(tmp_path):
    csv = _write_reported(
        tmp_path / "t.csv",
        [
            "P,2,CIFAR-10,iid,sym,FedGR,acc,80.0,,,",
            "P,2,CIFAR-10,noniid,sym,FedGR,acc,70.0,,,",
        ],
    )
    spec = TableSpec(
        paper="P",
        table="2",
        title="",
        rows=(RowSpec("FedGR"),),
        columns=(ColumnSpec("IID", key=("iid", "sym")), ColumnSpec("Non-IID", key=("noniid", "sym"))),
        metrics=(MetricSpec("acc"),),
        column_fields=("partition", "noise_setting"),
    )
    cells, unmatched = place_reported(spec, load_reported(csv))
    assert dict(zip(cells["column"], cells["reported"])) == {"IID": 80.0, "Non-IID": 70.0}
    assert unmatched.empty
    with pytest.raises(ConfigError, match="not columns of the reported table"):
        place_reported(
            TableSpec(paper="P", table="2", title="", rows=spec.rows, columns=(ColumnSpec("IID", key=("x",)),),
                      metrics=spec.metrics, column_fields=("variant",)),
            load_reported(csv),
        )


# --------------------------------------------------------------------------- spec validation


def test_table_spec_validation():
    ok = dict(
        paper="P", table="1", title="t", rows=(RowSpec("A"),), columns=(ColumnSpec("c"),), metrics=(MetricSpec("m"),)
    )
    TableSpec(**ok)
    with pytest.raises(ConfigError, match="duplicate row label"):
        TableSpec(**{**ok, "rows": (RowSpec("A"), RowSpec("A"))})
    with pytest.raises(ConfigError, match="status"):
        RowSpec("A", status="todo")
    with pytest.raises(ConfigError, match="std_ddof"):
        TableSpec(**{**ok, "std_ddof": 2})
    with pytest.raises(ConfigError, match="tolerance"):
        TableSpec(**{**ok, "tolerance": -1})
    with pytest.raises(ConfigError, match="one per key field"):
        TableSpec(**{**ok, "column_fields": ("partition", "noise_setting")})
    with pytest.raises(ConfigError, match="duplicate column key"):
        TableSpec(**{**ok, "columns": (ColumnSpec("c1", key=("k",)), ColumnSpec("c2", key=("k",)))})
    with pytest.raises(ConfigError, match="metrics is empty"):
        TableSpec(**{**ok, "metrics": ()})
    with pytest.raises(ConfigError, match="scale"):
        MetricSpec("m", scale=0)
    assert RowSpec("A", key="FedAvg").key == ("FedAvg",) and ColumnSpec("c", key=0.3).key == ("0.3",)


def test_table_spec_from_dict():
    d = {
        "paper": "fednoro",
        "table": 1,
        "title": "BACC",
        "rows": ["FedAvg", {"label": "FedCorr", "status": "not_implemented", "note": "later"}],
        "columns": [{"label": "ρ=0.2", "key": "H-IDN rho=0.2"}],
        "metrics": [{"name": "bacc_best_round", "label": "Best"}, "bacc_mean_last10_rounds"],
        "tolerance": 0.5,
        "std_ddof": 0,
    }
    s = TableSpec.from_dict(d)
    assert s.table == "1" and s.rows[1].status == "not_implemented"
    assert s.column_key(s.columns[0]) == ("H-IDN rho=0.2",)
    assert s.metrics[1].label == "bacc_mean_last10_rounds" and s.std_ddof == 0
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['colums'\]"):
        TableSpec.from_dict({**d, "colums": []})
    with pytest.raises(ConfigError, match=r"rows\[0\].*unknown key"):
        TableSpec.from_dict({**d, "rows": [{"label": "A", "stauts": "x"}]})


# --------------------------------------------------------------------------- aggregation


def test_aggregate_runs_mean_std_both_ddof():
    runs = _runs({("A", "c", "m"): [0.60, 0.70, 0.80], ("B", "c", "m"): [0.5]})
    a1 = aggregate_runs(runs, ddof=1).set_index("row")
    a0 = aggregate_runs(runs, ddof=0).set_index("row")
    assert a1.loc["A", "mean"] == pytest.approx(0.70)
    assert a1.loc["A", "std"] == pytest.approx(0.10)  # sample std of 0.6, 0.7, 0.8
    assert a0.loc["A", "std"] == pytest.approx(math.sqrt(0.02 / 3))  # population std
    assert a1.loc["A", "n_seeds"] == 3 and a1.loc["B", "n_seeds"] == 1
    assert math.isnan(a1.loc["B", "std"]) and a0.loc["B", "std"] == 0.0
    assert list(aggregate_runs(runs).columns) == ["row", "column", "metric", "mean", "std", "n_seeds"]


def test_aggregate_runs_errors_and_nan():
    with pytest.raises(DataError, match="several values"):
        aggregate_runs(_runs({("A", "c", "m"): [0.1]}).pipe(lambda d: pd.concat([d, d])))
    with pytest.raises(DataError, match=r"lacks column\(s\) \['seed'\]"):
        aggregate_runs(pd.DataFrame({"row": ["A"], "column": ["c"], "metric": ["m"], "value": [1.0]}))
    with pytest.raises(ConfigError, match="ddof"):
        aggregate_runs(_runs({("A", "c", "m"): [0.1]}), ddof=2)
    agg = aggregate_runs(_runs({("A", "c", "m"): [0.1, np.nan]}))
    assert math.isnan(agg.loc[0, "mean"]) and agg.loc[0, "n_seeds"] == 2  # an undefined run is not hidden


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_aggregate_runs_matches_numpy_and_ignores_order(values, seed):
    runs = _runs({("A", "c", "m"): values, ("B", "c", "m"): values[::-1]})
    shuffled = runs.sample(frac=1.0, random_state=seed)
    for ddof in (0, 1):
        a = aggregate_runs(runs, ddof=ddof)
        pd.testing.assert_frame_equal(a, aggregate_runs(shuffled, ddof=ddof))
        assert a.loc[0, "mean"] == pytest.approx(np.mean(values))
        if len(values) > ddof:
            assert a.loc[0, "std"] == pytest.approx(np.std(values, ddof=ddof), abs=1e-12)


# --------------------------------------------------------------------------- rendering


@pytest.fixture
def rendered(spec, reported_csv):
    runs = _runs(
        {
            ("FedAvg", "Clean", "bacc_best"): [0.6940, 0.6928],  # mean 69.34 -> delta 0
            ("FedAvg", "Clean", "bacc_last"): [0.6750, 0.6790],  # mean 67.70 vs 68.92 -> -1.22, tol 0.5 -> flag
            ("FedAvg", "ρ=0.4", "bacc_best"): [0.6200, 0.6130, 0.6150],  # 61.60 vs 60.52 -> +1.08, tol 1 -> flag
            ("FedNoRo", "Clean", "bacc_best"): [0.7150],  # 71.50 vs 71.00 -> +0.50 within 1.0
            ("FedNoRo", "ρ=0.4", "bacc_last"): [0.7064],  # 70.64 vs 70.14 -> +0.50, exactly the tolerance 0.5
        }
    )
    return render(spec, runs, load_reported(reported_csv))


def _cell(rt, row, column, metric):
    long = rt.long
    return long[(long["row"] == row) & (long["column"] == column) & (long["metric"] == metric)].iloc[0]


def test_render_statuses_deltas_and_flags(rendered):
    long = rendered.long
    assert list(long.columns) == [
        "row", "column", "metric", "reproduced_mean", "reproduced_std", "n_seeds", "reported",
        "reported_std", "delta", "tolerance", "within_tolerance", "status", "reported_note",
    ]
    assert len(long) == 3 * 2 * 2
    assert list(long["row"].unique()) == ["FedAvg", "FedNoRo", "FedX"]  # display order
    c = _cell(rendered, "FedAvg", "Clean", "bacc_best")
    assert c["status"] == "done" and c["reproduced_mean"] == pytest.approx(69.34)
    assert c["delta"] == pytest.approx(0.0, abs=1e-9) and bool(c["within_tolerance"])
    c = _cell(rendered, "FedAvg", "Clean", "bacc_last")
    assert c["delta"] == pytest.approx(-1.22) and c["tolerance"] == 0.5 and not c["within_tolerance"]
    assert c["reproduced_std"] == pytest.approx(np.std([67.5, 67.9], ddof=1))
    c = _cell(rendered, "FedAvg", "ρ=0.4", "bacc_best")
    assert c["delta"] == pytest.approx(61.60 - 60.52) and c["delta"] > 0 and not c["within_tolerance"]
    assert c["n_seeds"] == 3
    c = _cell(rendered, "FedNoRo", "Clean", "bacc_best")
    assert bool(c["within_tolerance"]) and math.isnan(c["reproduced_std"])  # one seed, sample std undefined
    assert bool(_cell(rendered, "FedNoRo", "ρ=0.4", "bacc_last")["within_tolerance"])  # |Δ| == tolerance
    c = _cell(rendered, "FedAvg", "ρ=0.4", "bacc_last")
    assert c["status"] == "pending" and c["n_seeds"] == 0
    assert pd.isna(c["within_tolerance"]) and math.isnan(c["delta"])
    assert _cell(rendered, "FedX", "ρ=0.4", "bacc_best")["status"] == "not_implemented"
    c = _cell(rendered, "FedX", "Clean", "bacc_best")
    assert c["status"] == "not_implemented" and math.isnan(c["reported"])
    assert rendered.status_counts() == {"done": 5, "pending": 3, "not_implemented": 4, "not_reported": 0}
    assert rendered.n_flagged() == 2
    assert len(rendered.unmatched_reported) == 1


def test_render_not_reported_cells(reported_csv):
    spec = TableSpec(
        paper="P",
        table="1",
        title="",
        rows=(RowSpec("FedX"), RowSpec("FedNew")),
        columns=(ColumnSpec("Clean", key=("clean",)),),
        metrics=(MetricSpec("bacc_best"),),
    )
    rt = render(spec, _runs({("FedNew", "Clean", "bacc_best"): [0.5]}), load_reported(reported_csv))
    x, new = _cell(rt, "FedX", "Clean", "bacc_best"), _cell(rt, "FedNew", "Clean", "bacc_best")
    assert x["status"] == "not_reported" and x["reported_note"] == "denoising method at rho=0"
    assert new["status"] == "not_reported" and new["reproduced_mean"] == pytest.approx(50.0)
    assert math.isnan(new["delta"])
    md = rt.markdown()
    assert "| FedX | – |" in md and "| FedNew | 50.00 |" in md  # nothing to compare with: no "rep" part
    assert "Δ" not in md and "tolerance" not in md  # the legend says only what applies
    assert "1 of 2 cells reproduced, 1 pending" in md and "2 cells have no reported number" in md


def test_render_without_runs_or_reported(spec):
    rt = render(spec, None, None)
    assert set(rt.long["status"]) == {"not_reported", "not_implemented"}
    rt = render(spec, pd.DataFrame(columns=["row", "column", "metric", "seed", "value"]), None)
    assert rt.long["n_seeds"].eq(0).all()


def test_render_rejects_unknown_labels(spec, reported_csv):
    with pytest.raises(DataError, match=r"row\(s\) \['FedAvgg'\]"):
        render(spec, _runs({("FedAvgg", "Clean", "bacc_best"): [0.5]}), load_reported(reported_csv))
    with pytest.raises(DataError, match=r"metric\(s\) \['bacc'\]"):
        render(spec, _runs({("FedAvg", "Clean", "bacc"): [0.5]}), None)


def test_markdown_content(rendered):
    md = rendered.markdown()
    lines = md.splitlines()
    assert lines[0] == "# BACC on ICH"
    header = next(line for line in lines if line.startswith("| Method"))
    assert "Clean · Best" in header and "ρ=0.4 · Last" in header
    fedavg = next(line for line in lines if line.startswith("| FedAvg |"))
    cells = [c.strip() for c in fedavg.strip("|").split("|")]
    assert cells[1] == "69.34 ± 0.08 (rep 69.34 ± 0.50, Δ +0.00) [2/3 seeds]"
    assert cells[2] == "67.70 ± 0.28 (rep 68.92, Δ −1.22) [2/3 seeds] ⚠"
    assert cells[3] == "61.60 ± 0.36 (rep 60.52 ± 0.50, Δ +1.08) ⚠"
    assert cells[4] == "pending (rep 60.05)"
    fedx = next(line for line in lines if line.startswith("| FedX |"))
    fedx_cells = [c.strip() for c in fedx.strip("|").split("|")][1:]
    assert fedx_cells == ["n.i.", "n.i.", "n.i. (rep 55.00 ± 0.50)", "n.i. (rep 54.00)"]
    assert "**Legend.**" in md and "Best 1.00, Last 0.50" in md
    # cells (row x column) as `fnl tables` counts them: none has all 3 seeds yet
    assert "0 of 6 cells reproduced, 4 pending, 2 not implemented; 5 numbers compared with the paper, 2 outside tolerance." in md
    assert "1 reported number(s) match no cell" in md
    assert "- Row FedNoRo: ours" in md and "- Column ρ=0.4: H-IDN" in md


def test_html_content_and_escaping(rendered, spec, reported_csv):
    page = rendered.html()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page and "</html>" in page
    assert 'class="flag"' in page and 'class="ok"' in page and 'class="pending"' in page and 'class="ni"' in page
    assert "67.70 ± 0.28 ⚠" in page and "rep 68.92, Δ −1.22" in page
    assert '<th colspan="2" title="H-IDN">ρ=0.4</th>' in page
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched
    weird = TableSpec(
        paper="P", table="1", title="a <b> & c", rows=(RowSpec("<script>", key=("FedAvg",)),),
        columns=spec.columns, metrics=spec.metrics,
    )
    page = render(weird, None, load_reported(reported_csv)).html()
    assert "<script>" not in page and "&lt;script&gt;" in page and "a &lt;b&gt; &amp; c" in page


def test_writers_are_deterministic_and_complete(rendered, spec, reported_csv, tmp_path):
    rendered.to_csv(tmp_path / "t.csv")
    rendered.to_markdown(tmp_path / "t.md")
    rendered.to_html(tmp_path / "sub" / "t.html")
    assert (tmp_path / "t.md").read_text(encoding="utf-8") == rendered.markdown()
    assert (tmp_path / "sub" / "t.html").read_text(encoding="utf-8") == rendered.html()
    back = pd.read_csv(tmp_path / "t.csv")
    assert len(back) == len(rendered.long) and list(back.columns) == list(rendered.long.columns)
    assert back["status"].tolist() == rendered.long["status"].tolist()
    np.testing.assert_allclose(back["delta"], rendered.long["delta"], equal_nan=True)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left
    # the same inputs in another order give the same bytes
    runs = _runs({("FedAvg", "Clean", "bacc_best"): [0.6940, 0.6928], ("FedNoRo", "Clean", "bacc_best"): [0.7150]})
    a = render(spec, runs, load_reported(reported_csv))
    b = render(spec, runs.iloc[::-1], load_reported(reported_csv))
    a.to_csv(tmp_path / "a.csv")
    b.to_csv(tmp_path / "b.csv")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert a.markdown() == b.markdown() and a.html() == b.html()


# --------------------------------------------------------------------------- real reported tables
# The project's own copies of the spec tables (config/papers/reported, byte copies of
# spec/tables), so these run on clones without ../shared.


def test_real_spec_table_loads_with_unique_keys():
    rep = load_reported(REPORTED_DIR / "fednoro_table1_ich.csv")
    assert len(rep) == 162
    spec = TableSpec.from_reported(rep, ("method",), ("noise_setting",), title="FedNoRo Table 1")
    assert len(spec.rows) == 9 and len(spec.columns) == 9
    assert [m.name for m in spec.metrics] == ["bacc_best_round", "bacc_mean_last10_rounds"]
    cells, unmatched = place_reported(spec, rep)
    assert len(cells) == 162 and unmatched.empty
    assert not cells.duplicated(["row", "column", "metric"]).any()
    fedavg = cells[(cells["row"] == "FedAvg") & (cells["column"] == "clean (rho=0.0, eta=(0.0,0.0))")]
    expected = {"bacc_best_round": 69.34, "bacc_mean_last10_rounds": 68.92}
    assert dict(zip(fedavg["metric"], fedavg["reported"])) == expected
    rt = render(spec, None, rep)
    assert rt.status_counts()["pending"] == 150 and rt.status_counts()["not_reported"] == 12  # 12 '-' cells


@pytest.mark.parametrize(
    "name, row_fields",
    [
        ("feddiv_table6_ablation.csv", ("method",)),
        ("fedgr_table6.csv", ("method", "variant", "row_order")),  # the default row is printed twice
        ("fedmlp_table1.csv", ("method",)),
        ("fedncl_tableI.csv", ("method",)),
    ],
)
def test_other_spec_tables_place_uniquely(name, row_fields):
    rep = load_reported(REPORTED_DIR / name)
    spec = TableSpec.from_reported(rep, row_fields, ("dataset", "partition", "noise_setting"))
    cells, unmatched = place_reported(spec, rep)
    assert len(cells) == len(rep) and unmatched.empty


# --------------------------------------------------------------------------- curves


def _curve(seed, offset=0.0, rounds=20):
    r = np.arange(rounds)
    return pd.DataFrame({"round": r, "seed": seed, "acc": 0.5 + 0.02 * r + offset})


def test_plot_curves_writes_png_and_is_deterministic(tmp_path):
    curves = {
        "FedAvg": pd.concat([_curve(0), _curve(1, 0.01), _curve(2, -0.01)]),  # band over 3 seeds
        "FedNoRo": _curve(0, 0.05).drop(columns="seed"),
    }
    plot_curves(curves, "acc", tmp_path / "a.png", title="CIFAR-10")
    plot_curves(curves, "acc", tmp_path / "b.png", title="CIFAR-10")
    data = (tmp_path / "a.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data == (tmp_path / "b.png").read_bytes()
    plot_curves(curves, "acc", tmp_path / "c.svg")
    plot_curves(curves, "acc", tmp_path / "d.svg")
    assert (tmp_path / "c.svg").read_bytes() == (tmp_path / "d.svg").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png", "c.svg", "d.svg"]


def test_plot_curves_errors(tmp_path):
    with pytest.raises(DataError, match="no curves"):
        plot_curves({}, "acc", tmp_path / "x.png")
    with pytest.raises(DataError, match="no column 'bacc'"):
        plot_curves({"A": _curve(0)}, "bacc", tmp_path / "x.png")
    with pytest.raises(DataError, match="rounds repeat"):
        plot_curves({"A": pd.concat([_curve(0), _curve(1)]).drop(columns="seed")}, "acc", tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def _avg_spec(**over):
    d = {
        "paper": "p", "table": "t", "rows": ["A", "B"], "metrics": ["acc"],
        "columns": ["c1", "c2", {"label": "Avg", "average_of": ["c1", "c2"]}], "std_ddof": 0,
    }
    d.update(over)
    return TableSpec.from_dict(d)


def test_average_column_is_the_per_seed_mean_of_its_columns():
    # A: seed 0 (0.5, 0.7) -> 0.6, seed 1 (0.6, 1.0) -> 0.8: mean 70, population std 10 (percent).
    # B: seed 0 has c1 only -> no average for that seed; seed 1 (0.2, 0.4) -> 0.3.
    runs = pd.DataFrame(
        [("A", "c1", "acc", 0, 0.5), ("A", "c2", "acc", 0, 0.7), ("A", "c1", "acc", 1, 0.6), ("A", "c2", "acc", 1, 1.0),
         ("B", "c1", "acc", 0, 0.9), ("B", "c1", "acc", 1, 0.2), ("B", "c2", "acc", 1, 0.4)],
        columns=["row", "column", "metric", "seed", "value"],
    )
    long = render(_avg_spec(), runs, None).long.set_index(["row", "column"])
    assert long.loc[("A", "Avg"), "reproduced_mean"] == pytest.approx(70.0)
    assert long.loc[("A", "Avg"), "reproduced_std"] == pytest.approx(10.0)
    assert long.loc[("A", "Avg"), "n_seeds"] == 2
    assert long.loc[("B", "Avg"), "reproduced_mean"] == pytest.approx(30.0)
    assert long.loc[("B", "Avg"), "n_seeds"] == 1
    # a NaN value in a listed column makes that seed's average NaN, never a partial mean
    nan = runs.copy()
    nan.loc[0, "value"] = float("nan")
    long = render(_avg_spec(), nan, None).long.set_index(["row", "column"])
    assert math.isnan(long.loc[("A", "Avg"), "reproduced_mean"])


def test_average_column_must_name_measured_columns():
    with pytest.raises(ConfigError, match="not measured columns"):
        _avg_spec(columns=["c1", {"label": "Avg", "average_of": ["c1", "c3"]}])
    with pytest.raises(ConfigError, match="not measured columns"):  # no average of an average
        _avg_spec(columns=["c1", {"label": "Avg", "average_of": ["c1"]}, {"label": "Avg2", "average_of": ["Avg"]}])
    with pytest.raises(ConfigError, match="average_of"):
        _avg_spec(columns=["c1", {"label": "Avg", "average_of": []}])


def test_a_row_can_average_its_own_columns():
    # FedGR Tables 14-15: some rows' Avg includes the clean column. Row A averages c0, c1, c2;
    # row B keeps the column's c1, c2. Seed 0: A (0.3, 0.5, 0.7) -> 0.5, B (0.2, 0.6) -> 0.4.
    spec = _avg_spec(
        rows=[{"label": "A", "average_of": {"Avg": ["c0", "c1", "c2"]}}, "B"],
        columns=["c0", "c1", "c2", {"label": "Avg", "average_of": ["c1", "c2"]}],
    )
    assert spec.average_of("A", "Avg") == ("c0", "c1", "c2")
    assert spec.average_of("B", "Avg") == ("c1", "c2")
    assert spec.average_of("A", "c1") is None
    runs = pd.DataFrame(
        [("A", "c0", "acc", 0, 0.3), ("A", "c1", "acc", 0, 0.5), ("A", "c2", "acc", 0, 0.7),
         ("B", "c0", "acc", 0, 0.9), ("B", "c1", "acc", 0, 0.2), ("B", "c2", "acc", 0, 0.6),
         ("A", "c1", "acc", 1, 0.4), ("A", "c2", "acc", 1, 0.4)],  # seed 1 lacks A's c0: no average
        columns=["row", "column", "metric", "seed", "value"],
    )
    long = render(spec, runs, None).long.set_index(["row", "column"])
    assert long.loc[("A", "Avg"), "reproduced_mean"] == pytest.approx(50.0)
    assert long.loc[("A", "Avg"), "n_seeds"] == 1
    assert long.loc[("B", "Avg"), "reproduced_mean"] == pytest.approx(40.0)
    # the mapping is stored as sorted pairs (a hashable, frozen spec) and equal either way it is given
    a = RowSpec("A", average_of={"Avg2": "c1", "Avg": ["c0", "c1"]})
    assert a.average_of == (("Avg", ("c0", "c1")), ("Avg2", ("c1",)))
    assert a == RowSpec("A", average_of=[("Avg", ["c0", "c1"]), ("Avg2", ["c1"])])
    assert a.averages("Avg2") == ("c1",) and a.averages("Avg3") is None
    hash(a)


def test_a_row_average_must_name_an_average_column_and_measured_columns():
    cols = ["c0", "c1", "c2", {"label": "Avg", "average_of": ["c1", "c2"]}]
    with pytest.raises(ConfigError, match="not an average_of column"):
        _avg_spec(rows=[{"label": "A", "average_of": {"c1": ["c0", "c2"]}}], columns=cols)
    with pytest.raises(ConfigError, match="not measured"):
        _avg_spec(rows=[{"label": "A", "average_of": {"Avg": ["c0", "c3"]}}], columns=cols)
    with pytest.raises(ConfigError, match="not measured"):  # no average of an average
        _avg_spec(rows=[{"label": "A", "average_of": {"Avg": ["c0", "Avg"]}}], columns=cols)
    for bad in ({}, {"Avg": []}, ["c0", "c1"], "c0", {"Avg": [1]}, {"Avg": ["c0", "c0"]}, {"": ["c0"]}):
        with pytest.raises(ConfigError, match="average_of|duplicate"):
            RowSpec("A", average_of=bad)
    with pytest.raises(ConfigError, match="unknown key"):  # the field name is checked like the others
        _avg_spec(rows=[{"label": "A", "averages": {"Avg": ["c0"]}}], columns=cols)
