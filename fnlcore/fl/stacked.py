"""K copies of one network trained as a single network: the batched-clients engine's model.

Layout: the K clients' batches of one step form one tensor (B, K*C, H, W): row b, channels
[k*C, (k+1)*C) hold sample b of client k. On that layout
- a convolution is one grouped convolution (groups x K) over the K stacked weights;
- BatchNorm over K*C channels takes each client's own batch statistics, running
  statistics included (a row mask drops padded rows when clients' batches differ in size);
- ReLU, pooling, residual additions and flatten act per channel or per sample, so they run
  unchanged (flattening (B, K*C, H, W) puts client k's features at [k*CHW, (k+1)*CHW), in
  its own order);
- a Linear layer reads (B, K*F) as (B, K, F) and applies the K weight matrices in one
  batched matrix product.
Every stacked parameter or buffer has shape (K, *original shape); client k's slice is its
model, under the original state-dict key. Inputs are channels-last: the CPU's grouped
convolutions are several times faster so (measured in benchmarks/bench_batched.py).

A model is stackable when its layers are among STACKABLE (any container whose own forward
acts per channel and per sample, as every backbone here does); dropout is refused, its masks
would come from another random stream than the sequential engine's.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .. import numerics
from ..errors import ConfigError

# Parameter-free layers that act per sample and per channel (they run unchanged on the layout).
_PASS_THROUGH = (
    nn.ReLU, nn.LeakyReLU, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.Identity,
)
STACKABLE = ("Conv2d", "Linear", "BatchNorm2d", "Flatten") + tuple(t.__name__ for t in _PASS_THROUGH)


# On the CPU, a convolution with more input channels per group than this runs as K convolutions.
SPLIT_CONV_CHANNELS = 64

# The device type whose code paths the choices by device below take (None: the tensors' own);
# fnlcore.app.opcount.gpu_paths sets "cuda" to count a GPU's ops on a CPU.
DEVICE_PATHS: str | None = None


def _paths(device: torch.device) -> str:
    return DEVICE_PATHS or device.type


class _Rows:
    """The step's row mask shared by the BatchNorm layers: (B, K) float, or None when every row is real."""

    mask: torch.Tensor | None = None


def _stack(t: torch.Tensor, k: int) -> torch.Tensor:
    return t.detach().unsqueeze(0).repeat(k, *([1] * t.dim())).clone()


class StackedConv2d(nn.Module):
    def __init__(self, m: nn.Conv2d, k: int):
        super().__init__()
        if m.padding_mode != "zeros":
            raise ConfigError(f"batched engine: Conv2d padding_mode={m.padding_mode!r} is not stackable; use engine: sequential")
        self.k, self.stride, self.padding, self.dilation, self.groups = k, m.stride, m.padding, m.dilation, m.groups
        self.weight = nn.Parameter(_stack(m.weight, k))
        self.bias = nn.Parameter(_stack(m.bias, k)) if m.bias is not None else None

        # CPU grouped convolutions lose to K separate ones beyond ~64 input channels a group
        # (benchmarks/README.md, "batched clients"); the device decides on its first call.
        self.split: bool | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.split is None:
            self.split = _paths(x.device) == "cpu" and self.weight.shape[2] > SPLIT_CONV_CHANNELS
        if self.split:  # unbind/chunk: one gradient gather each, not K full-size zero-filled ones
            biases = self.bias.unbind(0) if self.bias is not None else [None] * self.k
            outs = [
                F.conv2d(xi, wi, bi, self.stride, self.padding, self.dilation, self.groups)
                for xi, wi, bi in zip(x.chunk(self.k, 1), self.weight.unbind(0), biases)
            ]
            return torch.cat(outs, 1)
        w = self.weight.view(-1, *self.weight.shape[2:])
        b = self.bias.view(-1) if self.bias is not None else None
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, self.groups * self.k)


class StackedLinear(nn.Module):
    def __init__(self, m: nn.Linear, k: int):
        super().__init__()
        self.k = k
        self.weight = nn.Parameter(_stack(m.weight, k))  # (K, out, in)
        self.bias = nn.Parameter(_stack(m.bias, k)) if m.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        xk = x.reshape(b, self.k, -1).transpose(0, 1)  # (K, B, in)
        if self.bias is not None:
            out = torch.baddbmm(self.bias.unsqueeze(1), xk, self.weight.transpose(1, 2))
        else:
            out = torch.bmm(xk, self.weight.transpose(1, 2))
        return out.transpose(0, 1).reshape(b, -1)  # (B, K*out)


