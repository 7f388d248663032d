"""JointOpt (Tanaka et al. 2018) run locally inside FL, as FedCorr adapted it (baselines.md §13, A12).

Every training sample keeps a soft label ỹ_i (initialised to the one-hot given label) and a Q-deep
history of its predictions. The local objective on a batch, with s = softmax(z), s̄ its batch mean
and π = 1/C:

    L = −mean_i Σ_c ỹ_ic log s_c + α Σ_c π_c log(π_c / s̄_c) + β mean_i H(s_i).

After warm-up (rounds ≥ warmup_rounds), at the end of every local epoch each of the client's samples
gets ỹ_i <- mean of its last Q recorded predictions. The server is FedAvg. JointOpt's second
stage (retraining from scratch on the final labels) is omitted (spec A12).

Decided where the spec is silent:
- "prediction recorded for sample i" = the softmax output of the training forward pass on the
  augmented batch (train mode), detached, as the JointOpt paper records its network outputs
  during training; predictions are recorded from round 0 on, so the first update after warm-up
  already averages Q epochs; fewer than Q recorded -> the mean of those recorded;
- warm-up default 50 rounds: the FL-DivideMix budget of §10(a) for FedCorr's CIFAR-10 setting;
- after each post-warm-up local update the working labels are set to argmax ỹ through
  ``ctx.data.relabel`` so the run's relabel log shows JointOpt's corrections (the loss reads only ỹ);
- soft labels and histories live on the device as (N, C) and (N, Q, C) float32 tensors.
There is no code≠paper switch (no official FL code exists).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .api import FLMethod, host_side, masked_mean, MethodParams, param, METHODS, StackedBatch, Stage
from .api import numerics
from .parts import check_rounds_left


@dataclass(frozen=True)
class JointOptParams(MethodParams):
    name = "jointopt"
    slug_fields = ("warmup_rounds",)
    alpha: float = param(1.2, ge=0, doc="weight of the uniform-prior KL term")
    beta: float = param(0.8, ge=0, doc="weight of the entropy term")
    history: int = param(10, ge=1, doc="Q: predictions averaged per label update")
    warmup_rounds: int = param(50, ge=0, rounds=True, doc="rounds before labels are updated (§10(a) budget)")

    def check_training(self, settings) -> None:
        check_rounds_left(self, "warmup_rounds", settings, "(labels would never be updated); lower warmup_rounds")


# -- pure parts ----------------------------------------------------------------------------


def soft_cross_entropy(log_probs: torch.Tensor, soft_labels: torch.Tensor, mask: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """−mean_i Σ_c ỹ_ic log s_c: (..., B, C) -> (...) (each client's real rows, mask (K, B))."""
    return masked_mean(-(soft_labels * log_probs).sum(-1), mask)


def prior_penalty(probs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_c π_c log(π_c / s̄_c) with π uniform and s̄ the batch-mean prediction (0 when s̄ is uniform):
    (..., B, C) -> (...); s̄ over each client's real rows (mask (K, B)), uniform for a client
    riding along without a batch (a finite 0)."""
    c = probs.shape[-1]
    if mask is None:
        mean = probs.mean(-2)
    else:
        rows = mask.sum(-1, keepdim=True)
        mean = torch.where(mask[..., None], probs, torch.zeros((), dtype=probs.dtype, device=probs.device)).sum(-2)
        mean = torch.where(rows > 0, mean / rows.clamp_min(1).to(probs.dtype), torch.full_like(mean, 1.0 / c))
    uniform = numerics.log(torch.tensor(1.0 / c, dtype=probs.dtype)).to(probs.device, non_blocking=True)
    return (uniform - numerics.log(mean)).mean(-1)


def entropy_penalty(log_probs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """mean_i H(s_i) = −mean_i Σ_c s_ic log s_ic (0 for one-hot predictions): (..., B, C) -> (...)."""
    return masked_mean(-(numerics.exp(log_probs) * log_probs).sum(-1), mask)


def jointopt_loss(logits: torch.Tensor, soft_labels: torch.Tensor, alpha: float, beta: float,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """The loss of K clients: logits and soft labels (K, B, C), mask (K, B) real rows or None -> (K,)
    (one client's (B, C) -> 0-dim). The prior and entropy terms take s = exp(log s) each (two
    exponentials, as the golden record's: one shared would round the gradient differently)."""
    log_p = F.log_softmax(logits, dim=-1)
    return (soft_cross_entropy(log_p, soft_labels, mask) + alpha * prior_penalty(numerics.exp(log_p), mask)
            + beta * entropy_penalty(log_p, mask))


def record_predictions(history: torch.Tensor, counts: torch.Tensor, idx: torch.Tensor, probs: torch.Tensor) -> None:
    """Write ``probs`` into each sample's ring buffer of Q predictions (in place); ``idx`` distinct."""
    history[idx, counts[idx] % history.shape[1]] = probs
    counts[idx] += 1


def history_mean(history: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Mean of the recorded predictions (the last min(count, Q)); unwritten slots are zero."""
    return history.sum(1) / counts.clamp(max=history.shape[1]).clamp_min(1).to(history.dtype).unsqueeze(1)


@METHODS.register
class JointOpt(FLMethod):
    Params = JointOptParams
    paper = "Tanaka et al. 2018; baseline (via FedCorr) in FedDiv"
    persistent = ("soft", "history", "counts")

    def __init__(self, params: JointOptParams, ctx):
        super().__init__(params, ctx)
        data = ctx.data
        n, c = len(data.train), data.num_classes
        self.soft = F.one_hot(data.given.long(), c).float().to(ctx.device)
        self.history = torch.zeros(n, params.history, c, device=ctx.device)
        self.counts = torch.zeros(n, dtype=torch.int64, device=ctx.device)

    def stage_name(self, r: int) -> str:
        return "warmup" if r < self.params.warmup_rounds else "joint"

    def loss(self, sb: StackedBatch):
        """The one loss form over K clients (the sequential engine runs it at K = 1); each client's
        real rows record their predictions."""
        idx, probs = sb.idx, F.softmax(sb.logits.detach().float(), dim=-1)
        if sb.mask is not None:  # real rows only; the clients hold disjoint samples
            idx, probs = idx[sb.mask], probs[sb.mask]
        record_predictions(self.history, self.counts, idx.reshape(-1), probs.flatten(0, -2))
        return jointopt_loss(sb.logits, self.soft[sb.idx], self.params.alpha, self.params.beta, sb.mask)

    def _update_labels(self, k: int) -> None:
        idx = self.ctx.data.clients[k].to(self.ctx.device, non_blocking=True)
        self.soft[idx] = history_mean(self.history[idx], self.counts[idx])

    def epoch_end(self, sb: StackedBatch, stepped: torch.Tensor) -> None:
        """After each step: a client whose step ended one of its epochs (``sb.epoch_ends``) sets its
        labels to its prediction history's mean (the same as before the next epoch's first step:
        nothing of the client runs in between)."""
        with host_side():  # the epoch ends and the client ids are host values: no device sync
            ends = [int(sb.clients_host[i]) for i in sb.epoch_ends]
        for k in ends:
            self._update_labels(k)

    def upload_joint(self, r, k, job, nets):
        self._update_labels(k)  # the end of the last epoch: done already (epoch_end), the same values again
        idx = self.ctx.data.clients[k]
        return {"relabelled": self.ctx.data.relabel(idx, self.soft[idx.to(self.ctx.device)].argmax(1), r, self.stage_name(r), k)}

    stages = {"warmup": Stage(loss=loss), "joint": Stage(loss=loss, upload=upload_joint, after_step=epoch_end)}

    def end_round(self, r: int) -> None:
        data = self.ctx.data
        idx = torch.cat(data.clients).to(self.ctx.device)
        self.round_info["soft_label_acc"] = float((self.soft[idx].argmax(1) == data.y_true[idx]).float().mean())
