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


# Packing (README "What a table costs"): `--groups train=pack --group-components pack=N` runs N
# training runs in one Slurm job. Snakemake sums a group's integer resources over the jobs
# that run side by side (N runs would ask for N GPUs; it also turns "1" into 1), but passes a
# non-numeric string once when every job of the group gives the same one: grouped runs ask
# for their GPU as gres "gpu:1" (sbatch --gres=gpu:1) and share it. Functions, because the
# command line's groups are known only once the workflow is parsed.
def _train_grouped() -> bool:
    return bool(workflow.group_settings) and "train" in workflow.group_settings.overwrite_groups


def _train_gpu(wildcards) -> int:
    return 0 if _train_grouped() else 1


def _train_gres(wildcards) -> str:
    return "gpu:1" if _train_grouped() else ""


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
        gpu=_train_gpu,
        gres=_train_gres,
    script:
        "../workflow_scripts/train.py"
