"""One training job from artifacts to outputs (what the workflow's train rule calls):
read the prepared data and noisy labels, build the engine's context, run the method.

A failure that a retry cannot fix (a configuration error, a corrupt input, a shape error)
is recorded beside the checkpoint, so the workflow's next attempt of the same job fails at
once instead of running again (:func:`run_attempt`). A workflow retries a failed job
(``retries:`` in Snakemake): right for a node that died or a job pre-empted, wasted for a
failure that repeats on every attempt (:func:`fnlcore.errors.retry_cannot_fix`), which would
fill the log with the same traceback three times. A later attempt of the same job
(``attempt > 1``: a retry within one workflow invocation) sees the marker and fails at once
with the same message; a new invocation (``attempt == 1``: the user fixed something and
reran) removes the marker and runs.

Given ``time_budget_s`` (the seconds the job may run, counted from the call), a run that would
pass it stops after a round with a checkpoint and raises :class:`~fnlcore.errors.RunIncomplete`,
writing no output; :func:`train_job` turns that into the exit status
:data:`~fnlcore.errors.EXIT_CONTINUE` (75), and the next job of the run continues it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
import json

import numpy as np
import pandas as pd
import torch

from ..errors import EXIT_CONTINUE, NotRetried, RunIncomplete, retry_cannot_fix
from ..fl.context import RunContext, check_device, resolve_device, resolve_model_name
from ..fl.data import FederatedData, ImageSource
from ..fl.pipeline import make_pipeline
from ..image_transforms import image_loading
from ..fl.settings import TrainSettings
from ..fl.simulation import Simulation
from ..fl.time_budget import TimeBudget
from ..io import atomic_path, write_json, write_parquet
from ..provenance import MADE_BY_KEY, file_digest, made_by
from .results_lock import results_holder
from ..datasets import DATASETS, load_prepared
from ..datasets.decoded_cache import cache_geometries, find_decoded_cache
from ..logs import job_log
from ..methods import METHODS
from ..noise import read_noise

T = TypeVar("T")


def auto_augmentation(dataset: str, image_size: tuple[int, int]) -> str:
    """The papers' training augmentation for a dataset (fedcorr.md §1, fednoro.md §1, fedncl.md §4):
    the dataset's own (``DatasetInfo.augmentation``: CIFAR's crop+flip), else by size."""

    info = DATASETS.get(dataset)
    if info is not None and info.augmentation:
        return info.augmentation
    if image_size[0] > 32:
        return "affine_flip"
    return "none"


def auto_normalize(channels: int, pretrained: bool) -> str:
    return "imagenet" if channels == 3 else "data"


def run_journal(checkpoint_path: str | os.PathLike) -> Path:
    """The lines of every job of one run, beside its checkpoint (:func:`fnlcore.logs.job_log`):
    a run continued over several jobs keeps one log. Removed with the checkpoint when the run ends."""
    return Path(str(checkpoint_path) + ".log")


def train_job_log(log_path: str | os.PathLike, checkpoint_path: str | os.PathLike, attempt: int,
                  tag: str | None = None):
    """:func:`fnlcore.logs.job_log` of one training job: the run continues (its log starts with the
    earlier jobs' lines) when this is a retry (``attempt`` > 1) or a checkpoint is there to resume."""

    return job_log(log_path, tag=tag, journal=run_journal(checkpoint_path),
                   continued=attempt > 1 or Path(checkpoint_path).exists())


def load_federated_data(
    data_dir: str, noise_parquet: str, num_clients: int, device: torch.device, workers: int = 4,
    image_transform: str = "resize",
) -> FederatedData:
    """Assemble a run's data from the prepared dataset and a noisy-label artifact.

    ``image_transform`` (training.image_transform): how images streamed from files are resized
    and cut per split (fnlcore.image_transforms.image_loading); in-memory sets are stored at size."""

    ds = load_prepared(data_dir)
    info = ds.info
    y_true = ds.labels("train")
    n = len(y_true)
    table = read_noise(noise_parquet)
    assignment = table.assignment(n, num_clients)
    given = table.given_by_sample(n)
    unassigned = assignment.client_of() < 0
    given = np.where(unassigned if given.ndim == 1 else unassigned[:, None], y_true, given)
    if info.in_memory:
        train = ImageSource(device, images=ds.images("train"))
        test = ImageSource(device, images=ds.images("test"))
    else:
        # each split's loading (image_transform's sizes) is the geometry its decoded cache is named by
        geometry = cache_geometries(info.channels, info.image_size, image_transform)
        paths = {split: [str(p) for p in ds.paths(split)] for split in ("train", "test")}
        # each split's decoded cache where one was built (rules/cache.smk): the same pixels, no decoding
        cache = {split: find_decoded_cache(data_dir, split, paths[split], geometry[split]) for split in paths}
        train = ImageSource(device, paths=paths["train"], image_size=geometry["train"].size, channels=info.channels,
                            workers=workers, cache=cache["train"])
        test = ImageSource(device, paths=paths["test"], image_size=geometry["test"].size, channels=info.channels,
                           workers=workers, short_side=geometry["test"].short_side, cache=cache["test"])
    as_t = (lambda a: torch.as_tensor(a, dtype=torch.float32, device=device)) if info.multi_label else (
        lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64), device=device)
    )
    active = None
    if table.active is not None:
        active = np.ones((n, info.num_classes), dtype=np.float32)
        active[table.sample_id] = table.active
    return FederatedData(
        train=train,
        test=test,
        y_true=as_t(y_true),
        given=as_t(given),
        y_test=as_t(ds.labels("test")),
        clients=[torch.as_tensor(np.array(c, dtype=np.int64)) for c in assignment.clients],  # a writable copy
        num_classes=info.num_classes,
        multi_label=info.multi_label,
        active=None if active is None else torch.as_tensor(active, device=device),
        class_names=tuple(info.class_names),
    )


