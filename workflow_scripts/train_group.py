"""Rule train_group: a run group's runs side by side on one device (fnlcore.app.run_group).

Exit 0 when every run is done, 75 when some stopped before the job's time limit with a
checkpoint (the next attempt continues only those), 1 when some run failed (its log says why;
the finished ones are kept and not trained again)."""
import os
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 (injected by Snakemake)
sys.path.insert(0, str(Path(sm.scriptdir).parent))  # this checkout's fnlcore, also inside a conda env (envs/)

from fnlcore.app.resources import time_budget_s  # noqa: E402
from fnlcore.app.run_group import train_group  # noqa: E402
from fnlcore.logs import job_log  # noqa: E402

budget = time_budget_s(sm.resources.runtime) if os.environ.get("SLURM_JOB_ID") else None
attempt = int(sm.resources.get("attempt", 1))
with job_log(sm.log[0], tag=f"group {sm.wildcards.group}") as log:
    log.info("run group %s, attempt %d: %d runs", sm.wildcards.group, attempt, len(sm.params.members))
    status = train_group(sm.params.members, sm.output[0], attempt=attempt, time_budget_s=budget,
                         threads=int(sm.params.run_threads), log=log.info)
sys.exit(status)
