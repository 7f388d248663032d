"""Rule table: summarise the runs of one paper table and render it beside the reported numbers."""
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 (injected by Snakemake)
sys.path.insert(0, str(Path(sm.scriptdir).parent))  # this checkout's fnlcore, also inside a conda env (envs/)

from fnlcore.app.build_table import build_table  # noqa: E402 (after the path is set)
from fnlcore.io import read_parquet  # noqa: E402 (after the path is set)
from fnlcore.logs import job_log  # noqa: E402 (after the path is set)

with job_log(sm.log[0]) as log:
    table = sm.params.table
    outputs = {k: sm.output[k] for k in ("csv", "md", "html", "curves")}
    rendered = build_table(table, list(sm.input.metrics), outputs, read_parquet)
    log.info("table %s: %s", table.name, rendered.status_line())
