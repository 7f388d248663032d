"""One client's step as a method's one loss form sees it at K = 1 (what the sequential engine hands it),
for unit tests of a loss on hand-made batches."""

from __future__ import annotations

import torch

from fnlcore.fl.contract import Batch, LocalJob
from fnlcore.fl.one_client import OneClientBatch, one_client_batch


def one_step(ctx, model: torch.nn.Module, x: torch.Tensor, idx: torch.Tensor, k: int, *, nets: dict | None = None,
             job: LocalJob | None = None, step: int = 0, r: int = 0, raw: bool = False, views: dict | None = None,
             networks: tuple[str, ...] = ("model",), ends_epoch: bool = True) -> OneClientBatch:
    """Client ``k``'s batch ``x`` (sample ids ``idx``) on ``model``: the train view's logits, or for
    ``raw`` the uint8 batch as its one stream with the given ``views``."""
    b = Batch(model, nets if nets is not None else {"model": model}, x, idx, {"x": (x, idx)}, step, 0, r, k,
              job if job is not None else LocalJob(), views=views or {})
    return one_client_batch(ctx, b, (model,), networks, raw, ends_epoch)