class StackedBatchNorm2d(nn.Module):
    def __init__(self, m: nn.BatchNorm2d, k: int, rows: _Rows):
        super().__init__()
        if m.momentum is None or not m.track_running_stats or not m.affine:
            raise ConfigError(
                "batched engine: BatchNorm2d needs affine=True, track_running_stats=True and a numeric momentum "
                "(the backbones here all have them); use engine: sequential for this model"
            )
        self.k, self.c, self.eps, self.momentum, self.rows = k, m.num_features, m.eps, m.momentum, rows
        self.weight = nn.Parameter(_stack(m.weight, k))
        self.bias = nn.Parameter(_stack(m.bias, k))
        self.register_buffer("running_mean", _stack(m.running_mean, k))
        self.register_buffer("running_var", _stack(m.running_var, k))
        self.register_buffer("num_batches_tracked", _stack(m.num_batches_tracked, k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(
                x, self.running_mean.view(-1), self.running_var.view(-1), self.weight.view(-1), self.bias.view(-1),
                False, 0.0, self.eps,
            )
        mask = self.rows.mask
        if mask is None:  # every client has a full batch: the library kernel, running stats in place
            self.num_batches_tracked.add_(1)
            return F.batch_norm(
                x, self.running_mean.view(-1), self.running_var.view(-1), self.weight.view(-1), self.bias.view(-1),
                True, self.momentum, self.eps,
            )
        return self._masked(x, mask)

    def _masked(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-client statistics over the real rows only (clients with no rows keep their running stats)."""
        b, _, h, w = x.shape
        xv = x.view(b, self.k, self.c, h, w)
        mw = mask.view(b, self.k, 1, 1, 1)
        rows = mask.sum(0)  # (K,)
        n = (rows * (h * w)).clamp_min(1.0)[:, None]
        active = (rows > 0)[:, None]
        mean = (xv * mw).sum((0, 3, 4)) / n
        centred = xv - mean[None, :, :, None, None]
        var = torch.where(active, (centred.square() * mw).sum((0, 3, 4)) / n, torch.ones_like(mean))
        with torch.no_grad():
            unbiased = var * n / (n - 1).clamp_min(1.0)
            m = self.momentum
            self.running_mean.copy_(torch.where(active, (1 - m) * self.running_mean + m * mean, self.running_mean))
            self.running_var.copy_(torch.where(active, (1 - m) * self.running_var + m * unbiased, self.running_var))
            self.num_batches_tracked.add_(active.view(-1).long())
        scale = (self.weight * torch.rsqrt(var + self.eps))[None, :, :, None, None]
        return (centred * scale + self.bias[None, :, :, None, None]).view(b, self.k * self.c, h, w)


class StackedNet(nn.Module):
    """``k`` copies of ``template`` as one module on the stacked layout (see the module doc)."""

    def __init__(self, template: nn.Module, k: int):
        super().__init__()
        self.k = k
        self.rows = _Rows()
        self.keys = list(template.state_dict().keys())
        self.net = _convert(copy.deepcopy(template), k, self.rows, "model")
        own = set(self.net.state_dict().keys())
        if own != set(self.keys):  # a layer kept a parameter the conversion did not stack
            raise ConfigError(f"batched engine: cannot stack every tensor of the model ({sorted(own ^ set(self.keys))[:3]})")

    def forward(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, K*C, H, W) on the stacked layout; rows: (B, K) float mask of real rows or None.

        Returns the logits as (K, B, classes)."""
        self.rows.mask = rows
        try:
            out = self.net(x)
        finally:
            self.rows.mask = None
        return out.view(x.shape[0], self.k, -1).transpose(0, 1)

    def forward_features(self, x: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's ``forward_features`` (logits and penultimate features from one pass) on the
        stacked layout, as :meth:`forward`: returns (K, B, classes) logits and (K, B, ...) features."""
        fwd = getattr(self.net, "forward_features", None)
        if fwd is None:
            raise ConfigError(
                f"batched engine: the model ({type(self.net).__name__}) has no forward_features; use a model "
                "built by fnlcore.models (a backbone and a head) or engine: sequential"
            )
        self.rows.mask = rows
        try:
            logits, feats = fwd(x)
        finally:
            self.rows.mask = None
        b = x.shape[0]
        # channels [k*F, (k+1)*F) of the features are client k's (a flat vector or a feature map)
        feats = feats.reshape(b, self.k, feats.shape[1] // self.k, *feats.shape[2:]).transpose(0, 1)
        return logits.view(b, self.k, -1).transpose(0, 1), feats

    def load_all(self, state) -> None:
        """Every client's copy := ``state`` (the global model's state dict)."""
        mine = self.net.state_dict()
        with torch.no_grad():
            for key in self.keys:
                mine[key].copy_(state[key].unsqueeze(0).expand_as(mine[key]))

    def load_groups(self, states: list) -> None:
        """Copies in equal consecutive groups, group g := ``states[g]`` (several networks per client:
        copies g*K .. g*K + K-1 are network g of the K clients)."""
        per = self.k // len(states)
        if per * len(states) != self.k:
            raise ValueError(f"load_groups: {self.k} copies do not split into {len(states)} groups")
        mine = self.net.state_dict()
        with torch.no_grad():
            for key in self.keys:
                for g, state in enumerate(states):
                    mine[key][g * per : (g + 1) * per].copy_(state[key].unsqueeze(0).expand_as(mine[key][:per]))

    def load_client(self, i: int, state) -> None:
        """Client i's copy := ``state`` (a model state dict under the original keys)."""
        mine = self.net.state_dict()
        with torch.no_grad():
            for key in self.keys:
                mine[key][i].copy_(state[key])

    def client_state(self, i: int) -> dict[str, torch.Tensor]:
        """A detached copy of client i's model state, under the original keys."""
        mine = self.net.state_dict()
        return {key: mine[key][i].detach().clone() for key in self.keys}

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.net.parameters() if p.requires_grad]


def _convert(module: nn.Module, k: int, rows: _Rows, path: str) -> nn.Module:
    if isinstance(module, nn.Conv2d):
        return StackedConv2d(module, k)
    if isinstance(module, nn.Linear):
        return StackedLinear(module, k)
    if isinstance(module, nn.BatchNorm2d):
        return StackedBatchNorm2d(module, k, rows)
    if isinstance(module, nn.Dropout):
        if module.p == 0:
            return nn.Identity()
        raise ConfigError(
            f"batched engine: {path} is Dropout(p={module.p}); its masks would come from another random stream than "
            "the sequential engine's; use engine: sequential for this model"
        )
    if isinstance(module, nn.Flatten):
        if module.start_dim != 1 or module.end_dim != -1:
            raise ConfigError(f"batched engine: {path} flattens dims {module.start_dim}..{module.end_dim}; only 1..-1 stacks")
        return module
    if isinstance(module, _PASS_THROUGH) or (isinstance(module, nn.Sequential) and len(module) == 0):
        return module  # (an empty Sequential is an identity shortcut)
    children = dict(module.named_children())
    if not children:
        if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
            raise ConfigError(
                f"batched engine: {path} is a {type(module).__name__}, which has no stacked form "
                f"(stackable layers: {', '.join(STACKABLE)}); use engine: sequential for this model"
            )
        raise ConfigError(
            f"batched engine: {path} is a {type(module).__name__}, not known to act per sample and channel "
            f"(stackable layers: {', '.join(STACKABLE)}); use engine: sequential for this model"
        )
    if any(True for _ in module.parameters(recurse=False)):
        raise ConfigError(f"batched engine: {path} ({type(module).__name__}) holds parameters of its own; not stackable")
    for name, child in children.items():
        setattr(module, name, _convert(child, k, rows, f"{path}.{name}"))
    return module


def gains_on_cpu(model: nn.Module) -> bool:
    """Whether stacking this model is expected to be faster than one client after another on a CPU.

    Measured (benchmarks/README.md, "Batched clients"): yes for models without BatchNorm whose
    convolutions have at most SPLIT_CONV_CHANNELS input channels a group (Fed-NCL's LeNet-5:
    1.4-1.5x); no for ResNet-18 (0.6x): the CPU's BatchNorm over K*C channels in channels-last
    memory and its grouped or split wide convolutions lose to K separate NCHW passes."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            return False
        if isinstance(m, nn.Conv2d) and m.in_channels // m.groups > SPLIT_CONV_CHANNELS:
            return False
    return True


def check_stackable(template: nn.Module) -> None:
    """Raise the ConfigError :class:`StackedNet` would raise for this model (builds one copy)."""
    StackedNet(template, 1)


# -- optimisers on stacked parameters ------------------------------------------------------------
# Multi-tensor kernels (torch._foreach_*): a step is a handful of launches, not a few per parameter (some
# 300 on ResNet-18), which would dominate a GPU step at small batch sizes. On the CPU each runs the
# per-tensor kernel on every tensor in turn: the bits of the per-parameter loops they replace (kept as the
# reference in tests/test_foreach_updates.py). A Python scalar goes to an out-of-place op: an in-place one
# rounds it to a float16 or bfloat16 tensor's dtype first, which Tensor.mul_ does not.


@functools.lru_cache(maxsize=32)
def _row_starts(numels: tuple[int, ...], k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each (tensor, client) row but the first starts in the concatenation of (K, ...) tensors of
    ``numels`` elements, and the change of client index there; copied to the device once, not blocking."""
    starts, steps, at, prev = [], [], 0, 0
    for n in numels:
        if not n:  # no rows
            continue
        for c in range(k):
            if at:
                starts.append(at)
                steps.append(c - prev)
            prev, at = c, at + n // k
    return (torch.tensor(starts, dtype=torch.long).to(device, non_blocking=True),
            torch.tensor(steps, dtype=torch.int32).to(device, non_blocking=True))


def _clients(like: list[torch.Tensor]) -> torch.Tensor:
    """The client (index along dim 0) of every element of the concatenation of ``like``, (N,) int32, from a
    scatter and a cumulative sum (repeat_interleave needs no sync given its output size, but
    fnlcore.syncs counts it as one)."""
    starts, steps = _row_starts(tuple(t.numel() for t in like), like[0].shape[0], like[0].device)
    index = torch.zeros(sum(t.numel() for t in like), dtype=torch.int32, device=like[0].device)
    return index.scatter_(0, starts, steps).cumsum(0, dtype=torch.int32)


def _concatenated(like: list[torch.Tensor]) -> bool:
    """Whether per-client work goes over the concatenation of the tensors: on a GPU, where a launch per
    tensor costs more than the extra passes over memory; not on the CPU, where it is the other way round."""
    return _paths(like[0].device) != "cpu"


def per_client(values: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """(K,) ``values`` over each (K, ...) tensor of ``like``, in its dtype. Concatenated: full-size views of
    one buffer, as CUDA's multi-tensor kernels run a tensor at a time when an operand is a broadcast."""
    if not _concatenated(like):
        typed = {dt: values.to(dt) for dt in {t.dtype for t in like}}  # one conversion a dtype, not a tensor
        return [typed[t.dtype].view(-1, *([1] * (t.dim() - 1))) for t in like]
    index = _clients(like)
    spread = {dt: _unflatten_dense_tensors(values.to(dt).index_select(0, index), like)
              for dt in {t.dtype for t in like}}
    return [spread[t.dtype][i] for i, t in enumerate(like)]


def select_clients_(on: torch.Tensor, dst: list[torch.Tensor], new: list[torch.Tensor]) -> None:
    """``dst[i].copy_(torch.where(on (K,) over dim 0, new[i], dst[i]))`` for every i. torch.where has no
    multi-tensor form; concatenated: one select over the concatenations and one multi-tensor copy back, a
    dtype at a time (no conversion: exact bits)."""
    if not _concatenated(dst):
        for d, n in zip(dst, new):
            d.copy_(torch.where(on.view(-1, *([1] * (d.dim() - 1))), n, d))
        return
    for dtype in {d.dtype for d in dst}:
        ds = [d for d in dst if d.dtype == dtype]
        ns = [n for d, n in zip(dst, new) if d.dtype == dtype]
        sel = torch.where(on.index_select(0, _clients(ds)), _flatten_dense_tensors(ns), _flatten_dense_tensors(ds))
        torch._foreach_copy_(ds, _unflatten_dense_tensors(sel, ds))


class StackedSGD:
    """torch.optim.SGD (dampening 0, no Nesterov) on (K, ...) parameters, one step per client and step;
    ``lr`` one rate, or (K,) a rate per client.

    ``active`` (K,) bool leaves the other clients' parameters and momentum untouched: a client
    whose local update has ended (fewer samples) rides along without moving. The momentum
    buffer starts at zero, so the first step's m*0 + g is exactly the g torch starts from.
    """

    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 capturable: bool = False):
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.bufs = [torch.zeros_like(p) for p in params] if momentum else None
        self.capturable = capturable  # state updated in place (a CUDA graph replays on fixed addresses)

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], active: torch.Tensor | None = None) -> None:
        d = torch._foreach_add(grads, self.params, alpha=self.weight_decay) if self.weight_decay else grads
        if self.bufs is not None:
            new_bufs = list(torch._foreach_mul(self.bufs, self.momentum))  # a scalar: out of place (above)
            torch._foreach_add_(new_bufs, d)
            if active is None and self.capturable:
                torch._foreach_copy_(self.bufs, new_bufs)
            elif active is None:
                self.bufs = new_bufs
            else:
                select_clients_(active, self.bufs, new_bufs)
            d = self.bufs
        if isinstance(self.lr, torch.Tensor):  # (K,) a rate per client (each at its own local epoch's)
            new = torch._foreach_add(self.params, torch._foreach_mul(d, per_client(-self.lr, self.params)))
        elif active is None:
            torch._foreach_add_(self.params, d, alpha=-self.lr)
            return
        else:
            new = torch._foreach_add(self.params, d, alpha=-self.lr)
        if active is None:
            torch._foreach_copy_(self.params, new)
        else:
            select_clients_(active, self.params, new)


