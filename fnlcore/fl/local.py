"""Batched prediction and test evaluation, shared by the engine and the methods' detection passes.

The training loop is the engine's (:mod:`fnlcore.fl.client`)."""

from __future__ import annotations

import torch

from .context import RunContext

@torch.no_grad()
def predict(
    ctx: RunContext,
    model: torch.nn.Module,
    source,
    idx: torch.Tensor | None = None,
    augment: bool = False,
    batch_size: int | None = None,
    drawn: list[tuple] | None = None,
) -> torch.Tensor:
    """Logits for samples ``idx`` of ``source`` (default: all), in that order, model in eval mode.

    ``augment=True`` reproduces reference codes that run detection passes on
    the *training* dataset object, i.e. with training augmentation active; ``drawn``: its
    augmentation parameters drawn ahead (:func:`draw_predict`), else drawn here.
    """
    model.eval()
    order = torch.arange(len(source)) if idx is None else idx
    bs = batch_size or ctx.settings.eval_batch_size
    outs = []
    amp = ctx.autocast()
    for i, (xb, _) in enumerate(source.batches(order, bs)):
        if not augment:
            x = ctx.pipeline.eval(xb)
        elif drawn is not None:
            x = ctx.pipeline.apply_train(xb, drawn[i])
        else:
            x = ctx.pipeline.train(xb, ctx.aug_gen)
        with amp:
            outs.append(model(x).float())
    return torch.cat(outs) if outs else torch.zeros(0, ctx.data.num_classes, device=ctx.device)


def draw_predict(ctx: RunContext, n: int, batch_size: int | None = None) -> list[tuple]:
    """The augmentation parameters ``predict(..., augment=True)`` draws for ``n`` training samples,
    in its order: a stage's ``reserve`` makes them where the sequential engine's upload would."""
    bs = batch_size or ctx.settings.eval_batch_size
    size = tuple(ctx.data.train.images.shape[-2:])
    return [ctx.pipeline.draw_train(min(bs, n - at), ctx.aug_gen, ctx.device, size) for at in range(0, n, bs)]


def evaluate(ctx: RunContext, model: torch.nn.Module) -> dict[str, float]:
    """Test metrics of ``model`` (raw logits: no logit adjustment at inference)."""
    from .. import metrics

    logits = predict(ctx, model, ctx.data.test)
    y = ctx.data.y_test.cpu().numpy()
    if ctx.data.multi_label:
        return metrics.evaluate_multi_label(y, torch.sigmoid(logits).cpu().numpy())
    return metrics.evaluate_single_label(y, logits.cpu().numpy())
