"""Rule train: one federated run; resumes from its checkpoint after a kill."""
from fnlcore.app.train import train_run
from fnlcore.logs import job_log
from fnlcore.progress import round_reporter, run_tag

sm = snakemake  # noqa: F821 (injected by Snakemake)
w = sm.wildcards
# Each console line names its run: parallel jobs' lines interleave there (fnlcore.progress).
with job_log(sm.log[0], tag=run_tag(w.method, w.noise, w.seed)) as log:
    log.info("run %s", sm.output.metrics.rsplit("/", 1)[0])
    train_run(
        sm.params.data_dir, sm.input.noise, sm.params.num_clients, sm.params.settings, sm.params.method,
        int(sm.wildcards.seed), sm.params.device,
        sm.output.metrics, sm.output.clients, sm.output.model, sm.params.checkpoint,
        relabels_path=sm.output.relabels,
        progress=round_reporter(log.info),
    )
