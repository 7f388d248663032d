"""FedDiv (Li et al., AAAI'24; feddiv.md §2-§6, §8): a federated noise filter + predictive consistency sampler.

Phase A, warm-up (§2.2): ``warmup_iterations`` passes over the clients in FedCorr's
stage-1 groups (:func:`~.parts.sequential_client_groups`, ``frac1`` = 1/K: one client
per group, each group one engine round, stage "warmup", not evaluated); each client
trains on all its samples with its given labels (MixUp, + L_reg when ``reg_coef`` > 0).
Phase B, ``training.rounds`` main rounds (§2.3, stage "main", the only reported stage):
m = max(int(omega K), 1) clients drawn without replacement, each processed in turn:
global-model losses on the client's augmented data -> min-max normalised -> split by
the global 2-component GMM W(t) (clean = component of smaller mean) -> relabel
candidates (noisy, confidence > zeta, global argmax) -> PCS against the cached
de-biased labels -> gated training set -> local training (MixUp + eta L_reg) ->
local-model outputs -> de-biased label cache and masked momentum prior -> 3 EM steps
from W(t) on the local losses, uploaded. The server averages models with n_k and
filters over every client that has uploaded one (gamma_k = n_k / sum n; variances
with gamma_k^2). W(0) (§2.4): one M-step on synthetic blobs with random responsibilities, as the
code builds it; the code's unseeded blobs come from an independent stream of the seed (A7).

Official code behaviour by default; every documented difference is a switch:
- ``loss_form`` 'double_softmax' (code: CE applied to softmax outputs) | 'logits' (paper);
- ``normalize_losses`` true (code: per-client min-max of the losses) | false (paper);
- ``clean_posterior`` 'strict' (code: clean iff r_clean > 0.5) | 'inclusive' (paper Eq. 7: >= 0.5);
- ``clean_client_rule`` 'le' (code: delta_hat <= clean_set_thres trains on all data) | 'lt' (paper Eq. 11);
- ``participation_gate`` 5 / ``relabel_gate`` 0.2 (code: PCS and relabelled samples only from the
  5th participation on, relabelled samples only when delta_hat > 0.2) | 0 / 0 (paper: no gates);
- ``persistent_relabels`` true (code: relabels written into the working labels, kept across
  rounds) | false (paper: pseudo labels used for this local training only);
- ``pcs_reference`` 'cached' (code: the global prediction is compared once per round with the
  de-biased labels cached at the client's previous participation; R' is relabelled) |
  'local_epoch' (paper Alg. 1: before every local epoch, with the de-biased prediction of the
  model being optimised; every candidate of R is relabelled, Eq. 8, and PCS re-selects per epoch);
- ``prior_mask`` 0.85 (code: prior updated from samples with de-biased confidence > 0.85;
  empty mask keeps the prior) | 0 (paper Eq. 12: every sample);
- ``xi`` 0.2 / ``prior_momentum`` 0.5 (code defaults, A2) | 0.5 / 0.2 (paper);
- ``variance_weights`` 'squared' (code: sigma^2 = sum gamma^2 sigma_k^2) | 'linear' (paper Eq. 5);
- ``em_steps`` 3 (code) | 0 = EM until converged (paper; sklearn's tol 1e-3, 100 steps);
- ``bn_extra_forward`` true (code: an unused forward pass on the un-mixed batch updates BN
  statistics) | false.
``reg_coef``: the code multiplies L_reg by reg_coef twice, so eta = reg_coef**2 (1 for the
non-IID tables, 0 for IID). Table 6 variants: ``filter`` 'degraded' / 'local', ``relabel``,
``pcs``, ``xi`` 0, ``reg_coef`` 0 (§6).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .api import ClientUpdate, FLMethod, LocalJob, MethodParams, param, Phase, METHODS, StackedBatch, Stage
from .api import numerics
from .parts import (GroupPasses, MixupDraw, client_outputs, client_table, double_softmax_loss, minmax_columns,
                    mixup_cross_entropy, mixup_view, reserve_pass, sequential_client_groups, true_noise_rates)

REG_COVAR = 1e-6  # sklearn GaussianMixture's default, as the code's local filters use


@dataclass(frozen=True)
class FedDivParams(MethodParams):
    name = "feddiv"
    slug_fields = (("warmup_iterations", "wu"), ("filter", {"degraded": "degraded", "local": "localfilter"}), ("reg_coef", {1.0: "reg"}))
    warmup_iterations: int = param(5, ge=0, passes=True, doc="T_wu: passes over all clients before training.rounds")
    frac1: float | None = param(None, gt=0, le=1, doc="warm-up group fraction; default 1/K (one client per group)")
    zeta: float = param(0.75, ge=0, le=1, doc="relabel confidence of the global model")
    xi: float = param(0.2, ge=0, doc="de-bias factor (paper 0.5)",
                      switch="0.2 (code default, CLI could not change it) | 0.5 (paper)")
    prior_momentum: float = param(0.5, ge=0, le=1, doc="momentum m of the class prior (paper 0.2)",
                                  switch="0.5 (code default, CLI could not change it) | 0.2 (paper)")
    prior_mask: float = param(0.85, ge=0, lt=1, doc="de-biased confidence above which samples update the prior",
                              switch="0.85 (code: prior from samples with de-biased confidence > 0.85) | 0 (paper Eq. "
                                     "12)")
    reg_coef: float = param(0.0, ge=0, doc="L_reg weight as the code's flag: eta = reg_coef**2 (non-IID 1, IID 0)")
    em_steps: int = param(3, ge=0, doc="EM steps per local filter; 0 = until converged (paper)",
                          switch="3 (code: 3 EM steps per local filter) | 0 (paper: EM until converged)")
    clean_set_thres: float = param(0.1, ge=0, le=1, doc="a client with delta_hat <= this trains on all its data")
    relabel_gate: float = param(0.2, ge=0, le=1, doc="relabelled samples are trained only if delta_hat > this",
                                switch="0.2 (code: relabelled samples trained only if delta_hat > 0.2) | 0 (paper)")
    participation_gate: int = param(5, ge=0, doc="PCS and relabelled samples only from this participation count on",
                                    switch="5 (code: PCS/relabel from the 5th participation) | 0 (paper)")
    filter: str = param("federated", choices=("federated", "degraded", "local"), doc="Table 6 filter variants")
    relabel: bool = True
    pcs: bool = True
    pcs_reference: str = param("cached", choices=("cached", "local_epoch"),
                               switch="'cached' (code: cached de-biased labels, once per round) | 'local_epoch' "
                                      "(paper)")
    variance_weights: str = param("squared", choices=("squared", "linear"),
                                  switch="'squared' (code: gamma^2 for variances) | 'linear' (paper Eq. 5)")
    loss_form: str = param("double_softmax", choices=("double_softmax", "logits"),
                           switch="'double_softmax' (code: CE of softmax outputs) | 'logits' (paper)")
    normalize_losses: bool = param(True, switch="true (code: per-client min-max of the losses) | false (paper)")
    clean_posterior: str = param("strict", choices=("strict", "inclusive"),
                                 switch="'strict' (code: r_clean > 0.5) | 'inclusive' (paper Eq. 7: >= 0.5)")
    clean_client_rule: str = param("le", choices=("le", "lt"),
                                   switch="'le' (code: delta_hat <= clean_set_thres -> all data) | 'lt' (paper Eq. 11)")
    persistent_relabels: bool = param(True, switch="true (code: relabels kept in the working labels) | false (paper)")
    mixup_alpha: float = param(1.0, gt=0)
    bn_extra_forward: bool = param(True,
                                   switch="true (code: unused forward on the un-mixed batch updates BN stats) | false")


# -- pure parts ------------------------------------------------------------------------------
# A filter W is a (3, 2) float64 array: rows weights pi, means mu, variances sigma^2; columns the
# two components in the code's (unsorted) order.


def minmax_normalise(x: np.ndarray) -> np.ndarray:
    """(x - min) / (max - min); all zeros when every value is equal (the code would divide by 0)."""
    x = np.asarray(x, dtype=np.float64)
    return minmax_columns(x) if x.size else x


def _log_responsibilities(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((n, 2) log responsibilities, (n,) log-likelihoods) of x under W, from log(pi_g N(x; mu_g, sigma_g^2))."""
    pi, mu, var = w
    lj = np.log(pi)[None, :] - 0.5 * (np.log(2 * np.pi * var)[None, :] + (x[:, None] - mu[None, :]) ** 2 / var[None, :])
    norm = np.logaddexp(lj[:, 0], lj[:, 1])
    return lj - norm[:, None], norm


