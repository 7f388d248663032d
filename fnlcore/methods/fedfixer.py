"""FedFixer (Ji et al., AAAI'24; dual model), FedGR's baseline (baselines.md §11, A10).

A client trains two networks on the same minibatches: a personalised model θ_k and its copy w_k of
the global model. Per-sample confidence-regularised loss (CORES, uniform prior):
ℓ_CR(x, y) = CE(z, y) − β_e·(1/C)Σ_c[−log(p_c + 1e-8)]; a sample is "clean for model M" when
CE_M(x, y) − (1/C)Σ_c[−log(p_{M,c} + 1e-8)] ≤ 0.

β_e, e = r·E + local epoch: 0 for the first E·int(begin_sel/5) epochs, then linear 0 → β_max over
E·begin_sel epochs (numpy linspace, both ends included), then β_max. Both learning rates are
divided by (1 + β_e) for that local epoch.

Per minibatch (both networks in train mode, the run's training augmentation):
1. K inner steps: forward both networks; for r ≤ begin_sel every sample is selected, otherwise
   S_θ = clean-for-θ, S_w = clean-for-w; loss_θ = mean over S_w of ℓ_CR^θ;
   θ ← θ − plr·(∇loss_θ + λ(θ − w) + μ_wd·θ) (parameters only);
2. w ← w − λ·lr·(w − θ);
3. one step of the run's optimiser on w with loss_w = mean over S_θ of ℓ_CR^w, S_θ and w's outputs
   from the last inner step (cross selection);
4. an empty selection: the mean CR loss over all samples divided by 1e8 (no update in effect);
n̄_k = mean over local epochs of the number of samples in w's losses.

Server: w_g ← γ·Σ_k n̄_k w_k / Σ_k n̄_k + (1 − γ)·w_g (float entries; integer buffers from the
first client); Σ n̄ = 0 → the first term is Σ n̄_k w_k / 1e8 = 0, as the code. The global model is
evaluated. Upload: w_k and the scalar n̄_k.

Code (ResearchFL/HeteroFedNoisyLabelLearning, "FedTwin") faithful details:
- w's optimiser is the run's (003 overrides momentum and weight decay, §11(c)), built once per local
  update, its rate set every local epoch to plr/(1 + β_e) (the code's plan for that optimiser is
  plr's; plr defaults to the run's lr); the move of step 2 uses lr/(1 + β_e);
- w's forward passes of the K inner steps all run in train mode (BN statistics move K times per
  batch), its gradient comes from the last one, taken before the move of step 2 and applied after.

Switches: ``personalised`` 'reinit' (code default, §11(a): θ starts from the global model every
round) | 'persistent' (θ_k kept per client in the method state, checkpointed; the code's
"without regularisation term" ablation, which also sets λ = 0); ``cr_loss`` false = the code's
"without CR" ablation (plain CE, the sieve unchanged); ``alternate`` false = its "without
alternative update" ablation (each network trains on its own clean set).

Decided where the spec is silent: a persistent θ_k is created from the global model at the
client's first selection; the per-client θ_k are kept in a ClientStore (on disk between selections).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .api import (ClientStore, FLMethod, LocalJob, MethodParams, StackedBatch, Stage, State, assign_clients_,
                  load, masked_mean, param, METHODS)
from .api import numerics

EMPTY_SCALE = 1e8  # the code's divisor for an empty selection and for Σ n̄ = 0
LOG_EPS = 1e-8


@dataclass(frozen=True)
class FedFixerParams(MethodParams):
    name = "fedfixer"
    slug_fields = (("beta_max", "bmax"),)
    beta_max: float = param(2.0, ge=0, doc="β_max of the CR loss (CIFAR-10 2, CIFAR-100 20, Clothing1M 1.0)",
                            switch="2 (CIFAR-10) | 20 (CIFAR-100) | 1.0 (Clothing1M, value the code executes; option "
                                   "help says 2.8)")
    begin_sel: int = param(10, ge=0, rounds=True, doc="rounds r ≤ begin_sel train on every sample; also sets the β ramp")
    lam: float = param(15.0, ge=0, doc="λ: coupling of θ and w (regulariser and the move of w)")
    inner_steps: int = param(5, ge=1, doc="K: personalised steps per minibatch")
    mu_wd: float = param(0.001, ge=0, doc="μ: weight decay inside the personalised update")
    gamma: float = param(1.0, ge=0, le=1, doc="γ: server mixing of the aggregate with the old global model")
    plr: float | None = param(None, gt=0, doc="personalised learning rate (None = the run's lr)")
    personalised: str = param("reinit", choices=("reinit", "persistent"),
                              switch="'reinit' (code default: θ from the global model every round) | 'persistent' (θ_k "
                                     "kept per client, the code's 'without regularisation term' ablation with lam = 0)")
    cr_loss: bool = param(True, switch="true | false (code ablation 'without CR': plain CE)")
    alternate: bool = param(True, switch="true (cross selection) | false (code ablation 'without alternative update')")


# -- pure parts ----------------------------------------------------------------------------


def beta_schedule(epoch: int, local_epochs: int, begin_sel: int, beta_max: float) -> float:
    """β_e of the code's plan: E·int(begin_sel/5) zeros, linspace(0, β_max, E·begin_sel), then β_max."""
    zeros, ramp = local_epochs * int(begin_sel / 5), local_epochs * begin_sel
    if epoch < zeros:
        return 0.0
    if epoch < zeros + ramp:
        return 0.0 if ramp == 1 else beta_max * (epoch - zeros) / (ramp - 1)
    return float(beta_max)


