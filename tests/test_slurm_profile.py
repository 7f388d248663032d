"""The cluster advice of docs/cluster.md, checked with dry runs (no Slurm job is submitted).

A site profile (a copy of slurm/ with its SITE lines edited) keeps every resource of the
profile's `set-resources` block; a command-line `--set-resources` replaces that whole block,
which is why docs/cluster.md recommends the site profile: the dry run shows the annotator's memory
and time and the train caps dropped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _dry_run(workdir: Path, *args: str) -> str:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "-n",
           "--config", 'tables=["demo"]', "data_grid=[]", "results_dir=results", "device=cpu", *args]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    return out


def _resources(out: str, rule: str) -> dict[str, str]:
    """The resources Snakemake prints for the first job of ``rule`` in a dry run."""
    m = re.search(rf"^rule {rule}:\n(?:    .*\n)*?    resources: (.*)$", out, re.M)
    assert m, f"no job of rule {rule} in the dry run"
    return dict(item.split("=", 1) for item in m.group(1).split(", "))


def _site_profile(tmp_path: Path) -> Path:
    """docs/cluster.md's form: a copy of slurm/ whose SITE partition lines name the site's partitions."""
    site = tmp_path / "mysite"
    shutil.copytree(REPO / "slurm", site)
    text = (site / "config.yaml").read_text()
    text = re.sub(r"slurm_partition: debug(\s+# SITE: your GPU partition)", r"slurm_partition: gpu\1", text)
    text = re.sub(r"slurm_partition: debug(\s+# SITE: your CPU partition)", r"slurm_partition: cpu\1", text)
    (site / "config.yaml").write_text(text)
    return site


def test_a_site_profile_keeps_every_resource_of_the_profile(tmp_path):
    profile = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())
    out = _dry_run(tmp_path, "--profile", str(_site_profile(tmp_path)))
    for rule in ("train", "annotator"):
        got = _resources(out, rule)
        assert got["slurm_partition"] == "gpu", got
        for key, value in profile["set-resources"][rule].items():
            if key != "slurm_partition":
                assert got.get(key) == str(value), (rule, key, got)
    assert _resources(out, "partition")["slurm_partition"] == "cpu"


def test_a_command_line_set_resources_replaces_the_profiles_whole_block(tmp_path):
    """The pitfall docs/cluster.md warns about: the annotator's memory and time fall back to the rule's."""
    (tmp_path / "slurm").symlink_to(REPO / "slurm", target_is_directory=True)
    profile = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())["set-resources"]
    out = _dry_run(tmp_path, "--profile", "slurm", "--set-resources", "train:slurm_partition=gpu",
                   "annotator:slurm_partition=gpu")
    annotator = _resources(out, "annotator")
    assert annotator["slurm_partition"] == "gpu"
    assert annotator["mem_mb"] != str(profile["annotator"]["mem_mb"])
    dropped = [k for k in profile["train"] if k != "slurm_partition" and k not in _resources(out, "train")]
    assert dropped, "every train entry of the profile survived a command-line --set-resources"
