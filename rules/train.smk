# Training runs: results/runs/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}/{train}/{method}/seed{seed}/
# Each run checkpoints to results/checkpoints/... (not a declared output) and resumes from it when rerun.
from fnlcore.app.runs import CHECKPOINT, RUN, RUN_FILES


def _noise_parquet(w):
    return pattern(paths.NOISE, dataset=w.dataset, partition=w.partition, pseed=w.pseed, noise=w.noise, nseed=w.nseed) + ".parquet"


def training_settings(slug):
    try:
        return PLAN.trainings[slug]
    except KeyError:
        raise ValueError(f"training settings {slug!r} are not used by any selected table")


def method_params(slug):
    try:
        return PLAN.methods[slug]
    except KeyError:
        raise ValueError(f"method {slug!r} is not used by any selected table")


rule train:
    """Train one (dataset, partition, noise, training settings, method, seed) run."""
    input:
        data=_data_inputs,
        noise=_noise_parquet,
    output:
        metrics=pattern(RUN) + RUN_FILES["metrics"],
        clients=pattern(RUN) + RUN_FILES["clients"],
        relabels=pattern(RUN) + RUN_FILES["relabels"],
        model=pattern(RUN) + RUN_FILES["model"],
    params:
        data_dir=lambda w: pattern(paths.DATA_DIR, dataset=w.dataset),
        settings=lambda w: training_settings(w.train),
        method=lambda w: method_params(w.method),
        num_clients=lambda w: partition_spec(w.partition).num_clients,
        checkpoint=lambda w: pattern(CHECKPOINT, **dict(w.items())),
        device=PLAN.device,
    log:
        pattern("{results}/logs/runs/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}/{train}/{method}/seed{seed}.log"),
    # One thread per job: small models gain nothing from more, and two 2-thread torch
    # jobs on two cores thrash (rounds 100x slower). Raise it with --set-threads train=N.
    threads: 1
    retries: 2
    resources:
        mem_mb=8000,
        runtime=720,
        gpu=1,
    script:
        "../workflow_scripts/train.py"