def build_context(
    data: FederatedData,
    dataset_name: str,
    image_size: tuple[int, int],
    channels: int,
    settings: TrainSettings,
    seed: int,
    device: torch.device,
    log=print,
) -> RunContext:
    model_name = resolve_model_name(settings.model, channels, tuple(image_size))
    aug = auto_augmentation(dataset_name, tuple(image_size)) if settings.augmentation == "auto" else settings.augmentation
    norm = auto_normalize(channels, settings.pretrained) if settings.normalize == "auto" else settings.normalize
    sample = data.train.images if data.train.in_memory else None
    loading = None if data.train.in_memory else image_loading(settings.image_transform, tuple(image_size))
    pipeline = make_pipeline(norm, aug, channels, dataset_name, sample, loading)
    torch.manual_seed(seed)  # model initialisation
    return RunContext(settings, data, pipeline, device, model_name, tuple(image_size), channels, seed, log=log)


@dataclass(frozen=True)
class RunSpec:
    """One training run, as the workflow's train rule hands it to the engine: its inputs (the
    prepared dataset's folder, the noisy labels, the number of clients), what trains (settings,
    method parameters, seed, device) and where its outputs and checkpoint go."""

    data_dir: str
    noise_parquet: str
    num_clients: int
    settings: TrainSettings
    method: object  # a registered method's MethodParams
    seed: int
    metrics: str
    clients: str
    model: str
    checkpoint: str
    relabels: str | None = None
    device: str = "auto"
    results_dir: str | None = None  # the workflow's results folder (its lock tells whether it still runs)


# -- a job's attempts: a failure a retry cannot fix is not retried (the module's docstring) --

def failure_marker(checkpoint_path: str | os.PathLike) -> Path:
    """Where a job records a failure a retry cannot fix: beside its checkpoint (not a workflow output)."""
    return Path(str(checkpoint_path) + ".failed.json")


def run_attempt(marker: str | os.PathLike, attempt: int, body: Callable[[], T]) -> T:
    """``body()``, unless an earlier attempt (``attempt > 1``) left ``marker``: then fail at once."""
    marker = Path(marker)
    if attempt > 1 and marker.exists():
        raise NotRetried(
            f"not retried: the previous attempt failed for a reason a retry cannot fix ({_recorded(marker)}); "
            "fix it and rerun the workflow"
        )
    with contextlib.suppress(FileNotFoundError):
        os.remove(marker)
    try:
        return body()
    except Exception as err:
        if retry_cannot_fix(err) and not isinstance(err, NotRetried):
            write_json({"error": type(err).__name__, "message": str(err)}, marker)
        raise


def _recorded(marker: Path) -> str:
    try:
        rec = json.loads(marker.read_text())
        return f"{rec['error']}: {rec['message']}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"see {marker}"


