"""Rule table: summarise the runs of one paper table and render it beside the reported numbers."""
from fnlcore.app.build_table import build_table
from fnlcore.io import read_parquet
from fnlcore.logs import job_log

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0]) as log:
    rendered = build_table(sm.params.table, sm.params.results, read_parquet)
    log.info("table %s: %s", sm.params.table.name, rendered.status_counts())
