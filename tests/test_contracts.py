"""Contracts every registry entry and every paper YAML must meet, parametrised at collection time.

A method, noise model, partitioner or dataset is covered here the moment it is
registered, and a paper the moment its YAML lands in config/papers/: no test edit.

* methods: a run killed after round k and resumed from its checkpoint ends with the
  metrics (every column but the wall time) and the method state of an uninterrupted
  run; ``load_state_dict(state_dict())`` of the killed run round-trips (through ``torch.save``);
* slugs of every spec registry: injective over a generated set of specs (the defaults,
  then each field perturbed), stable (a pure function: rebuilt from ``to_dict`` gives
  the same slug) and filesystem-safe;
* papers: every reported line of every table lands in a cell, and every table expands
  at paper and smoke scale with runs for every implemented cell;
* config/smoke-all.yaml (the documented "every table at smoke scale" command) names
  every paper.

Specs are generated from the dataclass fields alone. Required fields get values by
type (floats increasing in field order, so that lower/upper bound pairs are ordered;
ints 3); a string the constructor rejects gets the first of the valid values its
ConfigError lists (the project's errors name the fix). Perturbed values are tried in
turn and kept when the constructor accepts them.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from fnlcore.assignment import ClientAssignment
from fnlcore.datasets import DATASETS
from fnlcore.errors import ConfigError, DataError
from fnlcore.app.papers import Scale, load_paper
from fnlcore.app.runs import PAPERS_DIR
from fnlcore.fl.settings import TrainSettings
from fnlcore.fl.persist import load_safely, to_safe_form
from fnlcore.fl.simulation import Simulation
from fnlcore.methods import METHODS, method_from_dict
from fnlcore.noise import NOISE_MODELS, noise_spec_from_dict
from fnlcore.partition import PARTITIONERS, partition_spec_from_dict
from fnlcore.tables import load_reported, place_reported

from .engine_helpers import make_ctx

REPO = Path(__file__).resolve().parents[1]
SAFE_SLUG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
SPEC_REGISTRIES = {
    "method": {name: cls.Params for name, cls in METHODS.items()},
    "noise model": dict(NOISE_MODELS),
    "partition": dict(PARTITIONERS),
}
FROM_DICT = {"method": method_from_dict, "noise model": noise_spec_from_dict, "partition": partition_spec_from_dict}
PAPERS = sorted(p.stem for p in PAPERS_DIR.glob("*.yaml"))


# -- generating specs from their dataclass fields ---------------------------------------------


def _options(message: str) -> list:
    """Valid values a ConfigError lists: "... one of ['a', 'b']" or "...; valid: a, b"."""
    m = re.search(r"\[([^\[\]]*)\]", message)
    if m:
        try:
            return list(ast.literal_eval("[" + m.group(1) + "]"))
        except (ValueError, SyntaxError):
            pass
    m = re.search(r"valid:\s*([^;\n]+)", message)
    return [v.strip().strip("'\"") for v in m.group(1).split(",")] if m else []


def _required(cls) -> list[dataclasses.Field]:
    return [
        f for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def _base_spec(cls):
    """An instance with every default and a valid value for each required field."""
    kw = {}
    for i, f in enumerate(_required(cls)):
        t = str(f.type)
        kw[f.name] = 0.2 + 0.15 * i if "float" in t else 3 if "int" in t else True if "bool" in t else "?"
    for _ in range(len(kw) + 1):
        try:
            return cls(**kw)
        except ConfigError as e:
            # a string field the constructor rejected: take the first value its error lists
            bad = [k for k, v in kw.items() if v == "?" and k in str(e)]
            opts = _options(str(e))
            if not bad or not opts:
                raise AssertionError(f"{cls.__name__}: cannot build an instance from its fields: {e}") from e
            kw[bad[0]] = opts[0]
    raise AssertionError(f"{cls.__name__}: cannot build an instance from its fields")


def _candidates(cls, spec, f: dataclasses.Field) -> list:
    """Other values to try for one field, most plausible first."""
    v = getattr(spec, f.name)
    t = str(f.type)
    if isinstance(v, bool):
        return [not v]
    out: list = []
    if v is None:
        out = [0.5, 0.25] if "float" in t else [3, 7]
    elif isinstance(v, float):
        out = [v * 0.5 if v else 0.1, v + 0.05, 0.15, v * 2 if v else 1.0]
    elif isinstance(v, int):
        out = [v + 1, v * 2, max(v - 1, 0), 1]
    else:  # strings and free-form values: the valid alternatives the error names
        try:
            dataclasses.replace(spec, **{f.name: "other_value"})
            out = ["other_value"]  # a free-form string (e.g. a model name)
        except ConfigError as e:
            out = _options(str(e))
        except (TypeError, ValueError):
            pass
    if "None" in t and v is not None:
        out.append(None)
    return [c for c in out if c != v or type(c) is not type(v)]


def _generated_specs(cls, per_field: int = 2) -> list:
    """The base spec plus, for each field, up to ``per_field`` accepted perturbations."""
    base = _base_spec(cls)
    specs = [base]
    for f in dataclasses.fields(cls):
        kept = 0
        for c in _candidates(cls, base, f):
            try:
                s = dataclasses.replace(base, **{f.name: c})
            except (ConfigError, TypeError, ValueError):
                continue
            if s.to_dict() != base.to_dict():
                specs.append(s)
                kept += 1
            if kept == per_field:
                break
    return specs


def _not_in_slug(f: dataclasses.Field) -> bool:
    """A field documented as not naming the artifact (e.g. a retry budget): equal slugs allowed."""
    return f.metadata.get("slug") is False or "not in the slug" in str(f.metadata.get("doc", ""))


REGISTRY_ENTRIES = [(kind, name) for kind, reg in SPEC_REGISTRIES.items() for name in reg]


@pytest.mark.parametrize("kind,name", REGISTRY_ENTRIES, ids=[f"{k.split()[0]}-{n}" for k, n in REGISTRY_ENTRIES])
def test_slugs_are_injective_stable_and_safe(kind, name):
    cls = SPEC_REGISTRIES[kind][name]
    specs = _generated_specs(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    # a field the generator could not change is not covered: say so instead of passing quietly
    changed = {k for s in specs[1:] for k, v in s.to_dict().items() if v != specs[0].to_dict()[k]}
    assert changed == set(fields), f"{name}: no valid perturbation found for {sorted(set(fields) - changed)}"
    by_slug: dict[str, object] = {}
    for s in specs:
        slug = s.slug()
        assert SAFE_SLUG.match(slug), f"{name}: slug {slug!r} is not filesystem-safe"
        assert slug == s.slug(), f"{name}: slug is not deterministic"
        rebuilt = FROM_DICT[kind](s.to_dict())
        assert rebuilt == s and rebuilt.slug() == slug, f"{name}: rebuilt from to_dict gives another slug"
        other = by_slug.setdefault(slug, s)
        differ = {k for k, v in s.to_dict().items() if v != other.to_dict()[k]}
        assert all(_not_in_slug(fields[k]) for k in differ), (
            f"{name}: {other.to_dict()} and {s.to_dict()} share the slug {slug!r}"
        )


def test_the_spec_generator_perturbs_a_field_it_is_given():
    """Guards the generator: a known required-field class gets a valid base and one spec per changed field."""
    from fnlcore.noise import FedGRNoise

    specs = _generated_specs(FedGRNoise, per_field=1)
    assert specs[0].noise_type in ("sym", "asym", "mixed") and specs[0].rho_min <= specs[0].rho_max
    assert len(specs) == 1 + len(dataclasses.fields(FedGRNoise))


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_dataset_names_are_filesystem_safe(name):
    assert SAFE_SLUG.match(name) and DATASETS[name].name == name


# -- noise models and partitioners: every registered entry runs and meets the invariants --------
# Like cleanlab's noise-generation tests, no model's numbers are asserted here (the per-model
# tests pin those against the official code): only what EVERY model must satisfy, checked on
# the specs the generator above makes (defaults, then each field perturbed) and several seeds,
# on digits-sized data (10 classes, a few hundred samples, a few clients and some samples in
# no client).

N_SAMPLES, N_CLASSES, N_CLIENTS = 360, 10, 6
CONTRACT_SEEDS = (0, 1, 7)


def _contract_data(multi_label: bool):
    """Labels (1-D, or (n, C) 0/1), soft labels and a partition leaving 12 samples in no client."""
    rs = np.random.RandomState(0)
    y = rs.randint(0, N_CLASSES, N_SAMPLES).astype(np.int64)
    if multi_label:
        y = (rs.rand(N_SAMPLES, N_CLASSES) < 0.3).astype(np.uint8)
    soft = rs.dirichlet(np.ones(N_CLASSES), size=N_SAMPLES)
    perm = rs.permutation(N_SAMPLES)[: N_SAMPLES - 12]
    assignment = ClientAssignment.from_lists(N_SAMPLES, [perm[k::N_CLIENTS] for k in range(N_CLIENTS)])
    return y, soft, assignment


def _runnable(spec, *args) -> bool:
    """False where the spec's dataset checks reject the contract data (e.g. a 100-class map)."""
    try:
        spec.check_dataset(*args)
        return True
    except ConfigError:
        return False


