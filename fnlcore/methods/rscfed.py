"""RSCFed (Liang et al., CVPR'22) as FedMLP's code adapts it to partial labels (baselines.md §15, fedmlp.md §6).

Client k (annotated classes A_k, missing M_k), two weak views v1, v2 of each batch:
- student = the received global model; L = L_sup + L_mse with L_sup FedAvg-PL's BCE-with-logits
  (pos_weight N_k / n_c^+) on v1 over A_k, sum / (B |A_k|) (B nominal), and
  L_mse = mean over the batch and M_k of (sigma(student(v1)) - sigma(teacher(v2)))^2 (0 when M_k is empty);
- teacher = the client's own EMA of its student: initialised once from the initial global model,
  never reset to the global model, updated after EVERY step over all float state tensors
  (teacher <- decay teacher + (1 - decay) student, decay 0.999; integer buffers copied), persistent
  across rounds and checkpointed.

Server: before local training, M groups of K_s distinct clients are drawn among the round's clients
(one ``RandomState.choice(..., replace=False)`` per group from the run's seeded stream, the analogue of
the code's ``random.sample``); every client trains once and its model is reused in each group that
contains it. Group g: w_bar = uniform mean of its members, d_i = sum over float tensors of
||theta_i - w_bar||_2, weight_i proportional to (n_i / sum_g n) exp(-beta d_i / n_i) (computed in
log space, baselines.md §15), sub-consensus = the weighted mean; the global model = the plain mean of
the M sub-consensus models.

K_s: the code's 6 (ChestXray14's 8 clients) cannot be drawn from ICH's 5 clients (the code's
``random.sample`` fails); the recommendation (baselines.md A13, fedmlp.md §9.9) is ``group_size: 4`` for
ICH (about the same 0.75 share). A group larger than the round's clients is a ConfigError.

Decisions where the spec is silent: the teacher's forward runs in eval mode (its BN statistics are
the EMA of the student's); L_mse is a mean over the actual batch size (MSE's reduction); a client
that is in no group still trains (and its teacher moves) but does not enter the global model;
groups are drawn from the round's selected clients (all of them by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .api import (
    ClientStore, ConfigError, FLMethod, load, LocalJob, MethodParams, param, Phase, METHODS, snapshot,
    StackedBatch, Stage, weighted_average,
)
from .api import numerics
from .multilabel import annotated_bce


@dataclass(frozen=True)
class RSCFedParams(MethodParams):
    name = "rscfed"
    slug_fields = ("group_size",)
    num_groups: int = param(10, ge=1, doc="M: random sub-groups per round")
    group_size: int = param(6, ge=1, doc="K_s: clients per sub-group (use 4 for ICH's 5 clients)",
                            switch="6 (code, ChestXray14's 8 clients) | 4 (baselines.md A13: ICH has only 5 clients, 6 "
                                   "is impossible)")
    beta: float = param(0.01, ge=0, doc="distance scale of the sub-consensus weights")
    ema_decay: float = param(0.999, ge=0, le=1, doc="decay of the client's EMA teacher, every step")


# -- pure rules ------------------------------------------------------------------------------


def subconsensus_weights(sizes, distances, beta: float) -> torch.Tensor:
    """Normalised weights of a group: proportional to (n_i / sum n) exp(-beta d_i / n_i), in log space."""
    n = torch.as_tensor(sizes, dtype=torch.float64)
    return torch.softmax(numerics.log(n / n.sum()) - beta * torch.as_tensor(distances, dtype=torch.float64) / n, 0)


def group_consensus(states, sizes, beta: float):
    """(sub-consensus state, weights) of one group: distance-weighted mean around the uniform mean."""
    mean = weighted_average(states, [1.0] * len(states))
    w = subconsensus_weights(sizes, [_distance(s, mean) for s in states], beta)
    return weighted_average(states, w.tolist()), w


def _distance(a, b) -> float:
    """Sum over float entries of ||a - b||_2 (``per_tensor_distance``, with one host sync instead of one per tensor)."""
    norms = [torch.linalg.vector_norm((v - b[k]).double()) for k, v in a.items() if v.is_floating_point()]
    return float(torch.stack(norms).sum()) if norms else 0.0


def missing_mse(p_student: torch.Tensor, p_teacher: torch.Tensor, missing: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over the real rows and the missing classes of (p_s - p_t)^2, 0 when nothing is missing:
    K clients' (K, B, C) probabilities, (K, C) missing classes and (K, B) real rows (None: all) ->
    (K,); one batch's (B, C), (C,) -> a scalar."""
    per = (((p_student - p_teacher) ** 2) * missing[..., None, :]).sum(-1)  # (..., B)
    rows = torch.full_like(per[..., 0], per.shape[-1])
    if mask is not None:
        per = torch.where(mask, per, torch.zeros_like(per))
        rows = mask.sum(-1).to(per.dtype)
    m = missing.sum(-1)
    return torch.where(m > 0, per.sum(-1) / (rows * m).clamp_min(1), per.sum(-1) * 0.0)


