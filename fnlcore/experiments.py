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
from typing import Any, Mapping

from . import paths, schemas
from .errors import ConfigError
from .errors import located as _wrap
from .fl.settings import TrainSettings
from .metrics import SummaryRule
from .slugs import fmt_float, short_hash

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
PAPERS_DIR = CONFIG_DIR / "papers"
SCALES_DIR = CONFIG_DIR / "scales"
REPORTED_DIR = PAPERS_DIR / "reported"

RUN = "{results}/runs/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}/{train}/{method}/seed{seed}"
RUN_FILES = {"metrics": "/metrics.parquet", "clients": "/clients.parquet", "model": "/final.pt"}
CHECKPOINT = "{results}/checkpoints/{dataset}/{partition}/pseed{pseed}/{noise}/nseed{nseed}/{train}/{method}/seed{seed}.pt"
TABLE = "{results}/tables/{paper}/{table}"
TABLE_FILES = {"csv": ".csv", "md": ".md", "html": ".html", "curves": ".curves.png"}


def train_slug(t: TrainSettings) -> str:
    """Readable core of the training settings plus a hash of every other non-default field."""
    core = ("model", "rounds", "local_epochs", "batch_size", "optimizer", "lr")
    head = f"{t.model}-r{t.rounds}-e{t.local_epochs}-b{t.batch_size}-{t.optimizer}{fmt_float(t.lr)}"
    rest = {
        f.name: getattr(t, f.name)
        for f in dataclasses.fields(t)
        if f.name not in core and getattr(t, f.name) != f.default and f.name != "checkpoint_every"
    }
    return head + (f"-{short_hash(rest)}" if rest else "")


@dataclass(frozen=True)
class RunSpec:
    """One training run: everything that determines its numbers."""

    dataset: str
    partition: Any  # PartitionSpec
    partition_seed: int
    noise: Any  # NoiseSpec
    noise_seed: int
    training: TrainSettings
    method: Any  # MethodParams
    seed: int

    def fields(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "partition": self.partition.slug(),
            "pseed": self.partition_seed,
            "noise": self.noise.slug(),
            "nseed": self.noise_seed,
            "train": train_slug(self.training),
            "method": self.method.slug(),
            "seed": self.seed,
        }

    def files(self, results: str) -> dict[str, str]:
        base = RUN.format(results=results, **self.fields())
        return {k: base + s for k, s in RUN_FILES.items()}

    def checkpoint(self, results: str) -> str:
        return CHECKPOINT.format(results=results, **self.fields())


@dataclass(frozen=True)
class MetricRule:
    source: str  # per-round metric column, e.g. "bacc"
    rule: SummaryRule


@dataclass
class TableRun:
    row: str
    column: str
    run: RunSpec


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

    @property
    def name(self) -> str:
        return f"{self.paper}/{self.table}"

    def outputs(self, results: str) -> dict[str, str]:
        base = TABLE.format(results=results, paper=self.paper, table=self.table)
        return {k: base + s for k, s in TABLE_FILES.items()}


@dataclass(frozen=True)
class Scale:
    """How a scale rewrites tables (see config/scales/*.yaml)."""

    name: str
    datasets: Mapping[str, str] = field(default_factory=dict)  # real dataset -> stand-in
    dataset_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    num_clients: int | None = None
    training: Mapping[str, Any] = field(default_factory=dict)  # overrides for every run
    noises: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per-noise-model overrides
    seeds: tuple[int, ...] | None = None
    note: str = ""

    @classmethod
    def load(cls, name: str) -> "Scale":
        from .config import load_yaml

        # A scale is a name in config/scales/ or the path of your own scale file (*.yaml).
        path = Path(name) if name.endswith((".yaml", ".yml")) else SCALES_DIR / f"{name}.yaml"
        if name.endswith((".yaml", ".yml")) and not path.exists():
            raise ConfigError(f"scale file {name!r} does not exist")
        if not path.exists():
            valid = sorted(p.stem for p in SCALES_DIR.glob("*.yaml"))
            raise ConfigError(f"scale {name!r}: no file {path.name} in config/scales; valid scales: {', '.join(valid)}")
        d = schemas.check(load_yaml(path), "scale", str(name if name.endswith((".yaml", ".yml")) else f"config/scales/{path.name}"))
        if "seeds" in d and d["seeds"] is not None:
            d["seeds"] = tuple(int(s) for s in d["seeds"])
        return cls(name=path.stem, **d)


