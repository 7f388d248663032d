"""Bad input is rejected before any job runs, in one line naming the file, the key and the fix;
and the fix an error names works.

Every case goes through the workflow's own startup checks: ``validate_schema`` (rules/validate.smk)
then ``build_plan`` (rules/common.smk). A paper file of a case is written into a scratch
``config/papers`` (``PAPERS_DIR`` patched, as tests/test_robustness.py does); the configuration's
own keys (``data_grid``, ``data.datasets``) come from ``--configfile``/``--config`` merged, so their
errors name the key alone, as every other configuration error does.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import runpy
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fnlcore.app.plan import build_plan, validate_schema
from fnlcore.errors import ConfigError, DataError
from tests.workflow_support import (
    REPO_ROOT, config_error, expected_plan, load_test_config, nothing_to_do, output_of, run_snakemake, write_config,
)

DEMO = yaml.safe_load((REPO_ROOT / "config" / "papers" / "demo.yaml").read_text())


def _error(config: dict) -> str:
    """The one-line ConfigError the workflow's startup gives for ``config``."""
    with pytest.raises(ConfigError) as e:
        build_plan(validate_schema(copy.deepcopy(config)))
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def _has(msg: str, *needles: str) -> None:
    for n in needles:
        assert n in msg, (n, msg)


@pytest.fixture
def paper(tmp_path, monkeypatch):
    """``paper(mutate)``: the demo paper, changed by ``mutate(doc)``, as config/papers/x.yaml (its
    reported CSVs in config/papers/reported/); returns the config selecting it at scale paper."""
    from fnlcore.app import papers

    folder = tmp_path / "papers"
    (folder / "reported").mkdir(parents=True)
    monkeypatch.setattr(papers, "PAPERS_DIR", folder)
    monkeypatch.setattr(papers, "REPORTED_DIR", folder / "reported")

    def make(mutate) -> dict:
        doc = copy.deepcopy(DEMO)
        doc["paper"] = "x"
        mutate(doc)
        (folder / "x.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return {"tables": ["x"], "data_grid": [], "scale": "paper"}

    make.reported = folder / "reported"
    return make


def _scale_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return str(path)


GRID = {"dataset": "digits", "partitions": [{"name": "iid", "num_clients": 10}], "partition_seeds": [0]}


# -- integers are integers: in the schema and in TrainSettings ---------------------------------------


def test_fractional_rounds_in_a_scale_file(tmp_path):
    scale = _scale_file(tmp_path, "training: {rounds: 6.5}\n")
    msg = _error({"tables": ["demo"], "data_grid": [], "scale": scale})
    _has(msg, scale, "training.rounds", "6.5", "must be an integer")


@pytest.mark.parametrize("text, needles", [
    ("training: {lr: -1}\n", ["training (applied to config/papers/demo.yaml: tables[0] (demo).rows[0]", "lr=-1"]),
    ("noises: {fednoro_hidn: {rho: 2}}\n", ["noises.fednoro_hidn (applied to config/papers/demo.yaml", "rho=2"]),
    ("training: {model: nonexist}\n", ["training.model (applied to table demo/demo", "'nonexist' is not a model"]),
    ("dataset_options: {digits: {test_size: 2}}\n", ["dataset_options.digits", "test_size must lie in (0, 1)"]),
])
def test_a_bad_value_in_a_scale_file_is_named_as_the_scale_files(tmp_path, text, needles):
    """Issue 46, item 5: such values were reported against the paper file's row (a bad test_size
    as a num_clients of -1797 samples)."""
    scale = _scale_file(tmp_path, text)
    msg = _error({"tables": ["demo"], "data_grid": [], "scale": scale})
    _has(msg, *needles)
    assert msg.index(scale) < min(msg.index(n) for n in needles), msg  # the scale's key comes first


def test_fractional_rounds_in_a_paper_row(paper):
    cfg = paper(lambda d: d["tables"][0]["rows"][0].setdefault("training", {}).update(rounds=6.5))
    _has(_error(cfg), "config/papers/x.yaml", "tables[0].rows[0].training.rounds", "6.5", "must be an integer")


def test_a_boolean_is_not_an_integer(paper):
    cfg = paper(lambda d: d["defaults"]["training"].update(local_epochs=True))
    _has(_error(cfg), "config/papers/x.yaml", "defaults.training.local_epochs", "True", "must be an integer")


def test_train_settings_check_types_themselves():
    """Settings built in code (not through a YAML file) are checked as well; nothing is converted."""
    from fnlcore.fl.settings import TrainSettings

    for key, value, fix in [("rounds", 6.5, "must be an integer"), ("batch_size", True, "must be an integer"),
                            ("lr", "0.1", "must be a finite number"), ("pretrained", 1, "must be true or false"),
                            ("lr_milestones", (2.5,), "integer round numbers"), ("normalize", "imagnet", "imagenet")]:
        with pytest.raises(ConfigError) as e:
            TrainSettings(**{key: value})
        _has(str(e.value), f"training.{key}={value!r}", fix)
    assert TrainSettings(lr=1).lr == 1 and type(TrainSettings(lr=1).lr) is int  # as given: slugs stay


def test_the_training_schema_lists_every_train_setting_with_its_type():
    from fnlcore.fl.settings import TrainSettings
    from fnlcore.schemas import load_schema

    props = load_schema("training")["properties"]
    fields = {f.name: f.type for f in dataclasses.fields(TrainSettings)}
    assert set(props) == set(fields)
    json_type = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}
    for name, ftype in fields.items():
        if ftype in json_type and name != "normalize":
            assert props[name]["type"] == json_type[ftype], name


