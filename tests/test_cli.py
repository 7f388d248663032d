"""The fnl command: tables, cell (targets of one cell), status; unknown names list the valid ones."""

from pathlib import Path

import pytest

from fnlcore import cli


def _run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cell_dry_prints_the_runs_of_that_cell(capsys):
    rc, out, _ = _run(capsys, "cell", "demo", "demo", "--row", "FedNoRo", "--col", "clean", "--dry")
    assert rc == 0
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "/clean/" in lines[0] and "/fednoro-" in lines[0] and lines[0].endswith("metrics.parquet")


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["cell", "demo", "demo", "--row", "FedNoRoo", "--col", "clean"], ["FedNoRoo", "'FedNoRo'", "'FedAvg'"]),
        (["cell", "demo", "demo", "--row", "FedAvg", "--col", "dirty"], ["dirty", "'clean'"]),
        (["cell", "demo", "table9", "--row", "FedAvg", "--col", "clean"], ["table9", "demo demo"]),
        (["cell", "nopaper", "1", "--row", "FedAvg", "--col", "clean"], ["nopaper"]),
        (["cell", "demo", "demo", "--row", "FedAvg", "--col", "clean", "--seed", "7"], ["seed 7", "[0]"]),
    ],
)
def test_unknown_names_list_valid_ones(capsys, argv, needles):
    rc, _, err = _run(capsys, *argv, "--dry")
    assert rc == 2
    for n in needles:
        assert n in err, (n, err)


def test_tables_lists_every_table(capsys):
    rc, out, _ = _run(capsys, "tables", "--results", "/nonexistent")
    assert rc == 0 and "demo" in out and "pending" in out


def test_status_counts_runs(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"results_dir: {tmp_path}/results\ntables: [demo]\ndata_grid: []\n")
    rc, out, _ = _run(capsys, "status", "--configfile", str(cfg))
    assert rc == 0 and out.startswith("done 0  running 0  failed 0  pending 12")
    assert len(out.strip().splitlines()) == 1 + 12 and all(l.startswith("pending ") for l in out.strip().splitlines()[1:])


def test_status_lists_every_run_failed_and_running_first_with_logs(tmp_path, capsys):
    from fnlcore.app.plan import load_plan

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"results_dir: {tmp_path}/results\ntables: [demo]\ndata_grid: []\n")
    plan = load_plan(cfg)
    runs = plan.runs()
    done, failed, running = runs[0], runs[5], runs[7]
    metrics = Path(done.files(plan.results_dir)["metrics"])
    metrics.parent.mkdir(parents=True)
    metrics.write_text("x")
    for run, text in ((failed, "2026 ERROR boom"), (running, "round 3/29")):
        log = cli.run_log(run, plan.results_dir)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text)
    rc, out, _ = _run(capsys, "status", "--configfile", str(cfg))
    lines = out.strip().splitlines()
    assert rc == 1 and lines[0] == "done 1  running 1  failed 1  pending 9"
    assert lines[1].startswith("failed ") and f"log: {cli.run_log(failed, plan.results_dir)}" in lines[1]
    assert lines[2].startswith("running ") and "log: " in lines[2]
    assert [l.split()[0] for l in lines[3:]] == ["pending"] * 9 + ["done"]


def test_cell_loads_only_its_own_paper(tmp_path, capsys):
    # 15 rounds suit the demo (warm-up 10) but not FedNoRo's Table 2 (warm-up 20): a cell of
    # the demo must not be refused because another paper's table cannot run at this scale.
    scale = tmp_path / "s.yaml"
    scale.write_text("training: {rounds: 15}\n")
    rc, out, err = _run(capsys, "cell", "demo", "demo", "--row", "FedAvg", "--col", "clean", "--scale", str(scale), "--dry")
    assert rc == 0, err
    assert "-r15-" in out
