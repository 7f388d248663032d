"""The fnl command: tables, cell (targets of one cell), status; unknown names list the valid ones."""

from pathlib import Path

import pytest

from fnlcore import cli
from fnlcore.app.rehearse import write_rehearsal


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
    from fnlcore.app.plan import load_plan

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"results_dir: {tmp_path}/results\ntables: [demo]\ndata_grid: []\n")
    n = len(load_plan(cfg).runs())  # the demo's rows x columns x seeds (12 today)
    rc, out, _ = _run(capsys, "status", "--configfile", str(cfg))
    assert rc == 0 and out.startswith(f"done 0  running 0  failed 0  pending {n}")
    assert len(out.strip().splitlines()) == 1 + n and all(l.startswith("pending ") for l in out.strip().splitlines()[1:])


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
    pending = len(runs) - 3
    assert rc == 1 and lines[0] == f"done 1  running 1  failed 1  pending {pending}"
    assert lines[1].startswith("failed ") and f"log: {cli.run_log(failed, plan.results_dir)}" in lines[1]
    assert lines[2].startswith("running ") and "log: " in lines[2]
    assert [l.split()[0] for l in lines[3:]] == ["pending"] * pending + ["done"]


def test_cell_loads_only_its_own_paper(tmp_path, capsys):
    # 15 rounds suit the demo (warm-up 10) but not FedNoRo's Table 2 (warm-up 20): a cell of
    # the demo must not be refused because another paper's table cannot run at this scale.
    scale = tmp_path / "s.yaml"
    scale.write_text("training: {rounds: 15}\n")
    rc, out, err = _run(capsys, "cell", "demo", "demo", "--row", "FedAvg", "--col", "clean", "--scale", str(scale), "--dry")
    assert rc == 0, err
    assert "-r15-" in out


# -- --configfile / --config: every command that reads a configuration takes them -------------------


def _config_file(tmp_path, text: str) -> Path:
    cfg = tmp_path / "mine.yaml"
    cfg.write_text(text)
    return cfg


def test_tables_takes_the_configurations_scale_and_results(tmp_path, capsys):
    rc, out, err = _run(capsys, "tables", "--config", "scale=smoke", f"results_dir={tmp_path}/r")
    assert rc == 0, err
    assert out.startswith("scale smoke ")
    cfg = _config_file(tmp_path, "scale: smoke\n")
    rc, out, err = _run(capsys, "tables", "--configfile", str(cfg))
    assert rc == 0 and out.startswith("scale smoke "), err
    rc, out, err = _run(capsys, "tables", "--configfile", str(cfg), "--scale", "paper")  # the option wins
    assert rc == 0 and out.startswith("scale paper "), err


def test_plan_takes_the_tables_and_scale_of_the_configuration(tmp_path, capsys):
    rc, out, err = _run(capsys, "plan", "--config", 'tables=["demo"]', "scale=smoke", f"results_dir={tmp_path}/r")
    assert rc == 0, err
    assert out.startswith("scale smoke: 1 tables, "), out  # the configuration's tables, not every table
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("demo ")] == [["demo", "demo"]], out


def test_rehearse_takes_the_tables_and_scale_of_the_configuration(tmp_path, capsys):
    rc, every, err = _run(capsys, "rehearse", "--list", "--scale", "smoke")
    assert rc == 0, err
    rc, demo, err = _run(capsys, "rehearse", "--list", "--tables", "demo", "--scale", "smoke")
    assert rc == 0 and demo.strip() and demo != every, err  # the check tells the tables apart
    cfg = _config_file(tmp_path, 'tables: ["demo"]\nscale: smoke\n')
    rc, out, err = _run(capsys, "rehearse", "--list", "--configfile", str(cfg))
    assert rc == 0 and out == demo, err  # the configuration's tables and scale, not every table at paper scale
    rc, out, err = _run(capsys, "rehearse", "--list", "--config", 'tables=["demo"]', "scale=smoke")
    assert rc == 0 and out == demo, err
    # no --out: the rehearsal goes to the configuration's results folder (here merged from an empty shard)
    shard, _ = write_rehearsal([], tmp_path / "shard", "an empty shard")
    rc, _, err = _run(capsys, "rehearse", "--configfile", str(cfg), "--config", f"results_dir={tmp_path}/r",
                      "--merge", str(shard))
    assert rc == 0 and (tmp_path / "r" / "plan" / "rehearsal.csv").is_file(), err