NOISE_ENTRIES = sorted(NOISE_MODELS)


@pytest.mark.parametrize("name", NOISE_ENTRIES)
def test_every_noise_model_runs_and_meets_the_invariants(name):
    cls = NOISE_MODELS[name]
    specs = _generated_specs(cls, per_field=1)
    ran = 0
    for multi in ((True, False) if name == "clean" else (cls.multi_label,)):
        y, soft, a = _contract_data(multi)
        outside = np.setdiff1d(np.arange(N_SAMPLES), np.concatenate(a.clients))
        for spec in specs:
            if not _runnable(spec, N_CLASSES, N_CLIENTS):
                continue
            sl = soft if spec.needs_soft_labels else None
            where = f"{spec.slug()} ({'multi' if multi else 'single'}-label)"
            for seed in CONTRACT_SEEDS:
                before = y.copy()
                r = spec.run(y, a, N_CLASSES, seed, sl)
                np.testing.assert_array_equal(y, before, err_msg=f"{where}: run changed its input labels")
                g = np.asarray(r.given)
                assert g.shape == y.shape and np.issubdtype(g.dtype, np.integer), f"{where}: given {g.shape} {g.dtype}"
                if multi:
                    assert set(np.unique(g)) <= {0, 1}, f"{where}: multi-label given outside {{0, 1}}"
                    changed = (g != y).any(axis=1)
                else:
                    assert g.min() >= 0 and g.max() < N_CLASSES, f"{where}: given labels out of [0, {N_CLASSES})"
                    changed = g != y
                np.testing.assert_array_equal(r.is_noisy, changed, err_msg=f"{where}: is_noisy != (given != true)")
                assert not r.is_noisy[outside].any(), f"{where}: a sample in no client was changed"
                assert len(r.client_noisy) == len(r.client_level) == len(r.client_type) == N_CLIENTS, where
                for k in np.flatnonzero(~r.client_noisy):
                    assert not r.is_noisy[a.clients[k]].any(), f"{where}: client {k} is not noisy but has changes"
                cheap = spec.noisy_clients(N_CLIENTS, seed)
                assert cheap is None or cheap == r.noisy_clients(), f"{where}: noisy_clients {cheap} != run's"
                again = spec.run(y, a, N_CLASSES, seed, sl)
                np.testing.assert_array_equal(again.given, g, err_msg=f"{where}: seed {seed} is not deterministic")
                assert set(spec.annotator_clients(N_CLIENTS, seed)) <= set(range(N_CLIENTS)), where
                ran += 1
    assert ran, f"{name}: no generated spec runs on {N_CLASSES}-class data; widen the contract data"