def _seed(value: Any, train_seed: int, where: str) -> int:
    if value == "same":
        return train_seed
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(f"{where}: must be a non-negative integer or 'same', got {value!r}")


def load_paper(paper: str, scale: Scale) -> list[PaperTable]:
    """Read config/papers/<paper>.yaml and expand every table at the given scale."""
    from .config import load_yaml

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
        out.append(_expand_table(paper, merged, scale, f"{where} ({t.get('id', '?')})"))
    return out


def _expand_table(paper: str, t: dict, scale: Scale, where: str) -> PaperTable:
    from .methods import method_from_dict
    from .noise import noise_spec_from_dict
    from .partition import partition_spec_from_dict
    from .tables import TableSpec

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
        cols.append({k: v for k, v in c.items() if k in ("label", "key", "note")})
    for j, r in enumerate(t["rows"]):
        rows.append({k: v for k, v in r.items() if k in ("label", "key", "note", "status")})
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
        },
    )
    dataset_options: dict[str, dict] = {}
    for j, c in enumerate(t["columns"]):
        cw = f"{where}.columns[{j}] ({c.get('label')})"
        real = c.get("dataset", t["dataset"])
        dataset = scale.datasets.get(real, real)
        if dataset == real:  # a stand-in is its own dataset: the real one's options do not apply
            opts = {**(t.get("dataset_options") or {}).get(real, {}), **(c.get("dataset_options") or {}).get(real, {})}
            if dataset_options.setdefault(real, opts) != opts:
                raise ConfigError(f"{cw}: dataset_options for {real!r} differ between the columns of one table")
        pdict = dict(c.get("partition", t["partition"]))
        if scale.num_clients is not None:
            pdict["num_clients"] = min(int(pdict.get("num_clients", scale.num_clients)), scale.num_clients)
        pspec = _wrap(f"{cw}.partition", partition_spec_from_dict, pdict)
        ndict = dict(c.get("noise", {"name": "clean"}))
        ndict.update(scale.noises.get(ndict.get("name"), {}))
        nspec = _wrap(f"{cw}.noise", noise_spec_from_dict, ndict)
        for k, r in enumerate(t["rows"]):
            if r.get("status", "implemented") != "implemented":
                continue
            rw = f"{where}.rows[{k}] ({r.get('label')})"
            tdict = {**t["training"], **c.get("training", {}), **r.get("training", {})}
            table_rounds = _wrap(f"{rw}.training", TrainSettings.from_dict, tdict).rounds
            training = _wrap(f"{rw}.training", TrainSettings.from_dict, {**tdict, **scale.training})
            mdict = dict(r["method"])
            # a column may set method hyper-parameters that depend on its dataset (FedNoRo's warm-up)
            mdict.update((c.get("methods") or {}).get(mdict.get("name"), {}))
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
                    )
                )
    reported = t.get("reported")
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
    )