class StackedAdam:
    """torch.optim.Adam (L2 weight decay, no AMSGrad) on (K, ...) parameters with per-client step counts;
    ``lr`` one rate, or (K,) float64 a rate per client."""

    def __init__(
        self, params: list[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
        weight_decay: float = 0.0, capturable: bool = False,
    ):
        self.params, self.lr, self.betas, self.eps, self.weight_decay = params, lr, betas, eps, weight_decay
        self.capturable = capturable  # state updated in place (a CUDA graph replays on fixed addresses)
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        k = params[0].shape[0]
        self.steps = torch.zeros(k, dtype=torch.float64, device=params[0].device)

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], active: torch.Tensor | None = None) -> None:
        b1, b2 = self.betas
        self.steps += 1 if active is None else active.to(self.steps.dtype)
        t = self.steps.clamp_min(1)
        step_size = self.lr / (1 - b1 ** t)  # (K,) float64, as torch computes it in Python floats
        # the CPU's exact roots (torch's CPU square root depends on the CPU maker: fnlcore.numerics), the GPU's
        # own kernels (also what fnlcore.app.opcount counts for a GPU on the CPU)
        cpu = _paths(self.steps.device) == "cpu"
        bc2_sqrt = numerics.sqrt(1 - b2 ** t) if cpu else torch.sqrt(1 - b2 ** t)
        p = self.params
        g = torch._foreach_add(grads, p, alpha=self.weight_decay) if self.weight_decay else grads
        new_m = list(torch._foreach_lerp(self.m, g, 1 - b1))
        new_v = list(torch._foreach_mul(self.v, b2))  # scalars: out of place (above)
        torch._foreach_addcmul_(new_v, g, g, value=1 - b2)
        denom = numerics.foreach_sqrt(new_v) if cpu else torch._foreach_sqrt(new_v)
        torch._foreach_div_(denom, per_client(bc2_sqrt, p))
        denom = torch._foreach_add(denom, self.eps)
        update = torch._foreach_mul(per_client(step_size, p), new_m)
        torch._foreach_div_(update, denom)
        if active is None:  # the new moments replace the old ones
            if self.capturable:
                torch._foreach_copy_(self.m, new_m)
                torch._foreach_copy_(self.v, new_v)
            else:
                self.m, self.v = new_m, new_v
            torch._foreach_sub_(p, update)
        else:
            for dst, new in ((self.m, new_m), (self.v, new_v), (p, torch._foreach_sub(p, update))):
                select_clients_(active, dst, new)


def stacked_optimizer(settings, params: list[torch.Tensor], lr: float, capturable: bool = False):
    """The run's optimiser (TrainSettings: sgd | adam, momentum, weight decay) on stacked parameters;
    ``capturable``: its state updated in place (a step a CUDA graph can replay)."""
    if settings.optimizer == "adam":
        return StackedAdam(params, lr, (settings.beta1, settings.beta2), weight_decay=settings.weight_decay,
                           capturable=capturable)
    return StackedSGD(params, lr, settings.momentum, settings.weight_decay, capturable=capturable)


def stacked_input(x: torch.Tensor, k: int) -> torch.Tensor:
    """(K*B, C, H, W), client-major, -> (B, K*C, H, W) in channels-last memory (one copy)."""
    kb, c, h, w = x.shape
    b = kb // k
    y = x.view(k, b, c, h, w).permute(1, 3, 4, 0, 2).contiguous()  # (B, H, W, K, C)
    return y.view(b, h, w, k * c).permute(0, 3, 1, 2)

