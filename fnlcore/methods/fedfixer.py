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

from .api import Batch, ClientStore, FLMethod, load, LocalJob, MethodParams, param, Phase, register, Stage, State

EMPTY_SCALE = 1e8  # the code's divisor for an empty selection and for Σ n̄ = 0
LOG_EPS = 1e-8


@dataclass(frozen=True)
class FedFixerParams(MethodParams):
    name = "fedfixer"
    slug_fields = (("beta_max", "bmax"),)
    switches = {
        "personalised": "'reinit' (code default: θ from the global model every round) | 'persistent' "
                        "(θ_k kept per client, the code's 'without regularisation term' ablation with lam = 0)",
        "cr_loss": "true | false (code ablation 'without CR': plain CE)",
        "alternate": "true (cross selection) | false (code ablation 'without alternative update')",
        "beta_max": "2 (CIFAR-10) | 20 (CIFAR-100) | 1.0 (Clothing1M, value the code executes; option help says 2.8)",
    }
    beta_max: float = param(2.0, ge=0, doc="β_max of the CR loss (CIFAR-10 2, CIFAR-100 20, Clothing1M 1.0)")
    begin_sel: int = param(10, ge=0, rounds=True, doc="rounds r ≤ begin_sel train on every sample; also sets the β ramp")
    lam: float = param(15.0, ge=0, doc="λ: coupling of θ and w (regulariser and the move of w)")
    inner_steps: int = param(5, ge=1, doc="K: personalised steps per minibatch")
    mu_wd: float = param(0.001, ge=0, doc="μ: weight decay inside the personalised update")
    gamma: float = param(1.0, ge=0, le=1, doc="γ: server mixing of the aggregate with the old global model")
    plr: float | None = param(None, gt=0, doc="personalised learning rate (None = the run's lr)")
    personalised: str = param("reinit", choices=("reinit", "persistent"))
    cr_loss: bool = True
    alternate: bool = True


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
    return -torch.log(F.softmax(logits, dim=1) + LOG_EPS).mean(1)


def cr_losses(logits: torch.Tensor, y: torch.Tensor, beta: float, cr: bool = True) -> torch.Tensor:
    """Per-sample ℓ_CR = CE − β·(1/C)Σ_c[−log p_c] (plain CE when ``cr`` is false)."""
    ce = F.cross_entropy(logits, y, reduction="none")
    return ce - beta * mean_neg_log_prob(logits) if cr else ce


