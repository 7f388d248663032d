"""Where every artifact lives. One place, used by fnlcore and by the Snakefile.

Paths name what they hold: dataset, partition slug + partition seed, noise
slug + noise seed. Slugs are pure functions of the parameters, so equal
settings in different tables resolve to the same cached file.
"""

from __future__ import annotations

# Patterns with {named} fields: fnlcore fills them with str.format, the Snakefile
# uses the same strings as wildcard patterns.
DATA_DIR = "{results}/data/{dataset}"
DATA_INDEX = DATA_DIR + "/index.parquet"
DATA_META = DATA_DIR + "/meta.json"
DATA_ARRAYS = DATA_DIR + "/arrays.npz"

PARTITION = "{results}/partitions/{dataset}/{partition}/pseed{pseed}"
NOISE_BASE = "{results}/noise/{dataset}/{partition}/pseed{pseed}"
NOISE = NOISE_BASE + "/{noise}/nseed{nseed}"
ANNOTATOR = NOISE_BASE + "/annotators/{annotator}/client{client}"

PARTITION_SUFFIXES = {"parquet": ".parquet", "counts": ".counts.csv", "figure": ".png"}
NOISE_SUFFIXES = {
    "parquet": ".parquet",
    "summary": ".summary.csv",
    "rates": ".rates.png",
    "matrix": ".matrix.png",
}
ANNOTATOR_SUFFIXES = {"checkpoint": ".pt", "probs": ".probs.npz"}


def fill(pattern: str, **fields: object) -> str:
    return pattern.format(**fields)


def partition_files(results: str, dataset: str, partition: str, pseed: int) -> dict[str, str]:
    base = fill(PARTITION, results=results, dataset=dataset, partition=partition, pseed=pseed)
    return {k: base + s for k, s in PARTITION_SUFFIXES.items()}


def noise_files(results: str, dataset: str, partition: str, pseed: int, noise: str, nseed: int) -> dict[str, str]:
    base = fill(
        NOISE, results=results, dataset=dataset, partition=partition, pseed=pseed, noise=noise, nseed=nseed
    )
    return {k: base + s for k, s in NOISE_SUFFIXES.items()}


def annotator_files(
    results: str, dataset: str, partition: str, pseed: int, annotator: str, client: int
) -> dict[str, str]:
    base = fill(
        ANNOTATOR,
        results=results,
        dataset=dataset,
        partition=partition,
        pseed=pseed,
        annotator=annotator,
        client=client,
    )
    return {k: base + s for k, s in ANNOTATOR_SUFFIXES.items()}
