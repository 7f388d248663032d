# Decoded image caches of on-disk sets: results/data/{dataset}/decoded/{split}-{geometry}.{npy,json},
# each split decoded once at the size training reads it (fnlcore.datasets.decoded_cache; geometry
# e.g. c3-224x224 or c3-224x224-short256). Train jobs ask for them unless the dataset option
# decoded_cache is false; training reads any complete one it finds, memory-mapped.
from fnlcore.datasets.decoded_cache import RULE_FILES, planned_cache_files

if ON_DISK_DATASETS:

    rule decoded_cache:
        """Decode one split of an on-disk set once into a memory-mapped uint8 (N, C, H, W) array."""
        input:
            index=pattern(paths.DATA_INDEX),
            meta=pattern(paths.DATA_META),
        output:
            pixels=pattern(paths.DATA_DIR, RULE_FILES["pixels"]),
            done=pattern(paths.DATA_DIR, RULE_FILES["done"]),
        log:
            pattern("{results}/logs/data/{dataset}/decoded-{split}-{geometry}.log"),
        wildcard_constraints:
            dataset="|".join(ON_DISK_DATASETS),
            split="train|test",
            geometry=r"c[13]-\d+x\d+(-short\d+)?",
        conda:
            "../envs/fnl.yaml"
        # decode workers: each core decodes some hundred images a second (benchmarks/README.md)
        threads: 4
        resources:
            mem_mb=4000,
            runtime=600,
        script:
            "../workflow_scripts/build_decoded_cache.py"