def test_cell_takes_the_configuration_and_hands_it_to_snakemake(tmp_path, capsys):
    cfg = _config_file(tmp_path, "scale: smoke\n")
    rc, out, err = _run(capsys, "cell", "demo", "demo", "--row", "FedAvg", "--col", "clean", "--configfile", str(cfg),
                        "--config", f"results_dir={tmp_path}/r", "--dry")
    assert rc == 0, err
    (target,) = out.split()
    assert target.startswith(f"{tmp_path}/r/runs/synthetic_") or target.startswith(f"{tmp_path}/r/runs/digits/")
    assert "/tiny-r4-" in target  # the smoke scale's training
    pt = cli._find(cli._tables("smoke", "demo"), "demo", "demo")
    cmd = cli.cell_command(pt, "smoke", "r", [target], ["--cores", "2"], configfile=str(cfg), config=["device=cpu"])
    i = cmd.index("--config")
    assert cmd[cmd.index(target) + 1:i] == ["--configfile", str(cfg)]
    assert cmd[i + 1] == "device=cpu" and cmd.index('tables=["demo/demo"]') > i + 1  # the cell's own values win
    assert cmd[-2:] == ["--cores", "2"]


def test_a_bad_config_value_is_named(capsys):
    for command in (["tables"], ["plan"], ["status"], ["rehearse", "--list"],
                    ["cell", "demo", "demo", "--row", "FedAvg", "--col", "clean"]):
        rc, _, err = _run(capsys, *command, "--config", "noequals")
        assert rc == 2 and "--config" in err and "noequals" in err, (command, err)


# -- the cell's value, once its runs are built ------------------------------------------------------


def test_cell_prints_its_value_per_seed_and_over_the_seeds_with_its_files(tmp_path, capsys, monkeypatch):
    """After Snakemake built the cell's runs (here: it writes stand-in metrics, no training), `fnl cell`
    prints each metric as the table prints the cell, every seed's value and the file it came from."""
    import numpy as np
    import pandas as pd

    from fnlcore.io import write_parquet

    scale = tmp_path / "two_seeds.yaml"
    scale.write_text("training: {rounds: 12}\nseeds: [0, 1]\n")
    bacc = {0: np.linspace(0.40, 0.62, 12), 1: np.linspace(0.50, 0.66, 12)}

    def snakemake(cmd):
        targets = [a for a in cmd if a.endswith("metrics.parquet")]
        assert len(targets) == 2
        for target in targets:
            seed = int(target.rsplit("/seed", 1)[1].split("/")[0])
            write_parquet(pd.DataFrame({"round": range(12), "stage": "main", "bacc": bacc[seed], "acc": bacc[seed]}),
                          target)
        return 0

    monkeypatch.setattr(cli.subprocess, "call", snakemake)
    results = f"{tmp_path}/results"
    rc, out, err = _run(capsys, "cell", "demo", "demo", "--row", "FedAvg", "--col", "clean", "--scale", str(scale),
                        "--results", results)
    assert rc == 0, err
    targets, report = out.split("Cell demo/demo", 1)
    files = targets.split()
    best = {s: 100 * bacc[s].max() for s in (0, 1)}
    last = {s: 100 * bacc[s][-10:].mean() for s in (0, 1)}

    def block(label):
        lines = report.splitlines()
        i = next(k for k, line in enumerate(lines) if line.strip().startswith(label + ", "))
        return lines[i:i + 3]

    for label, values in (("Best", best), ("Last", last)):
        head, s0, s1 = block(label)
        mean, std = np.mean(list(values.values())), np.std(list(values.values()), ddof=1)
        assert head.endswith(f": {mean:.2f} ± {std:.2f}"), head  # as the table prints the cell
        assert s0.split() == ["seed", "0:", f"{values[0]:.2f}", files[0]]
        assert s1.split() == ["seed", "1:", f"{values[1]:.2f}", files[1]]
    assert "test bacc" in block("Last")[0]  # the metric in words
    assert f"table: {results}/tables/" in report and "not built yet" in report
