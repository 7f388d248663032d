"""What a table and a finished run say about themselves: the scale in every format, no paper
comparison at a scale that changes the paper's settings, a legend that claims a std only where
there is one, the job log's status line, library warnings in the job log, and the report
command as the user can run it."""

from __future__ import annotations

import logging
import os
import warnings

import pandas as pd
import pytest

from fnlcore.app.build_table import build_table, curves_title
from fnlcore.app.papers import Scale, load_paper
from fnlcore.app.summary import report_command
from fnlcore.errors import ConfigError
from fnlcore.io import read_parquet, write_parquet
from fnlcore.logs import job_log


def _table(paper: str, table: str, scale: str):
    return next(t for t in load_paper(paper, Scale.load(scale)) if t.table == table)


# -- scales ------------------------------------------------------------------------------


@pytest.mark.parametrize("scale, compared", [("paper", True), ("paper_fast", True), ("smoke", False)])
def test_only_a_scale_keeping_the_papers_settings_is_compared_with_the_paper(scale, compared):
    t = _table("fednoro", "1", scale)
    assert Scale.load(scale).compares_with_paper is compared
    assert (t.reported is not None) is compared and t.spec.compared_with_paper is compared
    assert t.spec.scale == scale and scale in t.outputs("results")["md"].split("/")


def test_tables_of_different_scales_have_different_paths():
    paths = {s: _table("fednoro", "1", s).outputs("results")["md"] for s in ("paper", "paper_fast", "smoke")}
    assert paths["smoke"] == "results/tables/smoke/fednoro/1.md"
    assert len(set(paths.values())) == 3


def test_a_scale_file_cannot_take_a_built_in_scale_name(tmp_path):
    own = tmp_path / "smoke.yaml"
    own.write_text("num_clients: 2\n")
    with pytest.raises(ConfigError, match="built-in scale 'smoke'; rename"):
        Scale.load(str(own))
    renamed = tmp_path / "mysmoke.yaml"
    renamed.write_text("num_clients: 2\n")
    assert Scale.load(str(renamed)).name == "mysmoke"


def test_a_scale_changing_only_how_runs_execute_still_compares(tmp_path):
    fast = tmp_path / "fast.yaml"
    fast.write_text("training: {engine: auto, channels_last: true, eval_batch_size: 512}\nseeds: [0]\n")
    assert Scale.load(str(fast)).compares_with_paper
    bf16 = tmp_path / "bf16.yaml"
    bf16.write_text("training: {precision: bf16}\n")
    assert not Scale.load(str(bf16)).compares_with_paper  # precision changes the numbers


# -- a rendered table ----------------------------------------------------------------------


def _metrics_files(pt, tmp_path, rounds: int = 3) -> list[str]:
    from fnlcore.methods import METHODS

    files = []
    for i, tr in enumerate(pt.runs):
        path = tmp_path / f"run{i}.parquet"
        acc = [0.5 + 0.01 * r + 0.001 * i for r in range(rounds)]
        stage = (getattr(METHODS[tr.run.method.name], "reported_stages", None) or ["main"])[-1]  # rounds the table counts
        write_parquet(pd.DataFrame({"round": range(rounds), "stage": stage, "bacc": acc, "acc": acc}), str(path))
        files.append(str(path))
    return files


def _build(pt, tmp_path):
    outputs = {k: str(tmp_path / f"t{suffix}") for k, suffix in
               {"csv": ".csv", "md": ".md", "html": ".html", "curves": ".curves.png"}.items()}
    rendered = build_table(pt, _metrics_files(pt, tmp_path), outputs, read_parquet)
    return rendered, {k: open(v, "rb").read() for k, v in outputs.items()}


def test_every_format_names_the_scale_and_a_smoke_table_is_not_compared(tmp_path):
    pt = _table("fednoro", "1", "smoke")
    rendered, out = _build(pt, tmp_path)
    md, html = out["md"].decode(), out["html"].decode()
    assert "Scale smoke" in md and "not compared with the reported numbers" in md
    assert "Scale smoke" in html and "(smoke scale)" in html.split("</title>")[0]
    assert set(pd.read_csv(tmp_path / "t.csv")["scale"]) == {"smoke"}
    assert "rep " not in md and "outside tolerance" not in rendered.status_line()
    assert "not compared with the paper at smoke scale" in rendered.status_line()
    assert "(smoke scale)" in curves_title(pt, "bacc")


