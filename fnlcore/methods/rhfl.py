"""RHFL as FedNoRo ran it (baselines.md §6): symmetric-CE local training + client-confidence re-weighting.

FedNoRo had no public data for RHFL's distillation, so it combined RHFL's client
confidence re-weighting (CCR) with FedAvg. Locally each client minimises SCE =
alpha CE + beta_s RCE, RCE = -sum_c p_c log clamp(onehot(y)_c, 1e-4, 1) = 9.2103 (1 - p_y)
(p clamped to [1e-7, 1]). After training it reports L_k^t, the mean SCE of its trained
model on its own data (eval mode, no augmentation; A(c)). The server weights the models
by omega = softmax(1/(K-1) + beta_c q / sum_j q_j), q_k = (L_k^{t-1} - L_k^t) / L_k^t;
round 0 (no previous losses) and |sum q| < 1e-8 give uniform weights (A(d)); a client
with no previous loss (not sampled before) gets q = 0. The weights do not multiply n_k (A(b)).

Switch: ``local_loss`` 'sce' (RHFL's noise-tolerant loss, default) | 'ce' (plain FedAvg loss).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .api import clients_mean, FLMethod, load, MethodParams, param, predict, METHODS, Stage, weighted_average
from .symmetric_ce import LOG_ZERO, sce_per_sample


@dataclass(frozen=True)
class RHFLParams(MethodParams):
    name = "rhfl"
    slug_fields = ("beta_c",)
    alpha: float = param(0.1, ge=0, doc="SCE weight of CE")
    beta_s: float = param(1.0, ge=0, doc="SCE weight of reverse CE")
    beta_c: float = param(0.5, ge=0, doc="CCR strength")
    local_loss: str = param("sce", choices=("sce", "ce"),
                            switch="'sce' (RHFL's noise-tolerant loss; FedNoRo says only 'combined with FedAvg') | "
                                   "'ce'")


def ccr_aggregation_weights(prev: np.ndarray, cur: np.ndarray, beta_c: float) -> np.ndarray:
    """Client-confidence re-weighting: softmax(1/(K-1) + beta_c q / sum q), q / sum q zeros when |sum q| < 1e-8.

    ``prev``/``cur``: previous and current mean losses (NaN prev = no previous loss -> q = 0).
    """
    if len(cur) == 0:
        return np.zeros(0)
    q = np.where(np.isnan(prev), 0.0, (prev - cur) / cur)
    total = q.sum()
    share = np.zeros_like(q) if abs(total) < 1e-8 else q / total
    a = 1.0 / max(len(cur) - 1, 1) + beta_c * share
    e = np.exp(a - a.max())
    return e / e.sum()


@METHODS.register
class RHFL(FLMethod):
    Params = RHFLParams
    paper = "Fang & Ye (CVPR'22) as FedNoRo's baseline: CCR + FedAvg"

    persistent = ("prev_loss",)

    def __init__(self, params: RHFLParams, ctx):
        super().__init__(params, ctx)
        self.prev_loss = np.full(ctx.data.num_clients, np.nan)  # L_k of the client's last participation

    def upload(self, r, k, job, nets):  # L_k^t
        idx = self.ctx.data.clients[k]
        logits = predict(self.ctx, nets["model"], self.ctx.data.train, idx)
        y, p = self.ctx.data.given[idx.to(self.ctx.device)], self.params
        return {"mean_loss": float(sce_per_sample(logits, y, p.alpha, p.beta_s, LOG_ZERO["code"]).mean())}

    def loss(self, sb):
        z, y, p = sb.logits.flatten(0, 1), self.labels(sb.idx.reshape(-1)), self.params
        per = (F.cross_entropy(z, y, reduction="none") if p.local_loss == "ce"
               else sce_per_sample(z, y, p.alpha, p.beta_s, LOG_ZERO["code"]))  # RHFL's clamps: the code's log 0
        return clients_mean(sb, per)

    stages = {"main": Stage(upload=upload, loss=loss)}

    def aggregate(self, r, updates):
        ups = list(updates)  # CCR needs every client's loss before weighting
        clients = [u.client for u in ups]
        cur = np.array([u.uploads["mean_loss"] for u in ups], dtype=np.float64)
        weights = ccr_aggregation_weights(self.prev_loss[clients], cur, self.params.beta_c)
        load(self.global_model, weighted_average([u.state for u in ups], weights))
        self.prev_loss[clients] = cur
        self.round_info["ccr_max_weight"] = float(weights.max()) if len(weights) else float("nan")
