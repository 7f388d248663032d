"""`snakemake --lint` finds nothing: every rule names its software environment, rule files
hold rules only, no path is joined with `+` or hard-coded into params. CI runs it with the
other tests (.ci/run: pytest)."""

import subprocess
import sys

from .conftest import REPO_ROOT


def test_snakemake_lint_is_clean(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO_ROOT / "Snakefile"), "--directory", str(tmp_path),
         "--lint"],
        capture_output=True, text=True, timeout=600,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "Lints for" not in out, out[-6000:]
