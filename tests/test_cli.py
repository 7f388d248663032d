"""The fnl command: tables, cell (targets of one cell), status; unknown names list the valid ones."""

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


def test_cell_loads_only_its_own_paper(tmp_path, capsys):
    # 15 rounds suit the demo (warm-up 10) but not FedNoRo's Table 2 (warm-up 20): a cell of
    # the demo must not be refused because another paper's table cannot run at this scale.
    scale = tmp_path / "s.yaml"
    scale.write_text("training: {rounds: 15}\n")
    rc, out, err = _run(capsys, "cell", "demo", "demo", "--row", "FedAvg", "--col", "clean", "--scale", str(scale), "--dry")
    assert rc == 0, err
    assert "-r15-" in out
