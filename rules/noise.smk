# Noisy labels: results/noise/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}.*
# Annotator networks (H-IDN's): .../pseed{pseed}/annotators/{annotator}/client{client}.{pt,probs.npz}
# A noise model declares them (NoiseSpec.annotator_slug / annotator_clients); nothing here
# names a model. An annotator depends only on the partition and its own settings, so every
# noise setting that needs client k's network reuses the same cached one.


def _partition_parquet(w):
    return pattern(paths.PARTITION, dataset=w.dataset, partition=w.partition, pseed=w.pseed) + ".parquet"


def _annotator_inputs(w):
    """The probability files of the annotators the noise spec declares for this draw."""
    spec = noise_spec(w.noise)
    clients = spec.annotator_clients(partition_spec(w.partition).num_clients, int(w.nseed))
    return [
        pattern(
            paths.ANNOTATOR,
            dataset=w.dataset,
            partition=w.partition,
            pseed=w.pseed,
            annotator=spec.annotator_slug(),
            client=k,
        )
        + paths.ANNOTATOR_SUFFIXES["probs"]
        for k in clients
    ]


rule annotator:
    """Train one annotator network on one client's clean labels (H-IDN: FedNoRo Alg. 1)."""
    input:
        data=_data_inputs,
        partition=_partition_parquet,
    output:
        checkpoint=pattern(paths.ANNOTATOR) + paths.ANNOTATOR_SUFFIXES["checkpoint"],
        probs=pattern(paths.ANNOTATOR) + paths.ANNOTATOR_SUFFIXES["probs"],
    params:
        data_dir=lambda w: pattern(paths.DATA_DIR, dataset=w.dataset),
        settings=lambda w: annotator_settings(w.annotator),
        device=PLAN.device,
    log:
        pattern("{results}/logs/annotators/{dataset}/{partition}/pseed{pseed}/{annotator}/client{client}.log"),
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
        gpu=1,
    script:
        "../workflow_scripts/train_annotator.py"


rule noise:
    """Draw the noisy labels of one partition (the noise seed alone drives the draws)."""
    input:
        data=_data_inputs,
        partition=_partition_parquet,
        annotators=_annotator_inputs,
    output:
        parquet=pattern(paths.NOISE) + paths.NOISE_SUFFIXES["parquet"],
        summary=pattern(paths.NOISE) + paths.NOISE_SUFFIXES["summary"],
        rates=report(
            pattern(paths.NOISE) + paths.NOISE_SUFFIXES["rates"],
            caption="../report/noise_rates.rst", category="Noise", subcategory="{dataset}",
            labels={"partition": "{partition}", "noise": "{noise}", "seed": "{nseed}", "figure": "rates"},
        ),
        matrix=report(
            pattern(paths.NOISE) + paths.NOISE_SUFFIXES["matrix"],
            caption="../report/noise_matrix.rst", category="Noise", subcategory="{dataset}",
            labels={"partition": "{partition}", "noise": "{noise}", "seed": "{nseed}", "figure": "matrix"},
        ),
    params:
        spec=lambda w: noise_spec(w.noise),
        partition_spec=lambda w: partition_spec(w.partition),
        data_dir=lambda w: pattern(paths.DATA_DIR, dataset=w.dataset),
    log:
        pattern("{results}/logs/noise/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}.log"),
    resources:
        mem_mb=4000,
        runtime=30,
    script:
        "../workflow_scripts/make_noise.py"
