"""FedFixMatch (FixMatch on FedAvg) as FedMLP adapts it to partial labels (baselines.md §16, fedmlp.md §6).

Per batch, a weak view v_w and a strong view v_s (weak + RandAugment + Cutout, ``ctx.pipeline``):
- L_sup: FedAvg-PL's loss on the weak-view logits (BCE-with-logits, pos_weight N_k / n_c^+, the
  annotated classes A_k, sum / (B |A_k|), B nominal);
- confident set I: samples whose weak-view probabilities are > ``upper`` or < ``lower`` for EVERY
  missing class; hard pseudo-labels 1[sigma(z_w) > 0.5] (no gradient);
- L_u = sum_{i in I} sum_{c in M_k} BCE(z_s,ic, y^_ic) / (|I| |M_k|);
- L = L_sup + lambda_u L_u (L_sup alone when I or M_k is empty).

Switch (baselines.md §16 [AMBIG]): ``unsup_pos_weight`` 'none' (recommended: unweighted L_u) |
'client_index' (code: pos_weight N_k / n_k^+ on the class whose index equals the client id, 1
elsewhere; never a missing class in the one-class-per-client setting, where both agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .api import FLMethod, LocalJob, MethodParams, param, Phase, METHODS, StackedBatch, Stage
from .multilabel import annotated_bce


@dataclass(frozen=True)
class FedFixMatchParams(MethodParams):
    name = "fedfixmatch"
    lambda_u: float = param(1.0, ge=0, doc="weight of the unsupervised loss")
    upper: float = param(0.8, ge=0.5, le=1, doc="a missing-class probability above this is confident")
    lower: float = param(0.2, ge=0, le=0.5, doc="a missing-class probability below this is confident")
    unsup_pos_weight: str = param("none", choices=("none", "client_index"),
                                  switch="'none' (baselines.md §16 recommendation: unweighted L_u) | 'client_index' "
                                         "(code: pos_weight N_k/n_k^+ on class index = client id)")


def confident_pseudo_labels(p_weak: torch.Tensor, missing: torch.Tensor, upper: float, lower: float):
    """K clients' (confident sample mask (K, B), hard labels (K, B, C)) from weak-view probabilities
    (K, B, C) and missing classes (K, C): confident on every missing class; 1[p > 0.5]."""
    return ((p_weak > upper) | (p_weak < lower) | ~missing.bool()[:, None, :]).all(2), (p_weak > 0.5).float()


def unsupervised_loss(z_strong: torch.Tensor, hard: torch.Tensor, confident: torch.Tensor,
                      missing: torch.Tensor, pos_weight: torch.Tensor | None = None) -> torch.Tensor:
    """sum_{i in I} sum_{c in M_k} BCE(z_s, y^) / (|I| |M_k|) of K clients: z, hard (K, B, C),
    confident (K, B) (real rows only), missing and pos_weight (K, C) -> (K,); 0 for a client whose
    I or M_k is empty."""
    n = confident.sum(1) * missing.sum(1)
    pw = None if pos_weight is None else pos_weight[:, None, :]
    per = F.binary_cross_entropy_with_logits(z_strong.float(), hard, pos_weight=pw, reduction="none")
    total = (per * confident.float()[:, :, None] * missing[:, None, :]).sum((1, 2))
    return torch.where(n > 0, total / n.clamp_min(1), torch.zeros_like(total))


@METHODS.register
class FedFixMatch(FLMethod):
    Params = FedFixMatchParams
    paper = "Sohn et al. 2020 (FixMatch) on FedAvg; baseline in FedMLP (MICCAI'24)"
    label_kinds = ("multi",)

    def __init__(self, params: FedFixMatchParams, ctx):
        super().__init__(params, ctx)
        self._tally: torch.Tensor | None = None  # a chunk's (K, 2) confident and seen counts
        self._upw: torch.Tensor | None = None  # a chunk's (K, C) unsupervised pos weights (None: none)

    def _unsup_pos_weight(self, k: int) -> torch.Tensor | None:
        if self.params.unsup_pos_weight == "none" or k >= self.ctx.data.num_classes:
            return None
        w = torch.ones(self.ctx.data.num_classes, device=self.ctx.device)
        w[k] = self.pos_weights()[k, k]
        return w

    def prepare(self, r, k, nets):
        # raw batches: a weak and a strong view, declared so the batched engine can draw them ahead
        return LocalJob([Phase(augment="raw", views=("weak", "strong"))], info={"upw": self._unsup_pos_weight(k)})

    # the one loss form over a chunk of K clients (the sequential engine: K = 1), with its hooks
    def begin_chunk(self, r, clients, jobs):
        # the chunk's per-client tallies (confident, seen), written into each job's info at its end
        self._tally = torch.zeros(len(clients), 2, dtype=torch.int64, device=self.ctx.device)
        upw = [j.info["upw"] for j in jobs]
        ones = torch.ones(self.ctx.data.num_classes, device=self.ctx.device)
        self._upw = None if all(w is None for w in upw) else torch.stack([ones if w is None else w for w in upw])

    def loss(self, sb: StackedBatch):
        p = self.params
        z_w = sb.forward(sb.views["weak"])
        k, b, _ = z_w.shape
        missing = 1.0 - self.active[sb.clients]
        loss = annotated_bce(self, sb, z_w)
        confident, hard = confident_pseudo_labels(torch.sigmoid(z_w.detach().float()), missing, p.upper, p.lower)
        if sb.mask is not None:
            confident = confident & sb.mask
        seen = torch.full((k,), b, device=z_w.device) if sb.mask is None else sb.mask.sum(1)
        self._tally += torch.stack([confident.sum(1), seen], 1)
        if p.lambda_u > 0:
            z_s = sb.forward(sb.views["strong"])
            loss = loss + p.lambda_u * unsupervised_loss(z_s, hard, confident, missing, self._upw)
        return loss

    def end_chunk(self, r, clients, jobs):
        for job, (confident, seen) in zip(jobs, self._tally.tolist()):
            job.info.update(confident=confident, seen=seen)

    def upload(self, r, k, job, nets):
        return {"confident": float(job.info["confident"]), "seen": float(job.info["seen"])}

    stages = {"main": Stage(prepare=prepare, upload=upload, loss=loss, begin=begin_chunk, end=end_chunk)}

    def aggregate(self, r, updates):
        ups = self.fedavg(updates)
        # share of the round's samples confident on every missing class (FixMatch's mask)
        confident = sum(u.uploads["confident"] for u in ups)
        self.round_info["fixmatch_confident_share"] = confident / max(sum(u.uploads["seen"] for u in ups), 1.0)