def round_fields(cls) -> tuple[str, ...]:
    """Fields of a hyper-parameter dataclass that count rounds (metadata ``rounds: True``)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("rounds") is True)


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


__all__ = ["RunSpec", "PaperTable", "Scale", "load_paper", "train_slug", "RUN", "CHECKPOINT", "paths"]


# -- building a table from finished runs ------------------------------------------------------


def summarise_run(pt: PaperTable, tr: TableRun, metrics_df) -> list[dict]:
    """One value per table metric for one finished run (rounds limited to the method's reported stages)."""
    from dataclasses import replace

    from .methods import METHODS
    from .metrics import summarise

    stages = getattr(METHODS[tr.run.method.name], "reported_stages", None)
    out = []
    for name, mr in pt.metrics.items():
        rule = mr.rule if mr.rule.stages is not None or stages is None else replace(mr.rule, stages=tuple(stages))
        out.append({"row": tr.row, "column": tr.column, "metric": name, "seed": tr.run.seed,
                    "value": summarise(metrics_df, mr.source, rule)})
    return out


def build_table(pt: PaperTable, results: str, read_metrics) -> Any:
    """Render a table from its runs' metrics files; ``read_metrics(path) -> DataFrame``.

    Writes csv, md, html (reproduced beside reported, delta, tolerance flags,
    "n.i." rows) and a figure of the test-metric curves (one panel per column).
    """
    import pandas as pd

    from .tables import load_reported, render

    rows, curves = [], {}
    for tr in pt.runs:
        df = read_metrics(tr.run.files(results)["metrics"])
        rows += summarise_run(pt, tr, df)
        curves.setdefault(tr.column, {}).setdefault(tr.row, []).append(df.assign(seed=tr.run.seed))
    runs = pd.DataFrame(rows, columns=["row", "column", "metric", "seed", "value"])
    reported = load_reported(pt.reported) if pt.reported is not None else None
    rendered = render(pt.spec, runs, reported)
    out = pt.outputs(results)
    notes = comparison_notes(pt, runs)
    rendered.to_csv(out["csv"])
    _write_with_notes(rendered.markdown(), notes, out["md"], markdown=True)
    _write_with_notes(rendered.html(), notes, out["html"], markdown=False)
    source = next(iter(pt.metrics.values())).source if pt.metrics else "acc"
    plot_curve_grid({c: {r: pd.concat(v) for r, v in rows_.items()} for c, rows_ in curves.items()}, source, out["curves"],
                    title=f"{pt.paper} table {pt.table}: test {source} per round ({pt.scale} scale)")
    return rendered


def comparison_notes(pt: PaperTable, runs) -> list[str]:
    """Plain statements for the table's ``compare`` entries, true whatever the outcome.

    Each entry: {row: A, against: B, metric: name, columns: [...] (default all)}.
    """
    notes = []
    for c in pt.compare:
        metric, a, b = c["metric"], c["row"], c["against"]
        label = next((m.label for m in pt.spec.metrics if m.name == metric), metric)
        for col in c.get("columns") or [x.label for x in pt.spec.columns]:
            sel = runs[(runs.metric == metric) & (runs.column == col)]
            va = sel[sel.row == a].value.mean()
            vb = sel[sel.row == b].value.mean()
            if sel.empty or va != va or vb != vb:
                notes.append(f"{col}: {a} vs {b} ({label}) — not computed yet.")
                continue
            verdict = "beats" if va > vb else ("ties with" if va == vb else "does NOT beat")
            notes.append(f"{col}: {a} {verdict} {b} on {label} ({100 * va:.2f} vs {100 * vb:.2f}).")
    return notes


def _write_with_notes(text: str, notes: list[str], path: str, markdown: bool) -> None:
    from .io import atomic_path

    if notes:
        if markdown:
            text = text.rstrip("\n") + "\n\n**Observations**\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
        else:
            import html

            items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
            block = f'<div class="fnl-observations"><strong>Observations</strong><ul>{items}</ul></div>'
            text = text.replace("</body>", block + "</body>") if "</body>" in text else text + block
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def plot_curve_grid(curves: Mapping[str, Mapping[str, Any]], metric: str, path: str, title: str = "") -> None:
    """One panel per table column, one line (mean over seeds) per row."""
    import math

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .io import atomic_path
    from .tables.curves import curve_stats

    cols = list(curves)
    n = max(len(cols), 1)
    ncol = min(n, 3)
    nrow = math.ceil(n / ncol)
    fig = Figure(figsize=(4.2 * ncol, 3.2 * nrow), dpi=100)
    FigureCanvasAgg(fig)
    for i, col in enumerate(cols):
        ax = fig.add_subplot(nrow, ncol, i + 1)
        for row, df in curves[col].items():
            st = curve_stats(df, metric, f"{col}/{row}")
            ax.plot(st["round"], 100 * st["mean"], label=row, linewidth=1.3)
        ax.set_title(col, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(f"{metric} (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