@pytest.mark.parametrize("name", NOISE_ENTRIES)
def test_every_noise_model_goes_through_the_shared_checks(name):
    """run() is NoiseSpec's template: the seed and soft-label checks hold for every model."""
    spec = _base_spec(NOISE_MODELS[name])
    y, soft, a = _contract_data(spec.multi_label)
    with pytest.raises(ConfigError, match="seed"):
        spec.run(y, a, N_CLASSES, -1, soft if spec.needs_soft_labels else None)
    with pytest.raises(DataError, match="soft_labels"):
        spec.run(y, a, N_CLASSES, 0, None if spec.needs_soft_labels else soft)
    slug = spec.annotator_slug()
    assert slug is None or SAFE_SLUG.match(slug), f"{name}: annotator slug {slug!r} is not filesystem-safe"
    assert slug is not None or not spec.annotator_clients(N_CLIENTS, 0), f"{name}: annotators without a slug"


PARTITION_ENTRIES = sorted(PARTITIONERS)


@pytest.mark.parametrize("name", PARTITION_ENTRIES)
def test_every_partitioner_runs_and_meets_the_invariants(name):
    cls = PARTITIONERS[name]
    y = np.random.RandomState(0).randint(0, N_CLASSES, N_SAMPLES).astype(np.int64)
    multi = (np.random.RandomState(1).rand(N_SAMPLES, N_CLASSES) < 0.3).astype(np.uint8)
    ran = 0
    for spec in _generated_specs(cls, per_field=5):  # every candidate: some defaults need more data (fedmlp_equal)
        for seed in CONTRACT_SEEDS:
            before = y.copy()
            try:
                a = spec.run(y, seed)
            except ConfigError:
                continue  # settings that do not fit this small data (e.g. 5,000 per client); the error says so
            where = f"{spec.slug()} seed {seed}"
            np.testing.assert_array_equal(y, before, err_msg=f"{where}: run changed its input labels")
            assert isinstance(a, ClientAssignment) and a.num_samples == N_SAMPLES, where
            if hasattr(spec, "num_clients"):
                assert a.num_clients == spec.num_clients, f"{where}: {a.num_clients} clients"
            idx = np.concatenate(a.clients)
            assert idx.size == 0 or (idx.min() >= 0 and idx.max() < N_SAMPLES), f"{where}: index out of range"
            assert np.unique(idx).size == idx.size, f"{where}: a sample is in two clients (or twice in one)"
            again = spec.run(y, seed)
            assert again.equals(a), f"{where}: not deterministic"
            if not spec.needs_labels():  # only n is used: a multi-label matrix of n rows gives the same split
                assert spec.run(multi, seed).equals(a), f"{where}: needs_labels() is False but the labels changed it"
            ran += 1
    assert ran >= len(CONTRACT_SEEDS), f"{name}: too few generated specs fit {N_SAMPLES} samples of {N_CLASSES} classes"


