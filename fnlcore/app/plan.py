"""Turn a workflow configuration into a validated plan of artifacts.

Two layers of validation, both before any job runs:
1. JSON Schema (config/schema/config.schema.yaml): structure, unknown top-level
   keys, types. Snakemake's ``validate`` applies it in the Snakefile;
   :func:`validate_schema` applies the same file without Snakemake.
2. :func:`build_plan`: every partitioner / noise model / dataset is built into
   its typed spec, which rejects unknown keys and bad values by name, and the
   combinations are checked (a multi-label noise model on a single-label set...), the
   tables' models exist (and have ImageNet weights where ``pretrained`` asks for them),
   the ``device`` can run the jobs (:func:`fnlcore.fl.context.check_device`), no partition has
   more clients than an in-memory set has training samples (an on-disk set's size is known
   once prepared: the partition job checks it, naming the same key), every
   ``data.datasets.<name>`` block is of a dataset something selected uses, and the selected
   tables' reported CSVs hold what the table job reads.

Every error is a :class:`~fnlcore.errors.ConfigError` whose message starts with
the location in the config (``data_grid[0].noises[2]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .. import paths, schemas
from ..errors import ConfigError, FNLError
from ..errors import located as _at
from ..schemas import load_yaml
from ..datasets import expected_shape, get_dataset
from ..noise import noise_spec_from_dict
from ..partition import partition_spec_from_dict
from ..tables.reported import check_reported
from .papers import load_paper, partition_keys as table_keys, Scale
from .run_group import form_run_groups
from .runs import train_slug



@dataclass(frozen=True)
class DatasetSettings:
    name: str
    raw_dir: str
    mirrors: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NoisyLabelSet:
    """One cell of the data grid: a dataset, a partition with its seed, a noise model with its seed."""

    dataset: str
    partition: Any  # fnlcore.partition.PartitionSpec
    partition_seed: int
    noise: Any  # fnlcore.noise.NoiseSpec
    noise_seed: int

    @property
    def partition_slug(self) -> str:
        return self.partition.slug()

    @property
    def noise_slug(self) -> str:
        return self.noise.slug()


@dataclass
class Plan:
    results_dir: str
    device: str
    datasets: dict[str, DatasetSettings]
    partitions: dict[str, Any]  # slug -> PartitionSpec
    noises: dict[str, Any]  # slug -> NoiseSpec
    label_sets: list[NoisyLabelSet]
    scale: str = "paper"
    run_groups: int = 1  # runs a train_group job trains side by side (fnlcore.app.run_group); 1: none
    tables: list = field(default_factory=list)  # fnlcore.app.papers.PaperTable
    trainings: dict[str, Any] = field(default_factory=dict)  # slug -> TrainSettings
    methods: dict[str, Any] = field(default_factory=dict)  # slug -> MethodParams
    # (dataset, partition slug) -> the keys that set its num_clients ("data_grid[0].partitions[1].num_clients",
    # "config/papers/x.yaml: tables[0] (1).partition.num_clients"): a job's error can name them
    partition_keys: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def runs(self) -> list:
        """Every distinct training run of the selected tables (RunSpec), in table order."""
        seen: dict[str, Any] = {}
        for t in self.tables:
            for tr in t.runs:
                seen.setdefault(tr.run.files(self.results_dir)["metrics"], tr.run)
        return list(seen.values())

    def partition_files(self, s: NoisyLabelSet) -> dict[str, str]:
        return paths.partition_files(self.results_dir, s.dataset, s.partition_slug, s.partition_seed)

    def noise_files(self, s: NoisyLabelSet) -> dict[str, str]:
        return paths.noise_files(
            self.results_dir, s.dataset, s.partition_slug, s.partition_seed, s.noise_slug, s.noise_seed
        )

    def targets(self) -> list[str]:
        """Every final file of this config: the data grid's artifacts and the selected tables."""
        out: list[str] = []
        for s in self.label_sets:
            out += self.partition_files(s).values()
            out += self.noise_files(s).values()
        for t in self.tables:
            out += t.outputs(self.results_dir).values()
        return list(dict.fromkeys(out))  # de-duplicated, order kept


