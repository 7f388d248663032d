"""Rule noise: draw one noisy label set for one partition and write parquet, summary and figures."""
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 (injected by Snakemake)
sys.path.insert(0, str(Path(sm.scriptdir).parent))  # this checkout's fnlcore, also inside a conda env (envs/)

from fnlcore.datasets import load_prepared  # noqa: E402 (after the path is set)
from fnlcore.logs import job_log  # noqa: E402 (after the path is set)
from fnlcore.noise import write_noise_artifacts  # noqa: E402 (after the path is set)
from fnlcore.partition import read_partition  # noqa: E402 (after the path is set)

spec = sm.params.spec
with job_log(sm.log[0]) as log:
    ds = load_prepared(sm.params.data_dir)
    labels = ds.labels("train")
    C = ds.info.num_classes
    assignment = read_partition(sm.input.partition, num_samples=len(labels), num_clients=sm.params.partition_spec.num_clients)
    soft = spec.soft_labels_from(ds, list(sm.input.annotators))  # None unless the model reads soft labels
    result = spec.run(labels, assignment, C, seed=int(sm.wildcards.nseed), soft_labels=soft)
    log.info("%s seed %s: %d noisy samples", spec.slug(), sm.wildcards.nseed, int(result.is_noisy.sum()))
    write_noise_artifacts(
        result, labels, assignment, C,
        sm.output.parquet, sm.output.summary, sm.output.rates, sm.output.matrix,
        class_names=ds.info.class_names,
        title=f"{ds.info.name} · {sm.wildcards.partition} (partition seed {sm.wildcards.pseed}) · "
        f"{sm.wildcards.noise} (noise seed {sm.wildcards.nseed})",
    )