def mean_neg_log_prob(logits: torch.Tensor) -> torch.Tensor:
    """(1/C) Σ_c −log(p_c + 1e-8) per sample."""
    return -numerics.log(F.softmax(logits, dim=1) + LOG_EPS).mean(1)


def cr_losses(logits: torch.Tensor, y: torch.Tensor, beta: float, cr: bool = True) -> torch.Tensor:
    """Per-sample ℓ_CR = CE − β·(1/C)Σ_c[−log p_c] (plain CE when ``cr`` is false)."""
    ce = F.cross_entropy(logits, y, reduction="none")
    return ce - beta * mean_neg_log_prob(logits) if cr else ce


def clean_for(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The CR sieve: CE − (1/C)Σ_c[−log p_c] ≤ 0."""
    with torch.no_grad():
        return F.cross_entropy(logits, y, reduction="none") - mean_neg_log_prob(logits) <= 0


def selected_mean(losses: torch.Tensor, selected: torch.Tensor, mask: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, B) per-sample losses -> ((K,) each client's mean over its selected real rows, (K,) their number);
    a client with none selected: the mean over its real rows / 1e8 (the code's branch, no update in
    effect). Both branches are computed and chosen on the device (no host sync)."""
    sel = selected if mask is None else selected & mask
    n = sel.sum(-1)
    picked = torch.where(sel, losses, torch.zeros((), dtype=losses.dtype, device=losses.device)).sum(-1)
    return torch.where(n > 0, picked / n.clamp_min(1).to(losses.dtype), masked_mean(losses, mask) / EMPTY_SCALE), n


def _over(v: float | torch.Tensor, t: torch.Tensor) -> float | torch.Tensor:
    """A per-client value (one float, or (K,)) over a (K, ...) tensor."""
    return v if not isinstance(v, torch.Tensor) else v.to(t.dtype).view(-1, *([1] * (t.dim() - 1)))


@torch.no_grad()
def twin_step(theta: dict, grads: dict, w: dict, plr, lam: float, mu: float) -> dict:
    """θ − plr·(∇ + λ(θ − w) + μθ), by parameter name, (K, ...) each (``plr`` one rate or (K,))."""
    return {n: t - _over(plr, t) * (grads[n] + lam * (t - w[n]) + mu * t) for n, t in theta.items()}


@torch.no_grad()
def move_towards(w: dict, theta: dict, rate) -> dict:
    """w − rate·(w − θ), by parameter name (``rate`` = λ·lr, one value or (K,))."""
    return {n: t - _over(rate, t) * (t - theta[n]) for n, t in w.items()}


def mix_aggregate(old: State, weighted: Iterable[tuple[State, float]], gamma: float) -> State:
    """γ·Σ n̄_k w_k / Σ n̄_k + (1 − γ)·old on float entries (Σ n̄ = 0 → the first term is 0); integers
    from the first state. ``weighted``: (w_k, n̄_k) pairs, consumed once: one client's state is held at
    a time beside a float64 sum (not the round's every state: ten ResNet-50s are 0.9 GB)."""
    acc = {key: torch.zeros_like(ref, dtype=torch.float64) for key, ref in old.items() if ref.is_floating_point()}
    first: State | None = None
    total = 0.0
    for s, wt in weighted:  # each key sums its clients in client order, as one loop over keys did
        if first is None:
            first = {key: s[key].clone() for key in old if key not in acc}
        for key, a in acc.items():
            a.add_(s[key].to(torch.float64), alpha=float(wt))
        total += float(wt)
    denom = total or EMPTY_SCALE
    if first is None:  # no client: integer entries from the old state
        first = {key: ref.clone() for key, ref in old.items() if key not in acc}
    return {key: (gamma * acc.pop(key) / denom + (1.0 - gamma) * ref.to(torch.float64)).to(ref.dtype)
            if key in acc else first[key] for key, ref in old.items()}  # pop: each sum freed once used


# -- the method ----------------------------------------------------------------------------


@METHODS.register
class FedFixer(FLMethod):
    Params = FedFixerParams
    paper = "Ji et al. 2024 (AAAI), FedFixer; baseline in FedGR"
    client_networks = ("theta",)  # the personalised model θ, kept per client while it trains
    persistent = ("personal",)

    def __init__(self, params: FedFixerParams, ctx):
        super().__init__(params, ctx)
        self.personal = ClientStore("personal")  # client -> θ_k, 'persistent' only
        self._used = torch.zeros(0)  # (K,) samples in w's losses, the chunk's clients (Stage.begin)

    def stage_name(self, r: int) -> str:
        return "early" if r <= self.params.begin_sel else "sieve"

    def select(self, z_p: torch.Tensor, z_g: torch.Tensor, y: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(samples for θ's loss, samples for w's loss): all early, else the peer's clean set (cross)."""
        if r <= self.params.begin_sel:
            every = torch.ones_like(y, dtype=torch.bool)
            return every, every
        s_theta, s_w = clean_for(z_p, y), clean_for(z_g, y)
        return (s_w, s_theta) if self.params.alternate else (s_theta, s_w)

    def rates(self, r: int, epoch: int) -> tuple[float, float, float]:
        """(β_e, plr / (1 + β_e): θ's and w's optimiser's rate, lr / (1 + β_e): w's move) of a local epoch."""
        p, s = self.params, self.ctx.settings
        beta = beta_schedule(r * s.local_epochs + epoch, s.local_epochs, p.begin_sel, p.beta_max)
        lr = s.lr_at(r)
        return beta, (lr if p.plr is None else p.plr) / (1.0 + beta), lr / (1.0 + beta)

    def _per_client(self, sb: StackedBatch, which: int) -> float | torch.Tensor:
        """Rate ``which`` of each client's local epoch: one value when they agree, else (K,) on the device."""
        v = [self.rates(sb.r, e)[which] for e in sb.epochs]
        return v[0] if all(x == v[0] for x in v) else torch.tensor(v).to(self.ctx.device, non_blocking=True)

    def prepare(self, r: int, k: int, nets: dict) -> None:
        load(nets["theta"], self.personal.get(k) if self.params.personalised == "persistent" and k in self.personal
             else self.global_model.state_dict())
        nets["theta"].train()  # θ trains (the loss's twin steps), w is the engine's trained network

    def begin(self, r: int, clients: list[int], jobs: list) -> None:
        self._used = torch.zeros(len(clients), dtype=torch.int64, device=self.ctx.device)

    def loss(self, sb: StackedBatch) -> torch.Tensor:
        """One minibatch: K personalised steps on θ, then w's loss (the engine steps w after ``move``).

        w's forward with a gradient is the engine's (``sb.logits``); its other K − 1 forwards run here in
        train mode without one, as the code's inner steps do (its BatchNorm statistics move K times).
        w does not change during the inner steps, so each of its forwards gives these logits."""
        p = self.params
        k, b, c = sb.logits.shape
        y = self.labels(sb.idx.reshape(-1))
        beta, plr = self._per_client(sb, 0), self._per_client(sb, 1)
        beta_rows = beta if not isinstance(beta, torch.Tensor) else beta.float().repeat_interleave(b)
        theta, z_g = sb.copies["theta"], sb.logits.float().reshape(k * b, c)
        with torch.no_grad():
            for _ in range(p.inner_steps - 1):
                sb.forward(sb.x)
        w = sb.parameters()
        for _ in range(p.inner_steps):
            z_p = theta.forward(sb.x, sb.mask).float().reshape(k * b, c)
            for_theta, for_w = self.select(z_p, z_g, y, sb.r)
            loss_theta, _ = selected_mean(cr_losses(z_p, y, beta_rows, p.cr_loss).view(k, b), for_theta.view(k, b),
                                          sb.mask)
            theta.assign_(twin_step(theta.parameters(), theta.grads(loss_theta.sum()), w, plr, p.lam, p.mu_wd),
                          sb.moved)
        loss_w, n_w = selected_mean(cr_losses(z_g, y, beta_rows, p.cr_loss).view(k, b), for_w.view(k, b), sb.mask)
        self._used += n_w
        return loss_w

    def move(self, sb: StackedBatch, stepped: torch.Tensor) -> None:
        """w ← w − λ·lr·(w − θ) after w's gradient is taken, before its optimiser step (the code's order)."""
        w, theta = sb.parameters(), sb.copies["theta"].parameters()
        moved = move_towards({n: w[n] for n in theta}, theta, self.params.lam * self._per_client(sb, 2))
        assign_clients_([w[n] for n in moved], list(moved.values()), sb.moved)  # sb.moved None: all stepped

    def w_lr(self, r: int, epoch: int) -> float:
        """w's optimiser is the run's, at plr / (1 + β_e) in each local epoch."""
        return self.rates(r, epoch)[1]

    def end(self, r: int, clients: list[int], jobs: list) -> None:
        for job, n in zip(jobs, self._used.tolist()):  # once a chunk: samples in w's losses
            job.info = n

    def upload(self, r: int, k: int, job: LocalJob, nets: dict) -> dict:
        if self.params.personalised == "persistent":
            self.personal.put(k, nets["theta"].state_dict())
        return {"n_bar": float(job.info) / max(self.ctx.settings.local_epochs, 1)}  # n̄: per local epoch

    stages = dict.fromkeys(("early", "sieve"), Stage(loss=loss, prepare=prepare, upload=upload, copies=("theta",),
                                                     begin=begin, end=end, before_step=move, epoch_lr=w_lr))

    def aggregate(self, r: int, updates) -> None:
        fracs = []

        def weighted():  # streamed: a client's state is dropped once it is summed
            for upd in updates:
                n_bar = float(upd.uploads["n_bar"])
                fracs.append(n_bar / max(upd.num_samples, 1))
                yield upd.state, n_bar

        load(self.global_model, mix_aggregate(self.global_model.state_dict(), weighted(), self.params.gamma))
        if fracs:
            self.round_info["selected_frac"] = float(sum(fracs) / len(fracs))