def validate_schema(config: dict, set_default: bool = True) -> dict:
    """Apply the JSON Schema (filling defaults, as Snakemake's ``validate`` does); one-line errors.

    ``--config`` values that should be lists or mappings arrive from the command line as
    strings; they are parsed as YAML first.
    """

    schemas.coerce_cli_strings(config)
    return schemas.check(config, "config", "configuration", set_defaults=set_default)


def build_plan(config: dict, jobs_run_here: bool = True) -> Plan:
    """Validate the semantic content of a (schema-valid) config and expand the data grid.

    ``jobs_run_here``: the jobs run on this machine (not submitted to a cluster), so a CUDA
    ``device`` must exist here; for a cluster only the PyTorch build is checked."""
    # lazy: imports torch; fnlcore.app.plan imports without it (envs/labels.yaml)
    from ..fl.context import check_device

    results = str(config.get("results_dir", "results"))
    check_device(str(config.get("device", "auto")), here=jobs_run_here)
    data_cfg = config.get("data", {}) or {}
    raw_root = str(data_cfg.get("raw_dir", "resources/raw"))
    per_ds = data_cfg.get("datasets", {}) or {}
    for name in per_ds:
        _at(f"data.datasets.{name}", get_dataset, name)

    datasets: dict[str, DatasetSettings] = {}

    def settings(name: str, default_options: Mapping[str, Any] | None = None) -> DatasetSettings:
        if name not in datasets:
            d = per_ds.get(name, {}) or {}
            datasets[name] = DatasetSettings(
                name=name,
                raw_dir=str(d.get("raw_dir", f"{raw_root}/{name}")),
                mirrors=tuple(d.get("mirrors", ())),
                options={**(default_options or {}), **(d.get("options", {}) or {})},
            )
        elif default_options and not set(default_options) <= set(datasets[name].options):
            # a table's dataset options for a dataset the data grid already uses (the user's still win)
            old = datasets[name]
            datasets[name] = DatasetSettings(old.name, old.raw_dir, old.mirrors, {**default_options, **old.options})
        return datasets[name]

    partitions: dict[str, Any] = {}
    noises: dict[str, Any] = {}
    label_sets: list[NoisyLabelSet] = []
    grid_keys: dict[tuple[str, str], list[str]] = {}
    for i, entry in enumerate(config.get("data_grid", []) or []):
        where = f"data_grid[{i}]"
        info = _at(f"{where}.dataset", get_dataset, entry["dataset"])
        settings(info.name)
        pspecs = [
            _at(f"{where}.partitions[{j}]", partition_spec_from_dict, dict(p))
            for j, p in enumerate(entry["partitions"])
        ]
        nspecs = [
            _at(f"{where}.noises[{j}]", noise_spec_from_dict, dict(n))
            for j, n in enumerate(entry.get("noises") or [{"name": "clean"}])
        ]
        for j, ps in enumerate(pspecs):
            _check_partition_fits(f"{where}.partitions[{j}]", ps, info)
            _register(partitions, ps, f"{where}.partitions[{j}]")
            grid_keys.setdefault((info.name, ps.slug()), []).append(f"{where}.partitions[{j}].num_clients")
        for j, ns in enumerate(nspecs):
            _check_noise_fits(f"{where}.noises[{j}]", ns, info)
            _register(noises, ns, f"{where}.noises[{j}]")
        for ps in pspecs:
            for pseed in entry.get("partition_seeds", [0]):
                for ns in nspecs:
                    for nseed in entry.get("noise_seeds", [0]):
                        label_sets.append(NoisyLabelSet(info.name, ps, int(pseed), ns, int(nseed)))
    plan = Plan(
        results_dir=results,
        device=str(config.get("device", "auto")),
        datasets=datasets,
        partitions=partitions,
        noises=noises,
        label_sets=label_sets,
        scale=str(config.get("scale", "paper")),
        run_groups=_run_groups(config.get("run_groups", 1)),
        partition_keys=grid_keys,
    )
    _add_tables(plan, config.get("tables", []) or [], settings)
    _check_dataset_blocks(plan, per_ds)
    _check_dataset_options(plan, per_ds)
    _check_clients_fit(plan)
    return plan


