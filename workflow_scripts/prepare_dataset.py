"""Rule prepare_*_dataset: download/verify/convert one dataset into results/data/<name>/."""
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 (injected by Snakemake)
sys.path.insert(0, str(Path(sm.scriptdir).parent))  # this checkout's fnlcore, also inside a conda env (envs/)

from fnlcore.datasets import prepare_dataset  # noqa: E402 (after the path is set)
from fnlcore.logs import job_log  # noqa: E402 (after the path is set)

s = sm.params.settings
with job_log(sm.log[0]) as log:
    log.info("preparing %s from %s", s.name, s.raw_dir)
    prepare_dataset(s.name, Path(s.raw_dir), Path(sm.output.meta).parent, options=dict(s.options), mirrors=tuple(s.mirrors))
