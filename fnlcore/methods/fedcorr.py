"""FedCorr (Xu et al., CVPR'22; fedcorr.md §4-§7) and FedCorr+LA (baselines.md §8), as the official code runs.

Three stages; the pre-processing rounds come BEFORE ``training.rounds``:

1. ``preprocess`` (``iterations1`` iterations): each iteration is one pass over the
   clients in groups (:func:`~.parts.sequential_client_groups`, one client per group by default); each
   group is one engine round: local training from the global model (mixup CE plus
   beta * mu_k * ||w - w_g|| on every batch but the first of each epoch, mu_k = the
   client's noise level estimated in the previous iteration), per-sample softmax
   outputs and losses of the local model on the client's (augmented) data, the
   client's mean LID; FedAvg over the group. After the iteration's last group:
   accumulated LID -> 1-D GMM split of the clients (:func:`client_split`), per noisy
   client a 1-D GMM on its losses -> noise level (:func:`estimate_noise_level`), and
   relabelling of confident high-loss samples with the global model
   (:func:`relabel_candidates`). Not evaluated (NaN test metrics).
2. ``finetune`` (the first ``rounds1`` of ``training.rounds``): FedAvg over clients
   drawn from those with estimated noise level <= ``clean_set_thres``; after its
   last round every sample of a noisy client whose global max softmax exceeds
   ``confidence_thres`` takes the global argmax (:func:`confident_relabels`).
3. ``usual`` (the rest): FedAvg over ``client_fraction`` of all clients.
Every stage may train its clients on the batched engine (mixup's draws are declared; stage 1's
detection pass on augmented images is drawn ahead at its sequential place, ``Stage.reserve``).

Official code behaviour by default; each difference is a switch:
- ``detection_loss`` "double_softmax" (code: CE applied to softmax probabilities, for
  the loss GMM and the relabel ranking) | "ce" (CE on logits);
- ``detection_augment`` True (code: per-sample passes on the training dataset object,
  i.e. with training augmentation) | False.
``logit_adjust``: FedCorr+LA, every local CE term (both mixup terms included) becomes
the logit-adjusted CE with the client's current label prior; the detectors use raw logits.

Where the spec is silent (decisions, see also the report):
- the learning-rate schedule runs over ``training.rounds``: pre-processing rounds use
  the round-0 rate, training round t (0-based after pre-processing) the rate of t;
- ``fine_tuning=False``: every training round is usual training, no stage-2 relabel;
- A8, no fine-tuning candidate: stage 2 and its relabel are skipped, its rounds run
  as usual training (stage "usual");
- candidates of equal loss are ranked stably (numpy's default argsort is not).
- the code's log-only test accuracy of each stage-1 local model is not computed;
- a non-finite LID or per-sample loss (a NaN/inf local model; the un-squared proximal term has a
  NaN gradient at w = w_g, in the code too) stops the run with an FNLError naming the round, the
  client(s), the cause and the fix (the code fails inside sklearn's GMM: "Input X contains NaN").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from .api import (clients_cross_entropy, ConfigError, FLMethod, FNLError, LocalJob, MethodParams, param, parameter_keys,
                  Phase, METHODS, snapshot, StackedBatch, Stage)
from .logit_adjust import LogitAdjusted, la_cross_entropy
from .parts import (GroupPasses, MixupDraw, add_proximal, client_outputs, client_table, fit_two_gaussians, lid_scores,
                    mixup_cross_entropy, mixup_view, reserve_pass, sequential_client_groups, true_noise_rates)


@dataclass(frozen=True)
class FedCorrParams(MethodParams):
    name = "fedcorr"
    slug_fields = (("iterations1", "wu"), ("rounds1", "ft"), ("logit_adjust", {True: "la"}))
    iterations1: int = param(5, ge=1, passes=True, doc="T_wu: pre-processing iterations (each a pass over all clients), before training.rounds")
    frac1: float | None = param(None, gt=0, le=1, doc="clients per pre-processing group as a fraction of K (None: 1/K, one client)")
    rounds1: int = param(500, ge=0, rounds=True, doc="T_ft: the first rounds1 of training.rounds fine-tune on clean clients")
    beta: float = param(5.0, ge=0, doc="proximal coefficient of stage 1 (times the client's estimated noise level)")
    relabel_ratio: float = param(0.5, ge=0, le=1, doc="fraction of a noisy client's estimated noisy samples to relabel")
    confidence_thres: float = param(0.5, ge=0, le=1, doc="relabel only where the global max softmax exceeds this")
    clean_set_thres: float = param(0.1, ge=0, le=1, doc="fine-tuning candidates: estimated noise level <= this")
    lid_k: int = param(20, ge=1, doc="LID neighbours")
    mixup: bool = True
    mixup_alpha: float = param(1.0, gt=0)
    correction: bool = True
    fine_tuning: bool = True
    logit_adjust: bool = param(False, doc="FedCorr+LA: logit-adjusted local CE (FedNoRo Tables 1-2)")
    la_tau: float = param(1.0, ge=0, doc="logit-adjustment strength (logit_adjust only)")
    detection_loss: str = param("double_softmax", choices=("double_softmax", "ce"),
                                switch="'double_softmax' (code: CE of softmax probabilities for loss GMM and relabel "
                                       "ranking) | 'ce'")
    detection_augment: bool = param(True, switch="true (code: per-sample passes on augmented training images) | false")

    def check_training(self, settings) -> None:
        if self.rounds1 > settings.rounds:
            raise ConfigError(f"method 'fedcorr': rounds1={self.rounds1} must be <= training.rounds={settings.rounds} "
                              "(training.rounds = fine-tuning + usual rounds)")


# -- pure parts ------------------------------------------------------------------------------


def _gmm_components(values: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """1-D 2-component GaussianMixture (sklearn defaults, random_state=seed): (predicted component, means)."""
    x = np.asarray(values).reshape(-1, 1)
    gmm = fit_two_gaussians(x, seed)
    return gmm.predict(x), gmm.means_[:, 0]


def client_split(lid_acc: np.ndarray, seed: int) -> np.ndarray:
    """Noisy clients (ascending ids): those not in the smaller-mean component of a GMM on accumulated LID."""
    pred, means = _gmm_components(lid_acc, seed)
    return np.flatnonzero(pred != int(np.argsort(means)[0]))


def estimate_noise_level(losses: np.ndarray, seed: int) -> float:
    """Fraction of a client's samples in the larger-mean component of a GMM on their losses."""
    losses = np.asarray(losses, dtype=np.float64)  # the code's loss array is float64 (values from float32)
    if len(losses) < 2:  # a GMM needs two samples (the code would fail)
        return 0.0
    pred, means = _gmm_components(losses, seed)
    return float(np.count_nonzero(pred == int(np.argsort(means)[-1]))) / len(losses)