def _check_dataset_options(plan: Plan, per_ds: Mapping[str, Any]) -> None:
    """Options a dataset refuses, named before any job with where they were set (the config's
    data block, the scale file, a table's dataset_options), where the dataset can check them
    before preparation (the in-memory sets' sizes)."""

    scale = Scale.load(plan.scale) if plan.tables else None
    for name, ds in plan.datasets.items():
        info = get_dataset(name)
        if not info.in_memory or (info.shape_for is None and info.split_sizes is None):
            continue
        try:
            expected_shape(info, ds.options)
        except ConfigError as err:
            sources = [f"data.datasets.{name}.options"] if (per_ds.get(name) or {}).get("options") else []
            if scale is not None and scale.dataset_options.get(name):
                sources.append(f"{scale.source or 'scale ' + scale.name}: dataset_options.{name}")
            sources += [f"{t.source}: dataset_options.{name}" for t in plan.tables if t.dataset_options.get(name)]
            raise ConfigError(f"{' and '.join(sources) or f'dataset {name!r}'}: {err}") from None


def _run_groups(size: Any) -> int:
    form_run_groups([], size, "")  # a ConfigError naming the key unless a whole number >= 1
    return int(size)


def _add_tables(plan: Plan, selected: list[str], settings) -> None:
    """Expand the selected paper tables at the plan's scale and register their specs by slug."""

    scale = _at("scale", Scale.load, plan.scale)  # validated even when no table is selected
    if not selected:
        return
    cache: dict[str, list] = {}
    for i, name in enumerate(selected):
        paper, _, table = name.partition("/")
        if paper not in cache:
            cache[paper] = _at(f"tables[{i}]", load_paper, paper, scale)
        chosen = [t for t in cache[paper] if not table or t.table == table]
        if not chosen:
            valid = ", ".join(f"{paper}/{t.table}" for t in cache[paper])
            raise ConfigError(f"tables[{i}]: {name!r} is not a table of {paper!r}; valid: {valid}")
        for t in chosen:
            if t not in plan.tables:
                if t.reported is not None:  # read by the table job: a bad file is named before any job
                    _at(f"{t.source}.reported", check_reported, t.reported, t.spec)
                plan.tables.append(t)
    table_options = _table_dataset_options(plan.tables)
    for t in plan.tables:
        for tr in t.runs:
            r = tr.run
            info = _at(f"table {t.name}: dataset", get_dataset, r.dataset)
            settings(info.name, {**scale.dataset_options.get(info.name, {}), **table_options.get(info.name, {})})
            where = f"table {t.name}, row {tr.row!r}, column {tr.column!r}"
            _check_partition_fits(where, r.partition, info)
            _check_noise_fits(where, r.noise, info)
            # a model (or engine) the scale file sets is named as the scale's key
            set_by_scale = sorted(set(scale.training) & {"model", "pretrained", "engine"})
            twhere = f"{scale.source}: training.{'/'.join(set_by_scale)} (applied to {where})" if set_by_scale else where
            _check_method_fits(twhere, r.method, info, r.training)
            _register(plan.partitions, r.partition, where)
            keys = plan.partition_keys.setdefault((info.name, r.partition.slug()), [])
            if tr.partition_key and tr.partition_key not in keys:
                keys.append(tr.partition_key)
            _register(plan.noises, r.noise, where)
            _register_slug(plan.trainings, train_slug(r.training), r.training, where)
            _register_slug(plan.methods, r.method.slug(), r.method, where)


