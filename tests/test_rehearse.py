"""`fnl rehearse`: training configurations, and a toy rehearsal (start, checkpoint, SIGKILL, resume)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from fnlcore.app.plan import build_plan, validate_schema
from fnlcore.app.measurements import CSV_COLUMNS
from fnlcore.app.rehearse import (Options, distinct_configs, earlier_rows, merge_tables, rehearse, rehearse_one,
                                  training_config, write_rehearsal)
from fnlcore.errors import ConfigError


def _plan(tables, scale="smoke"):
    return build_plan(validate_schema({"tables": tables, "scale": scale, "data_grid": []}))


def test_key_names_what_sets_memory_and_time_and_is_a_safe_file_name():
    plan = _plan(["fedgr/3"], scale="paper")
    options = {n: d.options for n, d in plan.datasets.items()}
    keys = {training_config(r, options.get(r.dataset)).key for r in plan.runs()}
    assert "clothing1m-resnet50-pt-3x224x224-c14-n1000000-k500-m10-b32-e2-fedgr-sgd-fp32" in keys
    assert all(k.replace("-", "").replace("_", "").replace(".", "").isalnum() for k in keys)


def test_runs_that_differ_in_noise_or_seed_share_one_configuration():
    plan = _plan(["demo"])
    configs = distinct_configs(plan)
    assert len(configs) < len(plan.runs())
    cells = [c for r in configs.values() for c in r.cells]
    assert len(cells) == len(set(cells))  # every cell under exactly one configuration
    one = next(iter(configs.values()))
    assert one.config.stages and all(c.startswith("demo/") and ":" in c for c in one.cells)


def test_passes_over_every_client_are_cut_and_round_values_follow_the_rounds():
    """FedCorr's 5 pre-processing passes over 100 clients become 2; FedDiv's warm-up likewise; a
    pass count already under the cap, and none, stay."""
    from fnlcore.app.rehearse_job import MAX_PASSES, shortened
    from fnlcore.registry import param_text, pass_fields

    plan = _plan(["feddiv/1"], scale="paper")
    runs = {r.method.name: r for r in plan.runs()}
    spec = {"rounds": 4, "per_round": 0}
    fedcorr, feddiv = runs["fedcorr"], runs["feddiv"]
    assert pass_fields(type(fedcorr.method)) == ("iterations1",)
    assert pass_fields(type(feddiv.method)) == ("warmup_iterations",)
    docs = {f.name: param_text(f) for f in dataclasses.fields(type(fedcorr.method))}  # README's method table
    assert docs["iterations1"] == "`iterations1=5` (passes)" and docs["rounds1"] == "`rounds1=500` (rounds)"
    assert fedcorr.method.iterations1 > MAX_PASSES and feddiv.method.warmup_iterations > MAX_PASSES
    settings, params = shortened(fedcorr, spec)
    assert params.iterations1 == MAX_PASSES and settings.rounds == 4
    assert 1 <= params.rounds1 <= 3  # a round-valued field scaled along, not cut
    assert shortened(feddiv, spec)[1].warmup_iterations == MAX_PASSES
    short = dataclasses.replace(fedcorr, method=dataclasses.replace(fedcorr.method, iterations1=1))
    assert shortened(short, spec)[1].iterations1 == 1
    none = dataclasses.replace(feddiv, method=dataclasses.replace(feddiv.method, warmup_iterations=0))
    assert shortened(none, spec)[1].warmup_iterations == 0


@pytest.fixture(scope="module")
def toy():
    """The cheapest configuration of the demo table at smoke scale."""
    configs = distinct_configs(_plan(["demo"]))
    return next(r for k, r in configs.items() if "-tiny-" in k and k.endswith("fedavg-adam-fp32"))


def test_toy_rehearsal_is_killed_after_its_checkpoint_and_resumes(toy, tmp_path):
    row = rehearse_one(toy, Options(rounds=4, eval_samples=16, threads=1), tmp_path / "work", tmp_path)
    assert row["status"] == "pass", row["error"]
    log = (tmp_path / f"{toy.config.key}.log").read_text()
    assert "resumed from" in log and "at round 2" in log  # the second process went on from the first's checkpoint
    assert row["checkpoint_mb"] > 0 and row["written_per_checkpoint_mb"] != ""
    assert row["peak_rss_mb"] > 0 and row["steps"] > 0 and row["s_per_step"] > 0
    csv, md = write_rehearsal([row], tmp_path / "out", "toy")
    table = pd.read_csv(csv)
    assert tuple(table.columns) == CSV_COLUMNS and table.loc[0, "config"] == toy.config.key
    assert toy.config.key in md.read_text()
    assert not (tmp_path / "work").exists()  # checkpoints removed


def test_pass_clients_cuts_fedcorrs_passes_and_keeps_every_client_of_the_rounds(tmp_path, monkeypatch):
    """--pass-clients 1: FedCorr's pre-processing passes in two groups with one client trained in
    each, its training rounds with all their clients; killed after the passes, resumed, finished."""
    import fnlcore.app.rehearse as rh

    plan = _plan(["feddiv/1"])
    r = next(c for c in distinct_configs(plan).values() if c.config.method == "fedcorr")
    run = dataclasses.replace(r.run, partition=dataclasses.replace(r.run.partition, num_clients=10),
                              training=dataclasses.replace(r.run.training, client_fraction=0.5))
    events = []
    real_row = rh._row
    monkeypatch.setattr(rh, "_row", lambda cfg, cells, opts, ev, *a: events.extend(ev) or real_row(cfg, cells, opts, ev, *a))
    opts = Options(rounds=4, eval_samples=16, threads=1, pass_clients=1)
    assert opts.label.endswith("pass_clients=1") and "pass_clients" not in Options().label
    row = rehearse_one(dataclasses.replace(r, run=run), opts, tmp_path / "work", tmp_path)
    assert row["status"] == "pass", row["error"]
    done = next(e for e in events if e["event"] == "done")
    assert set(done["stages"]) >= {"preprocess", "finetune", "usual"}
    # 2 passes x 2 groups, then the 4 rounds (one pass of 10 clients, one a round, would be 10 rounds)
    assert done["rounds"] == 2 * 2 + 4
    first = next(e for e in events if e["event"] == "checkpoint")
    assert (first["next_round"], first["client_updates"]) == (4, 4)  # after the passes: one client a group
    assert (done["trained_rounds"], done["client_updates"]) == (4, 4 * 5)  # the resumed rounds: 5 clients each


def test_a_configuration_that_breaks_fails_and_names_its_cells(toy, tmp_path):
    run = toy.run
    broken = dataclasses.replace(run, training=dataclasses.replace(run.training, lr=1e38))  # weights overflow
    bad = dataclasses.replace(toy, run=broken)
    row = rehearse_one(bad, Options(rounds=2, eval_samples=16, threads=1), tmp_path / "work", tmp_path)
    # torch's unfused Adam refused the step ("overflow"); the fused one takes it and the outputs turn infinite
    assert row["status"] == "fail" and ("overflow" in row["error"] or "NaN or infinite" in row["error"]), row["error"]
    _, md = write_rehearsal([row], tmp_path / "out", "toy")
    text = md.read_text()
    assert "Not passed" in text and all(c in text for c in toy.cells)


def test_resume_keeps_passed_rows_of_the_same_options_and_reruns_the_rest(tmp_path):
    plan = _plan(["demo"])
    keys = list(distinct_configs(plan))
    opts = Options(rounds=4, eval_samples=16, threads=1)

    def row(key, status, with_):
        return {**dict.fromkeys(CSV_COLUMNS, ""), "config": key, "status": status, "rehearsed_with": with_,
                "code": "0.1.0+src.abc", "cells": "old", "peak_rss_mb": 100.0}

    rows = [row(keys[0], "pass", opts.label), row(keys[1], "fail", opts.label),
            row(keys[2], "pass", Options(rounds=2).label)]
    write_rehearsal(rows, tmp_path, "earlier")
    kept = earlier_rows(tmp_path / "rehearsal.csv", opts)
    assert list(kept) == [keys[0]]  # a failure is rehearsed again, other options are not reused
    logged = []
    out = rehearse(plan, opts, tmp_path, only=[keys[0]], log=logged.append, earlier=kept)
    assert [r["config"] for r in out] == [keys[0]] and "kept: 0.1.0+src.abc" in logged[0]
    assert out[0]["cells"] == ";".join(distinct_configs(plan)[keys[0]].cells)  # today's cells, not the stored ones
    assert not list((tmp_path / "rehearsal_work").glob("*"))  # nothing ran
    with pytest.raises(ConfigError, match="--only: nope"):
        rehearse(plan, opts, tmp_path, only=["nope"], earlier=kept)


def test_resume_with_only_adds_to_the_table_and_keeps_the_other_rows(tmp_path, monkeypatch):
    import fnlcore.app.rehearse as rh

    plan = _plan(["demo"])
    keys = list(distinct_configs(plan))
    opts = Options(rounds=4, eval_samples=16, threads=1)
    ran = []
    monkeypatch.setattr(rh, "rehearse_one", lambda r, *a: ran.append(r.config.key) or
                        {**dict.fromkeys(CSV_COLUMNS, ""), "config": r.config.key, "status": "pass"})
    earlier = {keys[2]: {**dict.fromkeys(CSV_COLUMNS, ""), "config": keys[2], "status": "pass", "code": "c"}}
    written = []
    out = rehearse(plan, opts, tmp_path, only=[keys[0]], log=lambda m: None, earlier=earlier,
                   on_row=lambda rows: written.append([r["config"] for r in rows]))
    assert ran == [keys[0]] and [r["config"] for r in out] == [keys[0], keys[2]]  # plan order, the kept row stays
    # the table written after the first configuration already holds the kept row further on (a
    # rehearsal stopped there must not lose it)
    assert written == [[keys[0], keys[2]]]
    assert out[1]["cells"] == ";".join(distinct_configs(plan)[keys[2]].cells)


def test_resume_refuses_a_table_without_the_columns_it_needs(tmp_path):
    pd.DataFrame({"config": ["x"], "status": ["pass"]}).to_csv(tmp_path / "rehearsal.csv", index=False)
    with pytest.raises(ConfigError, match="rehearsed_with.*move it aside"):
        earlier_rows(tmp_path / "rehearsal.csv", Options())


def test_merge_takes_each_configurations_last_measured_row_in_plan_order(tmp_path, capsys):
    """Shards rehearsed apart (``--only`` on two machines) become one table."""
    from fnlcore.cli import main

    plan = _plan(["demo"])
    keys = list(distinct_configs(plan))

    def row(key, status, code):
        return {**dict.fromkeys(CSV_COLUMNS, ""), "config": key, "status": status, "code": code, "cells": "old",
                "peak_rss_mb": 1.0}

    write_rehearsal([row(keys[2], "pass", "a"), row(keys[0], "fail", "a")], tmp_path / "a", "shard a")
    write_rehearsal([row(keys[0], "pass", "b"), row(keys[2], "fail", "b"), row("gone-config", "pass", "b")],
                    tmp_path / "b", "shard b")
    logged = []
    rows = merge_tables(plan, [tmp_path / "a" / "rehearsal.csv", tmp_path / "b" / "rehearsal.csv"], log=logged.append)
    # keys[0]: b's pass over a's failure; keys[2]: a's pass kept over b's later failure
    assert [(r["config"], r["status"], r["code"]) for r in rows] == [(keys[0], "pass", "b"), (keys[2], "pass", "a")]
    assert rows[0]["cells"] == ";".join(distinct_configs(plan)[keys[0]].cells)
    assert "gone-config" in logged[0]

    args = ["rehearse", "--tables", "demo", "--scale", "smoke", "--out", str(tmp_path / "m"), "--merge",
            str(tmp_path / "a" / "rehearsal.csv"), str(tmp_path / "b" / "rehearsal.csv")]
    assert main(args) == 0
    merged = pd.read_csv(tmp_path / "m" / "rehearsal.csv")
    assert list(merged["config"]) == [keys[0], keys[2]]
    assert f"Rehearsal of 2 of the {len(keys)} configurations" in (tmp_path / "m" / "rehearsal.md").read_text()
    assert main(args + ["--resume"]) == 2 and "--merge rehearses nothing" in capsys.readouterr().err
    pd.DataFrame({"config": [keys[0]], "status": ["pass"]}).to_csv(tmp_path / "old.csv", index=False)
    with pytest.raises(ConfigError, match="old.csv: not a rehearsal table"):
        merge_tables(plan, [tmp_path / "old.csv"])