def gmm_posteriors(x: np.ndarray, w: np.ndarray, inclusive: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(posterior of the clean component, clean mask); clean = component of the smaller mean."""
    log_resp, _ = _log_responsibilities(np.asarray(x, dtype=np.float64), w)
    r_clean = np.exp(log_resp[:, int(np.argmin(w[1]))])  # as sklearn's predict_proba
    return r_clean, clean_mask(r_clean, inclusive)


def clean_mask(r_clean: np.ndarray, inclusive: bool = False) -> np.ndarray:
    """Code: r_clean > 0.5; paper Eq. 7: r_clean >= 0.5."""
    return (r_clean >= 0.5) if inclusive else (r_clean > 0.5)


def m_step(x: np.ndarray, resp: np.ndarray) -> np.ndarray:
    """sklearn's M-step for a full-covariance 1-D mixture (10 eps added to the counts, REG_COVAR to the variances)."""
    nk = resp.sum(0) + 10 * np.finfo(np.float64).eps
    mu = resp.T @ x / nk
    return np.stack([nk / nk.sum(), mu, (resp * (x[:, None] - mu[None, :]) ** 2).sum(0) / nk + REG_COVAR])


def em_steps(x: np.ndarray, w: np.ndarray, steps: int, tol: float = 1e-3, max_iter: int = 100) -> np.ndarray:
    """``steps`` EM iterations from W (= GaussianMixture(warm_start, max_iter=1) fitted ``steps`` times).

    ``steps`` = 0: iterate until the mean log-likelihood changes by less than ``tol`` (sklearn's
    rule, at most ``max_iter`` steps; the paper's "until converged").
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.array(w, dtype=np.float64)
    if x.size == 0:
        return w
    prev = -np.inf
    for _ in range(steps if steps > 0 else max_iter):
        log_resp, norm = _log_responsibilities(x, w)
        w = m_step(x, np.exp(log_resp))
        bound = norm.mean()
        if steps == 0 and abs(bound - prev) < tol:
            break
        prev = bound
    return w


def aggregate_filters(filters: np.ndarray, sizes: np.ndarray, variance_weights: str = "squared") -> np.ndarray:
    """Server filter (§2.3): gamma_k = n_k / sum n; pi, mu with gamma; variances with gamma^2 (code) or gamma."""
    filters = np.asarray(filters, dtype=np.float64)
    gamma = np.asarray(sizes, dtype=np.float64) / np.sum(sizes)
    gv = gamma ** 2 if variance_weights == "squared" else gamma
    return np.stack([np.einsum("k,kg->g", g, filters[:, row]) for row, g in enumerate((gamma, gamma, gv))])


def pcs_select(clean: torch.Tensor, candidates: torch.Tensor, global_pred: torch.Tensor,
               reference: torch.Tensor, use_pcs: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(C', R'): clean samples and relabel candidates whose global argmax equals the reference label (the code's:
    the cached de-biased label of the client's previous participation); without PCS every one passes."""
    if not use_pcs:
        return clean.clone(), candidates.clone()
    agree = global_pred == reference
    return clean & agree, candidates & agree


def training_set(clean: torch.Tensor, c_prime: torch.Tensor, r_prime: torch.Tensor, delta_hat: float, count: int,
                 participation_gate: int = 5, relabel_gate: float = 0.2, clean_set_thres: float = 0.1,
                 clean_client_rule: str = "le") -> tuple[torch.Tensor, torch.Tensor]:
    """(training mask, relabel mask) of one client (§2.3 step 7).

    count >= gate: C' u R' if delta_hat > relabel_gate else C'; count < gate: all clean samples.
    A clean client (delta_hat <= / < clean_set_thres) trains on everything and relabels nothing;
    otherwise R' is relabelled (even when not trained on).
    """
    is_clean_client = delta_hat <= clean_set_thres if clean_client_rule == "le" else delta_hat < clean_set_thres
    if is_clean_client:
        return torch.ones_like(clean), torch.zeros_like(clean)
    if count < participation_gate:
        return clean.clone(), r_prime.clone()
    return (c_prime | r_prime if delta_hat > relabel_gate else c_prime.clone()), r_prime.clone()


def debias_prior_update(logits: torch.Tensor, probs: torch.Tensor, prior: torch.Tensor, xi: float,
                        mask_thres: float = 0.85, momentum: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """(de-biased labels, new prior) (Eqs. 9, 12 as the code): q = softmax(z - xi log p_old);
    p <- m p + (1 - m) mean of the probabilities of samples with max q > mask_thres (empty: p kept)."""
    conf, labels = F.softmax(logits - xi * numerics.log(prior)[None, :], dim=1).max(1)
    mask = conf > mask_thres
    if not bool(mask.any()):
        return labels, prior.clone()
    return labels, momentum * prior + (1.0 - momentum) * probs[mask].mean(0)


def label_balance_regulariser(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """L_reg = sum_c (1/C) log((1/C) / q_c), q = batch mean of softmax (Eq. 14); 0 when q is uniform. K clients:
    logits (K, B, C), mask (K, B) real rows or None -> (K,); q is the mean over each client's real rows (a
    client riding along without a batch: uniform, 0)."""
    c = logits.shape[-1]
    probs = F.softmax(logits, dim=-1)
    if mask is None:
        q = probs.mean(1)
    else:
        rows = mask.sum(1, keepdim=True)
        q = torch.where(mask[..., None], probs, torch.zeros((), dtype=probs.dtype, device=probs.device)).sum(1)
        q = torch.where(rows > 0, q / rows.clamp_min(1).to(probs.dtype), torch.full_like(q, 1.0 / c))
    return (torch.log(torch.tensor(1.0 / c, device=logits.device)) - torch.log(q)).sum(-1) / c


def initial_filter_data(seed: int) -> np.ndarray:
    """The 1,000 points W(0) is fitted on, as the code's train_data.py makes them: ``make_blobs(n_samples=1000,
    n_features=1, centers=2, shuffle=False)`` (unit-variance blobs, centres uniform in [-10, 10], the first 500
    points one blob), standardised (StandardScaler), min-max scaled.

    The code draws them from numpy's global state at import time, before the run is seeded: unseeded, and
    independent of the responsibilities' ``RandomState(args.seed)``. Here they come from the seed's first
    ``SeedSequence`` child (A7), a stream independent of ``RandomState(seed)``.
    """
    from sklearn.datasets import make_blobs  # lazy: scikit-learn takes ~1 s to import; only this step uses it

    stream = np.random.RandomState(np.random.MT19937(np.random.SeedSequence(int(seed), spawn_key=(0,))))
    x, _ = make_blobs(n_samples=1000, n_features=1, centers=2, shuffle=False, random_state=stream)
    x = x[:, 0].astype(np.float64)
    return minmax_normalise((x - x.mean()) / x.std())


def initial_filter(seed: int) -> np.ndarray:
    """W(0) (§2.4), as the code's server.py / gmm.py build it: ``GaussianMixture(n_components=2,
    init_params='random', random_state=args.seed)`` initialised on :func:`initial_filter_data`, i.e.
    responsibilities ``RandomState(seed).uniform(size=(1000, 2))``, rows normalised, and one M-step
    (reg_covar 1e-6); no EM step. W(0) for seed s is then one draw of the code's W(0) for args.seed = s.
    """
    x = initial_filter_data(seed)
    resp = np.random.RandomState(seed).uniform(size=(len(x), 2))
    resp /= resp.sum(1, keepdims=True)
    return m_step(x, resp)


@dataclass
class ClientPlan:
    """What a client's preparation decided, for its loss and its upload (LocalJob.info)."""

    labels: torch.Tensor  # the label array training reads (working labels, or a copy with this round's relabels)
    delta: float = 0.0  # delta_hat: the filter's noisy fraction
    relabel: torch.Tensor | None = None  # relabelled samples (mask over the client's samples)
    train_idx: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))  # last training set


# -- the method ------------------------------------------------------------------------------


@METHODS.register
class FedDiv(GroupPasses, FLMethod):
    Params = FedDivParams
    paper = "FedDiv (AAAI'24)"
    reported_stages = ("main",)
    persistent = ("global_filter", "filter_cache", "cached", "local_filters", "priors", "counts", "delta_hat",
                  "debiased", "warmup_groups")
    passes_param = "warmup_iterations"
    pass_stage = "warmup"  # schedule

    def __init__(self, params: FedDivParams, ctx):
        super().__init__(params, ctx)
        self.init_passes()
        data = ctx.data
        k, c = data.num_clients, data.num_classes
        self.sizes = data.sizes()
        self.global_filter = initial_filter(ctx.seed)
        self.filter_cache = np.zeros((k, 3, 2))
        self.cached = np.zeros(k, dtype=bool)
        self.local_filters = np.repeat(self.global_filter[None], k, axis=0)
        self.priors = torch.full((k, c), 1.0 / c, device=ctx.device)
        self.counts = np.zeros(k, dtype=np.int64)
        self.delta_hat = np.full(k, np.nan)
        self.debiased = torch.zeros(len(data.train), dtype=torch.int64, device=ctx.device)
        self.warmup_groups: list[list[int]] = []
        self._true_noise = true_noise_rates(data)  # before any relabel

    # -- schedule ------------------------------------------------------------------------
    def stage_name(self, r: int) -> str:
        return "warmup" if r < self.pre_rounds else "main"

    def select_clients(self, r: int) -> list[int]:
        if r >= self.pre_rounds:
            return super().select_clients(r)
        ctx, g = self.ctx, r % self.groups_per_iteration
        if g == 0:  # a new warm-up iteration: a fresh random pass over the clients
            self.warmup_groups = sequential_client_groups(ctx.rng, ctx.data.num_clients, self.params.frac1)
            assert len(self.warmup_groups) == self.groups_per_iteration
        return list(self.warmup_groups[g])

    # -- a client ------------------------------------------------------------------------
    def _phase(self, **kw) -> Phase:
        """A local training phase: the engine makes the train view ("weak") and mixup's draws (declared, so
        the batched engine draws them ahead in the sequential order)."""
        return Phase(augment="raw", views=("weak",), draws=MixupDraw(self.params.mixup_alpha), **kw)

    def loss(self, sb: StackedBatch) -> torch.Tensor:
        """MixUp CE on the plan's labels, + eta L_reg (eta = reg_coef**2: the code multiplies by reg_coef twice),
        of K clients -> (K,) (warm-up and main rounds)."""
        p = self.params
        y = torch.stack([job.info.labels[sb.idx[i]] for i, job in enumerate(sb.jobs)])
        x = sb.views["weak"]
        if p.bn_extra_forward:
            with torch.no_grad():
                sb.forward(x)  # output unused: the code's extra pass, it moves the BN running statistics
        lam, perm = sb.draws
        out = sb.forward(mixup_view(x, lam, perm))
        loss = mixup_cross_entropy(out, y, lam, perm, sb.mask)
        eta = p.reg_coef * p.reg_coef
        if eta > 0:
            loss = loss + eta * label_balance_regulariser(out, sb.mask)
        return loss

    def warm_up(self, r: int, k: int, nets: dict) -> LocalJob:
        return LocalJob(phases=[self._phase()], lr_round=self.lr_round(r), info=ClientPlan(self.ctx.data.given))

    def _per_sample_loss(self, logits: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
        loss = (double_softmax_loss(probs, labels) if self.params.loss_form == "double_softmax"
                else F.cross_entropy(logits, labels, reduction="none")).double().cpu().numpy()
        return minmax_normalise(loss) if self.params.normalize_losses else loss

    def _filter_for(self, k: int) -> np.ndarray:
        return self.local_filters[k] if self.params.filter == "local" else self.global_filter

    def prepare_main(self, r: int, k: int, nets: dict) -> LocalJob:
        """Steps 1-8: filter split of the global model's losses, relabels, PCS, the gated training set."""
        p, ctx = self.params, self.ctx
        idx = ctx.data.clients[k]
        dev_idx = idx.to(ctx.device)
        # 1-3: global-model losses, split by the filter
        logits_g, probs_g, _ = client_outputs(ctx, self.global_model, idx)
        _, clean_np = gmm_posteriors(self._per_sample_loss(logits_g, probs_g, ctx.data.given[dev_idx]),
                                     self._filter_for(k), p.clean_posterior == "inclusive")
        clean = torch.as_tensor(clean_np, device=ctx.device)
        delta = 1.0 - float(clean_np.mean()) if len(idx) else 0.0
        conf_g, pred_g = probs_g.max(1)
        # 4-6: relabel candidates; PCS (the cache is seeded by the global prediction at the first participation)
        candidates = ~clean & (conf_g > p.zeta) if p.relabel else torch.zeros_like(clean)
        select = lambda ref: training_set(  # noqa: E731  (7: gated training set and relabels)
            clean, *pcs_select(clean, candidates, pred_g, ref, p.pcs), delta, int(self.counts[k]),
            p.participation_gate, p.relabel_gate, p.clean_set_thres, p.clean_client_rule)
        bs = ctx.settings.batch_size
        if p.pcs_reference == "cached":
            train, relabel = select(pred_g if self.counts[k] == 0 else self.debiased[dev_idx])
            plan = ClientPlan(self._apply_relabels(r, k, idx, relabel, pred_g), delta, relabel, idx[train.cpu()])
            # 8: local training only on more than one batch
            phases = [self._phase(streams={"data": (plan.train_idx, bs)})] if len(plan.train_idx) > bs else []
        else:
            relabel = select(pred_g)[1] & candidates  # Eq. 8: every candidate of a noisy client
            plan = ClientPlan(self._apply_relabels(r, k, idx, relabel, pred_g), delta, relabel)
            phases = self._epoch_pcs(k, idx, select, plan, nets[self.networks[0]])
        return LocalJob(phases=phases, lr_round=self.lr_round(r), info=plan)

    def _epoch_pcs(self, k, idx, select, plan: ClientPlan, model):
        """Paper Alg. 1 lines 15-18: before each local epoch, PCS against the de-biased prediction
        of the model being optimised (a generator: each set sees the previous epoch's training)."""
        ctx, p, bs = self.ctx, self.params, self.ctx.settings.batch_size
        for _ in range(ctx.settings.local_epochs):
            logits, _, _ = client_outputs(ctx, model, idx)
            reference = (logits - p.xi * torch.log(self.priors[k])[None, :]).argmax(1)
            plan.train_idx = idx[select(reference)[0].cpu()]
            if len(plan.train_idx) > bs:
                yield self._phase(streams={"data": (plan.train_idx, bs)}, epochs=1)

    def main_upload(self, r: int, k: int, job: LocalJob, nets: dict) -> dict:
        """Steps 9, 11, 12: the local model's de-biased labels and prior, and its filter (EM from W(t)
        on the local losses, labels as trained)."""
        p, ctx, plan = self.params, self.ctx, job.info
        idx = ctx.data.clients[k]
        dev_idx = idx.to(ctx.device)
        logits_l, probs_l, _ = client_outputs(ctx, nets[self.networks[0]], idx, drawn=job.reserved)
        debiased, prior = debias_prior_update(logits_l, probs_l, self.priors[k], p.xi, p.prior_mask, p.prior_momentum)
        w_k = em_steps(self._per_sample_loss(logits_l, probs_l, plan.labels[dev_idx]), self._filter_for(k), p.em_steps)
        return {"train_loss": float(np.mean(job.losses)) if job.losses else float("nan"), "filter": w_k,
                "delta_hat": plan.delta, "train_size": int(len(plan.train_idx)), "relabelled": int(plan.relabel.sum()),
                "debiased": debiased, "prior": prior}

    def stage_key(self, r: int) -> str:
        # pcs_reference 'local_epoch' re-selects the training set before each local epoch with a detection pass
        # on the model being trained (a generator of phases, drawing between epochs): its own row, sequential
        key = self.stage_name(r)
        return "main_epoch_pcs" if key == "main" and self.params.pcs_reference == "local_epoch" else key

    # main rounds batch: the prepare's detection pass draws at its place (the engine draws each client's
    # training right after its prepare), the upload's is reserved (reserve_pass) right after the training
    # draws, and a client whose gated set is at most one batch trains nothing (no phase: a rider)
    stages = {"warmup": Stage(prepare=warm_up, loss=loss),
              "main": Stage(prepare=prepare_main, upload=main_upload, loss=loss, reserve=reserve_pass),
              "main_epoch_pcs": Stage(prepare=prepare_main, upload=main_upload, loss=loss, batches=False)}

    def _apply_relabels(self, r: int, k: int, idx: torch.Tensor, relabel: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """Write R' <- global argmax; returns the label array training reads (working labels, or a round copy)."""
        given = self.ctx.data.given
        if not bool(relabel.any()):
            return given
        sel, new = idx[relabel.cpu()], pred[relabel]
        if self.params.persistent_relabels:
            self.ctx.data.relabel(sel, new, r, "main", k)
            return given
        labels = given.clone()  # paper: pseudo labels for this local training only
        labels[sel.to(given.device)] = new
        return labels

    # -- server --------------------------------------------------------------------------
    def aggregation_weight(self, upd: ClientUpdate) -> float:
        return float(upd.num_samples)  # Eq. 1: full local sizes n_k

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        if r >= self.pre_rounds and self.params.filter == "degraded":
            self.cached[:] = False  # the degraded filter sees only this round's clients

    def aggregate(self, r: int, updates) -> None:
        ups = [u for u in self.fedavg(updates) if "filter" in u.uploads]
        if not ups:  # warm-up
            return
        for u in ups:  # the clients' state: de-biased label cache, prior, filter, participations
            k, up = u.client, u.uploads
            self.debiased[self.ctx.data.clients[k].to(self.ctx.device)] = up["debiased"]
            self.priors[k] = up["prior"]
            self.counts[k] += 1
            self.delta_hat[k] = up["delta_hat"]
            if self.params.filter == "local":
                self.local_filters[k] = up["filter"]
            else:
                self.filter_cache[k] = up["filter"]
                self.cached[k] = True
        if self.params.filter != "local":
            ks = np.flatnonzero(self.cached)
            self.global_filter = aggregate_filters(self.filter_cache[ks], self.sizes[ks], self.params.variance_weights)
        self.round_info = {
            "delta_hat_mean": float(np.mean([u.uploads["delta_hat"] for u in ups])),
            "train_fraction": float(sum(u.uploads["train_size"] for u in ups) / sum(u.num_samples for u in ups)),
            "relabelled": float(sum(u.uploads["relabelled"] for u in ups)),
        }

    # -- outputs -------------------------------------------------------------------------
    def client_results(self):
        data = self.ctx.data
        return client_table(data, self._true_noise, noise_rate_now=true_noise_rates(data), delta_hat=self.delta_hat,
                            participations=self.counts)
