# Prepared datasets: results/data/{dataset}/{index.parquet, meta.json[, arrays.npz]}.


rule prepare_in_memory_dataset:
    """Download (checksum-verified, resumable) and convert a set small enough to live in memory."""
    output:
        index=pattern(paths.DATA_INDEX),
        meta=pattern(paths.DATA_META),
        arrays=pattern(paths.DATA_ARRAYS),
    log:
        pattern("{results}/logs/data/{dataset}.log"),
    wildcard_constraints:
        dataset="|".join(IN_MEMORY_DATASETS),
    conda:
        "../envs/fnl.yaml"
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        settings=lambda w: dataset_settings(w.dataset),
        # the options over the dataset's defaults, tracked by Snakemake (the settings object is
        # not): a changed option or default prepares the set again, and what depends on it follows
        identity=lambda w: settings_identity(dataset_settings(w.dataset)),
    script:
        "../workflow_scripts/prepare_dataset.py"


if ON_DISK_DATASETS:

    rule prepare_on_disk_dataset:
        """Index a large image set whose files stay on disk (downloaded or placed by hand)."""
        output:
            index=pattern(paths.DATA_INDEX),
            meta=pattern(paths.DATA_META),
        log:
            pattern("{results}/logs/data/{dataset}.log"),
        wildcard_constraints:
            dataset="|".join(ON_DISK_DATASETS),
        conda:
            "../envs/fnl.yaml"
        resources:
            mem_mb=8000,
            runtime=600,
        params:
            settings=lambda w: dataset_settings(w.dataset),
            identity=lambda w: settings_identity(dataset_settings(w.dataset)),  # as above
        script:
            "../workflow_scripts/prepare_dataset.py"