# -- more clients than samples --------------------------------------------------------------------


def test_more_clients_than_samples_in_the_data_grid():
    grid = copy.deepcopy(GRID)
    grid["partitions"][0]["num_clients"] = 5000
    msg = _error({"data_grid": [grid], "tables": []})
    _has(msg, "data_grid[0].partitions[0].num_clients", "5000", "1347 training samples", "use at most 1347")


def test_more_clients_than_samples_in_a_paper(paper):
    cfg = paper(lambda d: d["defaults"]["partition"].update(num_clients=5000))
    _has(_error(cfg), "config/papers/x.yaml: defaults.partition.num_clients", "5000", "use at most 1347")


def test_more_clients_than_samples_of_an_on_disk_set_names_the_key_in_the_partition_job(tmp_path):
    """An on-disk set's size is known once prepared: the partition job checks it, naming the key
    (here with digits prepared, the check being the same for every set)."""
    from fnlcore.datasets import prepare_dataset
    from fnlcore.partition import partition_spec_from_dict

    data = tmp_path / "data" / "digits"
    prepare_dataset("digits", raw_dir=str(tmp_path / "raw"), out_dir=str(data))
    grid = copy.deepcopy(GRID)
    grid["partitions"][0]["num_clients"] = 5000
    spec = partition_spec_from_dict(dict(grid["partitions"][0]))
    sm = types.SimpleNamespace(
        scriptdir=str(REPO_ROOT / "workflow_scripts"), log=[str(tmp_path / "p.log")], config={"data_grid": [grid]},
        params=types.SimpleNamespace(spec=spec, data_dir=str(data)),
        wildcards=types.SimpleNamespace(dataset="digits", partition=spec.slug(), pseed="0"),
    )
    with pytest.raises(ConfigError) as e:
        runpy.run_path(str(REPO_ROOT / "workflow_scripts" / "make_partition.py"), init_globals={"snakemake": sm})
    _has(str(e.value), "data_grid[0].partitions[0].num_clients", "5000", "1347 training samples", "use at most 1347")


def test_the_partition_job_finds_a_tables_key_without_torch():
    """The key finder the partition job uses (its environment has no torch) reads tables too."""
    from fnlcore.app.plan import partition_keys

    cfg = {"tables": ["fednoro/1"], "scale": "paper", "data_grid": []}
    keys = partition_keys(cfg, "ich_fednoro", "bd-p0.9-a2.0-K20")
    assert keys == ["config/papers/fednoro.yaml: defaults.partition.num_clients"]
    smoke = partition_keys({"tables": ["fednoro/1"], "scale": "smoke"}, "synthetic_ich_fednoro", "bd-p1.0-a2.0-K4")
    assert smoke == ["config/scales/smoke.yaml: num_clients"]  # the scale's count is the one used


# -- seeds, ids, unused blocks ------------------------------------------------------------------------


