"""A run's identity covers its resolved settings, and a finished run records its code version.

Snakemake reruns a job when its params change, but it records plain values only: the spec
objects the rules pass (training settings, a method's params, a partitioner...) were dropped
unseen, and a path holds only the non-default settings. So a changed default in the code
reran nothing and the tables kept the old code's numbers. Each settings-dependent rule now
tracks ``identity``, a digest of its settings with every default filled in
(:func:`fnlcore.app.identity.settings_identity`).

The first half checks the digest without Snakemake. The second builds one tiny table (digits,
FedAvg and FedProx on a plug-in partition and noise model: 7 jobs) in a copy of the workflow,
changes one default in the copy's code (the edit a release makes), and asks Snakemake with a
dry run what a plain rerun would do: exactly the jobs whose settings changed, and what depends
on their outputs. A code change that changes no setting reruns nothing; `fnl status` and the
table footer then name the runs made by the other code.

Tests restore what they change, so they run in any order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fnlcore import provenance
from fnlcore.app import identity
from fnlcore.app.plan import DatasetSettings
from fnlcore.app.runs import train_slug
from fnlcore.fl.settings import TrainSettings
from fnlcore.methods.fedprox import FedProxParams
from fnlcore.partition.specs import DirichletNiidBenchPartition
from fnlcore.app.identity import settings_identity

from .workflow_support import RUN_TIMEOUT_S, job_counts, nothing_to_do, output_of

REPO = Path(__file__).resolve().parents[1]


# -- the digest, without Snakemake ------------------------------------------------------------------


def test_a_default_left_out_or_given_is_one_identity_and_another_value_another():
    given = TrainSettings(momentum=0.0)
    assert settings_identity(TrainSettings()) == settings_identity(given)
    assert settings_identity(TrainSettings(lr=1)) == settings_identity(TrainSettings(lr=1.0))  # 1 is 1.0
    # what a changed default does: the path stays (defaults add nothing to it), the identity moves
    moved = TrainSettings(momentum=0.5)
    assert train_slug(TrainSettings()) == "auto-r100-e1-b32-sgd0.01" != train_slug(moved)
    assert settings_identity(moved) != settings_identity(TrainSettings())
    # a field that never changes the numbers is out of it, as out of the path
    assert settings_identity(TrainSettings(checkpoint_every=2)) == settings_identity(TrainSettings())


def test_a_specs_identity_holds_every_field_but_those_that_never_change_a_result():
    assert settings_identity(FedProxParams()) == settings_identity(FedProxParams(form="squared_half"))
    assert settings_identity(FedProxParams(form="fedcorr_unsquared")) != settings_identity(FedProxParams())
    assert identity.resolved_settings(FedProxParams()) == {
        "kind": "method", "name": "fedprox", "mu": 0.01, "form": "squared_half", "skip_first_batch": False}
    # each part of a job's identity counts: the training's and the method's
    assert (settings_identity(TrainSettings(), FedProxParams())
            != settings_identity(TrainSettings(), FedProxParams(form="fedcorr_unsquared")))
    # a partition's retry limit (declared slug=False: it never changes a partition) is not in it
    dirichlet = DirichletNiidBenchPartition(num_clients=3)
    assert settings_identity(dirichlet) == settings_identity(dataclasses.replace(dirichlet, max_attempts=5))
    assert settings_identity(dirichlet) != settings_identity(dataclasses.replace(dirichlet, alpha=0.5))


def test_a_datasets_identity_fills_its_option_defaults_and_ignores_where_files_lie(monkeypatch):
    from fnlcore.datasets import digits

    plain = DatasetSettings("digits", raw_dir="resources/raw/digits")
    same = DatasetSettings("digits", raw_dir="/elsewhere", mirrors=("https://m",), options={"test_size": 0.25})
    assert settings_identity(plain) == settings_identity(same)
    other = DatasetSettings("digits", raw_dir="resources/raw/digits", options={"test_size": 0.3})
    assert settings_identity(other) != settings_identity(plain)
    before = settings_identity(plain)
    monkeypatch.setitem(digits.OPTIONS, "test_size", 0.3)  # a changed default in the code
    assert settings_identity(plain) == settings_identity(other) != before
    # an on-disk set's defaults come from its options dataclass; the cache switch is not the data's
    isic = DatasetSettings("isic2019", raw_dir="r")
    assert identity.resolved_settings(isic)["options"]["train_fraction"] == 0.7
    assert settings_identity(isic) == settings_identity(DatasetSettings("isic2019", "r", options={"decoded_cache": False}))


def test_a_finished_run_records_its_code_version_and_runs_of_other_code_are_named(tmp_path, monkeypatch):
    from fnlcore.app.train import write_metrics
    from fnlcore.io import read_parquet, write_parquet

    df = pd.DataFrame({"round": [0, 1], "acc": [0.5, 0.6]})
    ours, older, missing = tmp_path / "a" / "metrics.parquet", tmp_path / "b" / "metrics.parquet", tmp_path / "c.parquet"
    for p in (ours, older):
        p.parent.mkdir()
    write_metrics(df, ours)
    write_parquet(df, older)  # a run made before runs recorded their code
    assert read_parquet(ours).equals(df)
    assert provenance.recorded_made_by(ours) == provenance.made_by()
    assert provenance.recorded_made_by(older) is None
    assert provenance.other_code_runs([ours, older, missing]) == {str(older): None}
    monkeypatch.setattr(provenance, "source_digest", lambda: "0ther0c0de000")  # another code version
    other = provenance.other_code_runs([ours, older])
    assert set(other) == {str(ours), str(older)} and other[str(ours)]["code"] != provenance.code_version()
    text = provenance.other_code_text(other, {str(ours): "FedAvg / clean / seed 0"}, total=2)
    assert text.startswith("2 of 2 runs were made by another code version than this one (fnlcore 0.1.0+src.0ther0c0de000")
    assert "FedAvg / clean / seed 0" in text and str(older.parent) in text and "unknown code version" in text


# -- a tiny workflow: what a dry run would rerun ----------------------------------------------------

PAPER = "identitytest"
# A partitioner and a noise model whose defaults are not in their slugs (as most defaults are not),
# in their own plug-in module, so a test can change a default as a release would.
PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fnlcore.assignment import ClientAssignment
from fnlcore.noise.generators import symmetric_noise
from fnlcore.noise.specs import NOISE_MODELS, NoiseSpec
from fnlcore.partition.specs import PARTITIONERS, PartitionSpec
from fnlcore.registry import param
from fnlcore.rng import legacy_rng

SHIFT = 0
RATE = 0.2


@PARTITIONERS.register
@dataclass(frozen=True)
class ShiftedBlocks(PartitionSpec):
    name: ClassVar[str] = "test_shifted_blocks"
    paper: ClassVar[str] = "test plug-in"
    slug_head: ClassVar[str] = "test_shifted"
    slug_fields: ClassVar[tuple] = (("num_clients", "K"),)
    num_clients: int = param(3, ge=1)
    shift: int = param(SHIFT, ge=0, doc="positions the permutation is rolled by")

    def run(self, labels, seed):
        perm = np.roll(legacy_rng(seed).permutation(len(labels)), self.shift)
        return ClientAssignment(len(labels), tuple(np.array_split(perm, self.num_clients)))


@NOISE_MODELS.register
@dataclass(frozen=True)
class SomeSymmetricNoise(NoiseSpec):
    name: ClassVar[str] = "test_some_symmetric"
    paper: ClassVar[str] = "test plug-in"
    slug_head: ClassVar[str] = "test_somesym"
    rate: float = param(RATE, ge=0, le=1)

    def draw(self, labels, assignment, num_classes, seed, soft_labels=None):
        return symmetric_noise(labels, assignment, self.rate, seed, num_classes)
'''
TABLE_DOC = {
    "paper": PAPER,
    "title": "Run identity test",
    "defaults": {
        "dataset": "digits",
        "partition": {"name": "test_shifted_blocks", "num_clients": 3},
        "partition_seed": 0,
        "noise_seed": 0,
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 2, "local_epochs": 1, "batch_size": 64, "optimizer": "sgd",
                     "lr": 0.05},
    },
    "tables": [{
        "id": "t",
        "title": "Balanced accuracy (%) on digits",
        "metrics": [{"name": "bacc", "label": "BACC", "source": "bacc", "summary": {"kind": "best"}}],
        "columns": [{"label": "noisy", "noise": {"name": "test_some_symmetric"}}],
        "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}},
                 # FedCorr's un-squared form has no gradient where w = w_g (a round's first step): its code,
                 # as this row, skips the term on each epoch's first batch
                 {"label": "FedProx", "method": {"name": "fedprox", "mu": 0.01, "skip_first_batch": True}}],
    }],
}
DOWNSTREAM_OF_DATA = {"partition": 1, "noise": 1, "train": 2, "table": 1, "all": 1}


class Copy:
    """A copy of the workflow (its own fnlcore and plug-in, so a test can edit their defaults)."""

    def __init__(self, root: Path):
        self.copy = root / "workflow"
        self.workdir = root / "work"
        self.configfile = self.workdir / "config.yaml"

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.copy), os.environ.get("PYTHONPATH", "")) if p)
        plugins = ",".join(p for p in (os.environ.get("FNL_PLUGINS", ""), "identity_plugin") if p)
        return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1", "FNL_PLUGINS": plugins}

    def snakemake(self, *args: str, configfile: Path | None = None) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(self.copy / "Snakefile"),
               "--configfile", str(configfile or self.configfile), "--cores", "2", *args]
        return subprocess.run(cmd, cwd=self.workdir, env=self.env(), capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)

    def fnl_status(self) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "fnlcore.cli", "status", "--configfile", str(self.configfile)]
        return subprocess.run(cmd, cwd=self.workdir, env=self.env(), capture_output=True, text=True, timeout=300)

    @contextlib.contextmanager
    def edited(self, relpath: str, old: str, new: str):
        """The copy's ``relpath`` with ``old`` (found once) replaced by ``new``, restored after."""
        f = self.copy / relpath
        text = f.read_text()
        assert text.count(old) == 1, (relpath, old)
        f.write_text(text.replace(old, new))
        try:
            yield
        finally:
            f.write_text(text)

    def table_md(self) -> Path:
        return self.workdir / "results" / "tables" / "paper" / PAPER / "t.md"

    def run_dir(self, method: str) -> Path:
        (metrics,) = [p for p in (self.workdir / "results" / "runs").rglob("metrics.parquet")
                      if f"/{method}" in str(p.parent.parent)]
        return metrics.parent


