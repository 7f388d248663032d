"""FedIRM (Liu et al., MICCAI'21) as FedMLP's code adapts it to partial labels (baselines.md §17, fedmlp.md §6).

Client k (annotated classes A_k, missing M_k), two weak views v1, v2 of each batch; L_sup(v) =
FedAvg-PL's BCE-with-logits (pos_weight N_k / n_c^+) over A_k, sum / (B |A_k|), B nominal.

- Supervised rounds r < sup_rounds (20): L = L_sup(v1) + L_sup(v2).
- Relation matrix (C x C), from round sup_rounds - 1 on, accumulated over the round's batches: row c
  of a batch = sigma(mean of the student's v1 logit vectors over the batch's samples labelled positive
  for c / temperature); the client's row c = the mean over the batches that had such samples (0.5,
  i.e. sigma(0), when none). Server: global row c = N_k-weighted mean of the rows of the clients that
  annotate c and saw a positive of it (0.5 when none), fully replaced every round.
- Inter-client relation matching, r >= sup_rounds, per step:
  mask = samples whose sigma(student(v1)) is > upper or < lower on EVERY class and whose summed binary
  entropy (nats) over classes < max_entropy; pseudo-labels 1[sigma > 0.5]; the source matrix from the
  masked samples' logits (with gradient) as above (0.5 rows where no masked sample is positive);
  L_cons = sum over all entries of (sigma(student(v1)) - sigma(teacher(v2)))^2 / B;
  L_rel = sum over rows of 1/2 [KL(P_c || Q_c) + KL(Q_c || P_c)] / C, P the source and Q the global
  matrix, each row normalised to sum 1 ("each row treated as a distribution");
  L = w(r) (L_cons + L_rel) + L_sup(v1) + L_sup(v2), w(r) = consistency exp(-5 (1 - min(r, R_w)/R_w)^2)
  (0-based round r, R_w = ramp_rounds 30).
- EMA teacher per client: initialised from the received global model at the client's first
  relation-matching update, then client-persistent; after every step teacher <- alpha teacher +
  (1 - alpha) student with alpha = min(1 - 1/(step + 1), ema_decay), the step counter persistent.
Server aggregation: FedAvg.

[CODE≠PAPER / AMBIG] The code hard-codes 8 x 8 relation matrices (ChestXray14's 8 classes); here the
matrices are C x C (needed for ICH's 5 classes; baselines.md A15, fedmlp.md §9.9) — see ``switch_notes``.

Decisions where the spec is silent: the teacher's forward runs in eval mode; a client's row of a class
it annotates but saw no positive of is left out of the server average (it would be the 0.5 of
"no positives"); the rows of a KL are clamped at 1e-8 before the logarithms; the relation rows come
from the training forward pass (train mode) of view 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .api import ClientStore, FLMethod, load, LocalJob, MethodParams, param, Phase, METHODS, StackedBatch, Stage
from .api import numerics
from .multilabel import annotated_bce
from .parts import check_rounds_left


@dataclass(frozen=True)
class FedIRMParams(MethodParams):
    name = "fedirm"
    slug_fields = ("sup_rounds",)
    switch_notes = {
        "matrix": "C x C relation matrices (baselines.md A15; needed for ICH's 5 classes) — the code's hard-coded 8 x 8 "
                  "fits only ChestXray14's 8 classes and is not offered",
    }
    sup_rounds: int = param(20, ge=1, rounds=True, doc="supervised rounds before relation matching")
    ramp_rounds: int = param(30, ge=0, rounds=True, doc="R_w: rounds of the consistency ramp-up w(r)")
    consistency: float = param(1.0, ge=0, doc="final weight of L_cons + L_rel")
    temperature: float = param(2.0, gt=0, doc="logits are divided by it before the sigmoid of a relation row")
    upper: float = param(0.7, ge=0.5, le=1, doc="a probability above this is confident")
    lower: float = param(0.3, ge=0, le=0.5, doc="a probability below this is confident")
    max_entropy: float = param(2.0, gt=0, doc="summed binary entropy (nats) a masked sample must stay below")
    ema_decay: float = param(0.99, ge=0, le=1, doc="upper bound of the EMA teacher's alpha = min(1 - 1/(step+1), .)")

    def check_training(self, settings) -> None:
        check_rounds_left(self, "sup_rounds", settings, "(no round would match relations)")


# -- pure rules ------------------------------------------------------------------------------


def ramp_weight(r: int, consistency: float = 1.0, ramp_rounds: int = 30) -> float:
    """w(r) = consistency exp(-5 (1 - min(r, R_w)/R_w)^2); consistency when R_w = 0."""
    if ramp_rounds == 0:
        return consistency
    t = 1.0 - min(r, ramp_rounds) / ramp_rounds
    return consistency * math.exp(-5.0 * t * t)


def relation_rows(logits: torch.Tensor, positives: torch.Tensor, mask: torch.Tensor | None = None,
                  temperature: float = 2.0):
    """(rows (..., C, C), has (..., C) bool) of (..., B, C) logits and positives, (..., B) real rows (None:
    all): row c = sigma(mean logits of the samples positive for c / T); 0.5 if none. K clients'
    (K, B, C) give (K, C, C); one batch's (B, C) one matrix."""
    pos = positives.float() if mask is None else (positives & mask[..., None]).float()
    n = pos.sum(-2)  # (..., C)
    rows = torch.sigmoid((pos.transpose(-1, -2) @ logits.float()) / n.clamp_min(1)[..., None] / temperature)
    has = n > 0
    return torch.where(has[..., None], rows, torch.full_like(rows, 0.5)), has


