"""Rule partition: split the training set over clients and write parquet, counts and figure."""
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 (injected by Snakemake)
sys.path.insert(0, str(Path(sm.scriptdir).parent))  # this checkout's fnlcore, also inside a conda env (envs/)

from fnlcore.app.plan import clients_error, partition_keys  # noqa: E402 (after the path is set)
from fnlcore.datasets import load_prepared  # noqa: E402 (after the path is set)
from fnlcore.errors import ConfigError  # noqa: E402 (after the path is set)
from fnlcore.logs import job_log  # noqa: E402 (after the path is set)
from fnlcore.partition import write_partition_artifacts  # noqa: E402 (after the path is set)

spec = sm.params.spec
with job_log(sm.log[0]) as log:
    ds = load_prepared(sm.params.data_dir)
    labels = ds.labels("train")
    if spec.num_clients > len(labels):
        # An on-disk set's size is known only now (the workflow checks the in-memory ones at
        # startup): name the configuration key that sets num_clients, not the partitioner's argument.
        keys = partition_keys(sm.config, sm.wildcards.dataset, sm.wildcards.partition)
        raise ConfigError(clients_error(keys, spec, ds.info.name, len(labels)))
    assignment = spec.run(labels, seed=int(sm.wildcards.pseed))
    log.info("%s seed %s: client sizes %s", spec.slug(), sm.wildcards.pseed, assignment.sizes().tolist())
    write_partition_artifacts(
        assignment, labels, ds.info.num_classes,
        sm.output.parquet, sm.output.counts, sm.output.figure,
        class_names=ds.info.class_names,
        title=f"{ds.info.name}: {spec.slug()} (partition seed {sm.wildcards.pseed})",
    )