@pytest.fixture(scope="module")
def wf(tmp_path_factory) -> Copy:
    c = Copy(tmp_path_factory.mktemp("identity"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    c.copy.mkdir()
    for part in ("Snakefile", "rules", "workflow_scripts", "config", "fnlcore", "report", "envs"):
        src = REPO / part
        (shutil.copytree(src, c.copy / part, ignore=ignore) if src.is_dir() else shutil.copy2(src, c.copy / part))
    (c.copy / "identity_plugin.py").write_text(PLUGIN)
    (c.copy / "config" / "papers" / f"{PAPER}.yaml").write_text(yaml.safe_dump(TABLE_DOC, sort_keys=False))
    c.workdir.mkdir()
    c.configfile.write_text(yaml.safe_dump(
        {"results_dir": "results", "device": "cpu", "tables": [PAPER], "data_grid": [], "scale": "paper"}))
    res = c.snakemake()
    assert res.returncode == 0, output_of(res)[-5000:]
    assert job_counts(output_of(res)) == {"prepare_in_memory_dataset": 1, **DOWNSTREAM_OF_DATA}, output_of(res)[-3000:]
    # the identities are stable from one Snakemake process to the next (no addresses, no set order)
    again = c.snakemake("-n")
    assert nothing_to_do(again), output_of(again)[-3000:]
    return c


def _dry(wf: Copy, **kw) -> tuple[dict[str, int], str]:
    res = wf.snakemake("-n", **kw)
    out = output_of(res)
    assert res.returncode == 0, out[-3000:]
    return job_counts(out), out


@pytest.mark.slow
def test_a_changed_training_default_reruns_the_runs_and_nothing_before_them(wf):
    """The issue's first case: fnlcore/fl/settings.py momentum 0.0 -> 0.5 (the run paths stay)."""
    with wf.edited("fnlcore/fl/settings.py", "    momentum: float = 0.0\n", "    momentum: float = 0.5\n"):
        counts, out = _dry(wf)
        assert counts == {"train": 2, "table": 1, "all": 1}, out[-3000:]
        assert "Params have changed" in out
    assert nothing_to_do(wf.snakemake("-n"))  # the old default back: the recorded identities match again


@pytest.mark.slow
def test_a_setting_that_never_changes_a_result_reruns_nothing(wf):
    # no run reruns; the edit is a code change, so the table is built again for its code note
    with wf.edited("fnlcore/fl/settings.py", "    checkpoint_every: int = 5\n", "    checkpoint_every: int = 2\n"):
        counts, out = _dry(wf)
        assert counts == {"table": 1, "all": 1}, out[-3000:]


@pytest.mark.slow
def test_a_changed_dataset_option_or_default_prepares_again_with_everything_after_it(wf):
    """The issue's digits `test_size: 0.3`, from the config and as a changed default in the code."""
    cfg = yaml.safe_load(wf.configfile.read_text())
    cfg["data"] = {"datasets": {"digits": {"options": {"test_size": 0.3}}}}
    option = wf.workdir / "option.yaml"
    option.write_text(yaml.safe_dump(cfg))
    counts, out = _dry(wf, configfile=option)
    assert counts == {"prepare_in_memory_dataset": 1, **DOWNSTREAM_OF_DATA}, out[-3000:]
    with wf.edited("fnlcore/datasets/digits.py", 'OPTIONS = {"test_size": 0.25,', 'OPTIONS = {"test_size": 0.3,'):
        counts, out = _dry(wf)
        assert counts == {"prepare_in_memory_dataset": 1, **DOWNSTREAM_OF_DATA}, out[-3000:]
    # the option given at its default value is the same dataset: nothing to do
    cfg["data"] = {"datasets": {"digits": {"options": {"test_size": 0.25}}}}
    option.write_text(yaml.safe_dump(cfg))
    assert nothing_to_do(wf.snakemake("-n", configfile=option))


@pytest.mark.slow
def test_a_changed_partition_or_noise_default_reruns_from_that_artifact_on(wf):
    with wf.edited("identity_plugin.py", "SHIFT = 0\n", "SHIFT = 1\n"):
        counts, out = _dry(wf)
        assert counts == DOWNSTREAM_OF_DATA, out[-3000:]
    with wf.edited("identity_plugin.py", "RATE = 0.2\n", "RATE = 0.3\n"):
        counts, out = _dry(wf)
        assert counts == {"noise": 1, "train": 2, "table": 1, "all": 1}, out[-3000:]


@pytest.mark.slow
def test_a_changed_method_default_reruns_that_methods_runs_and_the_others_are_named_as_other_code(wf):
    """The issue's FedProx `form`: only the FedProx run reruns. The FedAvg run keeps the old code's
    version (a code change alone reruns nothing); the table footer and `fnl status` name it."""
    fedavg, fedprox = wf.run_dir("fedavg"), wf.run_dir("fedprox")
    form = 'form: str = param("squared_half",'
    with wf.edited("fnlcore/methods/fedprox.py", form, 'form: str = param("fedcorr_unsquared",'):
        counts, out = _dry(wf)
        assert counts == {"train": 1, "table": 1, "all": 1}, out[-3000:]
        assert str(fedprox.relative_to(wf.workdir)) in out and str(fedavg.relative_to(wf.workdir)) not in out
        res = wf.snakemake()
        assert res.returncode == 0, output_of(res)[-3000:]
        assert "1 of 2 runs of these tables were made by another code version" in output_of(res)
        footer = wf.table_md().read_text().split("**Code versions.** ")[1]
        assert footer.startswith("1 of 2 runs was made by another code version than the one that built this table")
        assert "FedAvg / noisy / seed 0" in footer and "FedProx" not in footer
        status = wf.fnl_status()
        assert status.returncode == 0 and "done 2" in status.stdout, status.stdout + status.stderr
        assert "Warning: 1 of 2 runs was made by another code version" in status.stderr
        assert str(fedavg.relative_to(wf.workdir)) in status.stderr and "fedprox" not in status.stderr
        made = {p: provenance.recorded_made_by(p / "metrics.parquet") for p in (fedavg, fedprox)}
        assert made[fedavg]["code"] != made[fedprox]["code"] and made[fedavg]["git"] is None  # no git in the copy
    # back to the old default: the FedProx run again (with the original code), then nothing
    status = wf.fnl_status()
    assert str(fedprox.relative_to(wf.workdir)) in status.stderr, status.stderr
    res = wf.snakemake()
    assert res.returncode == 0 and job_counts(output_of(res)) == {"train": 1, "table": 1, "all": 1}, output_of(res)[-3000:]
    assert "Code versions" not in wf.table_md().read_text()
    assert "Warning" not in wf.fnl_status().stderr
    assert nothing_to_do(wf.snakemake("-n"))


@pytest.mark.slow
def test_a_failed_table_job_keeps_the_last_good_table(wf):
    """Issue 46, item 5: a table job failing on a truncated metrics file deleted the table built before."""
    outputs = [wf.table_md().with_suffix(s) for s in (".md", ".csv", ".html")]
    before = {p: p.read_bytes() for p in outputs}
    metrics = wf.run_dir("fedavg") / "metrics.parquet"
    good = metrics.read_bytes()
    metrics.write_bytes(good[: len(good) // 2])
    try:
        res = wf.snakemake()
        out = output_of(res)
        assert res.returncode != 0 and job_counts(out) == {"table": 1, "all": 1}, out[-3000:]
        assert "metrics.parquet" in out
        assert {p: p.read_bytes() for p in outputs} == before  # the last good table, whole
    finally:
        metrics.write_bytes(good)
    res = wf.snakemake()
    assert res.returncode == 0 and job_counts(output_of(res)) == {"table": 1, "all": 1}, output_of(res)[-3000:]
    assert nothing_to_do(wf.snakemake("-n"))


@pytest.mark.slow
def test_a_code_change_alone_is_said_at_the_end_of_every_run_and_in_the_tables_note(wf):
    """Issue 46, item 3: a change that alters no setting reruns no run, yet the runs it leaves
    made by another code version are named by every plain run (also one with nothing to do) and
    by the table's "Code versions" note (the table is built again for it)."""
    with wf.edited("fnlcore/fl/settings.py", "class TrainSettings:\n", "class TrainSettings:  # edited\n"):
        counts, out = _dry(wf)
        assert counts == {"table": 1, "all": 1}, out[-3000:]
        res = wf.snakemake()
        assert res.returncode == 0 and job_counts(output_of(res)) == {"table": 1, "all": 1}, output_of(res)[-3000:]
        assert "2 of 2 runs of these tables were made by another code version" in output_of(res)
        footer = wf.table_md().read_text().split("**Code versions.** ")[1]
        assert footer.startswith("2 of 2 runs were made by another code version than the one that built this table")
        again = wf.snakemake()
        assert nothing_to_do(again), output_of(again)[-3000:]
        assert "2 of 2 runs of these tables were made by another code version" in output_of(again)
    # the code the runs were made with again: the table loses its note, and nothing is said
    res = wf.snakemake()
    assert res.returncode == 0 and job_counts(output_of(res)) == {"table": 1, "all": 1}, output_of(res)[-3000:]
    assert "Code versions" not in wf.table_md().read_text()
    again = wf.snakemake()
    assert nothing_to_do(again) and "another code version" not in output_of(again), output_of(again)[-3000:]
