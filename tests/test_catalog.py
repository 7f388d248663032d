"""The Snakemake Workflow Catalog's conventions: config/README.md, .snakemake-workflow-catalog.yml,
`snakefmt --check` and the `.test/` configuration.

The catalog (https://snakemake.github.io/snakemake-workflow-catalog) shows a workflow's
config/README.md and its `snakemake --lint` (tests/test_lint.py) and `snakefmt --check` results,
and reads its usage settings from .snakemake-workflow-catalog.yml; Snakemake's convention is a
small `.test/` configuration that runs the workflow end to end.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from .conftest import REPO_ROOT
from .workflow_support import (
    deep_update,
    effective_config,
    expected_plan,
    job_counts,
    output_of,
    run_snakemake,
)

TEST_DIR = REPO_ROOT / ".test"


def _schema(name: str) -> dict:
    return yaml.safe_load((REPO_ROOT / "config" / "schema" / f"{name}.schema.yaml").read_text())


# -- config/README.md -------------------------------------------------------------------------------


def test_config_readme_names_every_configuration_key():
    """Every key the configuration schema accepts has a row of the top-level table, and every key
    nested under `data` and `data_grid` entries is named: the file cannot drift from the schema."""
    text = (REPO_ROOT / "config" / "README.md").read_text()
    props = _schema("config")["properties"]
    rows = [key for key in props if f"| `{key}` |" not in text]
    assert not rows, f"config/README.md has no row for top-level key(s) {rows} of config/schema/config.schema.yaml"
    nested = list(props["data"]["properties"])
    nested += list(props["data"]["properties"]["datasets"]["additionalProperties"]["properties"])
    nested += list(props["data_grid"]["items"]["properties"])
    missing = [key for key in nested if f"`{key}`" not in text]
    assert not missing, f"config/README.md does not name the key(s) {missing} of config/schema/config.schema.yaml"


def test_config_readme_names_every_scale_and_paper():
    text = (REPO_ROOT / "config" / "README.md").read_text()
    scales = sorted(p.stem for p in (REPO_ROOT / "config" / "scales").glob("*.yaml"))
    assert [s for s in scales if f"| `{s}` |" not in text] == [], "a scale of config/scales/ has no row"
    papers = sorted(p.stem for p in (REPO_ROOT / "config" / "papers").glob("*.yaml"))
    unnamed = [p for p in papers if f"`{p}`" not in text]
    assert unnamed == [], (
        "config/README.md does not name " + ", ".join(f"config/papers/{p}.yaml" for p in unnamed)
        + ": add " + ", ".join(f"`{p}` (with its tables)" for p in unnamed) + " to the 'Papers:' list under "
        "'## Paper tables (`papers/`)' in config/README.md")
    # every key a scale file may set
    assert [k for k in _schema("scale")["properties"] if k != "note" and f"`{k}`" not in text] == []


# -- .snakemake-workflow-catalog.yml ----------------------------------------------------------------


def test_catalog_settings_have_the_catalogs_keys_only():
    """The keys of the catalog's documentation; `report` sits in `usage`, where the catalog reads it."""
    settings = yaml.safe_load((REPO_ROOT / ".snakemake-workflow-catalog.yml").read_text())
    assert set(settings) == {"usage"}
    usage = settings["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    flags = usage["mandatory-flags"]
    assert set(flags) == {"desc", "flags"} and flags["desc"].strip()
    assert isinstance(flags["flags"], (str, list))
    deployment = usage["software-stack-deployment"]
    assert set(deployment) == {"conda", "apptainer", "apptainer+conda"}
    assert all(isinstance(v, bool) for v in deployment.values()) and any(deployment.values())
    assert isinstance(usage["report"], bool)


def test_catalog_settings_match_the_workflow():
    usage = yaml.safe_load((REPO_ROOT / ".snakemake-workflow-catalog.yml").read_text())["usage"]
    snakefile = (REPO_ROOT / "Snakefile").read_text()
    rules = "".join(p.read_text() for p in sorted((REPO_ROOT / "rules").glob("*.smk")))
    # a report: the workflow declares its report page and report() outputs
    has_report = re.search(r"^report:\s*\"report/", snakefile, re.M) is not None and "report(" in rules
    assert usage["report"] == has_report
    # conda: every rule names an environment of envs/ (snakemake --lint checks that each has one)
    envs = set(re.findall(r"\"\.\./(envs/[\w.-]+\.yaml)\"", rules))
    assert usage["software-stack-deployment"]["conda"] == bool(envs)
    assert all((REPO_ROOT / e).is_file() for e in envs)
    # apptainer+conda needs the container directive the conda environments are built in
    assert usage["software-stack-deployment"]["apptainer+conda"] == ("\ncontainer:" in snakefile)


# -- snakefmt ---------------------------------------------------------------------------------------


def test_snakefile_and_rules_are_snakefmt_formatted():
    """What the catalog runs, in the repository root (so pyproject.toml's settings apply):
    `snakefmt --check Snakefile rules/*.smk`. Fix: `.venv/bin/snakefmt Snakefile rules/`."""
    try:
        version = importlib.metadata.version("snakefmt")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("snakefmt is not installed (requirements-dev.txt pins it: bash scripts/setup.sh)")
    files = ["Snakefile", *sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "rules").glob("*.smk"))]
    res = subprocess.run([sys.executable, "-m", "snakefmt", "--check", *files], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (
        f"snakefmt {version} would reformat (fix: .venv/bin/snakefmt Snakefile rules/):\n"
        + (res.stdout + res.stderr)[-4000:]
    )


# -- .test/ -----------------------------------------------------------------------------------------


def test_dot_test_label_sets_are_those_of_the_demo_table_at_its_scale(monkeypatch):
    """Adding `--config 'tables=["demo"]'` (as .test/config/config.yaml says) trains every run of the
    demo table on the very label sets the test configuration builds, at its scale."""
    from fnlcore.app.plan import build_plan, validate_schema

    monkeypatch.chdir(TEST_DIR)  # the config's scale path is relative to the working directory
    config = effective_config(TEST_DIR / "config" / "config.yaml")
    assert config["tables"] == [] and config["device"] == "cpu"
    grid = build_plan(validate_schema(config))
    with_table = build_plan(validate_schema(deep_update(config, {"tables": ["demo"]})))

    def key(s):
        return (s.dataset, s.partition.slug(), s.partition_seed, s.noise.slug(), s.noise_seed)

    (table,) = with_table.tables
    assert table.name == "demo/demo"
    # one run per row x column x seed of the demo's paper file (a row added there adds its runs)
    cells = {(tr.row, tr.column, tr.run.seed) for tr in table.runs}
    assert len(cells) == len(table.spec.rows) * len(table.spec.columns) * len({s for _, _, s in cells})
    assert len(with_table.runs()) == len(cells) >= 12
    assert {key(r) for r in with_table.runs()} == {key(s) for s in grid.label_sets}
    assert with_table.tables[0].scale == "test"  # results/tables/test/demo/demo.*


def test_dot_test_configuration_plans_its_jobs_and_targets(tmp_path, monkeypatch):
    """`snakemake --cores 2 --directory .test --configfile .test/config/config.yaml`, dry run in a copy
    of .test/: the dataset, the partition, the H-IDN annotator and three noisy label sets with their
    figures. A dry run: executing these very rules on digits is tests/test_workflow.py's data side
    (every target, annotators for noisy clients only), which keeps the suite within its time."""
    workdir = tmp_path / ".test"
    shutil.copytree(TEST_DIR, workdir, ignore=shutil.ignore_patterns("results", "resources", ".snakemake"))
    configfile = workdir / "config" / "config.yaml"
    res = run_snakemake(workdir, configfile, "-n", cores=2)
    out = output_of(res)
    assert res.returncode == 0, out[-5000:]
    assert job_counts(out) == {"prepare_in_memory_dataset": 1, "partition": 1, "annotator": 1, "noise": 3,
                               "all": 1}, out[-5000:]
    monkeypatch.chdir(workdir)
    plan = expected_plan(configfile)
    assert len(plan.targets()) == 3 + 3 * 4  # partition files + 3 label sets x 4 noise files
    assert not (workdir / plan.results_dir).exists()  # a dry run writes nothing
