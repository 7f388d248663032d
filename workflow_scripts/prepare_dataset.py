"""Rule prepare_*_dataset: download/verify/convert one dataset into results/data/<name>/."""
from pathlib import Path

from fnlcore.datasets import prepare_dataset
from fnlcore.logs import job_log

sm = snakemake  # noqa: F821 (injected by Snakemake)
s = sm.params.settings
with job_log(sm.log[0]) as log:
    log.info("preparing %s from %s", s.name, s.raw_dir)
    prepare_dataset(s.name, Path(s.raw_dir), Path(sm.output.meta).parent, options=dict(s.options), mirrors=tuple(s.mirrors))
