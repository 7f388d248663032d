"""Multi-label pieces several methods share: FedMLP's partial-label BCE and the per-client
class masks and positive weights (fedmlp.md §1, §6; baselines.md §14). Not a method."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def client_pos_weights(data) -> torch.Tensor:
    """(K, C) pos_weight_c = N_k / n_c^+ with n_c^+ the client's TRUE positives of class c (fedmlp.md §6).

    The true counts equal the observed ones on annotated classes; on missing classes every
    target is 0, so the weight has no effect there. A class without local positives gets 1
    (its weight multiplies only positive targets, of which there are none; N_k / 0 would
    turn the loss into NaN).
    """
    y = data.y_true.float()
    out = torch.ones(data.num_clients, data.num_classes, device=y.device)
    for k, idx in enumerate(data.clients):
        pos = y[idx.to(y.device, non_blocking=True)].sum(0)
        out[k] = torch.where(pos > 0, len(idx) / pos.clamp_min(1), torch.ones_like(pos))
    return out


def client_active_classes(data) -> torch.Tensor:
    """(K, C) 0/1 float: the classes each client annotates (FedMLP's A_k; fedmlp.md §1, §3).

    A class counts for client k when it is annotated on all of its samples (FedMLP's
    partial labels are per client); every class when the data has no ``active`` mask.
    """
    dev = data.given.device
    c = data.num_classes
    if data.active is None:
        return torch.ones(data.num_clients, c, device=dev)
    act = data.active.float()
    return torch.stack([
        act[idx.to(act.device)].amin(0) if len(idx) else torch.zeros(c, device=act.device) for idx in data.clients
    ]).to(dev)


def annotated_bce(method, sb, z: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """FedAvg-PL's loss of a step's K clients: :func:`partial_bce` of logits ``z`` (K, B, C) over each client's
    annotated classes (``method.active``); ``y`` the targets, default the step's given labels."""
    y = method.multi_label_targets(sb.idx.reshape(-1)).view(z.shape) if y is None else y
    return partial_bce(z, y, method.pos_weights()[sb.clients], method.ctx.settings.batch_size, sb.mask,
                       classes=method.active[sb.clients])


def partial_bce(logits: torch.Tensor, y: torch.Tensor, pos_weight: torch.Tensor | None, batch_size: int,
                mask: torch.Tensor | None = None, classes: torch.Tensor | None = None) -> torch.Tensor:
    """FedMLP's FedAvg / FedAvg-PL loss of K clients (fedmlp.md §6, baselines.md §14) -> (K,).

    Σ_i Σ_{c} BCEwithlogits_pw(z_ic, y_ic) / (B * C), or with ``classes`` (0/1 masks of each client's
    annotated classes, FedAvg-PL) the sum over those classes / (B * |A_k|); B = the nominal batch
    size (``batch_size``), also for a smaller last batch. (K, B, C) logits and targets, (K, C)
    pos_weight and class masks, (K, B) real rows (None: all); without the client axis ((B, C),
    (C,)) one batch's loss, a scalar.
    """
    pw = None if pos_weight is None else pos_weight[..., None, :]
    per = F.binary_cross_entropy_with_logits(logits.float(), y, pos_weight=pw, reduction="none")
    if classes is not None:
        per = per * classes[..., None, :]
    per = per.sum(-1)
    if mask is not None:
        per = torch.where(mask, per, torch.zeros_like(per))
    n = logits.shape[-1] if classes is None else classes.sum(-1).clamp_min(1)
    return per.sum(-1) / (batch_size * n)