def confident_relabels(probs: np.ndarray, thres: float) -> tuple[np.ndarray, np.ndarray]:
    """(positions, argmax labels) where the max probability exceeds ``thres`` strictly (stage-2-end rule)."""
    probs = np.asarray(probs)
    pos = np.flatnonzero(probs.max(1) > thres)
    return pos, probs[pos].argmax(1)


def relabel_candidates(losses: np.ndarray, probs: np.ndarray, noise_level: float, relabel_ratio: float,
                       thres: float) -> tuple[np.ndarray, np.ndarray]:
    """Stage-1 correction: of the floor(N * mu * ratio) largest-loss samples, the confident ones -> (ascending
    positions within the client, argmax labels of ``probs``)."""
    losses = np.asarray(losses)
    largest = np.argsort(-losses, kind="stable")[:int(len(losses) * noise_level * relabel_ratio)]
    conf, _ = confident_relabels(probs, thres)
    pos = np.intersect1d(largest, conf)
    return pos, np.asarray(probs)[pos].argmax(1)


class Slot(NamedTuple):
    stage: str
    iteration: int | None  # pre-processing iteration (None in training rounds)
    group: int | None  # group within the iteration (None in training rounds)


def stage_schedule(r: int, iterations1: int, groups_per_iteration: int, rounds1: int, fine_tuning: bool = True) -> Slot:
    """Round r -> (stage, iteration, group): iterations1 * groups pre-processing rounds, then rounds1 fine-tuning."""
    pre = iterations1 * groups_per_iteration
    if r < pre:
        return Slot("preprocess", r // groups_per_iteration, r % groups_per_iteration)
    if fine_tuning and r - pre < rounds1:
        return Slot("finetune", None, None)
    return Slot("usual", None, None)


# -- the method --------------------------------------------------------------------------------


@METHODS.register
class FedCorr(LogitAdjusted, GroupPasses, FLMethod):
    Params = FedCorrParams
    paper = "FedCorr (CVPR'22); baseline in FedNoRo (IJCAI'23, also +LA) and FedDiv"
    reported_stages = ("finetune", "usual")
    persistent = ("groups", "lid_acc", "lid_client", "losses", "noise_level", "noisy_set", "candidates",
                  "finetune_skipped")
    passes_param = "iterations1"
    pass_stage = "preprocess"  # schedule (then fine-tuning, whose rounds train min(m, candidates))

    def __init__(self, params: FedCorrParams, ctx):
        super().__init__(params, ctx)
        params.check_training(ctx.settings)
        self.init_passes()
        k, n = ctx.data.num_clients, len(ctx.data.train)
        self._true_noise = true_noise_rates(ctx.data)  # before any relabel
        self.groups: list[list[int]] = []  # this iteration's draw
        self.lid_acc = np.zeros(k)  # accumulated over iterations
        self.lid_client = np.zeros(k)  # this iteration's mean LID per client
        self.losses = np.zeros(n)  # this iteration's per-sample losses (float64 as the code's array; reset per iteration)
        self.noise_level = np.zeros(k)  # estimated; this is also mu of the next iteration
        self.noisy_set: list[int] | None = None
        self.candidates: list[int] | None = None  # fine-tuning clients
        self.finetune_skipped = False

    # -- schedule ------------------------------------------------------------------------
    def slot(self, r: int) -> Slot:
        p = self.params
        return stage_schedule(r, p.iterations1, self.groups_per_iteration, p.rounds1, p.fine_tuning)

    def stage_name(self, r: int) -> str:
        s = self.slot(r).stage
        return "usual" if s == "finetune" and self.finetune_skipped else s

    def select_clients(self, r: int) -> list[int]:
        stage, num = self.stage_name(r), self.ctx.data.num_clients
        if stage == "preprocess":
            return list(self.groups[self.slot(r).group])
        m, prob = max(int(self.ctx.settings.client_fraction * num), 1), None
        if stage == "finetune":
            prob = np.zeros(num)
            prob[self.candidates] = 1.0 / len(self.candidates)
            m = min(m, len(self.candidates))
        return [int(c) for c in self.ctx.rng.choice(num, m, replace=False, p=prob)]

    # -- a round ---------------------------------------------------------------------------
    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        if self.params.logit_adjust:
            self.refresh_priors()  # labels change in end_round: recompute (baselines.md §8 AMBIG a)
        slot = self.slot(r)
        if slot.stage == "preprocess":
            if slot.group == 0:
                self.groups = sequential_client_groups(self.ctx.rng, self.ctx.data.num_clients, self.params.frac1)
                self.lid_client = np.zeros_like(self.lid_client)
                self.losses = np.zeros_like(self.losses)
            self._ref = snapshot(self.global_model)
            self._keys = parameter_keys(self.global_model)

    # -- a client ----------------------------------------------------------------------------
    def prepare(self, r: int, k: int, nets: dict) -> LocalJob:
        # pre-processing at the round-0 rate; with mixup the engine makes the view and the (declared) draws
        p = self.params
        phase = Phase(augment="raw", views=("weak",), draws=MixupDraw(p.mixup_alpha)) if p.mixup else Phase()
        return LocalJob(phases=[phase], lr_round=self.lr_round(r))

    def loss(self, sb: StackedBatch) -> torch.Tensor:
        """Every stage's local loss (pre-processing adds its proximal term): mixup CE, or CE; logit-adjusted (+LA)."""
        p = self.params
        y = self.labels(sb.idx.reshape(-1)).view(sb.idx.shape)
        if p.mixup:
            lam, perm = sb.draws
            shift = p.la_tau * self.log_prior[sb.clients][:, None, :] if p.logit_adjust else None
            out = sb.forward(mixup_view(sb.views["weak"], lam, perm))
            return mixup_cross_entropy(out, y, lam, perm, sb.mask, shift)
        if p.logit_adjust:
            return la_cross_entropy(sb.logits, y, self.log_prior[sb.clients], p.la_tau, sb.mask)
        return clients_cross_entropy(sb.logits, y, sb.mask)

    def preprocess_loss(self, sb: StackedBatch) -> torch.Tensor:
        """:meth:`loss` plus beta * mu_k * ||w - w_g|| on every batch but the first of each epoch (the code)."""
        loss = self.loss(sb)
        # mu_k on the host (the noise levels are host values), rounded to the loss's dtype as a Python float is
        mu = (self.params.beta * torch.as_tensor(self.noise_level)[sb.clients_host]).to(loss.dtype)
        skip = (mu <= 0) | (sb.epoch_step_host == 0)
        return add_proximal(loss, sb, self._ref, self._keys, mu, "fedcorr_unsquared", skip)

    def detection_reserve(self, r: int, k: int, job: LocalJob) -> list[tuple] | None:
        """:meth:`detection_upload`'s :func:`~.parts.reserve_pass` (its pass draws with ``detection_augment``)."""
        return reserve_pass(self, r, k, job) if self.params.detection_augment else None

    def detection_upload(self, r: int, k: int, job: LocalJob, nets: dict) -> dict:
        """The local model's mean LID and per-sample losses on the client's data (for end_round's GMMs)."""
        probs, losses = self._per_sample(nets["model"], self.ctx.data.clients[k], job.reserved)
        return {"lid": float(lid_scores(probs, self.params.lid_k).mean()), "losses": losses.cpu().numpy()}

    stages = {"preprocess": Stage(prepare=prepare, upload=detection_upload,
                                  loss=preprocess_loss, reserve=detection_reserve),
              "finetune": Stage(prepare=prepare, loss=loss),
              "usual": Stage(prepare=prepare, loss=loss)}

    # -- server ------------------------------------------------------------------------------
    def aggregate(self, r: int, updates) -> None:
        detected = [u for u in self.fedavg(updates) if "lid" in u.uploads]
        self._check_finite_detection(r, detected)
        for u in detected:
            self.lid_client[u.client] = u.uploads["lid"]
            self.losses[self.ctx.data.clients[u.client].numpy()] = u.uploads["losses"]

    def _check_finite_detection(self, r: int, uploads) -> None:
        """Stop with the cause where a client's LID or losses are not finite (the GMMs would fail in sklearn)."""
        bad = sorted(u.client for u in uploads
                     if not (np.isfinite(u.uploads["lid"]) and np.isfinite(u.uploads["losses"]).all()))
        if not bad:
            return
        slot, beta = self.slot(r), self.params.beta
        mus = {k: beta * float(self.noise_level[k]) for k in bad}
        prox = [k for k in bad if mus[k] > 0]
        msg = (f"method 'fedcorr': round {r} (pre-processing iteration {slot.iteration}, group {slot.group}): "
               f"client(s) {bad} uploaded a non-finite LID or per-sample loss: the local model's outputs are "
               "NaN/inf, so the LID and loss GMMs cannot be fitted.")
        if prox:
            msg += (f" Client(s) {prox} trained with the proximal term beta*mu_k*||w - w_g|| (beta*mu_k = "
                    f"{', '.join(f'{mus[k]:.3g}' for k in prox)}); this un-squared norm has a NaN gradient "
                    "where w = w_g (FedCorr's code too), met when a local model still equals the global model at a "
                    "batch that adds the term (every batch but an epoch's first): updates below float precision "
                    "(a tiny training.lr) or zero gradients (a dead network; lenet5's ReLU on the logits can zero "
                    "them all). Fix: method.beta: 0 (no proximal term), a larger training.lr, or for a LeNet "
                    "the model lenet5_linear_head (FedCorr's own LeNet, no ReLU on the logits).")
        if len(prox) < len(bad):
            msg += (f" Client(s) {[k for k in bad if k not in prox]} had no proximal term: their local training "
                    "diverged; lower training.lr (or check the input normalisation).")
        raise FNLError(msg)

    def end_round(self, r: int) -> None:
        slot, p = self.slot(r), self.params
        if slot.stage == "preprocess" and slot.group == self.groups_per_iteration - 1:
            self._end_iteration(r, slot.iteration)
            if slot.iteration == p.iterations1 - 1:
                self._choose_finetune_clients()
        # fine-tuning's closing relabel (with no fine-tuning round: at the end of pre-processing)
        if p.fine_tuning and not self.finetune_skipped and r == self.pre_rounds + p.rounds1 - 1:
            self._relabel_confident(r, "finetune")

    # -- stage-1 and stage-2 server steps ----------------------------------------------------
    def _per_sample(self, model, idx, drawn: list[tuple] | None = None):
        """(softmax probabilities, detection losses) of ``model`` on the client's samples (``drawn``: the
        augmentation reserved ahead, else drawn here)."""
        logits, probs, losses = client_outputs(self.ctx, model, idx, augment=self.params.detection_augment, drawn=drawn)
        if self.params.detection_loss == "ce":
            losses = F.cross_entropy(logits, self.ctx.data.given[idx.to(self.ctx.device)], reduction="none")
        return probs, losses

    def _end_iteration(self, r: int, iteration: int) -> None:
        p, data, seed = self.params, self.ctx.data, self.ctx.seed
        self.lid_acc = self.lid_acc + self.lid_client
        noisy = client_split(self.lid_acc, seed)
        levels = np.zeros_like(self.noise_level)
        for k in noisy:
            levels[k] = estimate_noise_level(self.losses[data.clients[k].numpy()], seed)
        self.noise_level, self.noisy_set = levels, [int(k) for k in noisy]
        changed = 0
        if p.correction:
            for k in self.noisy_set:
                idx = data.clients[k]
                probs, _ = self._per_sample(self.global_model, idx)
                pos, labels = relabel_candidates(self.losses[idx.numpy()], probs.cpu().numpy(), levels[k],
                                                 p.relabel_ratio, p.confidence_thres)
                changed += data.relabel(idx[torch.as_tensor(pos, dtype=torch.int64)], torch.as_tensor(labels), r,
                                        "preprocess", k)
        self.round_info.update(noisy_clients=len(self.noisy_set), relabelled=changed)
        self.ctx.log(f"FedCorr iteration {iteration}: noisy clients {self.noisy_set}, "
                     f"estimated levels {np.round(levels[noisy], 3).tolist()}, {changed} labels changed")

    def _choose_finetune_clients(self) -> None:
        self.candidates = [int(k) for k in np.flatnonzero(self.noise_level <= self.params.clean_set_thres)]
        if self.params.fine_tuning and not self.candidates:  # A8: the code would fail
            self.finetune_skipped = True
            self.ctx.log("FedCorr: no client qualifies for fine-tuning; stage 2 skipped, its rounds are usual training")

    def _relabel_confident(self, r: int, stage: str) -> None:
        if not self.params.correction:
            return
        data, changed = self.ctx.data, 0
        for k in self.noisy_set:
            idx = data.clients[k]
            probs, _ = self._per_sample(self.global_model, idx)
            pos, labels = confident_relabels(probs.cpu().numpy(), self.params.confidence_thres)
            changed += data.relabel(idx[torch.as_tensor(pos, dtype=torch.int64)], torch.as_tensor(labels), r, stage, k)
        self.round_info["relabelled"] = changed
        self.ctx.log(f"FedCorr end of fine-tuning: {changed} labels changed on noisy clients {self.noisy_set}")

    # -- outputs -----------------------------------------------------------------------------
    def client_results(self):
        if self.noisy_set is None:
            return None
        data, rates = self.ctx.data, self._true_noise
        clients = range(data.num_clients)
        return client_table(data, rates, true_noisy=[r > 0 for r in rates], noise_rate_after=true_noise_rates(data),
                            lid_acc=self.lid_acc, estimated_noise_level=self.noise_level,
                            detected_noisy=[k in self.noisy_set for k in clients],
                            finetune_candidate=[self.candidates is not None and k in self.candidates for k in clients])
