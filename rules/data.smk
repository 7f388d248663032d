# Prepared datasets: results/data/{dataset}/{index.parquet, meta.json[, arrays.npz]}.
from fnlcore.datasets import DATASETS

_IN_MEMORY = sorted(n for n, i in DATASETS.items() if i.in_memory)
_ON_DISK = sorted(n for n, i in DATASETS.items() if not i.in_memory)


def _data_inputs(wildcards):
    """What a job needs of a prepared dataset: arrays too when the set lives in memory."""
    files = [pattern(paths.DATA_INDEX, dataset=wildcards.dataset), pattern(paths.DATA_META, dataset=wildcards.dataset)]
    if wildcards.dataset in _IN_MEMORY:
        files.append(pattern(paths.DATA_ARRAYS, dataset=wildcards.dataset))
    return files


rule prepare_in_memory_dataset:
    """Download (checksum-verified, resumable) and convert a set small enough to live in memory."""
    output:
        index=pattern(paths.DATA_INDEX),
        meta=pattern(paths.DATA_META),
        arrays=pattern(paths.DATA_ARRAYS),
    wildcard_constraints:
        dataset="|".join(_IN_MEMORY),
    params:
        settings=lambda w: dataset_settings(w.dataset),
    log:
        pattern("{results}/logs/data/{dataset}.log"),
    resources:
        mem_mb=4000,
        runtime=60,
    script:
        "../workflow_scripts/prepare_dataset.py"


if _ON_DISK:

    rule prepare_on_disk_dataset:
        """Index a large image set whose files stay on disk (downloaded or placed by hand)."""
        output:
            index=pattern(paths.DATA_INDEX),
            meta=pattern(paths.DATA_META),
        wildcard_constraints:
            dataset="|".join(_ON_DISK),
        params:
            settings=lambda w: dataset_settings(w.dataset),
        log:
            pattern("{results}/logs/data/{dataset}.log"),
        resources:
            mem_mb=8000,
            runtime=600,
        script:
            "../workflow_scripts/prepare_dataset.py"