def _table_dataset_options(tables: list) -> dict[str, dict]:
    """Dataset options the selected tables set (``dataset_options`` in a paper YAML).

    The user's ``data.datasets.<name>.options`` still win; two tables asking for
    different values of one option of one dataset cannot share its prepared data.
    """
    out: dict[str, dict] = {}
    source: dict[tuple[str, str], str] = {}
    for t in tables:
        for ds, opts in t.dataset_options.items():
            for k, v in opts.items():
                have = out.setdefault(ds, {})
                if k in have and have[k] != v:
                    raise ConfigError(
                        f"tables {source[(ds, k)]} and {t.name} set dataset option {ds}.{k} to "
                        f"{have[k]!r} and {v!r}; build them in separate result folders (results_dir)"
                    )
                have[k] = v
                source.setdefault((ds, k), t.name)
    return out


def _register_slug(table: dict[str, Any], slug: str, spec: Any, where: str) -> None:
    other = table.get(slug)
    if other is not None and other != spec:
        raise ConfigError(f"{where}: slug {slug!r} names two different settings; please report this bug")
    table[slug] = spec


def load_plan(path: str | Path, jobs_run_here: bool = True) -> Plan:
    """Schema-validate and build a plan from a YAML file (what the Snakefile does)."""
    return build_plan(validate_schema(load_yaml(path)), jobs_run_here)


# -- helpers -----------------------------------------------------------------


def _register(table: dict[str, Any], spec: Any, where: str) -> None:
    slug = spec.slug()
    other = table.get(slug)
    if other is not None and other != spec:
        raise ConfigError(
            f"{where}: slug {slug!r} is already used by different settings {other!r}; "
            "this is a bug in the slug function, please report it"
        )
    table[slug] = spec


def _check_dataset_blocks(plan: Plan, per_ds: Mapping[str, Any]) -> None:
    """A ``data.datasets.<name>`` block of a dataset that nothing selected uses would be ignored
    without a word (a typo'd or stale setting): every key of the configuration acts or is an error."""

    for name in per_ds:
        if name in plan.datasets:
            continue
        used = ", ".join(sorted(plan.datasets)) or "none"
        stand_in = Scale.load(plan.scale).datasets.get(name) if plan.tables else None
        why = f" (at scale {plan.scale!r} the tables use {stand_in!r} in its place)" if stand_in else ""
        raise ConfigError(
            f"data.datasets.{name}: no selected table and no data_grid entry uses dataset {name!r}{why}; "
            f"they use: {used}. Remove the block, or select a table (or add a data_grid entry) that uses it"
        )


def known_train_size(info: Any, options: Mapping[str, Any]) -> int | None:
    """The training split's size where it is known before preparation: the in-memory sets (their
    sizes are fixed by the published data and the options). An on-disk set holds the files the
    user placed, so its size is known once prepared (the partition job checks it then)."""

    if not info.in_memory or (info.shape_for is None and info.split_sizes is None):
        return None
    try:
        return expected_shape(info, options).n_train
    except ConfigError:
        return None  # options the dataset refuses: its preparation names them


def _check_clients_fit(plan: Plan) -> None:
    """More clients than training samples fails every partitioner: say so before any job runs,
    naming the key that sets num_clients."""

    seen: set[tuple[str, str]] = set()
    used = [(s.dataset, s.partition) for s in plan.label_sets]
    used += [(tr.run.dataset, tr.run.partition) for t in plan.tables for tr in t.runs]
    for dataset, spec in used:
        if (dataset, spec.slug()) in seen:
            continue
        seen.add((dataset, spec.slug()))
        info = get_dataset(dataset)
        k = getattr(spec, "num_clients", None)  # a user's partitioner may size clients otherwise
        n = known_train_size(info, plan.datasets[dataset].options) if isinstance(k, int) else None
        if n is not None and k > n:
            raise ConfigError(clients_error(plan.partition_keys.get((dataset, spec.slug()), []), spec, dataset, n))