def clean_for(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The CR sieve: CE − (1/C)Σ_c[−log p_c] ≤ 0."""
    with torch.no_grad():
        return F.cross_entropy(logits, y, reduction="none") - mean_neg_log_prob(logits) <= 0


def selected_mean(losses_all: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(mean of the selected per-sample losses, their number); none selected → mean of all / 1e8."""
    n = int(mask.sum())
    if n == 0:
        return losses_all.mean() / EMPTY_SCALE, 0
    return losses_all[mask].sum() / n, n


@torch.no_grad()
def twin_step(theta: list[torch.Tensor], w: list[torch.Tensor], plr: float, lam: float, mu: float) -> None:
    """θ ← θ − plr·(∇ + λ(θ − w) + μθ), in place (parameters without a gradient use ∇ = 0)."""
    for p, q in zip(theta, w):
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        p.sub_(plr * (g + lam * (p - q) + mu * p))


@torch.no_grad()
def move_towards(w: list[torch.Tensor], theta: list[torch.Tensor], rate: float) -> None:
    """w ← w − rate·(w − θ), in place (rate = λ·lr)."""
    for p, q in zip(w, theta):
        p.sub_(rate * (p - q))


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
    denom = total if total != 0 else total + EMPTY_SCALE
    out: State = {}
    for key, ref in old.items():
        if key not in acc:
            out[key] = first[key] if first is not None else ref.clone()
            continue
        out[key] = (gamma * acc.pop(key) / denom + (1.0 - gamma) * ref.to(torch.float64)).to(ref.dtype)
    return out


# -- the method ----------------------------------------------------------------------------


@dataclass
class _Twin:
    """One client's twin training: the parameter lists, this epoch's β and rates, w's sample count."""

    theta: list[torch.Tensor]
    w: list[torch.Tensor]
    beta: float = 0.0
    plr: float = 0.0  # θ's (and w's optimiser's) rate this epoch
    lr: float = 0.0  # the rate of w's move towards θ this epoch
    used: int = 0  # samples in w's losses, summed over the epochs


@register
class FedFixer(FLMethod):
    Params = FedFixerParams
    paper = "Ji et al. 2024 (AAAI), FedFixer; baseline in FedGR"
    round_cost = 6.8  # benchmarks/README.md, bench_methods.py (the personalised and global models both train)
    client_networks = ("theta",)  # the personalised model θ of the client being trained
    persistent = ("personal",)

    def __init__(self, params: FedFixerParams, ctx):
        super().__init__(params, ctx)
        self.personal = ClientStore("personal")  # client -> θ_k, 'persistent' only

    def stage(self, r: int) -> str:
        return "early" if r <= self.params.begin_sel else "sieve"

    def select(self, z_p: torch.Tensor, z_g: torch.Tensor, y: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(samples for θ's loss, samples for w's loss): all early, else the peer's clean set (cross)."""
        if r <= self.params.begin_sel:
            every = torch.ones_like(y, dtype=torch.bool)
            return every, every
        s_theta, s_w = clean_for(z_p, y), clean_for(z_g, y)
        return (s_w, s_theta) if self.params.alternate else (s_theta, s_w)

    def prepare(self, r: int, k: int, nets: dict) -> LocalJob:
        p, s = self.params, self.ctx.settings
        theta_net = nets["theta"]
        if p.personalised == "persistent" and k in self.personal:
            load(theta_net, self.personal.get(k))
        else:
            load(theta_net, self.global_model.state_dict())
        theta_net.train()  # stepped by hand (twin_step), not by the engine
        twin = _Twin(list(theta_net.parameters()), list(nets["model"].parameters()))
        base_lr = s.lr_at(r)
        base_plr = base_lr if p.plr is None else p.plr

        def on_epoch(epoch: int) -> None:
            twin.beta = beta_schedule(r * s.local_epochs + epoch, s.local_epochs, p.begin_sel, p.beta_max)
            twin.plr, twin.lr = base_plr / (1.0 + twin.beta), base_lr / (1.0 + twin.beta)
            for group in job.optimizers["model"].param_groups:
                group["lr"] = twin.plr

        # w's optimiser is the run's at plr, rescaled every epoch; θ has none
        job = LocalJob(phases=[Phase(step=self._step, on_epoch=on_epoch)], lr={"model": base_plr}, info=twin)
        return job

    def _step(self, b: Batch) -> torch.Tensor:
        """One minibatch: K personalised steps on θ, w's move towards θ, one optimiser step on w."""
        p, twin = self.params, b.job.info
        theta_net, w_net = b.nets["theta"], b.model
        y = self.labels(b.idx)
        for step in range(p.inner_steps):
            z_p = theta_net(b.x).float()
            if step == p.inner_steps - 1:
                z_g = w_net(b.x).float()
            else:
                with torch.no_grad():
                    z_g = w_net(b.x).float()
            for_theta, for_w = self.select(z_p, z_g, y, b.r)
            loss_theta, _ = selected_mean(cr_losses(z_p, y, twin.beta, p.cr_loss), for_theta)
            theta_net.zero_grad(set_to_none=True)
            loss_theta.backward()
            twin_step(twin.theta, twin.w, twin.plr, p.lam, p.mu_wd)
        loss_w, n_w = selected_mean(cr_losses(z_g, y, twin.beta, p.cr_loss), for_w)
        opt_w = b.job.optimizers["model"]
        opt_w.zero_grad(set_to_none=True)
        loss_w.backward()  # gradient at w before the move, as the code
        move_towards(twin.w, twin.theta, p.lam * twin.lr)
        opt_w.step()
        twin.used += n_w
        return loss_w

    def upload(self, r: int, k: int, job: LocalJob, nets: dict) -> dict:
        if self.params.personalised == "persistent":
            self.personal.put(k, nets["theta"].state_dict())
        return {"n_bar": float(job.info.used) / max(self.ctx.settings.local_epochs, 1)}  # n̄: per local epoch

    stages = {"early": Stage(prepare=prepare, upload=upload), "sieve": Stage(prepare=prepare, upload=upload)}

    def aggregate(self, r: int, updates) -> None:
        """w_g ← γ·Σ n̄_k w_k / Σ n̄_k + (1 − γ)·w_g."""
        fracs = []

        def weighted():  # streamed: a client's state is dropped once it is summed
            for upd in updates:
                n_bar = float(upd.uploads["n_bar"])
                fracs.append(n_bar / max(upd.num_samples, 1))
                yield upd.state, n_bar

        load(self.global_model, mix_aggregate(self.global_model.state_dict(), weighted(), self.params.gamma))
        if fracs:
            self.round_info["selected_frac"] = float(sum(fracs) / len(fracs))
