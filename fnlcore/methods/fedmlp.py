"""FedMLP (Sun et al., MICCAI'24; fedmlp.md §2): federated multi-label learning with missing classes.

Client k annotates its classes A_k; the others (M_k) are 0 in its labels (fedmlp.md §1).

- Multi-label logit adjustment (§2.1): p~_c = sigma(z_c + tau log(pi_c / (1 - pi_c))), l_LA =
  BCE(p~, y) (log clamped at -100 as ``F.binary_cross_entropy``); pi_c = n_c^+ / N_k on the client,
  for missing classes |P^k_{c,1}| / N_k (its pseudo-positives so far; 0 in the warm-up, unused).
  Computed in logit space (the code's p pi / (p pi + (1 - p)(1 - pi)) with NaN -> 0 is the same
  function; pi = 0 or 1 gives a shift of -inf / +inf, i.e. p~ = 0 / 1 with no NaN).
- Weighted-partial-class loss (§2.2): L_WPC = sum over the batch and A_k of l_LA / (B |A_k|),
  B the nominal batch size.
- Warm-up, rounds < warmup_rounds (§2.3): two weak views; L = 1/2 [L_WPC(x1) + L_WPC(x2)] +
  1/2 [D(x1) + D(x2)], D = sum over M_k of (sigma(z) - sigma(z^G))^2 / (B |M_k|), teacher = the
  received global model in eval mode (the distillation is in the code, not the paper's text).
- Dual prototypes and learning degrees (§2.4), after local training from round warmup_rounds - 1
  on: the trained local model (eval mode, one augmented view, no shuffling) gives per active class
  the mean feature of its negatives P_{c,0} and positives P_{c,1} (0 if none), per missing class
  the learning degree d_c = |{p < L or p > U}| / N_k. The server averages prototypes over the
  clients that label c and degrees over those that miss it (N_k-weighted; NaN prototype: nobody
  labels c, no pseudo-labels; d^G = 1: nobody misses c); the new averages replace the old.
- Missing-label detection with the self-adaptive threshold (§2.5), at the start of every stage-2
  local update: received global model (eval, one augmented view) features f_i;
  s_ic = cos(f_i, P^G_{c,0}) - cos(f_i, P^G_{c,1}) over the samples R_c not yet pseudo-labelled
  for c; S_0 = {s >= 0}, S_1 = {s < 0}; the floor(lambda_0 d^G_c |S_0|) samples with the largest s
  become 0, the floor(lambda_1 d^G_c |S_1|) with the smallest s become 1 (stable order; permanent).
  [CODE] ``pos_needs_neg`` (default true, the released code as it runs): a class that gets no
  pseudo-negatives in a round (n_0 = 0) gets no pseudo-positives either that round
  (``utils/local_training.py`` lines 1076 and 1099 at 2ad28b8 test ``len(max_m_indices_list) == 0``
  twice, the second meant to be the pseudo-positive list; fedmlp.md §2.5); false: S_0 and S_1
  are selected independently (the paper).
- Stage 2 (§2.6), one weak view: supervised entries (A_k, pseudo-labelled) get l_LA, the uncertain
  ones (sigma(z) - sigma(z^G))^2; L = [sum s l_LA + sum u mse] / [sum s + sum u].

Switches (code≠paper, fedmlp.md §0 and §9.1; the released code is an ablation snapshot):
- ``tau`` 1.0 (paper Eq. 3; the code's commented "abu1" lines) | 0 (HEAD code: LA commented out);
- ``st`` true (paper: tau_n = lambda_n d^G_c) | false (HEAD code: tau_n = lambda_n).
  [CODE≠PAPER] (fedmlp.md §2.5) the code's commented-out ST lines use tau_n = d^G_c alone
  (``int(tao[cls] * len(...))``), not lambda_n d^G_c; the paper's equation is ambiguous between
  the two and the spec recommends lambda_n d^G_c (implemented); d^G_c alone is not offered;
- ``pos_needs_neg`` true (code as it runs, see §2.5 above) | false (paper: S_0 and S_1 independent);
- ``cr`` 'both' (paper Sec. 2.4 / the commented stage-2 line) | 'warmup' (HEAD code: stage-2
  consistency term commented out, L = sum s l_LA / sum s) | 'none'.
Table 3 ablation rows (fedmlp.md §8, cumulative): FedAvg = method ``fedavg``; +MLD = ``wpc: false,
cr: none, st: false`` (pseudo-labels injected into FedAvg's BCE(pos_weight) over all classes, the
uncertain missing entries 0, / (B C)); +MLD+WPC = ``cr: none, st: false``; +MLD+WPC+CR =
``st: false``; full = the defaults. ``mld: false`` drops the detection (every missing entry stays
uncertain). HEAD code = ``tau: 0, st: false, cr: warmup``.

Decisions where the spec is silent: the warm-up keeps its two views whatever the switches;
``wpc: false`` with CR puts the uncertain entries into the MSE term (and the labelled ones into
BCE(pos_weight)) with the stage-2 normalisation; a client's annotated classes are those annotated
on all of its samples; pseudo-label counts and their agreement with the true labels (an oracle,
logged only) are reported per round.

Engines: every round batches. With ``mld`` on, the stage-2 detection (an augmented pass of the
global model, in the prepare) and the upload from round warmup_rounds - 1 on (prototypes and
degrees: an augmented pass of the trained model) draw random numbers; the upload declares them
(``reserve``) so the batched engine draws them where the sequential engine does.

Per-round outputs (metrics.parquet; with ``mld`` on): ``mld_degree_<c>``, the global learning
degree d^G_c aggregated at the end of the round (from round warmup_rounds - 1 on; the next round's
detection uses it), so that a run shows when d^G stays 0 and ST labels nothing (fedmlp.md §2.5:
it does at small scale); from warmup_rounds on ``mld_pseudo_pos`` / ``mld_pseudo_neg`` (totals
so far), ``mld_new_pos`` / ``mld_new_neg`` (labelled this round), ``mld_dropped_pos`` (the
pseudo-positives ``pos_needs_neg`` discarded this round) and ``mld_agreement``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from .api import (draw_predict, FLMethod, forward_bounded, LocalJob, MethodParams, param, Phase, METHODS,
                  StackedBatch, Stage)
from .logit_adjust import la_bce, la_shift
from .multilabel import partial_bce
from .partial_label_losses import missing_distillation, real_row_sums, wpc_loss
from .parts import check_rounds_left

UNLABELLED = -1  # pseudo-label state of an entry not (yet) pseudo-labelled


@dataclass(frozen=True)
class FedMLPParams(MethodParams):
    name = "fedmlp"
    slug_fields = ("warmup_rounds",)
    warmup_rounds: int = param(50, ge=0, rounds=True, doc="stage-1 rounds T_w (rounds_FedMLP_stage1)")
    tau: float = param(1.0, ge=0, doc="logit-adjustment strength (0: none)",
                       switch="1.0 (paper Eq. 3: multi-label logit adjustment) | 0 (HEAD code: LA commented out, plain "
                              "BCE)")
    low: float = param(0.3, ge=0, le=1, doc="L: a missing-class probability below L counts as learned")
    high: float = param(0.7, ge=0, le=1, doc="U: a missing-class probability above U counts as learned")
    lambda0: float = param(0.005, ge=0, le=1, doc="clean_threshold: share of S_0 pseudo-labelled 0 per round (x d^G)")
    lambda1: float = param(0.01, ge=0, le=1, doc="noise_threshold: share of S_1 pseudo-labelled 1 per round (x d^G)")
    mld: bool = param(True, doc="missing-label detection with the dual prototypes (Table 3 MLD)")
    wpc: bool = param(True, doc="weighted partial-class loss; false: FedAvg's BCE(pos_weight) over all classes")
    cr: str = param("both", choices=("both", "warmup", "none"), doc="consistency regularisation on missing/uncertain entries",
                    switch="'both' (paper: warm-up distillation + stage-2 MSE on uncertain entries) | 'warmup' (HEAD "
                           "code) | 'none'")
    st: bool = param(True, doc="self-adaptive threshold (Table 3 ST)",
                     switch="true (paper: self-adaptive tau_n = lambda_n d^G_c; [CODE≠PAPER] the code's commented-out "
                            "ST line uses tau_n = d^G_c alone, fedmlp.md §2.5, not offered) | false (HEAD code: tau_n ="
                            " lambda_n)")
    pos_needs_neg: bool = param(True, doc="the code's selection: no pseudo-negatives of a class in a round drops its pseudo-positives",
                                switch="true (code as it runs, utils/local_training.py L1076/L1099 at 2ad28b8: a class "
                                       "with no pseudo-negatives in a round gets no pseudo-positives; fedmlp.md §2.5) |"
                                       " false (paper: S_0 and S_1 selected independently)")

    def validate(self) -> None:
        if self.low > self.high:
            raise self.error("low", f"is larger than high={self.high}; swap them")

    def check_training(self, settings) -> None:
        check_rounds_left(self, "warmup_rounds", settings)


# -- losses: K clients at once, (K, B, C) entries, (K, C) class masks, (K, B) real rows (None: all) -> (K,)


def stage2_loss(per_entry, mse, supervised, mask) -> torch.Tensor:
    """[sum s l + sum u mse] / [sum s + sum u] (fedmlp.md §2.6); ``supervised`` (K, B, C) bool; ``mse``
    None: sum s l / sum s (no CR)."""
    s = supervised.float()
    if mse is None:
        return real_row_sums(per_entry * s, mask) / real_row_sums(s, mask).clamp_min(1)
    u = 1.0 - s
    return ((real_row_sums(per_entry * s, mask) + real_row_sums(mse * u, mask))
            / (real_row_sums(s, mask) + real_row_sums(u, mask)).clamp_min(1))


# -- prototypes, learning degrees, detection ---------------------------------------------------


def class_prototypes(features: torch.Tensor, y: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """(C, 2, D): [c, n] = mean feature of the samples with y_c = n, for annotated classes; 0 when empty or missing."""
    yb = (y > 0.5).float() * active  # (n, C), positives of annotated classes
    neg = (1.0 - (y > 0.5).float()) * active
    counts = torch.stack([neg.sum(0), yb.sum(0)], 1)  # (C, 2)
    sums = torch.stack([neg.t() @ features, yb.t() @ features], 1)  # (C, 2, D)
    return torch.where(counts[..., None] > 0, sums / counts.clamp_min(1)[..., None], torch.zeros_like(sums))


def learning_degree(p: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """(C,) share of samples with p < low or p > high (fedmlp.md §2.4, Eq. 10)."""
    return ((p < low) | (p > high)).float().mean(0)


def aggregate_prototypes(protos: list[torch.Tensor], sizes: list[int], actives: list[torch.Tensor]) -> torch.Tensor:
    """(C, 2, D) N_k-weighted mean over the clients that label each class; NaN where none does."""
    w = torch.stack([a.float() * n for a, n in zip(actives, sizes)])  # (K, C)
    total = torch.stack(protos).mul(w[:, :, None, None]).sum(0)
    return total / w.sum(0)[:, None, None]  # 0/0 = NaN: nobody labels the class (fedmlp.md §2.4)


def aggregate_degrees(degrees: list[torch.Tensor], sizes: list[int], actives: list[torch.Tensor]) -> torch.Tensor:
    """(C,) N_k-weighted mean over the clients that miss each class; 1 where none does."""
    w = torch.stack([(1.0 - a.float()) * n for a, n in zip(actives, sizes)])
    num = (torch.stack(degrees) * w).sum(0)
    den = w.sum(0)
    return torch.where(den > 0, num / den.clamp_min(1e-12), torch.ones_like(den))


def confidence(features: torch.Tensor, proto0: torch.Tensor, proto1: torch.Tensor) -> torch.Tensor:
    """s = cos(f, P_0) - cos(f, P_1): >= 0 looks negative (the code's sign, fedmlp.md §2.5)."""
    return F.cosine_similarity(features, proto0[None], dim=1) - F.cosine_similarity(features, proto1[None], dim=1)


def select_pseudo_labels(s: torch.Tensor, degree: float, lambda0: float, lambda1: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions labelled 0, positions labelled 1) among the residual samples with confidences ``s``:
    n_0 = floor(lambda0 d |S_0|) largest s (S_0 = {s >= 0}), n_1 = floor(lambda1 d |S_1|) smallest
    (S_1 = {s < 0}); ties by a stable sort in residual order (fedmlp.md §2.5)."""
    n_s0 = int((s >= 0).sum())
    n0 = math.floor(lambda0 * degree * n_s0)
    n1 = math.floor(lambda1 * degree * (len(s) - n_s0))
    return torch.argsort(s, descending=True, stable=True)[:n0], torch.argsort(s, stable=True)[:n1]


def pseudo_label_counts(pseudo: torch.Tensor, y_true: torch.Tensor) -> tuple[int, int, float]:
    """(pseudo-positives, pseudo-negatives, share of the pseudo-labels equal to ``y_true``: an oracle, logged only)."""
    labelled = pseudo != UNLABELLED
    n = int(labelled.sum())
    agree = int((labelled & (pseudo.float() == y_true.float())).sum())
    return int((pseudo == 1).sum()), int((pseudo == 0).sum()), agree / n if n else float("nan")


# -- the method ----------------------------------------------------------------------------------


@METHODS.register
class FedMLP(FLMethod):
    Params = FedMLPParams
    paper = "FedMLP (MICCAI'24)"
    label_kinds = ("multi",)

    persistent = ("pseudo", "protos_g", "degree_g")

    def __init__(self, params: FedMLPParams, ctx):
        super().__init__(params, ctx)
        params.check_training(ctx.settings)
        self.pseudo = torch.full((len(ctx.data.train), ctx.data.num_classes), UNLABELLED, dtype=torch.int8,
                                 device=ctx.device)
        self.protos_g: torch.Tensor | None = None  # (C, 2, D) global dual prototypes
        self.degree_g: torch.Tensor | None = None  # (C,) global learning degrees
        self._round_start = (0, 0)  # pseudo-positives / -negatives when the round began
        self._dropped = 0  # pseudo-positives pos_needs_neg discarded this round
        self._shifts: torch.Tensor | None = None  # a chunk's (K, C) LA shifts of its clients

    def stage_name(self, r: int) -> str:
        return "warmup" if r < self.params.warmup_rounds else "stage2"

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self._round_start = pseudo_label_counts(self.pseudo, self.ctx.data.y_true)[:2]
        self._dropped = 0

    # -- client -----------------------------------------------------------------------------
    def _shift(self, k: int) -> torch.Tensor:
        """Client k's LA shift for this local update (job.info), from its priors after detection (fedmlp.md §2.1)."""
        idx = self.ctx.data.clients[k]
        i, a = idx.to(self.ctx.device), self.active[k]
        pos = (self.ctx.data.given[i].float() * a).sum(0)
        prior = (pos + (self.pseudo[i] == 1).float().sum(0) * (1.0 - a)) / max(len(idx), 1)  # + pseudo-positives
        return la_shift(prior, self.params.tau)

    def prepare_warmup(self, r: int, k: int, nets) -> LocalJob:
        # raw images: two weak views, declared so the batched engine can draw them ahead
        return LocalJob(phases=[Phase(augment="raw", views=("weak:1", "weak:2"))], info=self._shift(k))

    def prepare_stage2(self, r: int, k: int, nets) -> LocalJob:
        if self.params.mld and self.protos_g is not None:
            self._detect(k, self.ctx.data.clients[k])
        return LocalJob(info=self._shift(k))  # one train view of the client's samples

    # the one loss form over a chunk of K clients (the sequential engine: K = 1), with its hook
    def begin_chunk(self, r, clients, jobs):
        self._shifts = torch.stack([job.info for job in jobs])

    def loss_warmup(self, sb: StackedBatch) -> torch.Tensor:
        p, bs = self.params, self.ctx.settings.batch_size
        active = self.active[sb.clients]
        y = self.multi_label_targets(sb.idx.reshape(-1)).view(*sb.idx.shape, -1)
        total = 0.0
        for v in (sb.views["weak:1"], sb.views["weak:2"]):
            z = sb.forward(v)
            sup = (wpc_loss(z, y, self._shifts, active, bs, sb.mask) if p.wpc else
                   partial_bce(z, y, self.pos_weights()[sb.clients], bs, sb.mask))
            total = total + 0.5 * sup
            if p.cr in ("both", "warmup"):
                teacher = torch.sigmoid(self.global_logits(sb, v).float())
                total = total + 0.5 * missing_distillation(torch.sigmoid(z.float()), teacher, 1.0 - active, bs, sb.mask)
        return total

    def loss_stage2(self, sb: StackedBatch) -> torch.Tensor:
        p, bs = self.params, self.ctx.settings.batch_size
        k, b, c = sb.logits.shape
        active = self.active[sb.clients].bool()[:, None, :]
        pw = self.pos_weights()[sb.clients]
        consistency = p.cr == "both"
        flat = sb.idx.reshape(-1)
        pseudo = self.pseudo[flat].view(k, b, c)
        labelled = pseudo != UNLABELLED
        y = torch.where(active | ~labelled, self.multi_label_targets(flat).view(k, b, c), pseudo.float())
        z = sb.logits
        if not p.wpc and not consistency:
            return partial_bce(z, y, pw, bs, sb.mask)
        per = (la_bce(z, y, self._shifts[:, None, :]) if p.wpc
               else F.binary_cross_entropy_with_logits(z.float(), y, pos_weight=pw[:, None, :], reduction="none"))
        mse = (torch.sigmoid(z.float()) - torch.sigmoid(self.global_logits(sb).float())) ** 2 if consistency else None
        return stage2_loss(per, mse, active | labelled, sb.mask)

    def upload(self, r: int, k: int, job: LocalJob, nets) -> dict:
        """From the last warm-up round on: dual prototypes and learning degrees (fedmlp.md §2.4)."""
        p = self.params
        if not p.mld or r < p.warmup_rounds - 1:
            return {}
        idx = self.ctx.data.clients[k]
        logits, feats = self._features(nets["model"], idx, job.reserved)
        return {"prototypes": class_prototypes(feats, self.multi_label_targets(idx), self.active[k]),
                "degrees": learning_degree(torch.sigmoid(logits), p.low, p.high)}

    def reserve(self, r: int, k: int, job: LocalJob):
        """The upload's augmentation draws, made where the sequential upload makes them (batched engine)."""
        if not self.params.mld or r < self.params.warmup_rounds - 1:
            return None
        return draw_predict(self.ctx, len(self.ctx.data.clients[k]))  # in _features' batches of eval_batch_size

    _hooks = dict(upload=upload, reserve=reserve, begin=begin_chunk)
    stages = {"warmup": Stage(prepare=prepare_warmup, loss=loss_warmup, **_hooks),
              "stage2": Stage(prepare=prepare_stage2, loss=loss_stage2, **_hooks)}

    @torch.no_grad()
    def _features(self, model: torch.nn.Module, idx: torch.Tensor, drawn: list | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, features) of ``model`` in eval mode on one augmented view of ``idx``, in order
        (``drawn``: the view's parameters drawn ahead by :meth:`reserve`)."""
        ctx = self.ctx
        model.eval()
        zs, fs = [], []
        for i, (xb, _) in enumerate(ctx.data.train.batches(idx, ctx.settings.eval_batch_size)):
            view = ctx.pipeline.train(xb, ctx.aug_gen) if drawn is None else ctx.pipeline.apply_train(xb, drawn[i])
            z, f = forward_bounded(model, view, model.forward_features)
            zs.append(z.float())
            fs.append(f.float().flatten(1))
        return torch.cat(zs), torch.cat(fs)

    def _detect(self, k: int, idx: torch.Tensor) -> None:
        """Missing-label detection on client k with the received global model (fedmlp.md §2.5)."""
        p = self.params
        missing = (self.active[k] == 0).nonzero().flatten().tolist()
        if not missing or not len(idx):
            return
        _, feats = self._features(self.global_model, idx)
        rows = idx.to(self.ctx.device)
        for c in missing:
            proto = self.protos_g[c]
            residual = (self.pseudo[rows, c] == UNLABELLED).nonzero().flatten()
            if torch.isnan(proto).any() or not len(residual):  # NaN: nobody labels c (fedmlp.md §9.7)
                continue
            s = confidence(feats[residual], proto[0], proto[1])
            d = float(self.degree_g[c]) if p.st else 1.0
            neg, pos = select_pseudo_labels(s, d, p.lambda0, p.lambda1)
            if p.pos_needs_neg and not len(neg):  # [CODE] local_training.py L1076/L1099 (fedmlp.md §2.5)
                self._dropped += len(pos)
                pos = pos[:0]
            self.pseudo[rows[residual[neg]], c] = 0
            self.pseudo[rows[residual[pos]], c] = 1

    # -- server -----------------------------------------------------------------------------
    def aggregate(self, r: int, updates) -> None:
        ups = [u for u in self.fedavg(updates) if "prototypes" in u.uploads]
        if ups:
            sizes = [u.num_samples for u in ups]
            actives = [self.active[u.client] for u in ups]
            self.protos_g = aggregate_prototypes([u.uploads["prototypes"] for u in ups], sizes, actives)
            self.degree_g = aggregate_degrees([u.uploads["degrees"] for u in ups], sizes, actives)

    def end_round(self, r: int) -> None:
        if not self.params.mld:
            return
        if self.degree_g is not None:  # d^G_c as just aggregated (from round warmup_rounds - 1 on)
            self.round_info.update({f"mld_degree_{c}": float(v) for c, v in enumerate(self.degree_g.tolist())})
        if r < self.params.warmup_rounds:
            return
        pos, neg, agreement = pseudo_label_counts(self.pseudo, self.ctx.data.y_true)
        self.round_info.update(mld_pseudo_pos=pos, mld_pseudo_neg=neg, mld_agreement=agreement,
                               mld_new_pos=pos - self._round_start[0], mld_new_neg=neg - self._round_start[1],
                               mld_dropped_pos=self._dropped)

    # -- outputs ----------------------------------------------------------------------------
    def client_results(self):
        data = self.ctx.data
        rows = []
        for k, idx in enumerate(data.clients):
            i = idx.to(self.ctx.device)
            pos, neg, agreement = pseudo_label_counts(self.pseudo[i], data.y_true[i])
            rows.append({"client": k, "n": len(idx),
                         "active_classes": ",".join(str(c) for c in self.active[k].nonzero().flatten().tolist()),
                         "pseudo_pos": pos, "pseudo_neg": neg, "pseudo_agreement": agreement})
        return pd.DataFrame(rows)