def test_a_negative_partition_seed_names_the_fix(paper):
    cfg = paper(lambda d: d["defaults"].update(partition_seed=-1))
    _has(_error(cfg), "config/papers/x.yaml", "defaults.partition_seed", "-1",
         "use a non-negative integer, or 'same'")


@pytest.mark.parametrize("where", ["defaults", "table"])
def test_a_repeated_seed_in_a_paper_is_named_before_any_job(paper, where):
    """Issue 46: `seeds: [0, 0]` failed only in the table job, after all the training."""
    target = (lambda d: d["defaults"]) if where == "defaults" else (lambda d: d["tables"][0])
    cfg = paper(lambda d: target(d).update(seeds=[0, 1, 0]))
    key = "defaults.seeds" if where == "defaults" else "tables[0].seeds"
    _has(_error(cfg), "config/papers/x.yaml", key, "[0, 1, 0]", "lists 0 more than once", "list each value once")


def test_a_repeated_seed_in_a_scale_file_or_the_data_grid_is_named(tmp_path):
    scale = _scale_file(tmp_path, "seeds: [3, 3]\n")
    _has(_error({"tables": ["demo"], "data_grid": [], "scale": scale}), scale, "seeds", "lists 3 more than once")
    for key in ("partition_seeds", "noise_seeds"):
        grid = {**copy.deepcopy(GRID), key: [1, 1]}
        _has(_error({"data_grid": [grid], "tables": []}), f"data_grid[0].{key}", "lists 1 more than once")


def test_a_table_id_that_is_not_a_file_name(paper):
    cfg = paper(lambda d: d["tables"][0].update(id="../escape"))
    _has(_error(cfg), "config/papers/x.yaml", "tables[0].id", "'../escape'", "letters, digits and underscores")


def test_a_dataset_block_no_selected_table_uses():
    msg = _error({"data_grid": [GRID], "tables": [], "data": {"datasets": {"cifar10": {"raw_dir": "x"}}}})
    _has(msg, "data.datasets.cifar10", "no selected table and no data_grid entry uses", "they use: digits",
         "Remove the block")


def test_a_dataset_block_for_a_dataset_the_scale_replaces():
    cfg = {"tables": ["fednoro/1"], "scale": "smoke", "data": {"datasets": {"ich_fednoro": {"raw_dir": "x"}}}}
    msg = _error(cfg)
    _has(msg, "data.datasets.ich_fednoro", "at scale 'smoke' the tables use 'synthetic_ich_fednoro'",
         "Remove the block")


# -- reported CSVs: read by the table job, checked at startup -----------------------------------------


def _reported(folder: Path, drop: str | None = None) -> None:
    df = pd.DataFrame({"paper": ["x"], "table": ["demo"], "dataset": ["digits"], "partition": ["bd"],
                       "noise_setting": ["clean"], "method": ["fedavg"], "metric": ["bacc_best_round"],
                       "value": [50.0], "std": [""]})
    df.drop(columns=[drop] if drop else []).to_csv(folder / "x.csv", index=False)


@pytest.mark.parametrize("drop,needles", [
    ("std", ["lacks column(s) ['std']", "add them to its header line"]),
    ("noise_setting", ["lacks column(s) ['noise_setting']", "add them to its header line"]),
])
def test_a_reported_csv_lacking_columns(paper, drop, needles):
    cfg = paper(lambda d: d["tables"][0].update(reported="x.csv"))
    _reported(paper.reported, drop)
    _has(_error(cfg), "config/papers/x.yaml: tables[0] (demo).reported", str(paper.reported / "x.csv"), *needles)


def test_a_reported_csv_lacking_a_key_field(paper):
    cfg = paper(lambda d: d["tables"][0].update(reported="x.csv", row_fields=["variant"]))
    _reported(paper.reported)
    _has(_error(cfg), "config/papers/x.yaml: tables[0] (demo).reported", "['variant']",
         "add them to the CSV, or change the table's row_fields/column_fields")


def test_a_missing_reported_csv(paper):
    cfg = paper(lambda d: d["tables"][0].update(reported="absent.csv"))
    _has(_error(cfg), "config/papers/x.yaml: tables[0] (demo).reported", "absent.csv", "does not exist; copy")


# -- through Snakemake: no job runs ----------------------------------------------------------------------


