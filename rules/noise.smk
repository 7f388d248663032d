# Noisy labels: results/noise/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}.*
# Annotator networks (H-IDN's): .../pseed{pseed}/annotators/{annotator}/client{client}.{pt,probs.npz}
# A noise model declares them (NoiseSpec.annotator_slug / annotator_clients); nothing here
# names a model. An annotator depends only on the partition and its own settings, so every
# noise setting that needs client k's network reuses the same cached one.
# The device (config key `device`) is read by the job from the config, not passed as a
# param: it is not part of an annotator's path, so changing it must not rerun the job.


rule annotator:
    """Train one annotator network on one client's clean labels (H-IDN: FedNoRo Alg. 1)."""
    input:
        data=data_inputs,
        partition=partition_parquet,
    output:
        checkpoint=pattern(paths.ANNOTATOR, paths.ANNOTATOR_SUFFIXES["checkpoint"]),
        probs=pattern(paths.ANNOTATOR, paths.ANNOTATOR_SUFFIXES["probs"]),
    log:
        pattern(
            "{results}/logs/annotators/{dataset}/{partition}/pseed{pseed}/{annotator}/client{client}.log"
        ),
    conda:
        "../envs/fnl.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
        gpu=1,
    params:
        data_dir=data_dir,
        settings=lambda w: annotator_settings(w.annotator),
        # tracked by Snakemake (the settings object is not): a changed default, of the annotator's
        # settings or of the training settings it trains with, reruns the annotator
        identity=lambda w: annotator_identity(
            annotator_settings(w.annotator), w.dataset
        ),
    script:
        "../workflow_scripts/train_annotator.py"


rule noise:
    """Draw the noisy labels of one partition (the noise seed alone drives the draws)."""
    input:
        data=data_inputs,
        partition=partition_parquet,
        annotators=annotator_inputs,
    output:
        parquet=pattern(paths.NOISE, paths.NOISE_SUFFIXES["parquet"]),
        summary=pattern(paths.NOISE, paths.NOISE_SUFFIXES["summary"]),
        rates=report(
            pattern(paths.NOISE, paths.NOISE_SUFFIXES["rates"]),
            caption="../report/noise_rates.rst",
            category="Noise",
            subcategory="{dataset}",
            labels={
                "partition": "{partition}",
                "noise": "{noise}",
                "seed": "{nseed}",
                "figure": "rates",
            },
        ),
        matrix=report(
            pattern(paths.NOISE, paths.NOISE_SUFFIXES["matrix"]),
            caption="../report/noise_matrix.rst",
            category="Noise",
            subcategory="{dataset}",
            labels={
                "partition": "{partition}",
                "noise": "{noise}",
                "seed": "{nseed}",
                "figure": "matrix",
            },
        ),
    log:
        pattern(
            "{results}/logs/noise/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}.log"
        ),
    conda:
        "../envs/labels.yaml"
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        spec=lambda w: noise_spec(w.noise),
        partition_spec=lambda w: partition_spec(w.partition),
        data_dir=data_dir,
        # tracked by Snakemake (the spec object is not): a changed default reruns the draw, also one
        # of the training settings its annotators train with; the partition reaches it as an input file
        identity=lambda w: noise_identity(noise_spec(w.noise), w.dataset),
    script:
        "../workflow_scripts/make_noise.py"
