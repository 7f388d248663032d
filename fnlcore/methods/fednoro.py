"""FedNoRo (Wu et al., IJCAI'23; fednoro.md §4): two-stage noise-robust FL.

Stage 1 (rounds < warmup_rounds): FedAvg with logit-adjusted CE. After the last
warm-up round the global model scores every training sample (CE on raw logits,
given labels); per-client per-class mean losses form a K x C matrix
(missing entries = column minimum, columns min-max normalised), and a
2-component GMM splits clients into clean and noisy (noisy = component with
the larger sum of means).
Stage 2: clean clients keep CE+LA; noisy clients distil from the frozen global
model, L = lambda(r) KL(softmax(f_G/T) || p_LA) + (1 - lambda(r)) NLL(p_LA);
the server aggregates with distance-aware weights (DaAgg).

Official code behaviour by default; each documented difference is a switch:
- ``detection_votes`` 9 (code: 9 GMM fits with random_state 0..8, majority vote
  over exact sets, ties to the tied set that first appears, i.e. at the smallest
  seed) | 1 (paper);
- ``detection_augment`` True (code: losses computed on the training dataset
  object, i.e. with training augmentation) | False;
- ``distance`` "per_tensor_sum" (code: sum over state-dict float tensors of the
  L2 norm of the difference, BN running stats included) | "global_l2" (paper).
Ablations of Table 4: ``use_noisy_clients``, ``use_kd``, ``use_daagg``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .api import (FLMethod, load, masked_mean, MethodParams, param, per_tensor_distance, METHODS, Stage, warm_up_then,
                  weighted_average)
from .logit_adjust import LogitAdjusted
from .noisy_client_detection import client_indicators, gmm_noisy
from .parts import check_rounds_left, class_loss_matrix, client_table, gaussian_ramp_up, minmax_columns, true_noise_rates


@dataclass(frozen=True)
class FedNoRoParams(MethodParams):
    name = "fednoro"
    slug_fields = ("warmup_rounds",)
    warmup_rounds: int = param(10, ge=1, rounds=True, doc="stage-1 rounds (FedAvg + logit adjustment)")
    tau: float = param(1.0, ge=0, doc="logit adjustment strength")
    kd_temperature: float = param(0.8, gt=0)
    lambda_max: float = param(0.8, ge=0, le=1)
    ramp_begin: int | None = param(None, ge=0, rounds=True, doc="default: warmup_rounds (fednoro.md A4)")
    ramp_end: int | None = param(None, ge=0, rounds=True, doc="default: rounds // 2 - 1 (49 for ICH's 100 rounds)")
    detection_votes: int = param(9, ge=1,
                                 switch="9 (code: 9 GMM fits, majority vote over exact sets) | 1 (paper: one GMM)")
    detection_augment: bool = param(True, switch="true (code: detection losses on augmented training images) | false")
    distance: str = param("per_tensor_sum", choices=("per_tensor_sum", "global_l2"),
                          switch="'per_tensor_sum' (code: sum of per-tensor L2 norms incl. BN buffers) | 'global_l2' "
                                 "(paper)")
    use_noisy_clients: bool = True
    use_kd: bool = True
    use_daagg: bool = True

    def check_training(self, settings) -> None:
        check_rounds_left(self, "warmup_rounds", settings)


def vote(sets: list[frozenset[int]]) -> frozenset[int]:
    """The most frequent exact set; ties go to the tied set that first appears (smallest seed).

    The official code lists the distinct sets in order of first appearance and
    takes ``index(max(counts))`` (fednoro.md §4.2 item 7): A,B,B,A,C,C,C,A,B -> A.
    """
    if not sets:
        raise ValueError("vote needs at least one GMM result")
    counts = Counter(sets)  # keys keep first-appearance order; max keeps the first of equal counts
    return max(counts, key=counts.__getitem__)


def detect_noisy_clients(matrix: np.ndarray, votes: int) -> frozenset[int]:
    feats = minmax_columns(matrix)
    return vote([frozenset(np.flatnonzero(gmm_noisy(feats, s)).tolist()) for s in range(votes)])


def daagg_weights(sizes: np.ndarray, distances: np.ndarray) -> np.ndarray:
    """DaAgg (Eqs. 6-7): w_i proportional to (n_i / sum n) * exp(-d_i / max d); d = 0 for clean clients."""
    dmax = distances.max()
    w = sizes / sizes.sum() * np.exp(-(distances / dmax if dmax > 0 else np.zeros_like(distances)))
    return w / w.sum()


@METHODS.register
class FedNoRo(LogitAdjusted, FLMethod):
    Params = FedNoRoParams
    paper = "FedNoRo (IJCAI'23)"
    reported_stages = ("stage2",)  # the code's Best/Last skip the warm-up rounds (fednoro.md §6)
    persistent = ("noisy", "loss_matrix")

    @classmethod
    def schedule(cls, params, settings, num_clients):
        return warm_up_then(params.warmup_rounds, settings, num_clients, "stage2")

    def __init__(self, params: FedNoRoParams, ctx):
        super().__init__(params, ctx)
        params.check_training(ctx.settings)
        self.ramp = (params.warmup_rounds if params.ramp_begin is None else params.ramp_begin,
                     ctx.settings.rounds // 2 - 1 if params.ramp_end is None else params.ramp_end)
        self.noisy: frozenset[int] | None = None  # detected after warm-up
        self.loss_matrix: np.ndarray | None = None

    def stage_name(self, r: int) -> str:
        return "warmup" if r < self.params.warmup_rounds else "stage2"

    def select_clients(self, r: int) -> list[int]:
        clients = super().select_clients(r)
        if self.stage_name(r) == "stage2" and not self.params.use_noisy_clients:
            clients = [k for k in clients if k not in self.noisy]
        return clients

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self.refresh_priors()
        if self.stage_name(r) == "stage2":
            self.round_info["kd_lambda"] = gaussian_ramp_up(r, *self.ramp, self.params.lambda_max)
            # which clients distil from the global model (noisy ones; a clean one keeps LA-CE), once a round:
            # the noisy set is fixed after warm-up
            self._distil = torch.as_tensor([k in self.noisy for k in range(self.ctx.data.num_clients)],
                                           device=self.ctx.device)

    # -- local objectives (each the one loss form over K clients; the sequential engine runs it at K = 1) --
    def stage2_loss(self, sb):
        """A distilling client: lambda(r) KL(softmax(f_G / T) || p_LA) + (1 - lambda(r)) NLL(p_LA) (fednoro.md
        §4.3), f_G the round's global model, frozen; the others (and stage 1) :meth:`la_loss`, logit-adjusted CE."""
        la = self.la_loss(sb)
        if not self.params.use_kd or not self.noisy:
            return la
        target = F.softmax(self.global_logits(sb) / self.params.kd_temperature, dim=2)
        log_p = F.log_softmax(sb.logits + self.log_prior[sb.clients][:, None, :], dim=2)
        log_p = torch.where(torch.isinf(log_p), torch.zeros_like(log_p), log_p)  # absent classes (code)
        kl = F.kl_div(log_p, target, reduction="none").sum(2)
        nll = -log_p.gather(2, self.labels(sb.idx.reshape(-1)).view(*sb.idx.shape, 1)).squeeze(2)
        lam = self.round_info["kd_lambda"]
        kd = lam * masked_mean(kl, sb.mask) + (1 - lam) * masked_mean(nll, sb.mask)
        return torch.where(self._distil[sb.clients], kd, la)

    stages = {"warmup": Stage(loss=LogitAdjusted.la_loss), "stage2": Stage(loss=stage2_loss)}

    # -- server --------------------------------------------------------------------------
    def aggregate(self, r, updates):
        if self.stage_name(r) == "warmup" or not self.params.use_daagg:
            return self.fedavg(updates)
        ups = list(updates)  # DaAgg needs every client's model at once
        clean = [u for u in ups if u.client not in self.noisy]
        sizes = np.array([u.num_samples for u in ups], dtype=np.float64)
        if len(clean) in (0, len(ups)):  # no clean or no noisy client: plain FedAvg (fednoro.md §4.4)
            weights = sizes / sizes.sum()
        else:  # d: a noisy client's distance to the nearest clean one, 0 for a clean client
            d = np.array([min(self._distance(u.state, c.state) for c in clean) if u.client in self.noisy else 0.0
                          for u in ups])
            weights = daagg_weights(sizes, d)
        self.round_info["daagg_min_weight"] = float(weights.min())
        load(self.global_model, weighted_average([u.state for u in ups], weights))

    def _distance(self, a, b) -> float:
        if self.params.distance == "per_tensor_sum":
            return per_tensor_distance(a, b)
        return math.sqrt(sum(float(((a[k] - b[k]).double() ** 2).sum()) for k in a if a[k].is_floating_point()))

    def end_round(self, r):
        if r != self.params.warmup_rounds - 1:
            return
        # the per-class loss matrix is Table 3's per-class loss indicator (CE of raw logits, given labels)
        self.loss_matrix = client_indicators(self.ctx, self.global_model, per_class=True,
                                             augment=self.params.detection_augment)
        self.noisy = detect_noisy_clients(self.loss_matrix, self.params.detection_votes)
        if len(self.noisy) == self.ctx.data.num_clients:  # fednoro.md §4.4: no clean client left
            self.ctx.log("FedNoRo: every client detected as noisy; treating all as clean")
            self.noisy = frozenset()
        self.ctx.log(f"FedNoRo: detected noisy clients {sorted(self.noisy)}")

    def client_results(self):
        if self.noisy is None:
            return None
        rates = true_noise_rates(self.ctx.data)
        return client_table(self.ctx.data, rates, true_noisy=[r > 0 for r in rates],
                            detected_noisy=[k in self.noisy for k in range(len(rates))])