def train_run(spec: RunSpec, progress=None, stop_after: int | None = None, attempt: int = 1,
              time_budget_s: float | None = None) -> pd.DataFrame:
    """Train one (dataset, partition, noise, method, seed) run; resumable through ``spec.checkpoint``.

    ``attempt``: the workflow's attempt number of this job; a later attempt after a failure that a
    retry cannot fix fails at once (:func:`run_attempt`).
    ``time_budget_s``: seconds this job may run from now (loading the data included); the run
    stops before it with a checkpoint and raises RunIncomplete (the module's docstring)."""
    budget = None if time_budget_s is None else TimeBudget(time_budget_s)
    return run_attempt(failure_marker(spec.checkpoint), attempt, lambda: _train(spec, progress, stop_after, budget))


def train_job(spec: RunSpec, progress=None, attempt: int = 1, time_budget_s: float | None = None) -> int:
    """:func:`train_run` as a job of the workflow: its exit status. 0: the run's outputs are written;
    EXIT_CONTINUE: stopped before the time limit with a checkpoint, the next job continues.
    A failure raises, as from train_run."""
    try:
        train_run(spec, progress=progress, attempt=attempt, time_budget_s=time_budget_s)
    except RunIncomplete as stop:
        (progress or print)(str(stop))
        return EXIT_CONTINUE
    return 0


def write_metrics(metrics: pd.DataFrame, path: str | os.PathLike) -> None:
    """A run's metrics as :func:`fnlcore.io.write_parquet` writes them, with the code version that
    made the run in the file's schema metadata (fnlcore.provenance.recorded_made_by reads it): the
    metrics are the run's completion mark, so the record is there exactly when the run is."""

    write_parquet(metrics, path, metadata={MADE_BY_KEY: json.dumps(made_by(), sort_keys=True).encode()})


def _orphaned(results_dir: str | None, started_under: str | None) -> bool:
    """True when the workflow that held the results folder as this job started (its lock's holder
    line) no longer holds it: its Snakemake was killed and this job outlived it."""
    return started_under is not None and results_holder(results_dir) != started_under


def _train(spec: RunSpec, progress, stop_after, budget=None) -> pd.DataFrame:
    check_device(spec.device)  # a config error (not retried), not PyTorch's message
    dev = resolve_device(spec.device)
    started_under = results_holder(spec.results_dir) if spec.results_dir else None  # the workflow running it
    settings = spec.settings
    ds = load_prepared(spec.data_dir)
    data = load_federated_data(spec.data_dir, spec.noise_parquet, spec.num_clients, dev,
                               image_transform=settings.image_transform)
    log = progress or print
    ctx = build_context(data, ds.info.name, ds.info.image_size, ds.info.channels, settings, spec.seed, dev, log=log)
    method = METHODS[spec.method.name](spec.method, ctx)
    # what the engine cannot see makes the run too: a checkpoint of other noisy labels is not resumed
    identity = {"dataset": ds.info.name, "noisy_labels": file_digest(spec.noise_parquet),
                "num_clients": int(spec.num_clients)}
    sim = Simulation(method, ctx, spec.checkpoint, progress=progress, stop_after=stop_after, identity=identity,
                     time_budget=budget)
    engine = sim.engine.describe()
    log(f"engine: {engine} on {dev}")
    metrics = sim.run()
    if len(metrics) < method.num_rounds():
        return metrics  # stopped early on purpose (tests)
    write_metrics(metrics, spec.metrics)
    clients = method.client_results()
    write_parquet(clients if clients is not None else pd.DataFrame({"client": pd.Series(dtype="int64")}), spec.clients)
    if spec.relabels is not None:  # every label the method changed: sample, client, round, stage, from, to
        write_parquet(data.relabels.frame(), spec.relabels)
    with atomic_path(spec.model, suffix=".pt") as tmp:
        torch.save({"state_dict": method.eval_model().state_dict(), "model": ctx.model_name,
                    "method": spec.method.to_dict()}, tmp)
    if _orphaned(spec.results_dir, started_under):
        # Its Snakemake was killed while it ran, leaving the outputs marked incomplete: the next
        # workflow runs this job again. The final checkpoint stays, so that job resumes at the last
        # round and writes the same outputs in seconds instead of training the run again.
        log(f"the workflow that started this job no longer runs; checkpoint {spec.checkpoint} kept: "
            "the next workflow reruns this job (its Snakemake marked it incomplete), which rewrites these "
            "outputs from it without training")
        return metrics
    sim.remove_checkpoint()  # outputs are complete; the checkpoint is no longer needed
    run_journal(spec.checkpoint).unlink(missing_ok=True)  # its lines are in this job's log
    return metrics
