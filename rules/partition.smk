# Client partitions: results/partitions/{dataset}/{partition}/pseed{pseed}.{parquet,counts.csv,png}


rule partition:
    """Assign every training sample to a client (the partition seed alone drives the draws)."""
    input:
        data_inputs,
    output:
        parquet=pattern(paths.PARTITION, paths.PARTITION_SUFFIXES["parquet"]),
        counts=pattern(paths.PARTITION, paths.PARTITION_SUFFIXES["counts"]),
        figure=report(
            pattern(paths.PARTITION, paths.PARTITION_SUFFIXES["figure"]),
            caption="../report/partition.rst",
            category="Partitions",
            subcategory="{dataset}",
            labels={"partition": "{partition}", "seed": "{pseed}"},
        ),
    log:
        pattern("{results}/logs/partitions/{dataset}/{partition}/pseed{pseed}.log"),
    conda:
        "../envs/labels.yaml"
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        spec=lambda w: partition_spec(w.partition),
        data_dir=data_dir,
        # tracked by Snakemake (the spec object is not): a changed default reruns the partition
        identity=lambda w: settings_identity(partition_spec(w.partition)),
    script:
        "../workflow_scripts/make_partition.py"
