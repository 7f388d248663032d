"""DivideMix (Li et al. 2020) inside FL: FedGR's "FL-DivideMix" and FedDiv's "DivideMix" (FedCorr's
adaptation); baselines.md §10, A9, pitfalls §19.4-6.

Two global networks net1/net2, each FedAvg-aggregated on its own.

* Warm-up (rounds t < W, stage ``warmup``): a client trains each network on its own with plain CE
  (net1's local epochs, then net2's).
* Afterwards (stage ``dividemix``), at the start of every local epoch the client co-divides its data:
  for each network, the per-sample CE of every local sample (eval mode, no augmentation) is min-max
  normalised and a 2-component 1-D GMM is fitted; w_i = posterior of the lower-mean component,
  labelled X = {w_i > τ_p}, unlabelled U = the rest. Then net1 trains one epoch on net2's
  division with net2 frozen (eval mode), then net2 one epoch on net1's division (DivideMix's
  interleaving; both divisions are taken before either network trains in that epoch). One step on a
  labelled batch (two weak views x', x'') and an unlabelled batch (u', u''), network A, peer B:
  - co-refinement ȳ = sharpen(w·y + (1 − w)·mean(p_A(x'), p_A(x'')), T);
  - co-guessing q = sharpen(mean of p over {A, B} × {u', u''}, T);
  - MixMatch on [x', x'', u', u''] / [ȳ, ȳ, q, q] with λ' = max(λ, 1 − λ), λ ~ Beta(α, α), one
    permutation partner per row;
  - L = L_x + λ_u(t)·L_u + L_reg (soft CE on the mixed labelled rows, mean squared error of the
    softmax on the mixed unlabelled rows, Σ_c (1/C) log((1/C)/p̄_c) over the whole mixed batch),
    λ_u(t) = λ_u·clip((t − W)/rampup, 0, 1), t = round + fraction of the round's local steps done.
  An empty X or U (§10(d)): that network trains with CE on all local data for that epoch.
* Evaluation (§10(c), A9): ``evaluate='ensemble'`` scores :class:`EnsembleModel`, whose forward
  returns log of the mean of both networks' softmax (argmax = DivideMix's test prediction);
  'net1' scores net1 alone. Either way ``acc_net1``/``acc_net2`` are logged each round, and after
  warm-up ``labelled_frac`` (mean share of a client's samples in X) and ``labelled_clean_frac``
  (share of X whose given label is the true one; a diagnostic, never used in training).

There is no code≠paper switch: no official FL code exists (FedRN's FL DivideMix uses GMM
max_iter 100; the default here is DivideMix's 10, a parameter).

Decided where the spec was silent:
- warm-up default 50 rounds (A9: FedCorr's CIFAR-10 pre-processing budget; 100 for CIFAR-100 /
  Clothing1M, 100 for FedGR: set per table);
- the guessing/refinement forward passes of A run in train mode under no_grad (as DivideMix's
  train loop does: its BN statistics move), the peer B in eval mode;
- labelled and unlabelled batches both use training.batch_size; the labelled stream sets the
  epoch length (DivideMix's num_iter), the unlabelled one cycles;
- a degenerate loss distribution (fewer than 2 samples, or all losses equal: min-max would
  divide by 0, §19.4) gives w = 1 for every sample, so U is empty and the CE fallback runs;
- the GMM's random_state is drawn from ctx.rng (one draw per division, also when the guard skips
  the fit), so a resumed run is exact;
- the two networks are initialised by two successive ``ctx.new_model()`` calls, i.e. differently
  (§10(e), §19.5);
- the mean local loss uploaded is the mean over the client's phases (network epochs) of their mean batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .api import evaluate, FLMethod, LocalJob, MethodParams, param, Phase, predict, METHODS, Stage, warm_up_then
from .api import numerics
from .parts import check_rounds_left, fit_two_gaussians, minmax_columns
from ..randaugment import mix_targets, mixup


@dataclass(frozen=True)
class DivideMixParams(MethodParams):
    name = "dividemix"
    slug_fields = ("warmup_rounds",)
    warmup_rounds: int = param(50, ge=0, rounds=True, doc="W: rounds of plain CE for both networks (§10(a))")
    temperature: float = param(0.5, gt=0, doc="T: sharpening temperature")
    p_threshold: float = param(0.5, gt=0, lt=1, doc="τ_p: GMM clean-posterior threshold for the labelled set")
    lambda_u: float = param(25.0, ge=0, doc="weight of the unlabelled loss after the ramp")
    alpha: float = param(4.0, gt=0, doc="MixMatch Beta(α, α) parameter")
    rampup_rounds: int = param(16, ge=1, rounds=True, doc="rounds over which λ_u ramps up linearly after W")
    gmm_max_iter: int = param(10, ge=1, doc="EM iterations of the co-divide GMM (DivideMix: 10)")
    gmm_tol: float = param(1e-2, gt=0, doc="EM convergence tolerance of the co-divide GMM")
    gmm_reg_covar: float = param(5e-4, gt=0, doc="variance floor of the co-divide GMM")
    evaluate: str = param("ensemble", choices=("ensemble", "net1"),
                          doc="evaluated model: mean softmax of both networks (§10(c)) or net1")

    def check_training(self, settings) -> None:
        check_rounds_left(self, "warmup_rounds", settings, "(DivideMix would never run); lower warmup_rounds")


# -- pure parts ----------------------------------------------------------------------------


def sharpen(p: torch.Tensor, temperature: float) -> torch.Tensor:
    """p^{1/T} / Σ_c p^{1/T}, row-wise."""
    q = p.pow(1.0 / temperature)
    return q / q.sum(1, keepdim=True)


def co_refine(one_hot: torch.Tensor, w: torch.Tensor, probs_views: list[torch.Tensor], temperature: float) -> torch.Tensor:
    """Label co-refinement: sharpen(w·y + (1 − w)·mean of the network's softmax over the views)."""
    w = w.view(-1, 1)
    mean = torch.stack(probs_views).mean(0)
    return sharpen(w * one_hot + (1 - w) * mean, temperature)


def co_guess(probs: list[torch.Tensor], temperature: float) -> torch.Tensor:
    """Label co-guessing: sharpen(mean softmax over both networks × both views)."""
    return sharpen(torch.stack(probs).mean(0), temperature)


def unlabelled_weight(t: float, lambda_u: float, warmup: int, rampup: int) -> float:
    """λ_u(t) = λ_u · clip((t − W) / rampup, 0, 1); t in rounds, fractional within a round."""
    return lambda_u * float(np.clip((t - warmup) / rampup, 0.0, 1.0))


def prior_penalty(logits: torch.Tensor) -> torch.Tensor:
    """L_reg = Σ_c (1/C) log((1/C) / p̄_c), p̄ = the batch-mean softmax (0 when p̄ is uniform)."""
    c = logits.shape[1]
    mean = F.softmax(logits, dim=1).mean(0)
    prior = torch.full_like(mean, 1.0 / c)
    return (prior * (numerics.log(prior) - numerics.log(mean))).sum()


def mixmatch_loss(logits_x: torch.Tensor, targets_x: torch.Tensor, logits_u: torch.Tensor, targets_u: torch.Tensor,
                  weight_u: float) -> torch.Tensor:
    """L_x + λ_u L_u + L_reg on a mixed batch (labelled rows first, then unlabelled rows)."""
    l_x = -(F.log_softmax(logits_x, dim=1) * targets_x).sum(1).mean()
    l_u = (F.softmax(logits_u, dim=1) - targets_u).pow(2).mean()
    return l_x + weight_u * l_u + prior_penalty(torch.cat([logits_x, logits_u]))


def normalise_losses(losses: np.ndarray) -> np.ndarray | None:
    """Min-max to [0, 1]; None when the distribution is degenerate (< 2 samples or all equal)."""
    if losses.size < 2 or not losses.max() > losses.min():
        return None
    return minmax_columns(losses)


def clean_posterior(losses: np.ndarray, max_iter: int, tol: float, reg_covar: float, seed: int) -> np.ndarray:
    """w_i: posterior of the lower-mean component of a 2-component 1-D GMM on the min-max-normalised
    losses (float64); 1 for every sample when the losses are degenerate (§19.4 guard)."""
    x = normalise_losses(np.asarray(losses, dtype=np.float64).reshape(-1))
    if x is None:
        return np.ones(np.asarray(losses).size)
    x = x.reshape(-1, 1)
    gmm = fit_two_gaussians(x, seed, max_iter=max_iter, tol=tol, reg_covar=reg_covar)
    return gmm.predict_proba(x)[:, int(np.argmin(gmm.means_.reshape(-1)))]


class EnsembleModel(torch.nn.Module):
    """Both global networks as one classifier: forward returns log(mean_m softmax(f_m(x))).

    Log-probabilities, so argmax is DivideMix's test prediction (the mean softmax's argmax) and
    softmax of the output gives back the mean probabilities; ``eval()`` reaches both networks.
    The networks are shared, not copied: the module always scores the current globals.
    """

    def __init__(self, *nets: torch.nn.Module):
        super().__init__()
        self.nets = torch.nn.ModuleList(nets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.stack([F.softmax(net(x).float(), dim=1) for net in self.nets]).mean(0)
        return numerics.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))


