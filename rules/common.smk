# Shared state of the workflow: the validated plan and every helper the rules call.
# Rule files hold rules only (snakemake --lint); their input/params functions live here.
import sys

from fnlcore import paths
from fnlcore.app.plan import build_plan
from fnlcore.app.resources import train_resources
from fnlcore.app.runs import CHECKPOINT, RUN, RUN_FILES, TABLE, TABLE_FILES
from fnlcore.datasets import DATASETS
from fnlcore.errors import ConfigError
from fnlcore.provenance import code_version
from fnlcore.app.identity import (
    annotator_identity,
    noise_identity,
    settings_identity,
    train_identity,
)

try:
    # a cluster's submit node needs no GPU: the jobs' device is checked where they run
    PLAN = build_plan(config, jobs_run_here=workflow.local_exec)
except ConfigError as err:
    # One clear line instead of a traceback: the message names the key and the fix.
    sys.stderr.write(f"\nConfiguration error: {err}\n\n")
    raise SystemExit(1)

RESULTS = PLAN.results_dir


def pattern(template, suffix="", **fixed):
    """Fill some fields of a fnlcore.paths template, keep the rest as {wildcards}; ``suffix`` ends the name."""

    class Keep(dict):
        def __missing__(self, key):
            return f"{{{key}}}"

    return f"{template.format_map(Keep(results=RESULTS, **fixed))}{suffix}"


def dataset_settings(name):
    from fnlcore.app.plan import DatasetSettings

    return PLAN.datasets.get(name) or DatasetSettings(
        name=name, raw_dir=f"resources/raw/{name}"
    )


def partition_spec(slug):
    try:
        return PLAN.partitions[slug]
    except KeyError:
        raise ValueError(
            f"partition {slug!r} is not declared in the configuration; declared: {sorted(PLAN.partitions)}"
        )


def noise_spec(slug):
    try:
        return PLAN.noises[slug]
    except KeyError:
        raise ValueError(
            f"noise {slug!r} is not declared in the configuration; declared: {sorted(PLAN.noises)}"
        )


def annotator_settings(slug):
    """The annotator settings behind an annotator slug (from any noise spec declaring it: NoiseSpec.annotator_slug)."""
    from fnlcore.app.annotate import AnnotatorSettings

    for spec in PLAN.noises.values():
        if spec.annotator_slug() == slug:
            return AnnotatorSettings.from_noise_spec(spec)
    raise ValueError(
        f"annotator {slug!r} is not used by any noise model in the configuration"
    )


def data_dir(wildcards):
    return pattern(paths.DATA_DIR, dataset=wildcards.dataset)


# -- prepared datasets (rules/data.smk) ----------------------------------------------

IN_MEMORY_DATASETS = sorted(n for n, i in DATASETS.items() if i.in_memory)
ON_DISK_DATASETS = sorted(n for n, i in DATASETS.items() if not i.in_memory)


def data_inputs(wildcards):
    """What a job needs of a prepared dataset: arrays too when the set lives in memory."""
    files = [
        pattern(paths.DATA_INDEX, dataset=wildcards.dataset),
        pattern(paths.DATA_META, dataset=wildcards.dataset),
    ]
    if wildcards.dataset in IN_MEMORY_DATASETS:
        files.append(pattern(paths.DATA_ARRAYS, dataset=wildcards.dataset))
    return files


# -- partitions and noisy labels (rules/partition.smk, rules/noise.smk) --------------


def partition_parquet(w):
    suffix = paths.PARTITION_SUFFIXES["parquet"]
    return pattern(
        paths.PARTITION, suffix, dataset=w.dataset, partition=w.partition, pseed=w.pseed
    )


def annotator_inputs(w):
    """The probability files of the annotators the noise spec declares for this draw."""
    spec = noise_spec(w.noise)
    clients = spec.annotator_clients(
        partition_spec(w.partition).num_clients, int(w.nseed)
    )
    fields = dict(
        dataset=w.dataset,
        partition=w.partition,
        pseed=w.pseed,
        annotator=spec.annotator_slug(),
    )
    return [
        pattern(paths.ANNOTATOR, paths.ANNOTATOR_SUFFIXES["probs"], client=k, **fields)
        for k in clients
    ]


# -- training runs (rules/train.smk) --------------------------------------------------


def noise_parquet(w):
    fields = dict(
        dataset=w.dataset,
        partition=w.partition,
        pseed=w.pseed,
        noise=w.noise,
        nseed=w.nseed,
    )
    return pattern(paths.NOISE, paths.NOISE_SUFFIXES["parquet"], **fields)


def training_settings(slug):
    try:
        return PLAN.trainings[slug]
    except KeyError:
        raise ValueError(
            f"training settings {slug!r} are not used by any selected table"
        )


def method_params(slug):
    try:
        return PLAN.methods[slug]
    except KeyError:
        raise ValueError(f"method {slug!r} is not used by any selected table")


# Packing (README "What a table costs"): `--groups train=pack --group-components pack=N` runs N
# training runs in one Slurm job. Snakemake sums a group's integer resources over the jobs
# that run side by side (N runs would ask for N GPUs; it also turns "1" into 1), but passes a
# non-numeric string once when every job of the group gives the same one: grouped runs ask
# for their GPU as gres "gpu:1" (sbatch --gres=gpu:1) and share it. Functions, because the
# command line's groups are known only once the workflow is parsed.
def _train_grouped() -> bool:
    return (
        bool(workflow.group_settings)
        and "train" in workflow.group_settings.overwrite_groups
    )


def _train_gpu(wildcards) -> int:
    return 0 if _train_grouped() else 1


def _train_gres(wildcards) -> str:
    return "gpu:1" if _train_grouped() else ""


# -- tables (rules/tables.smk) --------------------------------------------------------


def paper_table(w):
    for t in PLAN.tables:
        if t.paper == w.paper and t.table == w.table and t.scale == w.scale:
            return t
    raise ValueError(
        f"table {w.paper}/{w.table} at scale {w.scale!r} is not selected in the configuration (keys 'tables', 'scale')"
    )


def table_metrics(w):
    """Every run's metrics file, in the table's run order (build_table pairs them with its runs)."""
    return [tr.run.files(RESULTS)["metrics"] for tr in paper_table(w).runs]


def table_reported(w):
    t = paper_table(w)
    return [str(t.reported)] if t.reported is not None else []


wildcard_constraints:
    dataset=r"[a-z0-9_]+",
    partition=r"[A-Za-z0-9.\-_]+",
    noise=r"[A-Za-z0-9.\-_]+",
    annotator=r"[A-Za-z0-9.\-_]+",
    pseed=r"\d+",
    nseed=r"\d+",
    client=r"\d+",
    seed=r"\d+",
    train=r"[A-Za-z0-9.\-_]+",
    method=r"[A-Za-z0-9.\-_]+",
    paper=r"[a-z0-9_]+",
    table=r"[A-Za-z0-9_]+",
    scale=r"[A-Za-z0-9.\-_]+",