# -- the method --------------------------------------------------------------------------------


@METHODS.register
class RSCFed(FLMethod):
    Params = RSCFedParams
    paper = "Liang et al. CVPR'22 (RSCFed), as FedMLP (MICCAI'24) adapts it to partial labels"
    label_kinds = ("multi",)
    client_networks = ("teacher",)
    persistent = ("teachers",)

    def __init__(self, params: RSCFedParams, ctx):
        super().__init__(params, ctx)
        k = ctx.data.num_clients
        if params.group_size > k:
            raise ConfigError(
                f"method 'rscfed': group_size={params.group_size} is larger than the {k} clients, so no group of "
                f"distinct clients can be drawn; set group_size <= {k} (recommended: 4 for ICH's 5 clients, the "
                "code's 6 for ChestXray14's 8)"
            )
        self.teachers = ClientStore("teachers")  # per-client EMA teachers, all from the initial global model
        init = snapshot(self.global_model)
        for c in range(k):
            self.teachers.put(c, init)
        self.groups: list[list[int]] = []

    def select_clients(self, r: int) -> list[int]:
        clients = super().select_clients(r)
        p = self.params
        if p.group_size > len(clients):
            raise ConfigError(
                f"method 'rscfed': group_size={p.group_size} is larger than the {len(clients)} clients of round {r}; "
                "lower group_size or raise training.client_fraction"
            )
        rng = self.ctx.rng
        self.groups = [[clients[int(i)] for i in rng.choice(len(clients), p.group_size, replace=False)]
                       for _ in range(p.num_groups)]
        return clients

    def prepare(self, r, k, nets):
        # the client's EMA teacher, kept per client by the engine (client_networks), follows the student
        # after every step (after_step); info: the missing classes M_k
        load(nets["teacher"], self.teachers.get(k))
        nets["teacher"].eval()
        return LocalJob([Phase(augment="raw", views=("weak:1", "weak:2"))], info={"missing": 1.0 - self.active[k]})

    def loss(self, sb: StackedBatch):
        z = sb.forward(sb.views["weak:1"])
        loss = annotated_bce(self, sb, z)
        pt = torch.sigmoid(sb.copies["teacher"](sb.views["weak:2"]).float())
        missing = torch.stack([job.info["missing"] for job in sb.jobs])  # (K, C)
        return loss + missing_mse(torch.sigmoid(z.float()), pt, missing, sb.mask)

    def after_step(self, sb, stepped):
        sb.copies["teacher"].ema_(self.params.ema_decay, stepped)

    def upload(self, r, k, job, nets):
        self.teachers.put(k, nets["teacher"].state_dict())  # the trained teacher stays with the client
        return {}

    stages = {"main": Stage(prepare=prepare, upload=upload, loss=loss, after_step=after_step, copies=("teacher",))}

    def aggregate(self, r, updates):
        got = {u.client: u for u in updates}
        subs = [group_consensus([got[k].state for k in g], [got[k].num_samples for k in g], self.params.beta)[0]
                for g in self.groups]
        load(self.global_model, weighted_average(subs, [1.0] * len(subs)))
        self.round_info["rscfed_clients_in_groups"] = float(len({k for g in self.groups for k in g}))
