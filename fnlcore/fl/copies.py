"""Per-client networks the engine keeps while a client trains (an EMA teacher), on either engine.

A method names them in ``client_networks`` (FedGR's EMA model, FedIRM's and RSCFed's teachers),
a stage the ones it keeps in ``Stage.copies``. Its ``prepare`` leaves client k's copy in the working network of that name, as it would for the
sequential engine; the engine then keeps one copy per client of the step: on the sequential
engine the working network itself (:class:`OneCopy`), on the batched engine K stacked copies
loaded from what each client's prepare left (:class:`StackedCopies`), written back into the
working network before the client's upload. A loss reads the copies with ``sb.copies[name](view)``
((K, B, ...) outputs, no gradient) and a stage's ``after_step`` moves them towards the trained
network with :meth:`lerp_` or :meth:`ema_`; no method builds a stacked network or asks which
engine runs it. The sequential forms are the per-client code's own ops (the golden set holds
them to the bit); the stacked ones run a handful of multi-tensor kernels over the K copies.

A copy its ``prepare`` left in train mode trains by the method's own rule (FedFixer's
personalised model): :meth:`forward` with a gradient (padded rows masked), :meth:`grads` of a
loss by parameter name, (K, ...) each, and :meth:`assign_` of new (K, ...) parameters to the
clients that stepped; :func:`assign_clients_` does the same for the trained network's
``sb.parameters()``.
"""

from __future__ import annotations

import torch

from ..syncs import host_side
from .stacked import StackedNet, per_client, select_clients_, stacked_input


def assign_clients_(dst: list[torch.Tensor], new: list[torch.Tensor], on: torch.Tensor | None) -> None:
    """``dst[i] := new[i]`` in place, for the clients ``on`` (K,) (None: all): a client without a batch
    at this step (a rider) keeps its tensors."""
    with torch.no_grad():
        if on is None:
            for d, n in zip(dst, new):
                d.copy_(n)
        else:
            select_clients_(on, dst, new)


