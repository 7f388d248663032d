"""FL-Coteaching (Co-teaching, Han et al. 2018, inside FL; baselines.md §9, FedGR's baseline).

Two global networks net1/net2, each aggregated by FedAvg on its own. A client
trains both on the same augmented minibatches: per-sample CE l1 (net1) and l2 (net2), keep
m = floor(R(r) |B|) samples with R(r) = 1 - tau min(r^c / T_k, 1) (r the 0-based round), S1 = the
m smallest l1, S2 = the m smallest l2; net1 learns from the mean l1 over S2 and net2 from the
mean l2 over S1 (cross exchange). Both networks step together: one optimiser per network (the
run's), the loss l1(S2) + l2(S1) gives each network exactly its own gradient.

tau = E[rho_k] of the noise (003 A.5): (rho_min + rho_max) / 2 on CIFAR (Sym U(0.5, 1.0): 0.75;
Asym/Mixed U(0.2, 0.4): 0.3), 0.39 on Clothing1M; no default, a config states it.

Switches (the spec's alternatives, §9(a)-(b)):
- ``tau_scope`` 'all' (§9(a): the same tau on every client, no oracle) | 'noisy_only' (fedgr.md
  ambiguity 11: tau = 0 on clients whose given labels all equal the true ones; an oracle);
- ``evaluate`` 'net1' (§9(b)) | 'net2'; the other network's metrics are logged as ``net2_acc``...
  (or ``net1_...``) when ``log_networks``.
Decision where the spec is silent: m is at least 1 (a batch of one sample with R < 1 would keep
none and give a NaN mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .api import evaluate, FLMethod, LocalJob, masked_mean, MethodParams, param, Phase, METHODS, Stage
from .small_loss import small_loss_order


@dataclass(frozen=True)
class CoteachingParams(MethodParams):
    name = "coteaching"
    slug_fields = ("tau",)
    tau: float = param(ge=0, le=1, doc="final drop rate, E[rho_k] of the noise (0.75 Sym, 0.3 Asym/Mixed, 0.39 Clothing1M)")
    t_k: int = param(25, ge=1, rounds=True, doc="rounds over which the drop rate ramps up to tau")
    c: float = param(1.0, gt=0, doc="ramp exponent")
    tau_scope: str = param("all", choices=("all", "noisy_only"),
                           switch="'all' (spec §9(a): one tau for every client) | 'noisy_only' (fedgr.md A11: tau = 0 "
                                  "on clean clients, oracle)")
    evaluate: str = param("net1", choices=("net1", "net2"), switch="'net1' (spec §9(b)) | 'net2'")
    log_networks: bool = param(True, slug=False, doc="log the other network's test metrics too; not in the slug")


def keep_rate(r: int, tau: float, t_k: int, c: float = 1.0) -> float:
    """R(r) = 1 - tau min(r^c / T_k, 1): the fraction of each batch kept in round r."""
    return 1.0 - tau * min(r**c / t_k, 1.0)


def small_loss_masks(losses: torch.Tensor, m: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(K, B) bool: each client's m_k smallest losses among its real rows (a stable sort: ties broken by
    position, padded rows last)."""
    order, kept = small_loss_order(losses, m, mask)  # RoFL's selection, scattered back to the row order
    return torch.zeros_like(order, dtype=torch.bool).scatter_(1, order, kept)


def exchanged_losses(l1: torch.Tensor, l2: torch.Tensor, m: torch.Tensor,
                     mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean l1 over S2, mean l2 over S1) of K clients, each (K,): each network learns from its peer's m_k
    small-loss samples; l1, l2 (K, B) per-sample losses, m (K,), mask (K, B) real rows or None."""
    s1, s2 = small_loss_masks(l1, m, mask), small_loss_masks(l2, m, mask)
    return masked_mean(l1, s2), masked_mean(l2, s1)  # S_k holds m_k rows


@METHODS.register
class Coteaching(FLMethod):
    Params = CoteachingParams
    paper = "Han et al. 2018 (Co-teaching); FL-Coteaching in FedGR"
    networks = ("net1", "net2")

    def __init__(self, params: CoteachingParams, ctx):
        super().__init__(params, ctx)
        data = ctx.data
        # clients holding any wrong given label (only the 'noisy_only' scope reads it: an oracle)
        wrong = (data.given != data.y_true).cpu()
        self.noisy_clients = frozenset(k for k, idx in enumerate(data.clients) if bool(wrong[idx].any()))

    def client_tau(self, k: int) -> float:
        if self.params.tau_scope == "noisy_only" and k not in self.noisy_clients:
            return 0.0
        return self.params.tau

    def begin_round(self, r: int) -> None:
        super().begin_round(r)
        self.round_info["keep_rate"] = keep_rate(r, self.params.tau, self.params.t_k, self.params.c)  # a client with tau

    def loss(self, sb) -> torch.Tensor:
        """Both networks' per-sample CE on the same batches, exchanged (:func:`exchanged_losses`) -> (K,)."""
        k, b = sb.idx.shape
        y = self.labels(sb.idx.reshape(-1))
        l1, l2 = (F.cross_entropy(sb.of(n).reshape(k * b, -1), y, reduction="none").view(k, b) for n in self.networks)
        rows = torch.full((k,), b, device=l1.device) if sb.mask is None else sb.mask.sum(1)
        rates = torch.tensor([job.info for job in sb.jobs], dtype=torch.float64).to(l1.device, non_blocking=True)
        m = torch.floor(rates * rows).clamp_min(1)  # m_k = max(1, floor(R(r) |B_k|)), in float64 (job.info: R(r))
        a, c = exchanged_losses(l1, l2, m, sb.mask)
        return a + c  # disjoint parameters: each network gets only its own term's gradient

    def prepare(self, r: int, k: int, nets: dict) -> LocalJob:
        rate = keep_rate(r, self.client_tau(k), self.params.t_k, self.params.c)
        return LocalJob(phases=[Phase(train=("net1", "net2"))], info=rate)

    stages = {"main": Stage(prepare=prepare, loss=loss)}

    def end_round(self, r: int) -> None:
        super().end_round(r)
        other = "net2" if self.params.evaluate == "net1" else "net1"
        if self.params.log_networks and self.should_evaluate(r):
            self.round_info.update({f"{other}_{k}": v for k, v in evaluate(self.ctx, self.globals[other]).items()})

    def eval_model(self) -> torch.nn.Module:
        return self.globals[self.params.evaluate]
