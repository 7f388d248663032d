"""Rule cross_paper: the shared configurations of the selected tables, reported beside reproduced."""
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 (injected by Snakemake)
sys.path.insert(0, str(Path(sm.scriptdir).parent))  # this checkout's fnlcore, also inside a conda env (envs/)

from fnlcore.io import read_parquet  # noqa: E402 (after the path is set)
from fnlcore.logs import job_log  # noqa: E402 (after the path is set)
from fnlcore.app.cross_paper import build_cross_paper  # noqa: E402 (after the path is set)

with job_log(sm.log[0]) as log:
    view = sm.params.view
    outputs = {k: sm.output[k] for k in ("csv", "md")}
    long = build_cross_paper(view, list(sm.input.metrics), outputs, read_parquet)
    log.info("cross-paper view: %d shared configuration(s), %d lines", len(view.groups), len(long))