def partition_keys(config: Mapping[str, Any], dataset: str, slug: str) -> list[str]:
    """The keys of ``config`` (its data grid, its selected tables at its scale) that set num_clients
    of partition ``slug`` of ``dataset``: a job that finds a problem with it names them. Builds
    partitions only (no torch: the partition job's environment); [] where they cannot be read."""

    keys: list[str] = []
    try:
        for i, entry in enumerate(config.get("data_grid") or []):
            for j, p in enumerate(entry.get("partitions") or []):
                if entry.get("dataset") == dataset and partition_spec_from_dict(dict(p)).slug() == slug:
                    keys.append(f"data_grid[{i}].partitions[{j}].num_clients")
        scale = Scale.load(str(config.get("scale", "paper")))
        for name in config.get("tables") or []:
            paper, _, table = str(name).partition("/")
            keys += [k for k in table_keys(paper, scale, table).get((dataset, slug), []) if k not in keys]
    except (FNLError, OSError, ValueError, TypeError):
        return keys  # the job's own error still stands; it names what was found
    return keys


def clients_error(keys: list[str], spec: Any, dataset: str, n: int) -> str:
    """One line: where num_clients is set, the count, the dataset's size, the fix."""
    where = " and ".join(keys) if keys else f"partition {spec.slug()!r}: num_clients"
    return (f"{where}: num_clients={spec.num_clients} is more than the {n} training samples of dataset "
            f"{dataset!r}; use at most {n} clients")


def _check_partition_fits(where: str, spec: Any, info: Any) -> None:
    if info.multi_label and spec.needs_labels():
        raise ConfigError(
            f"{where}: partitioner {spec.name!r} splits by class and needs single-label data, "
            f"but dataset {info.name!r} is multi-label; use 'iid' or 'fedmlp_equal'"
        )


def _check_method_fits(where: str, spec: Any, info: Any, training: Any = None) -> None:
    # lazy: imports torch; fnlcore.app.plan imports without it (envs/labels.yaml)
    from ..methods import METHODS
    # lazy: imports torch; fnlcore.app.plan imports without it (envs/labels.yaml)
    from ..fl.simulation import use_batched_engine
    # lazy: imports torch; fnlcore.app.plan imports without it (envs/labels.yaml)
    from ..methods.base import check_label_kind

    check_label_kind(METHODS[spec.name], bool(info.multi_label), where)
    if training is not None:
        _check_model(where, training)
        use_batched_engine(METHODS[spec.name], training.engine, where)  # engine: batched it cannot run


def _check_model(where: str, training: Any) -> None:
    """The training's model is registered, with ImageNet weights when ``pretrained`` asks for them."""
    # lazy: imports torch; fnlcore.app.plan imports without it (envs/labels.yaml)
    from ..models import MODELS

    name = training.model
    if name == "auto":
        return  # resolved from the input shape to a registered model
    if name not in MODELS:
        raise ConfigError(f"{where}: training.model={name!r} is not a model; valid: auto, {', '.join(sorted(MODELS))}")
    if training.pretrained and not MODELS[name].pretrained_weights:
        with_weights = sorted(n for n, e in MODELS.items() if e.pretrained_weights)
        raise ConfigError(f"{where}: training.model={name!r} has no pretrained weights (pretrained: true); "
                          f"use one of {', '.join(with_weights)} or pretrained: false")


def _check_noise_fits(where: str, spec: Any, info: Any) -> None:
    wants_multi = bool(getattr(spec, "multi_label", False))
    if wants_multi != bool(info.multi_label) and spec.name != "clean":
        kind = "multi-label" if wants_multi else "single-label"
        raise ConfigError(
            f"{where}: noise model {spec.name!r} is for {kind} data, but dataset {info.name!r} is "
            f"{'multi' if info.multi_label else 'single'}-label"
        )


__all__ = ["Plan", "NoisyLabelSet", "DatasetSettings", "build_plan", "validate_schema", "load_plan", "FNLError"]
