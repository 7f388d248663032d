"""`snakemake --report` on a finished (tiny) demo: the HTML report holds the table and its figures."""

import base64
import re
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT


@pytest.mark.slow
def test_report_contains_tables_and_figures(tmp_path):
    scale = tmp_path / "tiny.yaml"
    scale.write_text(
        "note: tiny\nnum_clients: 3\ntraining: {rounds: 2, local_epochs: 1}\n"
        "noises: {fednoro_hidn: {annotator_epochs: 1}}\n"
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"results_dir: results\ntables: [demo]\nscale: {scale}\ndata_grid: []\n")
    base = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO_ROOT / "Snakefile"),
            "--directory", str(tmp_path), "--configfile", str(cfg)]
    run = subprocess.run(base + ["--cores", "2", "-q"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    rep = subprocess.run(base + ["--report", str(tmp_path / "report.html")], capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-3000:]
    html = (tmp_path / "report.html").read_text()
    for needle in ("Tables", "Partitions", "Noise", "filename=demo.curves.png", "filename=pseed100.png"):
        assert needle in html, needle
    blob = re.search(r'"data:text/html;charset=utf8;filename=demo\.html;base64,([A-Za-z0-9+/=]+)"', html)
    assert blob, "the demo table is not embedded"
    table = base64.b64decode(blob.group(1)).decode()
    assert "FedNoRo" in table and "FedAvg" in table and "Observations" in table