# -- the method ----------------------------------------------------------------------------


@METHODS.register
class DivideMix(FLMethod):
    Params = DivideMixParams
    paper = "Li et al. 2020 (ICLR), inside FL; baseline in FedGR (FL-DivideMix) and FedDiv (via FedCorr)"
    networks = ("net1", "net2")

    @classmethod
    def schedule(cls, params, settings, num_clients):
        return warm_up_then(params.warmup_rounds, settings, num_clients, "dividemix")

    def __init__(self, params: DivideMixParams, ctx):
        super().__init__(params, ctx)
        self.ensemble = EnsembleModel(*(self.globals[n] for n in self.networks))
        # each sample's clean posterior under the peer's latest GMM (overwritten every epoch, not state)
        self._clean_w = torch.zeros(len(ctx.data.train), device=ctx.device)
        self._division: dict[str, list[float]] = {}

    def stage_name(self, r: int) -> str:
        return "warmup" if r < self.params.warmup_rounds else "dividemix"

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self._division = {"labelled": [], "labelled_clean": []}

    # -- co-divide ---------------------------------------------------------------------------
    def divide(self, net: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
        """Clean posteriors w (device, aligned with ``idx``) from ``net``'s per-sample CE (eval, no augmentation)."""
        ctx, p = self.ctx, self.params
        logits = predict(ctx, net, ctx.data.train, idx)
        losses = F.cross_entropy(logits, ctx.data.given[idx.to(ctx.device)], reduction="none")
        seed = int(ctx.rng.randint(2**31 - 1))  # drawn even when the guard skips the fit: one draw per division
        w = clean_posterior(losses.cpu().numpy(), p.gmm_max_iter, p.gmm_tol, p.gmm_reg_covar, seed)
        return torch.as_tensor(w, dtype=torch.float32, device=ctx.device)

    # -- local training ------------------------------------------------------------------------
    def warm_up(self, r: int, k: int, nets: dict) -> LocalJob:
        """Each network on its own with the stage's plain CE: net1's local epochs, then net2's."""
        return LocalJob(phases=[Phase(train=(n,)) for n in self.networks])

    def co_divide(self, r: int, k: int, nets: dict) -> LocalJob:
        return LocalJob(phases=self._co_divide_phases(r, k, nets))

    def _co_divide_phases(self, r: int, k: int, nets: dict):
        """Per local epoch: divide with both networks (both before either trains), then one epoch of
        each network on its peer's division. A generator: each division sees the previous epoch's training."""
        idx = self.ctx.data.clients[k]
        for epoch in range(self.ctx.settings.local_epochs):
            weights = {n: self.divide(nets[n], idx) for n in self.networks}
            for name, peer in (("net1", "net2"), ("net2", "net1")):  # trained network, peer whose division it uses
                yield self._epoch_phase(r, epoch, name, nets[peer], idx, weights[peer])

    def _epoch_phase(self, r, epoch, name, peer, idx, w) -> Phase:
        """One local epoch of network ``name`` on the peer's division (clean posteriors ``w``; MixMatch), or the
        stage's CE on all data when X or U is empty (§10(d)). The division's shares are logged."""
        ctx, data = self.ctx, self.ctx.data
        labelled = w > self.params.p_threshold
        mask = labelled.cpu()
        lab, unl = idx[mask], idx[~mask]
        self._division["labelled"].append(float(labelled.float().mean()))
        if len(lab):
            at = lab.to(data.given.device)
            self._division["labelled_clean"].append(float((data.given[at] == data.y_true[at]).float().mean()))
        if len(lab) == 0 or len(unl) == 0:
            return Phase(train=(name,), epochs=1)
        self._clean_w[idx.to(ctx.device)] = w
        bs = ctx.settings.batch_size
        steps = len(lab) // bs if ctx.settings.drop_last else -(-len(lab) // bs)
        peer.eval()  # frozen: no BN statistics move, no gradient

        def loss(b):
            t = r + (epoch + b.step / max(steps, 1)) / ctx.settings.local_epochs
            weight_u = unlabelled_weight(t, self.params.lambda_u, self.params.warmup_rounds, self.params.rampup_rounds)
            return self.mixmatch_step(b.model, peer, b.streams["labelled"], b.streams["unlabelled"], weight_u)

        return Phase(loss=loss, train=(name,), streams={"labelled": (lab, bs), "unlabelled": (unl, bs)},
                     augment="raw", epochs=1)

    def mixmatch_step(self, net, peer, labelled, unlabelled, weight_u: float) -> torch.Tensor:
        """DivideMix's loss for one labelled + one unlabelled batch (uint8 images, sample indices)."""
        ctx, p = self.ctx, self.params
        (xl, il), (xu, _) = labelled, unlabelled
        dev_il = il.to(ctx.device, non_blocking=True)
        x1, x2 = ctx.pipeline.views(xl, ctx.aug_gen, ("weak:1", "weak:2")).values()
        u1, u2 = ctx.pipeline.views(xu, ctx.aug_gen, ("weak:1", "weak:2")).values()
        with torch.no_grad():
            soft = lambda m, x: F.softmax(m(x).float(), dim=1)  # noqa: E731
            q = co_guess([soft(net, u1), soft(net, u2), soft(peer, u1), soft(peer, u2)], p.temperature)
            y = F.one_hot(self.labels(il), ctx.data.num_classes).float()
            ybar = co_refine(y, self._clean_w[dev_il], [soft(net, x1), soft(net, x2)], p.temperature)
        inputs = torch.cat([x1, x2, u1, u2])
        targets = torch.cat([ybar, ybar, q, q])
        mixed, ta, tb, lam = mixup(inputs, targets, p.alpha, ctx.aug_gen, keep_major=True)
        mixed_targets = mix_targets(ta, tb, lam)
        logits = net(mixed).float()
        n_x = 2 * len(il)
        return mixmatch_loss(logits[:n_x], mixed_targets[:n_x], logits[n_x:], mixed_targets[n_x:], weight_u)

    # The co-divide stage stays sequential: each epoch's labelled/unlabelled sets, and so the sizes of its
    # shuffles and draws, come from the client's previous epoch, so no batched order can reproduce the
    # sequential draws of the next client. The warm-up batches (two phases on distinct networks).
    stages = {"warmup": Stage(loss=FLMethod.loss, prepare=warm_up),
              "dividemix": Stage(loss=FLMethod.loss, prepare=co_divide, batches=False)}

    # -- server side, outputs --------------------------------------------------------------------
    def end_round(self, r: int) -> None:
        for key, vals in self._division.items():
            if vals:
                self.round_info[f"{key}_frac"] = float(np.mean(vals))
        for n in self.networks:  # §10(c): log each network too
            self.round_info[f"acc_{n}"] = evaluate(self.ctx, self.globals[n])["acc"]

    def eval_model(self) -> torch.nn.Module:
        return self.ensemble if self.params.evaluate == "ensemble" else self.globals["net1"]
