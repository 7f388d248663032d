"""The identity of a workflow job's settings: a digest of them with every default filled in.

A Snakemake param of each rule whose output depends on settings (rules/*.smk): Snakemake
records a job's params and reruns it when they change, but it records only plain values (a
spec object is dropped unseen), and a path holds only the non-default settings, so without
it a changed default in the code reran nothing. It lives in the app layer because it reads
the workflow's dataset settings and the registries; fnlcore.provenance keeps the low-level
digests that the engine uses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Iterable, Mapping

from ..provenance import _plain, _stable_str
from ..datasets import DATASETS
from ..fl.settings import TrainSettings
from ..spec import Spec
from .plan import DatasetSettings

# -- the identity of a workflow job's settings ----------------------------------------------

# Fields that never change a result, left out of an identity as out of the artifact's path: the
# training's checkpoint cadence (fnlcore.app.runs.train_slug, fnlcore.fl.simulation) and, of a
# spec, every field declared ``param(..., slug=False)``; of a dataset's options, the switch of
# the decoded cache (train jobs read it, not the preparation) and whether downloaded archives
# are kept after extraction.
_TRAINING_NOT_IDENTITY = ("checkpoint_every",)
# Training fields added after runs existed, with the value they had before: in the identity only at
# another value, so adding one reruns no job (a later change of its default moves the identity).
_TRAINING_IF_SET = {"cuda_graphs": False}
_DATASET_OPTIONS_NOT_IDENTITY = ("decoded_cache", "keep_archives")
# What a registered dataset declares that its prepared files depend on (not, e.g., its sizes
# for cost estimates or the augmentation training takes for 'auto').
_DATASET_INFO_IDENTITY = ("num_classes", "class_names", "multi_label", "channels", "image_size")


def settings_identity(*settings: Any) -> str:
    """``settings sha256:<16 hex>`` of the canonical JSON of ``settings`` resolved by
    :func:`resolved_settings` (Snakemake prints it before and now when it reruns a job for it).

    A workflow rule passes it as a param, so a job reruns exactly when the settings it runs
    with change: in the config, or as a default in the code (the path holds only the
    non-default ones). Equal settings, given or left to their defaults, give equal identities."""
    text = json.dumps([resolved_settings(s) for s in settings], sort_keys=True, separators=(",", ":"),
                      default=_stable_str)
    return "settings sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def resolved_settings(value: Any) -> Any:
    """``value`` as plain JSON with every default filled in, less the fields that never change a result.

    A spec (method, partitioner, noise model): its kind, name and every field but those declared
    ``slug=False``; training settings: every field but ``checkpoint_every``; a dataset's settings
    (fnlcore.app.plan.DatasetSettings): its options over the dataset's defaults and what its
    registry entry declares of the data (not where its raw files lie, nor ``decoded_cache``);
    another dataclass: every field; mappings and sequences item by item."""

    if isinstance(value, DatasetSettings):
        return _dataset_identity(value)
    if isinstance(value, Spec):
        keep = [f for f in dataclasses.fields(value) if f.metadata.get("slug", True)]
        return {"kind": value.kind, "name": value.name, **_fields(value, keep)}
    if isinstance(value, TrainSettings):
        keep = [f for f in dataclasses.fields(value) if f.name not in _TRAINING_NOT_IDENTITY
                and not (f.name in _TRAINING_IF_SET and getattr(value, f.name) == _TRAINING_IF_SET[f.name])]
        return {"kind": "training", **_fields(value, keep)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"kind": type(value).__name__, **_fields(value, dataclasses.fields(value))}
    if isinstance(value, Mapping):
        return {str(k): resolved_settings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [resolved_settings(v) for v in value]
    return _plain(value)


def train_identity(training: Any, method: Any, dataset: str) -> str:
    """The identity of a training job: its training settings and method, and what an ``auto``
    augmentation resolves to from the dataset's registry entry (fnlcore.app.train.auto_augmentation)."""

    extra = {}
    if getattr(training, "augmentation", None) == "auto" and dataset in DATASETS:
        extra = {"dataset_augmentation": DATASETS[dataset].augmentation}
    return settings_identity(training, method, extra)


def annotator_identity(settings: Any, dataset: str) -> str:
    """The identity of one of ``dataset``'s H-IDN annotators: its settings (fnlcore.app.annotate.AnnotatorSettings)
    and every resolved training setting it trains with, digested as a run's are."""
    # lazy: imports torch; fnlcore.app.identity imports without it (envs/labels.yaml)
    from .annotate import annotator_training

    return settings_identity(settings, annotator_training(settings, *_geometry(dataset)))


def noise_identity(spec: Any, dataset: str) -> str:
    """The identity of a noise set: its spec and, for a model that draws from annotator networks
    (H-IDN), every resolved setting they train with, as in :func:`annotator_identity`."""
    if spec.annotator_slug() is None:
        return settings_identity(spec)
    # lazy: imports torch; fnlcore.app.identity imports without it (envs/labels.yaml)
    from .annotate import AnnotatorSettings, annotator_training

    settings = AnnotatorSettings.from_noise_spec(spec)
    return settings_identity(spec, annotator_training(settings, *_geometry(dataset)))


def _geometry(dataset: str) -> tuple[tuple[int, int], int]:
    """(image size, channels) of a registered dataset: what picks an annotator's network and pipeline."""

    try:
        info = DATASETS[dataset]
    except KeyError:
        raise ValueError(f"dataset {dataset!r} is not registered; registered: {sorted(DATASETS)}") from None
    return tuple(info.image_size), int(info.channels)


def _fields(obj: Any, fields: Iterable[dataclasses.Field]) -> dict[str, Any]:
    # an int given for a float field (lr: 1) is the same setting as its float
    out = {}
    for f in fields:
        v = getattr(obj, f.name)
        if isinstance(f.default, float) and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        out[f.name] = resolved_settings(v)
    return out


def _dataset_identity(settings: Any) -> dict:
    info = DATASETS.get(settings.name)
    given = {k: v for k, v in dict(settings.options).items() if k not in _DATASET_OPTIONS_NOT_IDENTITY}
    defaults = {k: v for k, v in dataset_option_defaults(info).items() if k not in _DATASET_OPTIONS_NOT_IDENTITY}
    options = {**defaults, **given}
    for k, v in options.items():
        if isinstance(defaults.get(k), float) and isinstance(v, int) and not isinstance(v, bool):
            options[k] = float(v)
    declared = {k: _plain(getattr(info, k)) for k in _DATASET_INFO_IDENTITY} if info is not None else {}
    return {"kind": "dataset", "name": settings.name, "options": resolved_settings(options), "info": declared}


def dataset_option_defaults(info: Any) -> dict[str, Any]:
    """A registered dataset's option defaults, found where its module keeps them: the options
    dataclass its ``prepare`` step parses (``parse_options(..., IsicOptions, ...)``), else the
    module's ``OPTIONS`` mapping (``validate_options(..., OPTIONS)``); {} where neither is found
    (then the identity holds the options as given)."""
    prepare = getattr(info, "prepare", None)
    glob = getattr(prepare, "__globals__", None)
    if glob is None:
        return {}
    for name in getattr(getattr(prepare, "__code__", None), "co_names", ()):
        cls = glob.get(name)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and name.endswith("Options"):
            try:
                return dataclasses.asdict(cls())
            except TypeError:  # a required option: no default to fill
                break
    options = glob.get("OPTIONS")
    return dict(options) if isinstance(options, Mapping) else {}