def aggregate_relations(mats, sizes, valid) -> torch.Tensor:
    """(C, C) global matrix: row c = sum_k N_k valid_kc M_k[c] / sum_k N_k valid_kc; 0.5 rows where no client counts."""
    w = torch.stack([v.float() * n for v, n in zip(valid, sizes)])  # (K, C)
    num = (torch.stack(mats) * w[:, :, None]).sum(0)
    den = w.sum(0)[:, None]
    return torch.where(den > 0, num / den.clamp_min(1e-12), torch.full_like(num, 0.5))


def relation_kl(source: torch.Tensor, target: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """sum_c 1/2 [KL(P_c || Q_c) + KL(Q_c || P_c)] / C, rows normalised to sum 1: sources (..., C, C)
    (K clients' (K, C, C) -> (K,)) against one target (C, C)."""
    p = source / source.sum(-1, keepdim=True)
    q = target / target.sum(-1, keepdim=True)
    lp, lq = numerics.log(p.clamp_min(eps)), numerics.log(q.clamp_min(eps))
    return (0.5 * ((p * (lp - lq)).sum(-1) + (q * (lq - lp)).sum(-1))).sum(-1) / source.shape[-2]


def confident_mask(p: torch.Tensor, upper: float, lower: float, max_entropy: float) -> torch.Tensor:
    """(B,) samples confident on every class (> upper or < lower) with summed binary entropy < max_entropy."""
    sure = ((p > upper) | (p < lower)).all(1)
    q = p.clamp(1e-12, 1 - 1e-12)
    return sure & (-(q * numerics.log(q) + (1 - q) * numerics.log(1 - q)).sum(1) < max_entropy)


def ema_alpha(steps: torch.Tensor, cap: float) -> torch.Tensor:
    """alpha = min(1 - 1/(step + 1), cap) of each client's step counter: 0 at step 0 (the teacher becomes
    the student), 0.5 at step 1."""
    return (1.0 - 1.0 / (steps + 1)).clamp_max(cap)


# -- the method --------------------------------------------------------------------------------


@dataclass
class _Chunk:
    """The relation-matching clients being trained (K): their EMA step counters, on the host (float64:
    the alpha is computed from them as from the Python counter), and their mask counts."""

    steps: torch.Tensor
    masked: torch.Tensor
    seen: torch.Tensor


class _RowMean:
    """Mean of relation rows over the batches that defined them."""

    def __init__(self, c: int, device):
        self.sum = torch.zeros(c, c, device=device)
        self.count = torch.zeros(c, device=device)

    def add(self, rows: torch.Tensor, has: torch.Tensor) -> None:
        self.sum += rows.detach() * has[:, None]
        self.count += has.float()

    def result(self):
        rows = torch.where(self.count[:, None] > 0, self.sum / self.count.clamp_min(1)[:, None], torch.full_like(self.sum, 0.5))
        return rows, self.count > 0


@METHODS.register
class FedIRM(FLMethod):
    Params = FedIRMParams
    paper = "Liu et al. MICCAI'21 (FedIRM), as FedMLP (MICCAI'24) adapts it to partial labels"
    label_kinds = ("multi",)
    client_networks = ("teacher",)
    persistent = ("teachers", "steps", "relation_g")

    def __init__(self, params: FedIRMParams, ctx):
        super().__init__(params, ctx)
        params.check_training(ctx.settings)
        self.teachers = ClientStore("teachers")  # per-client EMA teachers, from a client's first matching update
        self.steps = [0] * ctx.data.num_clients  # per-client EMA step counters
        self.relation_g: torch.Tensor | None = None  # (C, C) global relation matrix
        self._chunk: _Chunk | None = None  # the relation-matching clients being trained

    def stage_name(self, r: int) -> str:
        return "supervised" if r < self.params.sup_rounds else "relation"

    def stage_key(self, r: int) -> str:
        # the last supervised round already collects the relation rows the first matching round needs
        return "collect" if r == self.params.sup_rounds - 1 else self.stage_name(r)

    def prepare(self, r, k, nets, info=None):
        return LocalJob([Phase(augment="raw", views=("weak:1", "weak:2"))], info=info)  # raw batches, two weak views

    def collect_prepare(self, r, k, nets):
        return self.prepare(r, k, nets, {"rows": _RowMean(self.ctx.data.num_classes, self.ctx.device)})

    def relation_prepare(self, r, k, nets):
        p, c = self.params, self.ctx.data.num_classes
        # the client's EMA teacher (its own, or the received global model at its first matching update),
        # kept per client by the engine (client_networks) and moved after every step (relation_after_step)
        start = self.teachers.get(k)
        load(nets["teacher"], start if start is not None else self.global_model.state_dict())
        nets["teacher"].eval()
        target = self.relation_g if self.relation_g is not None else torch.full((c, c), 0.5, device=self.ctx.device)
        w = ramp_weight(r, p.consistency, p.ramp_rounds)
        return self.prepare(r, k, nets, {"rows": _RowMean(c, self.ctx.device), "target": target, "w": w})

    def _supervised(self, sb: StackedBatch, collect: bool = True):
        """((K,) L_sup(v1) + L_sup(v2), (K, B, C) v1 logits); ``collect``: each client's relation rows of the
        step (from its v1 annotated positives) added to its own."""
        y = self.multi_label_targets(sb.idx)
        z1, z2 = sb.forward(sb.views["weak:1"]), sb.forward(sb.views["weak:2"])
        loss = annotated_bce(self, sb, z1, y) + annotated_bce(self, sb, z2, y)
        if collect:
            pos = (y > 0.5) & self.active[sb.clients].bool()[:, None, :]
            rows, has = relation_rows(z1.detach(), pos, sb.mask, self.params.temperature)
            for job, r_i, h_i in zip(sb.jobs, rows, has):  # a rider has no positives: nothing added
                job.info["rows"].add(r_i, h_i)
        return loss, z1

    def supervised_loss(self, sb: StackedBatch):
        return self._supervised(sb, collect=False)[0]

    def collect_loss(self, sb: StackedBatch):
        return self._supervised(sb)[0]

    def relation_loss(self, sb: StackedBatch):
        p, chunk, info = self.params, self._chunk, sb.jobs[0].info  # target and w(r) are the round's
        k, bsz = sb.idx.shape
        loss, z1 = self._supervised(sb)
        p1 = torch.sigmoid(z1.float())
        pt = torch.sigmoid(sb.copies["teacher"](sb.views["weak:2"]).float())
        sq = ((p1 - pt) ** 2).sum(-1)  # (K, B)
        real = torch.ones_like(sq, dtype=torch.bool) if sb.mask is None else sb.mask
        cons = torch.where(real, sq, torch.zeros_like(sq)).sum(1) / self.ctx.settings.batch_size
        mask = confident_mask(p1.detach().flatten(0, 1), p.upper, p.lower, p.max_entropy).view(k, bsz) & real
        chunk.masked += mask.sum(1)
        chunk.seen += real.sum(1)
        source, _ = relation_rows(z1, (p1.detach() > 0.5) & mask[:, :, None], sb.mask, p.temperature)
        return info["w"] * (cons + relation_kl(source, info["target"])) + loss

    def relation_begin(self, r, clients, jobs):
        zeros = torch.zeros(len(clients), dtype=torch.int64, device=self.ctx.device)
        self._chunk = _Chunk(torch.tensor([self.steps[c] for c in clients], dtype=torch.float64), zeros, zeros.clone())

    def relation_after_step(self, sb, stepped):
        """Each stepped client's teacher update with its own alpha (:func:`ema_alpha`, on the host),
        its counter advanced."""
        chunk = self._chunk
        sb.copies["teacher"].ema_(ema_alpha(chunk.steps, self.params.ema_decay), stepped)  # alpha (K,) float64, host
        chunk.steps += sb.moved_host.to(chunk.steps.dtype)

    def relation_end(self, r, clients, jobs):
        chunk = self._chunk
        for i, (c, job) in enumerate(zip(clients, jobs)):
            self.steps[c] = int(chunk.steps[i])
            job.info.update(masked=chunk.masked[i], seen=chunk.seen[i])
        self._chunk = None

    def rows_upload(self, r, k, job, nets):
        rows, valid = job.info["rows"].result()
        return {"relation": rows, "relation_valid": valid}

    def relation_upload(self, r, k, job, nets):
        info = job.info
        self.teachers.put(k, nets["teacher"].state_dict())  # the trained teacher stays with the client
        return {"masked": float(info["masked"]), "seen": float(info["seen"]), **self.rows_upload(r, k, job, nets)}

    stages = {
        "supervised": Stage(prepare=prepare, loss=supervised_loss),
        "collect": Stage(prepare=collect_prepare, upload=rows_upload, loss=collect_loss),
        "relation": Stage(prepare=relation_prepare, upload=relation_upload, loss=relation_loss,
                          begin=relation_begin, after_step=relation_after_step, end=relation_end, copies=("teacher",)),
    }

    def aggregate(self, r, updates):
        ups = [u for u in self.fedavg(updates) if "relation" in u.uploads]
        if ups:
            valid = [u.uploads["relation_valid"] & self.active[u.client].bool() for u in ups]
            sizes = [u.num_samples for u in ups]
            self.relation_g = aggregate_relations([u.uploads["relation"] for u in ups], sizes, valid)
        matched = [u for u in ups if "masked" in u.uploads]
        if matched:
            seen = sum(u.uploads["seen"] for u in matched)
            self.round_info["fedirm_masked_share"] = sum(u.uploads["masked"] for u in matched) / max(seen, 1.0)
