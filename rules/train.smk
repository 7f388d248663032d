# Training runs: results/runs/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}/{train}/{method}/seed{seed}/
# Each run checkpoints to results/checkpoints/... (not a declared output) and resumes from it when rerun.
# The device (config key `device`) is read by the job from the config, not passed as a
# param: a run's path does not record it (equal settings give equal numbers on any device up
# to float rounding), so changing it must not rerun the run. Every tracked param below is a
# function of the run's path. Snakemake tracks plain values only (a settings object is not
# compared): `identity` is what tracks the settings. Helpers: rules/common.smk.


rule train:
    """Train one (dataset, partition, noise, training settings, method, seed) run."""
    input:
        data=data_inputs,
        noise=noise_parquet,
        cache=lambda w: planned_cache_files(
            data_dir(w),
            w.dataset,
            dataset_settings(w.dataset).options,
            training_settings(w.train).image_transform,
        ),
        group=run_group_record,
    output:
        metrics=pattern(RUN, RUN_FILES["metrics"]),
        clients=pattern(RUN, RUN_FILES["clients"]),
        relabels=pattern(RUN, RUN_FILES["relabels"]),
        model=pattern(RUN, RUN_FILES["model"]),
    log:
        pattern(
            "{results}/logs/runs/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}/{train}/{method}/seed{seed}.log"
        ),
    # Predicted from the rehearsal and the step costs, capped by the site (fnlcore/app/resources.py);
    # a run longer than the site's max_runtime stops before it with a checkpoint (exit 75) and
    # continues in the next attempt; a failure a retry cannot fix fails its retries at once.
    retries: train_resources(PLAN, workflow).retries
    conda:
        "../envs/fnl.yaml"
    # One thread per job: small models gain nothing from more, and two 2-thread torch
    # jobs on two cores thrash (rounds 100x slower). Raise it with --set-threads train=N.
    threads: 1
    resources:
        attempt=lambda wildcards, attempt: attempt,
        mem_mb=train_resources(PLAN, workflow).mem_mb,
        disk_mb=train_resources(PLAN, workflow).disk_mb,
        runtime=train_resources(PLAN, workflow).runtime,
        gpu=_train_gpu,
        gres=_train_gres,
    params:
        data_dir=data_dir,
        settings=lambda w: training_settings(w.train),
        method=lambda w: method_params(w.method),
        num_clients=lambda w: partition_spec(w.partition).num_clients,
        checkpoint=lambda w: pattern(CHECKPOINT, **dict(w.items())),
        # The settings with every default filled in (the path holds only the non-default ones):
        # a changed default in the code reruns the run (fnlcore.app.identity.settings_identity).
        identity=lambda w: train_identity(
            training_settings(w.train), method_params(w.method), w.dataset
        ),
        # trained by its run group's job (rule train_group): this job only publishes its outputs
        grouped=lambda w: bool(run_group_record(w)),
    script:
        "../workflow_scripts/train.py"


# Run groups (config key run_groups, docs/cluster.md "Run groups"): one job trains a group's runs
# side by side on one device, each in a child process of its own (fnlcore.app.run_group); a
# finished run is kept in its staging folder and never trained again (kill, scancel, exit 75,
# retries). Each run's train job above then only links its outputs, on the submit host.
if RUN_GROUPS:

    localrules:
        train,


rule train_group:
    """Train a run group's runs side by side on one device (config key run_groups)."""
    input:
        group_inputs,
    output:
        pattern(GROUP_RECORD),
    log:
        pattern("{results}/logs/groups/{group}.log"),
    retries: train_resources(PLAN, workflow).retries * max(1, PLAN.run_groups)
    conda:
        "../envs/fnl.yaml"
    threads: group_threads
    resources:
        attempt=lambda wildcards, attempt: attempt,
        mem_mb=group_mem_mb,
        disk_mb=group_disk_mb,
        runtime=group_runtime,
        gpu=1,
    params:
        members=group_members,
        identities=group_identities,
        run_threads=run_threads(),
    script:
        "../workflow_scripts/train_group.py"
