"""Rule train: one federated run; resumes from its checkpoint after a kill.

Under a scheduler that ends the job at its ``runtime`` (Slurm), the run stops a few minutes
before it with a checkpoint and exits 75; the rule's next attempt continues it.

One writer per run: the job holds the run's lock (``<checkpoint>.lock``) for its whole life.
Where a live process holds it (a job of a killed Snakemake, still running), this job exits
at once, naming that process, before it opens the run's journal or log or loads anything;
a retry of the job checks again (it proceeds once the other writer has ended)."""
import os
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 (injected by Snakemake)
sys.path.insert(0, str(Path(sm.scriptdir).parent))  # this checkout's fnlcore, also inside a conda env (envs/)

from fnlcore.app.results_lock import RunBusy, lock_run, note_refused_start  # noqa: E402 (standard library only)

try:
    run_lock = lock_run(sm.params.checkpoint)
except RunBusy as busy:
    note_refused_start(sm.log[0], busy, journal=str(sm.params.checkpoint) + ".log")  # fnlcore.app.train.run_journal
    sys.stderr.write(f"\nRun not started: {busy}\n\n")
    sys.exit(1)

from fnlcore.app.resources import time_budget_s  # noqa: E402 (after the run's lock)
from fnlcore.app.run_group import publish_for_train_job  # noqa: E402 (after the run's lock)
from fnlcore.app.train import RunSpec, train_job, train_job_log  # noqa: E402 (after the run's lock)
from fnlcore.progress import round_reporter, run_tag  # noqa: E402 (after the run's lock)

w = sm.wildcards
budget = time_budget_s(sm.resources.runtime) if os.environ.get("SLURM_JOB_ID") else None
attempt = int(sm.resources.get("attempt", 1))
# Each console line names its run: parallel jobs' lines interleave there (fnlcore.progress).
# A run continued from its checkpoint, or a retry, keeps its earlier jobs' lines in the log.
try:
    spec = RunSpec(
        data_dir=sm.params.data_dir, noise_parquet=sm.input.noise, num_clients=sm.params.num_clients,
        settings=sm.params.settings, method=sm.params.method, seed=int(w.seed),
        metrics=sm.output.metrics, clients=sm.output.clients, model=sm.output.model,
        checkpoint=sm.params.checkpoint, relabels=sm.output.relabels, device=str(sm.config.get("device", "auto")),
        results_dir=str(sm.config.get("results_dir", "results")),  # the folder the workflow locks
    )
    # a run its group's job trained (config key run_groups): link its outputs and its log into place
    if publish_for_train_job(spec, sm.params.identity, sm.params.grouped, sm.log[0]):
        status = 0
    else:
        with train_job_log(sm.log[0], sm.params.checkpoint, attempt, tag=run_tag(w.method, w.noise, w.seed)) as log:
            log.info("run %s, attempt %d", sm.output.metrics.rsplit("/", 1)[0], attempt)
            status = train_job(spec, progress=round_reporter(log.info), attempt=attempt, time_budget_s=budget)
finally:
    if run_lock is not None:
        run_lock.release()  # after the outputs (a kill releases it too: the kernel does)
sys.exit(status)  # outside the log: a planned stop (75) is not logged as an exception