def _rows(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if mask is None else mask.t().to(dtype)


class OneCopy:
    """One client's copy: the working network ``model``, tracking the trained network ``student``
    (its tensors, taken once: ``fl.state.load`` copies into them in place). ``stepped`` is always
    set at K = 1 and is not read."""

    def __init__(self, model: torch.nn.Module, student: torch.nn.Module):
        self.model = model
        e, s = model.state_dict(), student.state_dict()
        self._floats = [(v, s[k]) for k, v in e.items() if v.is_floating_point()]
        self._ints = [(v, s[k]) for k, v in e.items() if not v.is_floating_point()]
        self._named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # once: a step reuses them
        with torch.no_grad():  # views of the parameters, written in place (no_grad) by assign_
            self._views = {n: p.unsqueeze(0) for n, p in self._named}

    @torch.no_grad()
    def __call__(self, view: torch.Tensor) -> torch.Tensor:
        return self.model(view).unsqueeze(0)

    def forward(self, view: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(1, B, ...) outputs with a gradient, in the copy's mode."""
        return self.model(view).unsqueeze(0)

    def parameters(self) -> dict[str, torch.Tensor]:
        """Each trainable parameter by name, with a leading client axis (a view: writes reach the copy)."""
        return self._views

    def grads(self, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        """d loss / d each trainable parameter, (1, ...) (zero where the loss does not reach it)."""
        gs = torch.autograd.grad(loss, [p for _, p in self._named], allow_unused=True)
        return {n: (torch.zeros_like(p) if g is None else g).unsqueeze(0) for (n, p), g in zip(self._named, gs)}

    def assign_(self, new: dict[str, torch.Tensor], stepped: torch.Tensor | None) -> None:
        """The copy's parameters := ``new`` (by name, (1, ...))."""
        ps = self.parameters()
        assign_clients_([ps[n] for n in new], list(new.values()), None)

    @torch.no_grad()
    def lerp_(self, weight: float, stepped: torch.Tensor) -> None:
        """copy <- lerp(copy, student, weight) on float entries (``torch.lerp``), integer buffers copied."""
        if self._floats:
            torch._foreach_lerp_([t for t, _ in self._floats], [s for _, s in self._floats], weight)
        for t, s in self._ints:
            t.copy_(s)

    @torch.no_grad()
    def ema_(self, decay: float | torch.Tensor, stepped: torch.Tensor) -> None:
        """copy <- decay copy + (1 - decay) student on float entries, integer buffers copied; ``decay``
        one value or a (1,) host tensor, applied as a Python float (the per-client code's rounding)."""
        if isinstance(decay, torch.Tensor):
            if decay.device.type != "cpu":  # reading it back would wait for the device
                raise ValueError("client copies: a per-client decay must be a host tensor (computed on the host)")
            with host_side():  # a host tensor: no device sync
                decay = float(decay[0])
        for t, s in self._floats:
            t.mul_(decay).add_(s, alpha=1.0 - decay)
        for t, s in self._ints:
            t.copy_(s)


class StackedCopies:
    """The K clients' copies as one :class:`~fnlcore.fl.stacked.StackedNet`, tracking the stacked
    trained network ``student``; a client whose ``stepped`` entry is unset (a rider) keeps its copy."""

    def __init__(self, net: StackedNet, student: StackedNet):
        if net.k != student.k:  # a phase of several trained networks stacks G * K: which one is the student?
            raise ValueError(f"client copies: {net.k} copies, but the trained network stacks {student.k}; "
                             "a stage with copies trains one network")
        self.net, self.student = net, student

    @torch.no_grad()
    def __call__(self, view: torch.Tensor) -> torch.Tensor:
        return self.net(stacked_input(view, self.net.k))

    def forward(self, view: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(K, B, ...) outputs with a gradient, in the copies' mode; ``mask`` (K, B) the real rows (a padded
        row moves no BatchNorm statistic)."""
        return self.net(stacked_input(view, self.net.k), _rows(mask, view.dtype))

    def parameters(self) -> dict[str, torch.Tensor]:
        return {n: p for n, p in self.net.net.named_parameters() if p.requires_grad}

    def grads(self, loss: torch.Tensor) -> dict[str, torch.Tensor]:
        named = list(self.parameters().items())
        gs = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        return {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(named, gs)}

    def assign_(self, new: dict[str, torch.Tensor], stepped: torch.Tensor | None) -> None:
        """The clients ``stepped`` (K,) (None: all) take ``new`` (by name, (K, ...)); a rider keeps its copy."""
        ps = self.parameters()
        assign_clients_([ps[n] for n in new], list(new.values()), stepped)

    @torch.no_grad()
    def lerp_(self, weight: float, stepped: torch.Tensor) -> None:
        t, s = self._entries()
        floats = [key for key in self.net.keys if t[key].is_floating_point()]
        ints = [key for key in self.net.keys if not t[key].is_floating_point()]
        new = torch._foreach_lerp([t[key] for key in floats], [s[key] for key in floats], weight)
        select_clients_(stepped, [t[key] for key in floats + ints], [*new, *(s[key] for key in ints)])

    @torch.no_grad()
    def ema_(self, decay: float | torch.Tensor, stepped: torch.Tensor) -> None:
        """``decay`` one value or (K,) float64, one per client (rounded to each entry's dtype as a
        Python scalar is); a host tensor goes to the device in one non-blocking copy."""
        t, s = self._entries()
        floats = [key for key in self.net.keys if t[key].is_floating_point()]
        ints = [key for key in self.net.keys if not t[key].is_floating_point()]
        tf, sf = [t[key] for key in floats], [s[key] for key in floats]
        if isinstance(decay, torch.Tensor):  # spread to full size: a multi-tensor kernel takes no broadcast
            decay = decay.to(stepped.device, non_blocking=True)
            new = torch._foreach_mul(tf, per_client(decay, tf))
            torch._foreach_add_(new, torch._foreach_mul(sf, per_client(1.0 - decay, tf)))
        else:
            new = torch._foreach_mul(tf, decay)
            torch._foreach_add_(new, sf, alpha=1.0 - decay)
        select_clients_(stepped, tf + [t[key] for key in ints], [*new, *(s[key] for key in ints)])

    def _entries(self):
        return self.net.net.state_dict(), self.student.net.state_dict()
