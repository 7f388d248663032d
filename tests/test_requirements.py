"""The pip pins and the conda environment file must describe the same environment."""

import re

import yaml


def _pins(lines):
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_conda_env_matches_requirements(repo_root):
    req = _pins((repo_root / "requirements.txt").read_text().splitlines())
    env = yaml.safe_load((repo_root / "envs" / "fnl.yaml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert _pins(pip_section) == req


def test_torch_and_torchvision_pinned_together(repo_root):
    req = _pins((repo_root / "requirements.txt").read_text().splitlines())
    assert req["torch"] == "2.13.0" and req["torchvision"] == "0.28.0"