# -- methods: kill and resume, state round trip ------------------------------------------------

ROUNDS, KILL_AFTER = 4, 2
SETTINGS = TrainSettings(rounds=ROUNDS, local_epochs=1, batch_size=16, optimizer="adam", lr=3e-3, checkpoint_every=1)


def _round_fields(params_cls) -> list[str]:
    """Fields whose values are round numbers: marked ``rounds: True`` in their metadata.

    Until a registry marks any field, a field counts when its name ends in ``_rounds``.
    """
    fields = dataclasses.fields(params_cls)
    if any("rounds" in f.metadata for f in fields):
        return [f.name for f in fields if f.metadata.get("rounds")]
    return [f.name for f in fields if f.name.endswith("_rounds")]


# defaults that cannot fit the 4-client digits context (a ConfigError at construction names the fix)
CONTEXT_FIT = {"rscfed": {"group_size": 3}}  # the code's 6-client groups need >= 6 clients


def _fitting_params(name: str):
    """The method's defaults, round-valued fields shrunk to the middle of a short run if rejected."""
    params = _base_spec(METHODS[name].Params)
    if name in CONTEXT_FIT:
        params = dataclasses.replace(params, **CONTEXT_FIT[name])
    try:
        params.check_training(SETTINGS)
        return params
    except ConfigError:
        shrink = {k: ROUNDS // 2 for k in _round_fields(type(params)) if getattr(params, k) is not None}
        params = dataclasses.replace(params, **shrink)
        params.check_training(SETTINGS)  # still rejected: mark its round-valued fields
        return params


def _method_run(name, multi_label=None, **sim_kw):
    """A short run of ``name``; on the multi-label digits when it trains only on multi-label data."""
    if multi_label is None:
        multi_label = "single" not in METHODS[name].label_kinds
    ctx = make_ctx(SETTINGS, seed=0, multi_label=multi_label)
    method = METHODS[name](_fitting_params(name), ctx)
    log: list[str] = []
    return Simulation(method, ctx, progress=log.append, **sim_kw), method, log


def assert_same_state(a, b, where="state"):
    assert type(a) is type(b) or (np.isscalar(a) and np.isscalar(b)), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_same_state(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b)
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} vs {b!r}"


def test_state_comparison_sees_a_changed_tensor():
    with pytest.raises(AssertionError):
        assert_same_state({"g": {"w": torch.zeros(2)}}, {"g": {"w": torch.tensor([0.0, 1e-7])}})


# every method on its first label kind, and the methods of both kinds on multi-label data too
KILL_RESUME = [(n, None) for n in sorted(METHODS)] + [
    (n, True) for n in sorted(METHODS) if set(METHODS[n].label_kinds) == {"single", "multi"}
]


