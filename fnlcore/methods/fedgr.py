"""FedGR (Global Reviser for federated learning with noisy labels, ICML 2026; fedgr.md §1).

Local objective (Eq. 4) on a weak view x^w and a strong view x^s of every batch sample:
L_k = L^SR + λ_B B_k + λ_R R_k, the supervised loss always on the strong view.

Round t (0-based; warm-up, the "label-noise sniffing" rounds, are t < α):

* sampling (§1.2): in warm-up clients are drawn without replacement across rounds
  (:class:`~fnlcore.fl.sampling.CyclicSampler`: shuffle the K clients, take the next m each
  round, reshuffle when exhausted); afterwards m distinct clients uniformly per round.
* client k, before local training, with the received global model w_g^{t-1} in eval mode:
  1. loss observation ℓ_i = CE(w_g^{t-1}(x_i), ŷ_i) on the un-augmented image, folded into the
     running mean ℓ̄_i over the client's selections (Eqs. 9-10);
  2. FixMatch pseudo-label on a weak view: argmax if its max probability > ε;
  3. Label Refining (t ≥ α, §1.4): the persistent reliable-label set Y*_k (Eq. 16) gets the
     given label of every clean-flagged sample and the pseudo-label of every noisy-flagged
     sample with a confident one (older entries are kept otherwise). Y*_k lives in the run's
     working labels: ``ctx.data.relabel`` writes it (recorded in relabels.parquet), a mask marks
     which samples have an entry, and the original noisy labels ŷ are kept aside;
  4. revision of the client's persistent EMA model (Eqs. 12, 15): t < α or (r_k ≥ β and
     |Y*_k| / n_k < μ) → w_ema ← w_g^{t-1}; otherwise w_ema ← γ_g w_ema + (1 - γ_g) w_g^{t-1}
     (parameters and float buffers); teacher logits of the revised EMA model on one weak view
     per sample are cached for the round (Eq. 14).
* E local epochs; after every optimiser step w_ema ← γ_l w_ema + (1 - γ_l) w_k.
  - L^SR: t < α: CE(p^s, ŷ); t ≥ α with r_k < β: q_i CE(p^s, ŷ_i) + (1 - q_i) CE(p^s, Y*_i)
    (second term 0 without an entry); r_k ≥ β: CE(p^s, Y*_i) (0 without an entry); mean over
    the batch (missing labels count as zeros).
  - B_k (t ≥ α): KL(softmax(p^{le,w}/τ) ‖ softmax(p^s/τ)), batchmean, no τ² factor.
  - R_k (all rounds): KL(softmax(f_g(x^w)/τ) ‖ softmax(f_k(x^s)/τ)) over the feature dimension,
    f = the backbone's (pooled) feature, global backbone frozen in eval mode. The target f_g(x^w)
    (``global_features``): 'per_step' (dev code, spec §1.6: the global backbone on the batch's own
    weak view at every step) or 'cached' (paper Algorithm 2 line 4 and Table 18's (E+3)F: one
    feature per sample before local training). Cached features come from the same forward pass
    and weak view as the pseudo-labels of step 2 (t ≥ α); in warm-up, where nothing else needs
    a weak view, the pre-training pass draws one per sample after its un-augmented loss
    observation (chunks of eval_batch_size in the client's sample order, for each chunk the
    un-augmented image, then one weak draw). With cached features and the revised teacher a
    training step draws only the strong view.
* upload (n_k, w_k, {(sample id, ℓ̄_i)}); the server FedAvg-aggregates and runs Federated
  Sieving (§1.3) on the proxies uploaded this round: a 2-component 1-D GMM (max_iter 50,
  tol 1e-2, reg_covar 5e-4, raw losses), q_i = posterior of the smaller-mean component, clean
  iff q_i ≥ 0.5; partition and q persist per sample until the client is selected again;
  r_k = noisy-flagged share of client k. FS runs in every round.

Strong view: the run's weak augmentation with reflect padding, then RandAugment of the
'fixmatch_uniform' kind with n = 3 ops and a Cutout (fedgr.md §4); the method sets it on its
own copy of the run's pipeline.

Ablations and design variants (Tables 4 and 5) are switches, each declared on its field (``switch=``).

Decided where the spec is silent:
- a sample never sieved yet (a client first selected after warm-up, possible only with
  ``warmup_sampling='uniform'``) counts as clean with q = 1;
- a client's first EMA model is the global model it first receives;
- the GMM's random_state is drawn from ctx.rng once per fit (also when a degenerate proxy
  set, fewer than 2 samples or all equal, skips the fit and flags everything clean);
- "w/o weak aug": every weak view (pseudo-labelling, teacher, R target) is the un-augmented
  image; "w/o strong aug": the student sees the batch's weak view instead of a strong one;
- "w/o FS" (``sieving='local'``): after local training the client observes its samples' losses
  with its trained local model (un-augmented images), folds them into its running means and fits
  its own GMM (same settings); the partition is used at its next selection;
- per-client EMA models live in a ClientStore (on disk between selections: 100-500 clients would
  not fit on one accelerator); the revised one is left in the EMA working network, which the engine
  keeps per client while the clients train (``sb.copies["ema"]``, fnlcore.fl.copies);
- the dev code's EMA decay ramp min(γ_l, 1 - 1/(s+1)) is not applied (Eq. 12 as written).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from .api import (
    clients_cross_entropy, clients_mean, ClientStore, FLMethod, forward_bounded, load, LocalJob,
    MethodParams, on, OneCopy, param, Phase, METHODS, sampling, StackedBatch, Stage,
)
from .parts import check_rounds_left, fit_two_gaussians
from ..randaugment import RandAugmentSpec


@dataclass(frozen=True)
class FedGRParams(MethodParams):
    name = "fedgr"
    slug_fields = ("warmup_rounds", ("lambda_r", "lamR"))
    warmup_rounds: int = param(100, ge=0, rounds=True,
                               doc="α: warm-up (label-noise sniffing) rounds (CIFAR 100, Clothing1M 50)")
    lambda_b: float = param(1.0, ge=0, doc="λ_B: weight of the revised-EMA distillation (from round α)",
                            switch="0 = Table 4 'w/o B_k'")
    lambda_r: float = param(0.2, ge=0, doc="λ_R: weight of the representation regulariser (0.1 for CIFAR-10)",
                            switch="0 = Table 4 'w/o R_k'")
    confidence: float = param(0.9, ge=0, lt=1, doc="ε: FixMatch confidence threshold (strictly exceeded)")
    beta: float = param(0.8, ge=0, le=1, doc="β: client noise-ratio threshold")
    mu: float = param(0.5, ge=0, le=1, doc="μ: reliable-label proportion threshold of the EMA reset")
    gamma_g: float = param(0.9, ge=0, le=1, doc="γ_g: decay of the global revision of the local EMA")
    gamma_l: float = param(0.99, ge=0, le=1, doc="γ_l: decay of the per-step local EMA update")
    tau_b: float = param(0.5, gt=0, doc="τ of the distillation B_k")
    tau_r: float = param(0.5, gt=0, doc="τ of the representation regulariser R_k",
                         switch="0.5 (paper Table 17) | 0.1 (dev code's representation temperature)")
    p_threshold: float = param(0.5, gt=0, lt=1, doc="a sample is clean iff its clean posterior q ≥ this")
    gmm_max_iter: int = param(50, ge=1, doc="EM iterations of the sieving GMM")
    gmm_tol: float = param(1e-2, gt=0, doc="EM tolerance of the sieving GMM")
    gmm_reg_covar: float = param(5e-4, gt=0, doc="variance floor of the sieving GMM")
    randaugment_n: int = param(3, ge=1, doc="ops per strong view (RandAugment, uniform magnitudes)")
    sieving: str = param("federated", choices=("federated", "local"),
                         switch="'federated' (FS: global-model loss proxies, one GMM on the server) | 'local' (Table 4 "
                                "'w/o FS': local-model losses, one GMM per client)")
    label_refining: bool = param(True,
                                 switch="true | false (Table 4 'w/o LR': train on clean-flagged samples only, "
                                        "CE(ŷ)·1[clean])")
    weak_aug: bool = param(True, switch="true | false (Table 5 'w/o weak aug': weak views are the un-augmented images)")
    strong_aug: bool = param(True, switch="true | false (Table 5 'w/o strong aug': the student sees the weak view)")
    teacher: str = param("revised", choices=("revised", "online"),
                         switch="'revised' (Eq. 14: revised EMA logits cached once per round) | 'online' (Table 5 "
                                "'Online EMA distill': the current EMA model on the batch's weak view)")
    warmup_sampling: str = param("cyclic", choices=("cyclic", "uniform"),
                                 switch="'cyclic' (without replacement across warm-up rounds) | 'uniform' (Table 5: "
                                        "random sampling in warm-up too)")
    high_noise_labels: str = param("reliable", choices=("reliable", "pseudo_only"),
                                   switch="'reliable' (dev code: r_k ≥ β trains on Y*_k, clean-flagged samples keep ŷ) "
                                          "| 'pseudo_only' (paper Eq. 11: this round's confident pseudo-labels only)")
    global_features: str = param("per_step", choices=("per_step", "cached"),
                                 switch="'per_step' (dev code: R_k's target f(x^w; w_g) on each batch's fresh weak "
                                        "view) | 'cached' (paper Alg. 2 line 4, Table 18: once per sample before local "
                                        "training, on the pseudo-labelling weak view)")
    ema_reset_strict: bool = param(False, switch="false (paper Eq. 15: reset when r_k ≥ β) | true (dev code: r_k > β)")
    freeze_sieving: bool = param(False, switch="false (dev default: FS every round) | true (FS only in warm-up)")

    def check_training(self, settings) -> None:
        check_rounds_left(self, "warmup_rounds", settings,
                          "(the main phase would never run); lower warmup_rounds")


# -- pure parts ----------------------------------------------------------------------------


def running_mean_update(mean: torch.Tensor, count: torch.Tensor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 10 incrementally: mean over the observations so far after adding ``obs`` (count + 1 of them)."""
    count = count + 1
    return mean + (obs.to(mean.dtype) - mean) / count.to(mean.dtype), count


