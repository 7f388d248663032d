# Shared state of the workflow: the validated plan and every helper the rules call.
# Rule files hold rules only (snakemake --lint); their input/params functions live here.
import sys

from fnlcore import paths
from fnlcore.app.plan import build_plan
from fnlcore.app.resources import train_resources
from fnlcore.app.run_group import GROUP_RECORD, Member, form_run_groups, group_request
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


# Packing (docs/cluster.md, "Packing several training runs onto one GPU job"): `--groups train=pack --group-components pack=N` runs N
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
    # a run of a run group (run_groups) is trained by its train_group job, which holds the GPU
    return 0 if _train_grouped() or run_group_record(wildcards) else 1


def _train_gres(wildcards) -> str:
    return "gpu:1" if _train_grouped() else ""


# Run groups (config key run_groups; fnlcore/app/run_group.py, docs/cluster.md): one train_group
# job trains N runs of the same dataset and training settings side by side on its one device,
# into each run's staging folder; each run's own train job then links the outputs into place,
# so every run stays its own tracked output set.
RUN_GROUPS = {g.gid: g for g in form_run_groups(PLAN.runs(), PLAN.run_groups, RESULTS)}
_GROUP_OF_RUN = {
    run.files(RESULTS)["metrics"]: g for g in RUN_GROUPS.values() for run in g.runs
}


class _RunWildcards(dict):
    """A planned run's path fields as the rules' helpers read wildcards (w.dataset, w.items())."""

    __getattr__ = dict.__getitem__


def run_group_record(w):
    """The record of the run group that trains this run ([] when it trains by itself)."""
    g = _GROUP_OF_RUN.get(pattern(RUN, RUN_FILES["metrics"], **dict(w.items())))
    if g is not None and _train_grouped():  # known once the command line is parsed
        raise ValueError(
            "run_groups and --groups train=... both pack training runs; use run_groups (its runs run "
            "side by side, docs/cluster.md) and drop --groups for train"
        )
    return [g.record(RESULTS)] if g is not None else []


def run_group(w):
    try:
        return RUN_GROUPS[w.group]
    except KeyError:
        raise ValueError(
            f"run group {w.group!r} is not one of the configuration's (key run_groups; its records: "
            f"{pattern(GROUP_RECORD)})"
        )


def _group_runs(w):
    return [_RunWildcards(run.fields()) for run in run_group(w).runs]


def group_inputs(w):
    """Every input of the group's runs (rule train's, once each)."""
    files = []
    for r in _group_runs(w):
        files += data_inputs(r) + [noise_parquet(r)]
        files += planned_cache_files(
            data_dir(r),
            r.dataset,
            dataset_settings(r.dataset).options,
            training_settings(r.train).image_transform,
        )
    return list(dict.fromkeys(files))


def train_log(w):
    return pattern(
        "{results}/logs/runs/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}/{train}/{method}/seed{seed}.log",
        **dict(w.items()),
    )


def group_members(w):
    """What each run's own train job would get (workflow_scripts/train.py), for its child process."""
    from fnlcore.app.train import RunSpec
    from fnlcore.progress import run_tag

    members = []
    for r in _group_runs(w):
        out = {k: pattern(RUN, suffix, **r) for k, suffix in RUN_FILES.items()}
        spec = RunSpec(  # positional: a line starting with `checkpoint=` is Snakemake syntax
            data_dir(r),
            noise_parquet(r),
            partition_spec(r.partition).num_clients,
            training_settings(r.train),
            method_params(r.method),
            int(r.seed),
            out["metrics"],
            out["clients"],
            out["model"],
            pattern(CHECKPOINT, **r),
            relabels=out["relabels"],
            device=str(config.get("device", "auto")),
            results_dir=str(config.get("results_dir", "results")),
        )
        identity = train_identity(
            training_settings(r.train), method_params(r.method), r.dataset
        )
        members.append(
            Member(spec, identity, train_log(r), run_tag(r.method, r.noise, r.seed))
        )
    return members


def group_identities(w):
    """Tracked (plain values): a changed setting of any run reruns its group, which trains that run only."""
    return [m.identity for m in group_members(w)]


def _group_request(w):
    """Summed over the group's runs, each as its own train job would ask (--set-resources train:... too)."""
    res = train_resources(PLAN, workflow)
    given = workflow.resource_settings.overwrite_resources.get("train", {})
    given = {k: getattr(v, "raw", v) for k, v in given.items()}
    runs = [
        tuple(
            int(given[k]) if k in given else getattr(res, k)(r)
            for k in ("mem_mb", "disk_mb", "runtime")
        )
        for r in _group_runs(w)
    ]
    return group_request(runs, res.cap.max_mem_mb, res.cap.max_runtime)


def group_mem_mb(w):
    return _group_request(w)["mem_mb"]


def group_disk_mb(w):
    return _group_request(w)["disk_mb"]


def group_runtime(w):
    return _group_request(w)["runtime"]


def run_threads():
    """Each run's CPU threads: rule train's (1, or --set-threads train=N)."""
    given = workflow.resource_settings.overwrite_threads.get("train", 1)
    # a Resource when given on the command line
    return int(getattr(given, "raw", given))


def group_threads(w):
    return run_threads() * len(run_group(w).runs)


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
    group=r"[a-z0-9_]+-[0-9a-f]{12}",
    nseed=r"\d+",
    client=r"\d+",
    seed=r"\d+",
    train=r"[A-Za-z0-9.\-_]+",
    method=r"[A-Za-z0-9.\-_]+",
    paper=r"[a-z0-9_]+",
    table=r"[A-Za-z0-9_]+",
    scale=r"[A-Za-z0-9.\-_]+",