@pytest.mark.parametrize("name,multi", KILL_RESUME, ids=[n + ("-multi" if m else "") for n, m in KILL_RESUME])
def test_killed_and_resumed_run_equals_an_uninterrupted_one(tmp_path, name, multi):
    full_sim, full_method, _ = _method_run(name, multi)
    full = full_sim.run()
    # a method may add rounds before the shared training.rounds (FedCorr's pre-processing)
    assert len(full) == full_method.num_rounds() >= ROUNDS

    ckpt = tmp_path / "run.ckpt.pt"
    killed_sim, killed_method, _ = _method_run(name, multi, checkpoint_path=ckpt, stop_after=KILL_AFTER)
    assert len(killed_sim.run()) == KILL_AFTER and ckpt.exists()
    # load_state_dict(state_dict()) round-trips through torch.save, mid-schedule (after FedNoRo's warm-up)
    state = killed_method.state_dict()
    buf = io.BytesIO()
    torch.save(to_safe_form(state), buf)  # as a checkpoint stores it
    buf.seek(0)
    _, fresh, _ = _method_run(name, multi)
    fresh.load_state_dict(load_safely(buf))
    assert_same_state(fresh.state_dict(), state)
    resumed_sim, resumed_method, log = _method_run(name, multi, checkpoint_path=ckpt)
    out = resumed_sim.run()
    assert any(f"at round {KILL_AFTER}" in line for line in log), log  # it did resume, not restart

    cols = [c for c in full.columns if c != "seconds"]
    pd.testing.assert_frame_equal(out[cols], full[cols], check_exact=True)
    assert_same_state(resumed_method.state_dict(), full_method.state_dict())
    assert torch.equal(resumed_sim.ctx.data.given, full_sim.ctx.data.given)
    pd.testing.assert_frame_equal(resumed_sim.ctx.data.relabels.frame(), full_sim.ctx.data.relabels.frame())


# -- papers: reported numbers placed, tables expand ----------------------------------------------


def _tables(paper: str, scale: str):
    return load_paper(paper, Scale.load(scale))


@pytest.mark.parametrize("paper", PAPERS)
def test_every_reported_line_is_placed_in_its_table(paper):
    for t in _tables(paper, "paper"):
        if t.reported is None:
            continue
        assert t.reported.is_file(), f"{t.name}: reported file {t.reported} is missing"
        reported = load_reported(t.reported)
        cells, unmatched = place_reported(t.spec, reported)  # two lines for one cell raise
        assert unmatched.empty, f"{t.name}: reported lines match no cell:\n{unmatched.to_string()}"
        assert len(cells) == len(reported)
        metrics = {m.reported_key for m in t.spec.metrics}
        assert set(reported["metric"].astype(str)) <= metrics


@pytest.mark.parametrize("scale", ["paper", "smoke"])
@pytest.mark.parametrize("paper", PAPERS)
def test_every_implemented_cell_has_runs(paper, scale):
    from fnlcore.app.plan import build_plan, validate_schema

    tables = _tables(paper, scale)
    assert tables, f"{paper}: no tables"
    for t in tables:
        implemented = [r.label for r in t.spec.rows if r.status == "implemented"]
        got = pd.Series([(tr.row, tr.column) for tr in t.runs], dtype=object).value_counts()
        for row in implemented:
            for col in t.spec.columns:
                if col.average_of:  # derived when rendered, runs nothing
                    assert got.get((row, col.label), 0) == 0, (t.name, row, col.label)
                    continue
                assert got.get((row, col.label), 0) == t.spec.expected_seeds > 0, (t.name, row, col.label)
    # the plan's checks too: the datasets exist at this scale and fit the partitions and noises
    with open(REPO / "config" / "config.yaml") as fh:
        config = yaml.safe_load(fh)
    config.update(tables=[paper], scale=scale, data_grid=[])
    plan = build_plan(validate_schema(config))
    assert len(plan.runs()) > 0


def test_smoke_all_config_names_every_paper():
    with open(REPO / "config" / "smoke-all.yaml") as fh:
        config = yaml.safe_load(fh)
    assert config["scale"] == "smoke" and config["data_grid"] == []
    missing = [p for p in PAPERS if p not in config["tables"]]
    assert missing == [], (
        ", ".join(f"config/papers/{p}.yaml" for p in missing) + " is not in config/smoke-all.yaml: add "
        + ", ".join(missing) + " to the `tables:` list of config/smoke-all.yaml")
    assert sorted(config["tables"]) == PAPERS, "config/smoke-all.yaml names a paper that config/papers/ lacks"