def fixmatch_labels(logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """argmax of softmax where its max probability exceeds ``threshold`` strictly, else -1."""
    conf, pred = F.softmax(logits.float(), dim=1).max(1)
    return torch.where(conf > threshold, pred, torch.full_like(pred, -1))


def sieve(proxies: np.ndarray, p_threshold: float, max_iter: int, tol: float, reg_covar: float,
          seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Federated Sieving on 1-D proxies, raw (un-normalised): (q = posterior of the smaller-mean component,
    clean = q ≥ p_threshold); a degenerate set (fewer than 2 values, or all equal) gives q = 1."""
    x = np.asarray(proxies, dtype=np.float64).reshape(-1, 1)
    if len(x) < 2 or not float(x.max()) > float(x.min()):
        q = np.ones(len(x))
    else:
        gmm = fit_two_gaussians(x, seed, max_iter=max_iter, tol=tol, reg_covar=reg_covar)
        q = gmm.predict_proba(x)[:, int(np.argmin(gmm.means_.reshape(-1)))]
    return q, q >= p_threshold


def refine_reliable(noisy_flag: torch.Tensor, given: torch.Tensor, pseudo: torch.Tensor, reliable: torch.Tensor,
                    has_reliable: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Label Refining's update of Y* (Eq. 16, dev realisation) -> (labels, has-entry mask): clean-flagged → ŷ;
    noisy-flagged with a pseudo-label (≥ 0) → it; the others keep their previous entry (or none: label as it was)."""
    take_given, take_pseudo = ~noisy_flag, noisy_flag & (pseudo >= 0)
    labels = torch.where(take_given, given, torch.where(take_pseudo, pseudo, reliable))
    return labels, has_reliable | take_given | take_pseudo


def refined_terms(logits: torch.Tensor, given: torch.Tensor, reliable: torch.Tensor, has_reliable: torch.Tensor,
                  q: torch.Tensor, high_noise: torch.Tensor) -> torch.Tensor:
    """L^SR for t ≥ α of each sample: r_k < β: q CE(p, ŷ) + (1 - q) CE(p, Y*); r_k ≥ β (``high_noise``, bool per
    sample): CE(p, Y*); a CE(p, Y*) without an entry in Y* counts as a zero."""
    target = torch.where(has_reliable, reliable, torch.zeros_like(reliable))
    ce_rel = F.cross_entropy(logits, target, reduction="none") * has_reliable.to(logits.dtype)
    ce_given = F.cross_entropy(logits, given, reduction="none")
    q = q.to(logits.dtype)
    return torch.where(high_noise, ce_rel, q * ce_given + (1.0 - q) * ce_rel)


def distill_kl_rows(student: torch.Tensor, target: torch.Tensor, tau: float) -> torch.Tensor:
    """KL(softmax(target/τ) ‖ softmax(student/τ)) of each row (last dim the distribution), no τ² factor:
    B_k and R_k per sample, (..., D) -> (...)."""
    return F.kl_div(F.log_softmax(student.float() / tau, dim=-1), F.softmax(target.float() / tau, dim=-1),
                    reduction="none").sum(-1)


def revision_decay(r: int, warmup: int, noise_ratio: float, reliable_frac: float, beta: float, mu: float,
                   gamma_g: float, strict: bool = False) -> float:
    """γ_g of Eq. 15: 0 in warm-up or for a high-noise client short of reliable labels, else γ_g."""
    if r < warmup:
        return 0.0
    high = noise_ratio > beta if strict else noise_ratio >= beta
    return 0.0 if high and reliable_frac < mu else gamma_g


# -- the method ----------------------------------------------------------------------------


class _GlobalFeatures(NamedTuple):
    """R_k's cached targets for one client ('cached'): the global backbone's features by sample id."""

    ids: torch.Tensor  # the client's sample ids, sorted, on the device
    feats: torch.Tensor  # (n_k, d) float32, row j for ids[j]

    def __getitem__(self, i: torch.Tensor) -> torch.Tensor:
        return self.feats[torch.searchsorted(self.ids, i)]


@dataclass
class _JobInfo:
    """What a local update's loss needs from its preparation."""

    high_noise: bool | None  # r_k ≥ β (main stage); None in warm-up
    features: _GlobalFeatures | None  # R_k's cached targets; None: per step, or no R_k


@METHODS.register
class FedGR(FLMethod):
    Params = FedGRParams
    paper = "FedGR: Learning Locally, Revising Globally (ICML 2026)"
    client_networks = ("ema",)  # the selected client's EMA model
    persistent = ("noisy_labels", "loss_mean", "loss_count", "clean_prob", "noisy_flag", "has_reliable", "ema",
                  "sampler")

    def __init__(self, params: FedGRParams, ctx):
        super().__init__(params, ctx)
        n, dev = len(ctx.data.train), ctx.device
        strong = RandAugmentSpec(kind="fixmatch_uniform", n=params.randaugment_n)
        # The strong view's crop (fedgr.md §4): CIFAR the weak crop padded by reflection;
        # Clothing1M (training images read larger than the network input, image_transform
        # resize_crop*) RandomResizedCrop(224) of the 256 x 256 resize + flip.
        crop = "resized" if ctx.pipeline.crop_size is not None else "train"
        self.pipeline = dataclasses.replace(ctx.pipeline, strong=strong, strong_padding="reflect", strong_crop=crop)
        # the engine draws a step's declared views from the run's pipeline: give it FedGR's strong view (the
        # strong view is the only thing that differs, and nothing else in a run uses it)
        ctx.pipeline = self.pipeline
        self.noisy_labels = ctx.data.given.clone()  # ŷ: the working labels hold Y* from round α on
        self.loss_mean = torch.zeros(n, dtype=torch.float64, device=dev)  # ℓ̄_i
        self.loss_count = torch.zeros(n, dtype=torch.int64, device=dev)
        self.clean_prob = torch.ones(n, dtype=torch.float32, device=dev)  # q_i (1 until sieved)
        self.noisy_flag = torch.zeros(n, dtype=torch.bool, device=dev)
        self.has_reliable = torch.zeros(n, dtype=torch.bool, device=dev)  # entry in Y*_k
        # this round's confident pseudo-labels (-1: none), rewritten per client before it trains (not state)
        self._pseudo = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.ema = ClientStore("ema")  # client -> its EMA model
        self.sampler = sampling.CyclicSampler(ctx.data.num_clients, ctx.settings.client_fraction)
        self._teacher: torch.Tensor | None = None  # teacher logits by sample id, rewritten per client (not state)
        self._stats: dict[str, list[float]] = {}
        self._cache_features = params.lambda_r > 0 and params.global_features == "cached"
        self._high_noise: torch.Tensor | None = None  # the training clients' r_k ≥ β flags (K,) (not state)

    # -- schedule ---------------------------------------------------------------------------
    def stage_name(self, r: int) -> str:
        return "warmup" if r < self.params.warmup_rounds else "main"

    def select_clients(self, r: int) -> list[int]:
        if r < self.params.warmup_rounds and self.params.warmup_sampling == "cyclic":
            return self.sampler.next(self.ctx.rng)
        return super().select_clients(r)

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self._stats = {"noise_ratio": [], "reliable_frac": [], "ema_reset": []}

    # -- client side ------------------------------------------------------------------------
    @torch.no_grad()
    def _pass(self, model: torch.nn.Module, idx: torch.Tensor, views: tuple[str, ...],
              features: bool = False) -> dict[str, torch.Tensor]:
        """Logits of ``model`` (eval mode) on the named views of samples ``idx``, in order: chunks of eval_batch_size,
        per chunk the views in the order named ('eval'; 'weak': one draw per sample, the un-augmented image under
        'w/o weak aug'); ``features``: also the backbone features of the same weak views, under 'feat'."""
        model.eval()
        outs = {v: [] for v in views + (("feat",) if features else ())}
        for xb, _ in self.ctx.data.train.batches(idx, self.ctx.settings.eval_batch_size):
            for v in views:
                x = self.pipeline.view(v if self.params.weak_aug else "eval", xb, self.ctx.aug_gen)
                if features and v == "weak":
                    logits, feat = forward_bounded(model, x, model.forward_features)
                    outs["feat"].append(feat.float())
                else:
                    logits = forward_bounded(model, x)
                outs[v].append(logits.float())
        width, dev = {"feat": getattr(model, "feature_dim", 0)}, self.ctx.device  # (0, width): a client without samples
        return {v: torch.cat(o) if o else torch.zeros(0, width.get(v, self.ctx.data.num_classes), device=dev)
                for v, o in outs.items()}

    def noise_ratio(self, k: int) -> float:
        """r_k: share of client k's samples flagged noisy by the latest sieving."""
        idx = self.ctx.data.clients[k].to(self.ctx.device)
        return float(self.noisy_flag[idx].float().mean()) if len(idx) else 0.0

    def label_refining(self, r: int, k: int, pseudo: torch.Tensor) -> int:
        """Update Y*_k from the current partition and this round's pseudo-labels (aligned with the
        client's samples, -1 = none); Y*_k is written into the working labels (not under 'w/o LR', where
        only its size is kept for the EMA rule, as the dev code). Returns the number of labels changed."""
        didx = self.ctx.data.clients[k].to(self.ctx.device)
        self._pseudo[didx] = pseudo  # this round's only ('pseudo_only')
        labels, has = refine_reliable(self.noisy_flag[didx], self.noisy_labels[didx], pseudo,
                                      self.ctx.data.given[didx], self.has_reliable[didx])
        self.has_reliable[didx] = has
        if not self.params.label_refining:  # 'w/o LR': |Y*_k| still feeds the EMA rule, no label is written
            return 0
        return self.ctx.data.relabel(didx, labels, r, self.stage_name(r), k)

    def revise_ema(self, r: int, k: int, noise_ratio: float, reliable_frac: float) -> float:
        """Put client k's EMA model, revised by the global model (Eqs. 12 and 15), in the EMA working
        network; returns the γ_g used (0 = replaced by the global model; also a client's first EMA model)."""
        p = self.params
        decay = revision_decay(r, p.warmup_rounds, noise_ratio, reliable_frac, p.beta, p.mu, p.gamma_g,
                               p.ema_reset_strict) if k in self.ema else 0.0
        net = self.workers["ema"]
        load(net, self.ema.get(k) if decay > 0 else self.global_model.state_dict())
        if decay > 0:  # torch.lerp on the float entries (parameters and buffers), integer ones copied
            OneCopy(net, self.global_model).lerp_(1.0 - decay, None)
        return decay

    def _observe(self, k: int, views: tuple[str, ...]) -> tuple[dict[str, torch.Tensor], _GlobalFeatures | None]:
        """Steps 1-2: the received global model's logits on client k's samples ('eval', 'weak' as named),
        and R_k's cached targets ('cached': the features of a weak view, drawn here if not named; else
        None); folds the loss observations into ℓ̄ (federated sieving)."""
        idx = self.ctx.data.clients[k]
        if self._cache_features and "weak" not in views:
            views = views + ("weak",)
        out = self._pass(self.global_model, idx, views, features=self._cache_features)
        if self.params.sieving == "federated":
            self._fold_losses(idx.to(self.ctx.device), out["eval"])
        if "feat" not in out:
            return out, None
        ids, order = torch.sort(idx.to(self.ctx.device))
        return out, _GlobalFeatures(ids, out["feat"][order])

    def _fold_losses(self, didx: torch.Tensor, logits: torch.Tensor) -> None:
        """Eqs. 9-10: CE(logits, ŷ) of samples ``didx`` folded into their running means ℓ̄."""
        obs = F.cross_entropy(logits, self.noisy_labels[didx], reduction="none")
        self.loss_mean[didx], self.loss_count[didx] = running_mean_update(
            self.loss_mean[didx], self.loss_count[didx], obs)

    def _revise(self, r: int, k: int) -> float:
        """Step 4's revision of client k's EMA model; returns r_k."""
        didx = self.ctx.data.clients[k].to(self.ctx.device)
        r_k = self.noise_ratio(k)
        reliable_frac = float(self.has_reliable[didx].float().mean()) if len(didx) else 0.0
        decay = self.revise_ema(r, k, r_k, reliable_frac)
        self._stats["noise_ratio"].append(r_k)
        self._stats["reliable_frac"].append(reliable_frac)
        self._stats["ema_reset"].append(float(decay == 0.0))
        return r_k

    def _step_views(self, stage: str) -> tuple[str, ...]:
        """The views a training step draws, in the order the loss uses them: a weak view where a term
        needs one ('eval', which draws nothing, under 'w/o weak aug'), then the strong view; under
        'w/o strong aug' the student sees the weak view, drawn once."""
        p = self.params
        weak = "weak" if p.weak_aug else "eval"
        if not p.strong_aug:
            return (weak,)
        online = stage == "main" and p.lambda_b > 0 and p.teacher == "online"
        return ((weak,) if (p.lambda_r > 0 and not self._cache_features) or online else ()) + ("strong",)

    def _job(self, stage: str, nets: dict[str, torch.nn.Module], info: _JobInfo) -> LocalJob:
        """E epochs on the client's samples with the stage's declared views. The revised EMA model left in
        ``nets["ema"]`` is the client's copy the engine keeps while it trains (``sb.copies["ema"]``)."""
        nets["ema"].eval()
        return LocalJob(phases=[Phase(augment="raw", views=self._step_views(stage))], info=info)

    def prepare_warmup(self, r: int, k: int, nets: dict) -> LocalJob:
        _, features = self._observe(k, ("eval",))
        self._revise(r, k)
        return self._job("warmup", nets, _JobInfo(None, features))

    def prepare_main(self, r: int, k: int, nets: dict) -> LocalJob:
        p, ctx = self.params, self.ctx
        out, features = self._observe(k, ("eval", "weak"))
        self.label_refining(r, k, fixmatch_labels(out["weak"], p.confidence))  # step 3
        r_k = self._revise(r, k)
        if p.lambda_b > 0 and p.teacher == "revised":  # Eq. 14: the revised EMA model's logits, once per round
            if self._teacher is None:
                self._teacher = torch.zeros(len(ctx.data.train), ctx.data.num_classes, device=ctx.device)
            idx = ctx.data.clients[k]
            self._teacher[idx.to(ctx.device)] = self._pass(nets["ema"], idx, ("weak",))["weak"]
        return self._job("main", nets, _JobInfo(r_k >= p.beta, features))

    def _supervised_terms(self, z: torch.Tensor, i: torch.Tensor, high_noise: torch.Tensor) -> torch.Tensor:
        """L^SR of each sample ``i`` of main-stage clients under the switches (``high_noise``: r_k ≥ β of
        each sample's client, a bool tensor)."""
        p = self.params
        if not p.label_refining:  # 'w/o LR': CE(ŷ)·1[clean-flagged]
            return F.cross_entropy(z, self.noisy_labels[i], reduction="none") * (~self.noisy_flag[i]).to(z.dtype)
        reliable, has = self.ctx.data.given[i], self.has_reliable[i]
        if p.high_noise_labels == "pseudo_only":  # Eq. 11 where r_k ≥ β: this round's confident pseudo-labels only
            ps = self._pseudo[i]
            reliable, has = torch.where(high_noise, ps, reliable), torch.where(high_noise, ps >= 0, has)
        return refined_terms(z, self.noisy_labels[i], reliable, has, self.clean_prob[i], high_noise)

    # -- the loss, once over the K clients of a step (K = 1 on the sequential engine) ------------------
    def _student(self, sb: StackedBatch):
        """(weak view or None, the student's logits (K * B, C) and features (K * B, F) on its view (see _step_views),
        flat sample ids). Every term reads these same rows (no per-term reshape), which fixes the order their
        gradients add up in: at K = 1 the golden record's, to the bit."""
        weak = sb.views.get("weak" if self.params.weak_aug else "eval")
        logits, feat = sb.forward_features(sb.views["strong"] if self.params.strong_aug else weak)
        return weak, logits.float().flatten(0, 1), feat.flatten(2).flatten(0, 1), sb.idx.reshape(-1)

    def _with_representation(self, total: torch.Tensor, sb: StackedBatch, weak: torch.Tensor | None,
                             feat: torch.Tensor) -> torch.Tensor:
        """total + λ_R R_k (K,): the frozen global backbone's features on a weak view (the batch's, or the
        cached ones of the pre-training pass) as the target."""
        p = self.params
        if p.lambda_r > 0:
            if self._cache_features:
                g_feat = torch.cat([job.info.features[ids] for job, ids in zip(sb.jobs, sb.idx)])
            else:
                with torch.no_grad():
                    g_feat = self.global_model.features(weak)
            total = total + p.lambda_r * clients_mean(sb, distill_kl_rows(feat, g_feat, p.tau_r))
        return total

    def warmup_loss(self, sb: StackedBatch) -> torch.Tensor:
        weak, logits, feat, i = self._student(sb)
        ce = clients_cross_entropy(logits.view(*sb.idx.shape, -1), self.noisy_labels[i], sb.mask)
        return self._with_representation(ce, sb, weak, feat)

    def main_loss(self, sb: StackedBatch) -> torch.Tensor:
        p = self.params
        weak, logits, feat, i = self._student(sb)
        high = self._high_noise[:, None].expand(sb.idx.shape).reshape(-1)
        total = clients_mean(sb, self._supervised_terms(logits, i, high))
        if p.lambda_b > 0:  # the teacher: the EMA model on the batch's weak view, or its cached revised logits
            t_logits = sb.copies["ema"](weak).float().flatten(0, 1) if p.teacher == "online" else self._teacher[i]
            total = total + p.lambda_b * clients_mean(sb, distill_kl_rows(logits, t_logits, p.tau_b))
        return self._with_representation(total, sb, weak, feat)

    def begin(self, r: int, clients: list[int], jobs: list[LocalJob]) -> None:
        """Before K clients train: their r_k ≥ β flags (K,); the global backbone (R_k's target) in eval mode."""
        self.global_model.eval()
        self._high_noise = on(torch.tensor([bool(job.info.high_noise) for job in jobs]), self.ctx.device)

    def after_step(self, sb: StackedBatch, stepped: torch.Tensor) -> None:
        """Eq. 12 after every optimiser step: each client's EMA model ← γ_l EMA + (1 - γ_l) its trained model."""
        sb.copies["ema"].lerp_(1.0 - self.params.gamma_l, stepped)

    def upload(self, r: int, k: int, job: LocalJob, nets: dict) -> dict:
        """Keep the client's trained EMA model; upload the loss proxies, or under 'w/o FS' observe them with the
        trained model and sieve on the client's own (unless the sieving is frozen)."""
        idx = self.ctx.data.clients[k]
        self.ema.put(k, nets["ema"].state_dict())
        if self.params.sieving == "federated":
            return {"proxy": (idx.clone(), self.loss_mean[idx.to(self.ctx.device)].clone())}
        if not (self.params.freeze_sieving and r >= self.params.warmup_rounds):
            didx = idx.to(self.ctx.device)
            self._fold_losses(didx, self._pass(nets["model"], idx, ("eval",))["eval"])
            self._apply_sieve(idx, self.loss_mean[didx])
        return {}

    _hooks = dict(upload=upload, begin=begin, after_step=after_step, copies=("ema",))
    stages = {"warmup": Stage(prepare=prepare_warmup, loss=warmup_loss, **_hooks),
              "main": Stage(prepare=prepare_main, loss=main_loss, **_hooks)}

    def _apply_sieve(self, idx: torch.Tensor, proxies: torch.Tensor) -> None:
        p = self.params
        seed = int(self.ctx.rng.randint(2**31 - 1))
        q, clean = sieve(proxies.cpu().numpy(), p.p_threshold, p.gmm_max_iter, p.gmm_tol, p.gmm_reg_covar, seed)
        didx = idx.to(self.ctx.device)
        self.clean_prob[didx] = torch.as_tensor(q, dtype=torch.float32, device=self.ctx.device)
        self.noisy_flag[didx] = torch.as_tensor(~clean, device=self.ctx.device)

    # -- server side ---------------------------------------------------------------------------
    def aggregate(self, r: int, updates) -> None:
        """FedAvg, then Federated Sieving on this round's uploaded proxies, pooled."""
        proxies = [u.uploads["proxy"] for u in self.fedavg(updates) if "proxy" in u.uploads]
        frozen = self.params.freeze_sieving and r >= self.params.warmup_rounds
        if proxies and not frozen:
            self._apply_sieve(torch.cat([i for i, _ in proxies]), torch.cat([v for _, v in proxies]))

    def end_round(self, r: int) -> None:
        super().end_round(r)
        self.round_info.update({f"{key}_mean": float(np.mean(vals)) for key, vals in self._stats.items() if vals})
        data = self.ctx.data
        seen = self.loss_count > 0
        if bool(seen.any()):  # diagnostics against the truth, never used in training
            wrong = self.noisy_labels != data.y_true
            flagged = self.noisy_flag & seen
            self.round_info["sieve_noisy_frac"] = float(flagged.sum() / seen.sum())
            self.round_info["sieve_acc"] = float((flagged == wrong)[seen].float().mean())
        if bool(self.has_reliable.any()):
            self.round_info["reliable_label_acc"] = float((data.given == data.y_true)[self.has_reliable].float().mean())
