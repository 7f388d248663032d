"""`snakemake --report` on a finished (tiny) demo: the HTML report holds the table and its figures."""

import base64
import re
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT


@pytest.mark.slow  # the report itself takes ~10 s; the demo run is the session's `demo_table` (tests/conftest.py)
def test_report_contains_tables_and_figures(demo_table, tmp_path):
    demo_table.check_ok()
    base = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO_ROOT / "Snakefile"),
            "--directory", str(demo_table.workdir), "--configfile", str(demo_table.configfile)]
    report = tmp_path / "report.html"  # outside the shared run's folder
    rep = subprocess.run(base + ["--report", str(report)], capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-3000:]
    html = report.read_text()
    for needle in ("Tables", "Partitions", "Noise", "filename=demo.curves.png", "filename=pseed100.png"):
        assert needle in html, needle
    blob = re.search(r'"data:text/html;charset=utf8;filename=demo\.html;base64,([A-Za-z0-9+/=]+)"', html)
    assert blob, "the demo table is not embedded"
    table = base64.b64decode(blob.group(1)).decode()
    assert "FedNoRo" in table and "FedAvg" in table and "Observations" in table
