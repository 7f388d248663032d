"""One training run from artifacts to outputs: what the workflow's train rule calls."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from ..io import atomic_path, write_parquet
from .context import RunContext, resolve_model_name
from .data import FederatedData, load_federated_data
from .pipeline import make_pipeline
from .settings import TrainSettings, auto_augmentation, auto_normalize
from .simulation import Simulation


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


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
    pipeline = make_pipeline(norm, aug, channels, dataset_name, sample)
    torch.manual_seed(seed)  # model initialisation
    return RunContext(settings, data, pipeline, device, model_name, tuple(image_size), channels, seed, log=log)


def train_run(
    data_dir: str,
    noise_parquet: str,
    num_clients: int,
    settings: TrainSettings,
    method_params,
    seed: int,
    device: str,
    metrics_path: str,
    clients_path: str,
    model_path: str,
    checkpoint_path: str,
    progress=None,
    stop_after: int | None = None,
) -> pd.DataFrame:
    """Train one (dataset, partition, noise, method, seed) run; resumable through ``checkpoint_path``."""
    from ..datasets import load_prepared
    from ..methods import METHODS

    dev = resolve_device(device)
    ds = load_prepared(data_dir)
    data = load_federated_data(data_dir, noise_parquet, num_clients, dev)
    log = progress or print
    ctx = build_context(data, ds.info.name, ds.info.image_size, ds.info.channels, settings, seed, dev, log=log)
    method = METHODS[method_params.name](method_params, ctx)
    sim = Simulation(method, ctx, checkpoint_path, progress=progress, stop_after=stop_after)
    metrics = sim.run()
    if len(metrics) < method.num_rounds():
        return metrics  # stopped early on purpose (tests)
    write_parquet(metrics, metrics_path)
    clients = method.client_results()
    write_parquet(clients if clients is not None else pd.DataFrame({"client": pd.Series(dtype="int64")}), clients_path)
    with atomic_path(model_path, suffix=".pt") as tmp:
        torch.save({"state_dict": method.eval_model().state_dict(), "model": ctx.model_name, "method": method_params.to_dict()}, tmp)
    sim.remove_checkpoint()  # outputs are complete; the checkpoint is no longer needed
    return metrics
