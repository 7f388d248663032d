"""Paper tables as data: expand ``config/papers/<paper>.yaml`` into training runs.

A table file declares, for each table, its dataset, partition, training
settings, columns (noise settings; a column may also override the dataset,
partition or training, as FedNoRo's Table 4 mixes ICH and ISIC), rows (methods
with their hyper-parameters, or ``status: not_implemented``), metrics (which
per-round test metric, summarised how), seeds and the CSV of reported numbers.
A *scale* (``config/scales/<name>.yaml``) rewrites a table for a budget:
``paper`` changes nothing; ``smoke`` swaps in synthetic stand-in datasets of
the same shape, fewer clients and rounds and a tiny model, so every table's DAG
runs end to end on a CPU.

Seeds: the training seed of a run is one of the table's ``seeds``. The
partition seed and the noise seed are separate settings: a fixed integer, or
``same`` (= the training seed; FedNoRo's code seeds its noise with ``--seed``
and fixes the partition seed at 100).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping
import hashlib

from .. import schemas
from ..errors import ConfigError
from ..errors import located as _wrap
from ..fl.settings import TrainSettings
from ..metrics import SummaryRule
from ..registry import round_fields
from .runs import PAPERS_DIR, REPORTED_DIR, SCALES_DIR, TABLE, TABLE_FILES, RunSpec
from ..noise import noise_spec_from_dict
from ..partition import partition_spec_from_dict, PARTITIONERS
from ..schemas import load_yaml
from ..tables import TableSpec

@dataclass(frozen=True)
class MetricRule:
    source: str  # per-round metric column, e.g. "bacc"
    rule: SummaryRule


@dataclass
class TableRun:
    row: str
    column: str
    run: RunSpec
    # where num_clients of this run's partition is set (file: key), for errors found later
    partition_key: str = ""


@dataclass
class PaperTable:
    paper: str
    table: str
    spec: Any  # fnlcore.tables.TableSpec
    runs: list[TableRun]
    metrics: dict[str, MetricRule]
    reported: Path | None
    scale: str
    compare: list[dict] = field(default_factory=list)
    dataset_options: dict[str, dict] = field(default_factory=dict)  # dataset -> options the table sets
    source: str = ""  # the table in its file, "config/papers/<paper>.yaml: tables[i] (<id>)", for errors

    @property
    def name(self) -> str:
        return f"{self.paper}/{self.table}"

    def outputs(self, results: str) -> dict[str, str]:
        """The table's files: results/tables/<scale>/<paper>/<table>.{csv,md,html,curves.png}."""
        base = TABLE.format(results=results, scale=self.scale, paper=self.paper, table=self.table)
        return {k: base + s for k, s in TABLE_FILES.items()}

    def content_digest(self) -> str:
        """A digest of everything besides the runs' metrics and the reported CSV (the rule's
        inputs) that changes what the table shows: rows, columns, metrics with their summary
        rules, tolerance, notes, comparisons, the scale, and which run fills which cell.

        The table rule passes it as a param, so Snakemake rebuilds the table when it changes
        (``{kind: best}`` -> ``{kind: last_mean, n: 5}`` in a paper YAML).
        """

        content = (
            self.spec,
            sorted(self.metrics.items()),
            self.compare,
            self.scale,
            self.reported.name if self.reported is not None else None,
            [(tr.row, tr.column, sorted(tr.run.fields().items())) for tr in self.runs],
        )
        return hashlib.sha256(repr(content).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Scale:
    """How a scale rewrites tables (see config/scales/*.yaml)."""

    name: str
    datasets: Mapping[str, str] = field(default_factory=dict)  # real dataset -> stand-in
    dataset_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    num_clients: int | None = None
    training: Mapping[str, Any] = field(default_factory=dict)  # overrides for every run
    noises: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per-noise-model overrides
    partitions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per-partitioner overrides
    seeds: tuple[int, ...] | None = None
    note: str = ""
    source: str = ""  # the file it was read from, for errors that name a key of it

    # Training settings that change how a run executes, not its numbers (beyond float rounding).
    EXECUTION_ONLY = frozenset({"engine", "batched_clients", "channels_last", "cuda_graphs", "eval_batch_size",
                                "checkpoint_every"})

    @property
    def compares_with_paper(self) -> bool:
        """True when the scale keeps the papers' data, clients, partitions, noise and budget
        (``paper``, ``paper_fast``): only then are its numbers set beside the reported ones.
        Fewer seeds still compare (cells show [k/n seeds])."""
        return not (
            self.datasets or self.dataset_options or self.num_clients is not None
            or self.noises or self.partitions or set(self.training) - self.EXECUTION_ONLY
        )

    def describe(self) -> str:
        """One line for a table's header: the scale, what it means, whether it is compared."""
        if self.name == "paper":
            return "scale paper (the table's own settings)"
        note = f" ({self.note})" if self.note else ""
        if self.compares_with_paper:
            return f"scale {self.name}{note}"
        return f"scale {self.name}{note}; not compared with the reported numbers, which need the table's own settings"

    @classmethod
    def load(cls, name: str) -> "Scale":
        # A scale is a name in config/scales/ or the path of your own scale file (*.yaml).
        path = Path(name) if name.endswith((".yaml", ".yml")) else SCALES_DIR / f"{name}.yaml"
        if name.endswith((".yaml", ".yml")) and not path.exists():
            raise ConfigError(f"scale file {name!r} does not exist")
        builtin = SCALES_DIR / f"{path.stem}.yaml"
        if path.resolve() != builtin.resolve() and builtin.exists():
            # a scale's name is part of every table path (results/tables/<scale>/...)
            raise ConfigError(
                f"scale file {name!r} has the name of the built-in scale {path.stem!r}; "
                "rename your file so its tables get their own folder"
            )
        if not path.exists():
            valid = sorted(p.stem for p in SCALES_DIR.glob("*.yaml"))
            raise ConfigError(f"scale {name!r}: no file {path.name} in config/scales; valid scales: {', '.join(valid)}")
        source = str(name if name.endswith((".yaml", ".yml")) else f"config/scales/{path.name}")
        d = schemas.check(load_yaml(path), "scale", source)
        if "seeds" in d and d["seeds"] is not None:
            d["seeds"] = tuple(int(s) for s in d["seeds"])
        return cls(name=path.stem, source=source, **d)


def _seed(value: Any, train_seed: int, where: str) -> int:
    if value == "same":
        return train_seed
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(f"{where}: must be a non-negative integer or 'same', got {value!r}")


def load_paper(paper: str, scale: Scale) -> list[PaperTable]:
    """Read config/papers/<paper>.yaml and expand every table at the given scale."""

    path = PAPERS_DIR / f"{paper}.yaml"
    if not path.exists():
        valid = sorted(p.stem for p in PAPERS_DIR.glob("*.yaml"))
        raise ConfigError(f"paper {paper!r}: no file config/papers/{paper}.yaml; valid papers: {', '.join(valid)}")
    doc = schemas.check(load_yaml(path), "paper", f"config/papers/{paper}.yaml")
    defaults = doc.get("defaults", {}) or {}
    out = []
    for i, t in enumerate(doc.get("tables", [])):
        where = f"config/papers/{paper}.yaml: tables[{i}]"
        merged = {**copy.deepcopy(defaults), **t}
        # a key the table takes from `defaults` is named there in errors
        inherited = {k: f"config/papers/{paper}.yaml: defaults" for k in defaults if k not in t}
        out.append(_expand_table(paper, merged, scale, f"{where} ({t.get('id', '?')})", inherited))
    return out


def _expand_table(
    paper: str, t: dict, scale: Scale, where: str, inherited: Mapping[str, str] | None = None
) -> PaperTable:
    # lazy: imports torch; fnlcore.app.papers imports without it (envs/labels.yaml)
    from ..methods import method_from_dict

    for k in ("id", "dataset", "partition", "training", "rows", "columns", "metrics"):
        if k not in t:
            raise ConfigError(f"{where}: missing key {k!r}")
    table_id = str(t["id"])
    seeds = tuple(scale.seeds) if scale.seeds is not None else tuple(t.get("seeds", [0]))
    metrics: dict[str, MetricRule] = {}
    metric_specs = []
    for j, m in enumerate(t["metrics"]):
        mw = f"{where}.metrics[{j}]"
        metrics[m["name"]] = MetricRule(m["source"], _wrap(mw, lambda s: SummaryRule(**s), m["summary"]))
        metric_specs.append({k: v for k, v in m.items() if k not in ("source", "summary")})
    rows, cols, runs = [], [], []
    for j, c in enumerate(t["columns"]):
        cols.append({k: v for k, v in c.items() if k in ("label", "key", "note", "average_of")})
    for j, r in enumerate(t["rows"]):
        rows.append({k: v for k, v in r.items() if k in ("label", "key", "note", "status", "average_of")})
        if r.get("status", "implemented") == "implemented" and "method" not in r:
            raise ConfigError(f"{where}.rows[{j}] ({r.get('label')}): an implemented row needs 'method'")
    spec = _wrap(
        where,
        TableSpec.from_dict,
        {
            "paper": paper, "table": table_id, "title": t.get("title", ""), "rows": rows, "columns": cols,
            "metrics": metric_specs, "tolerance": t.get("tolerance", 1.0), "std_ddof": t.get("std_ddof", 1),
            "row_fields": t.get("row_fields", ["method"]), "column_fields": t.get("column_fields", ["noise_setting"]),
            "expected_seeds": len(seeds), "note": t.get("note", ""),
            "scale": scale.name, "scale_note": scale.describe(), "compared_with_paper": scale.compares_with_paper,
        },
    )
    dataset_options: dict[str, dict] = {}
    for j, c in enumerate(t["columns"]):
        cw = f"{where}.columns[{j}] ({c.get('label')})"
        if "average_of" in c:  # derived from the other columns' runs when the table is rendered
            extra = sorted(set(c) & {"dataset", "partition", "noise", "training", "methods", "dataset_options"})
            if extra:
                raise ConfigError(f"{cw}: an average_of column runs nothing; remove {extra}")
            continue
        real = c.get("dataset", t["dataset"])
        dataset = scale.datasets.get(real, real)
        if dataset == real:  # a stand-in is its own dataset: the real one's options do not apply
            opts = {**(t.get("dataset_options") or {}).get(real, {}), **(c.get("dataset_options") or {}).get(real, {})}
            if dataset_options.setdefault(real, opts) != opts:
                raise ConfigError(f"{cw}: dataset_options for {real!r} differ between the columns of one table")
        pdict, pkey = _column_partition(t, c, cw, where, scale, inherited)
        # the paper's own entry (the scale's num_clients cap applied) checked first, then the scale's values
        forced = scale.partitions.get(pdict.get("name"), {})
        original = dict(c.get("partition", t["partition"]))
        own = {k: (original[k] if k in forced else v) for k, v in pdict.items() if k not in forced or k in original}
        pspec = _from_scale(scale, f"partitions.{pdict.get('name')}", forced, f"{cw}.partition",
                            partition_spec_from_dict, own)
        ndict = dict(c.get("noise", {"name": "clean"}))
        forced = scale.noises.get(ndict.get("name"), {})
        nspec = _from_scale(scale, f"noises.{ndict.get('name')}", forced, f"{cw}.noise", noise_spec_from_dict, ndict)
        for k, r in enumerate(t["rows"]):
            if r.get("status", "implemented") != "implemented":
                continue
            rw = f"{where}.rows[{k}] ({r.get('label')})"
            tdict = {**t["training"], **c.get("training", {}), **r.get("training", {})}
            table_rounds = _wrap(f"{rw}.training", TrainSettings.from_dict, tdict).rounds
            training = _from_scale(scale, "training", scale.training, f"{rw}.training", TrainSettings.from_dict, tdict)
            # a column may set defaults for hyper-parameters that depend on its dataset (FedNoRo's
            # warm-up, FedDiv's L_reg on non-IID columns); a value the row sets itself wins
            mdict = {**(c.get("methods") or {}).get(r["method"].get("name"), {}), **r["method"]}
            method = _wrap(f"{rw}.method", method_from_dict, mdict)
            method = _wrap(f"{rw}.method", rescale_rounds, method, table_rounds, training.rounds)
            _wrap(f"{rw}.method", method.check_training, training)
            for s in seeds:
                runs.append(
                    TableRun(
                        row=r["label"],
                        column=c["label"],
                        run=RunSpec(
                            dataset=dataset,
                            partition=pspec,
                            partition_seed=_seed(t.get("partition_seed", "same"), s, f"{where}.partition_seed"),
                            noise=nspec,
                            noise_seed=_seed(t.get("noise_seed", "same"), s, f"{where}.noise_seed"),
                            training=training,
                            method=method,
                            seed=int(s),
                        ),
                        partition_key=pkey,
                    )
                )
    # a table at a scale that changes its data or budget is not compared with the paper
    reported = t.get("reported") if scale.compares_with_paper else None
    return PaperTable(
        paper=paper,
        table=table_id,
        spec=spec,
        runs=runs,
        metrics=metrics,
        reported=(REPORTED_DIR / reported) if reported else None,
        scale=scale.name,
        compare=list(t.get("compare", [])),
        dataset_options={k: v for k, v in dataset_options.items() if v},
        source=where,
    )


def _from_scale(scale: Scale, key: str, overrides: Mapping[str, Any], where: str, build: Callable[[dict], Any],
                given: Mapping[str, Any]) -> Any:
    """``build({**given, **overrides})``, where ``overrides`` are the scale file's values under ``key``.
    ``given`` (the paper's own values) is checked first, naming the paper's key; then a value that
    fails only with the scale's overrides is named as the scale file's key, not the paper's row."""
    built = _wrap(where, build, dict(given))
    if not overrides:
        return built
    scale_file = scale.source or f"scale {scale.name}"
    return _wrap(f"{scale_file}: {key} (applied to {where})", build, {**given, **overrides})


def _column_partition(t: dict, c: dict, cw: str, where: str, scale: Scale,
                      inherited: Mapping[str, str] | None) -> tuple[dict, str]:
    """A column's partition entry at this scale, and the key that sets its num_clients: the
    column's, the table's (or its defaults'), or the scale's where the scale's value is the one used."""
    pdict = dict(c.get("partition", t["partition"]))
    pkey = f"{cw}.partition.num_clients" if "partition" in c else \
        f"{(inherited or {}).get('partition', where)}.partition.num_clients"
    scale_file = scale.source or f"scale {scale.name}"
    given = pdict.get("num_clients", scale.num_clients)
    if scale.num_clients is not None and _scales_clients(pdict.get("name")) and _is_int(given):
        if "num_clients" not in pdict or given > scale.num_clients:
            pkey = f"{scale_file}: num_clients"
        pdict["num_clients"] = min(given, scale.num_clients)  # a non-integer is left to the spec's check
    forced = scale.partitions.get(pdict.get("name"), {})
    if "num_clients" in forced:
        pkey = f"{scale_file}: partitions.{pdict.get('name')}.num_clients"
    pdict.update(forced)
    return pdict, pkey


def partition_keys(paper: str, scale: Scale, table: str = "") -> dict[tuple[str, str], list[str]]:
    """(dataset, partition slug) -> the keys that set its num_clients, over the paper's tables (its
    table ``table`` only, where given) at ``scale``. Builds partitions only: no methods, so no torch
    (the partition job's environment, which finds an on-disk set's size)."""

    doc = schemas.check(load_yaml(PAPERS_DIR / f"{paper}.yaml"), "paper", f"config/papers/{paper}.yaml")
    defaults = doc.get("defaults", {}) or {}
    out: dict[tuple[str, str], list[str]] = {}
    for i, own in enumerate(doc.get("tables", [])):
        if table and str(own.get("id")) != table:
            continue
        t = {**copy.deepcopy(defaults), **own}
        where = f"config/papers/{paper}.yaml: tables[{i}] ({own.get('id', '?')})"
        inherited = {k: f"config/papers/{paper}.yaml: defaults" for k in defaults if k not in own}
        for j, c in enumerate(t.get("columns", [])):
            if "average_of" in c or ("partition" not in c and "partition" not in t):
                continue
            real = c.get("dataset", t.get("dataset"))
            pdict, pkey = _column_partition(t, c, f"{where}.columns[{j}] ({c.get('label')})", where, scale, inherited)
            keys = out.setdefault((scale.datasets.get(real, real), partition_spec_from_dict(pdict).slug()), [])
            if pkey not in keys:
                keys.append(pkey)
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _scales_clients(partitioner: Any) -> bool:
    return partitioner not in PARTITIONERS or PARTITIONERS[partitioner].scales_clients


def rescale_rounds(params, from_rounds: int, to_rounds: int):
    """Round-valued hyper-parameters follow a scale's change of ``training.rounds``.

    Rule: v -> min(max(1, round(v * R'/R)), R' - 1) for each round-valued field v that
    is set (None = the method's own default, derived from the rounds at run time), so
    every stage keeps at least one round: FedNoRo's 10-round warm-up of 100 rounds
    becomes 1 of 4 at smoke scale. Unchanged when R' = R.
    """
    if from_rounds == to_rounds:
        return params
    changes = {}
    for name in round_fields(type(params)):
        v = getattr(params, name)
        if v is not None:
            changes[name] = min(max(1, round(v * to_rounds / from_rounds)), max(to_rounds - 1, 1))
    return dataclasses.replace(params, **changes) if changes else params