def test_the_demo_says_its_own_settings_not_paper_scale_and_claims_no_std_for_one_seed(tmp_path):
    pt = _table("demo", "demo", "paper")
    rendered, out = _build(pt, tmp_path)
    md = out["md"].decode()
    assert "paper scale" not in curves_title(pt, "bacc") and "own settings" in curves_title(pt, "bacc")
    assert "Scale paper" not in md and "No paper reports these numbers" in md
    legend = md.split("**Legend.**")[1].split("\n")[0]
    assert "± std" not in legend and "one seed" in legend
    # the job log's summary is the table's own status line (not a count of reported-number statuses)
    status = md.split("**Status.** ")[1].split("\n")[0]
    assert rendered.status_line() == status and status.startswith("12 of 12 cells reproduced")


def test_a_legend_claims_a_std_where_cells_have_several_seeds(tmp_path):
    import dataclasses

    pt = _table("demo", "demo", "paper")
    two = [dataclasses.replace(tr, run=dataclasses.replace(tr.run, seed=s)) for tr in pt.runs for s in (0, 1)]
    pt = dataclasses.replace(pt, runs=two, spec=dataclasses.replace(pt.spec, expected_seeds=2))
    _, out = _build(pt, tmp_path)
    legend = out["md"].decode().split("**Legend.**")[1].split("\n")[0]
    assert "mean ± std over seeds" in legend and "one seed" not in legend


def test_a_changed_table_spec_changes_its_digest():
    import dataclasses

    pt = _table("demo", "demo", "paper")
    assert pt.content_digest() == _table("demo", "demo", "paper").content_digest()  # stable across loads
    rule = next(iter(pt.metrics.values()))
    changed = dataclasses.replace(rule, rule=dataclasses.replace(rule.rule, kind="last_mean", n=5))
    other = dataclasses.replace(pt, metrics={**pt.metrics, next(iter(pt.metrics)): changed})
    assert other.content_digest() != pt.content_digest()
    assert dataclasses.replace(pt, scale="smoke").content_digest() != pt.content_digest()


# -- the job log -------------------------------------------------------------------------------


def test_library_warnings_go_to_the_job_log_and_once_per_kind_to_the_console(tmp_path, capsys):
    log_path = tmp_path / "job.log"
    with job_log(str(log_path), tag="fedavg | clean | seed0") as log:
        for i in range(5):
            warnings.warn(f"did not converge in {i} iterations", RuntimeWarning)
        log.info("done")
    logged = log_path.read_text()
    assert logged.count("RuntimeWarning: did not converge") == 5
    console = capsys.readouterr().err
    assert console.count("RuntimeWarning") == 1
    assert "[fedavg | clean | seed0] WARNING RuntimeWarning: did not converge in 0 iterations" in console
    assert f"4 more library warning(s) of the same kind(s) in {log_path}" in console
    assert warnings.showwarning.__module__ != "fnlcore.logs"  # restored after the job
    logging.getLogger("fnl").handlers.clear()


# -- the end-of-run hint -----------------------------------------------------------------------


def test_the_report_command_is_the_snakemake_the_user_ran_with_the_same_configuration(tmp_path):
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    exe = venv / "snakemake"
    exe.write_text("")
    cwd = str(tmp_path)
    assert report_command([str(exe), "--cores", "2"], cwd) == ".venv/bin/snakemake --report report.html"
    assert report_command([".venv/bin/snakemake", "-c2", "--configfile", "a.yaml", "b.yaml", "--config",
                           'tables=["fednoro/1"]', "scale=smoke", "--forcerun", "table"], cwd) == (
        ".venv/bin/snakemake --configfile a.yaml b.yaml --config 'tables=[\"fednoro/1\"]' scale=smoke "
        "--report report.html")
    assert report_command(["/elsewhere/snakemake", "-d", "run1"], cwd) == (
        "/elsewhere/snakemake -d run1 --report report.html")
    module = report_command([os.path.join("site-packages", "snakemake", "__main__.py"), "--configfile=c.yaml"], cwd)
    assert module.endswith(" -m snakemake --configfile=c.yaml --report report.html")