@pytest.mark.slow  # one Snakemake start, a few CPU seconds
def test_snakemake_stops_before_any_job(tmp_path):
    workdir = tmp_path / "wf"
    cfg = load_test_config("demo_table")
    cfg["scale"] = _scale_file(tmp_path, "training: {rounds: 6.5}\n")
    res = run_snakemake(workdir, write_config(workdir, cfg), "-n")
    out = output_of(res)
    assert res.returncode != 0, out[-3000:]
    message = config_error(out)
    assert message and len(message.splitlines()) == 1, out[-3000:]
    _has(message, cfg["scale"], "training.rounds", "6.5", "must be an integer")
    assert "Building DAG of jobs" not in out and not (workdir / "results").exists()


# -- a broken artifact's advice (item 6) ------------------------------------------------------------------


def test_a_truncated_partition_names_a_fix_that_rebuilds_it(tmp_path, monkeypatch):
    from fnlcore import io
    from fnlcore.partition import read_partition

    monkeypatch.chdir(tmp_path)  # jobs read their inputs by the relative paths Snakemake gives them
    path = "results/partitions/digits/iid-K10/pseed0.parquet"
    os.makedirs(os.path.dirname(path))
    frame = pd.DataFrame({"sample_id": np.arange(500), "client": np.zeros(500, int), "position": np.arange(500)})
    io.write_parquet(frame, path)
    Path(path).write_bytes(Path(path).read_bytes()[:200])
    with pytest.raises(DataError) as e:
        read_partition(path, num_samples=500)
    _has(str(e.value), path, "truncated or corrupt", f"`--forcerun {path}`")


def _fake_results(workdir: Path, configfile: Path) -> list[str]:
    """Every output of the workflow, as empty files of one age: a finished workflow, for dry runs."""
    res = run_snakemake(workdir, configfile, "-n", "--rerun-triggers", "mtime")
    assert res.returncode == 0, output_of(res)[-3000:]
    listed = re.finditer(r"^\s+output: (.+)$", output_of(res), re.M)
    outputs = [p.strip() for m in listed for p in m.group(1).split(",")]
    plan = expected_plan(configfile)
    # the table job prints its message instead of an output line
    outputs += [f for t in plan.tables for f in t.outputs(plan.results_dir).values()]
    for p in outputs:
        (workdir / p).parent.mkdir(parents=True, exist_ok=True)
        (workdir / p).write_bytes(b"x")
        os.utime(workdir / p, (1.7e9, 1.7e9))
    return outputs


@pytest.mark.slow  # four dry runs of the demo table (Snakemake, a few CPU seconds each)
def test_the_advice_for_a_broken_partition_rebuilds_it(tmp_path, monkeypatch):
    """The issue's case: a table's partition (no data_grid target) found broken by its noise job.
    Deleting it and rerunning plainly does nothing while the noisy labels made from it are
    present; the command the error names builds it again, then what was made from it.
    (``--rerun-triggers mtime``: the fake files carry no Snakemake records.)"""
    from fnlcore import io
    from fnlcore.partition import read_partition

    workdir = tmp_path / "wf"
    configfile = write_config(workdir, load_test_config("demo_table"))
    outputs = _fake_results(workdir, configfile)
    dry = ("-n", "--rerun-triggers", "mtime")
    assert nothing_to_do(run_snakemake(workdir, configfile, *dry))
    (part,) = [p for p in outputs if p.startswith("results/partitions/") and p.endswith(".parquet")]

    monkeypatch.chdir(workdir)
    io.write_parquet(pd.DataFrame({"a": np.arange(1000)}), part)
    Path(part).write_bytes(Path(part).read_bytes()[:100])  # truncated
    with pytest.raises(DataError) as e:
        read_partition(part, num_samples=1000)
    advice = re.search(r"delete it and rerun with `([^`]+)` added to the snakemake command", str(e.value))
    assert advice, str(e.value)

    Path(part).unlink()
    assert nothing_to_do(run_snakemake(workdir, configfile, *dry))  # why "delete it and rerun" was not enough
    res = run_snakemake(workdir, configfile, *dry, *advice.group(1).split())
    out = output_of(res)
    assert res.returncode == 0, out[-3000:]
    assert re.search(rf"^\s+output: {re.escape(part)},", out, re.M), out[-3000:]
    assert re.search(r"^noise\s+3$", out, re.M) and re.search(r"^train\s+12$", out, re.M), out[-3000:]
