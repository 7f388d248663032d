"""FedNoRo Table 3: how well each client-level indicator finds the noisy clients (fednoro.md §6, §8, A6).

Trains ``training.rounds`` (= FedNoRo's T1) warm-up rounds, FedAvg with plain CE or, with
``logit_adjust``, FedNoRo's stage 1 (logit-adjusted CE). After the last round the global
model scores every client's samples and builds one indicator per client:
- ``loss``: mean CE of the raw logits against the given labels (training augmentation on,
  as FedNoRo's detection pass: ``detection_augment``); with ``per_class`` the K x C matrix of
  per-class mean losses (FedNoRo's; missing classes = column minimum);
- ``conf``: mean softmax probability of the given label (FedNoiL-style, A6);
- ``lid``: FedCorr's client mean LID of the softmax outputs (k = 20).
``norm`` min-max normalises each column (Eq. 3). Then ``gmm_seeds`` single 2-component GMM
fits (random_state 0, 1, ...; no vote) split the clients; the noisy component is the one
whose mean sums larger (loss, LID) or smaller (confidence). Recall, precision (0 when
nothing is detected) and the matching ratio (1 when the detected set equals the true
noisy set) are averaged over the fits and logged at the last round as ``det_recall``,
``det_precision``, ``det_mr``; the true noisy clients are those holding a flipped label.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .api import FLMethod, MethodParams, param, METHODS, Stage
from .logit_adjust import LogitAdjusted
from .noisy_client_detection import client_indicators, gmm_noisy
from .parts import minmax_columns


@dataclass(frozen=True)
class FedNoRoDetectionParams(MethodParams):
    name = "fednoro_detection"
    slug_fields = (("indicator", ""), ("logit_adjust", {True: "la"}), ("per_class", {True: "perclass"}), ("norm", {True: "norm"}))
    indicator: str = param("loss", choices=("loss", "conf", "lid"))
    logit_adjust: bool = False
    per_class: bool = False
    norm: bool = False
    tau: float = param(1.0, ge=0, doc="logit adjustment strength (with logit_adjust)")
    gmm_seeds: int = param(100, ge=1, doc="single GMM fits averaged (Table 3 sets the paper's 10,000: ~45 s per run)")
    lid_k: int = param(20, ge=1, doc="neighbours of the LID estimate (FedCorr: 20)")
    detection_augment: bool = True


def detection_scores(detected: np.ndarray, truth: np.ndarray) -> tuple[float, float, float]:
    """(recall, precision, matching) of one detected client mask against the true one."""
    hit = float((detected & truth).sum())
    recall = hit / truth.sum() if truth.sum() else float(not detected.any())
    return recall, hit / detected.sum() if detected.sum() else 0.0, float(np.array_equal(detected, truth))


def gmm_detection_rates(features: np.ndarray, truth: np.ndarray, seeds: int, noisy_high: bool = True) -> tuple[float, float, float]:
    """Mean (recall, precision, matching ratio) over ``seeds`` single GMM fits (random_state 0..seeds-1)."""
    total = np.zeros(3)
    cache: dict[bytes, tuple[float, float, float]] = {}
    for s in range(seeds):
        detected = gmm_noisy(features, s, noisy_high)
        key = detected.tobytes()
        if key not in cache:
            cache[key] = detection_scores(detected, truth)
        total += cache[key]
    return tuple(float(v) for v in total / seeds)


@METHODS.register
class FedNoRoDetection(LogitAdjusted, FLMethod):
    Params = FedNoRoDetectionParams
    paper = "FedNoRo (IJCAI'23) Table 3: noisy-client detection indicators"
    persistent = ("features", "rates")

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.features: np.ndarray | None = None
        self.rates: tuple[float, float, float] | None = None

    def begin_round(self, r):
        super().begin_round(r)
        if self.params.logit_adjust:
            self.refresh_priors()

    def loss(self, sb):
        return self.la_loss(sb) if self.params.logit_adjust else FLMethod.loss(self, sb)

    stages = {"main": Stage(loss=loss)}

    def end_round(self, r):
        if r != self.num_rounds() - 1:
            return
        p = self.params
        self.features = client_indicators(self.ctx, self.global_model, p.indicator, p.per_class, p.detection_augment,
                                          p.lid_k)
        feats = minmax_columns(self.features) if p.norm else self.features
        truth = self.ctx.data.wrong_label_clients()
        self.rates = gmm_detection_rates(feats, truth, p.gmm_seeds, noisy_high=p.indicator != "conf")
        self.round_info.update(det_recall=self.rates[0], det_precision=self.rates[1], det_mr=self.rates[2])

    def client_results(self):
        if self.features is None:
            return None
        cols = {f"indicator_{j}": self.features[:, j] for j in range(self.features.shape[1])}
        truth = self.ctx.data.wrong_label_clients()
        return pd.DataFrame({"client": np.arange(len(self.features)), "true_noisy": truth, **cols})
