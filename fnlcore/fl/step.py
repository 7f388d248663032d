"""A step of K clients as the one loss form sees it (:class:`StackedBatch`), shared by both engines.

The batched engine (:mod:`fnlcore.fl.batched`) fills it with K clients on a
:class:`~fnlcore.fl.stacked.StackedNet`; the sequential engine with one client on the plain
model (:mod:`fnlcore.fl.one_client`). It imports neither engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .stacked import StackedNet, stacked_input


@dataclass
class StackedBatch:
    """One step of K clients as a batched loss sees it (the batched twin of fnlcore.fl.client.Batch).

    ``logits`` (K, B, classes) of the stacked network on the train view (None for a phase with
    ``augment="raw"``: the loss runs :meth:`forward` on the views it wants); ``idx`` (K, B)
    sample ids on the device; ``mask`` (K, B) real rows, or None when every row is real;
    ``clients`` (K,) client ids; ``x`` the train view of the K batches, client after client
    ((K * B, C, H, W): a global model's forward on it, viewed as (K, B, classes), is the
    clients' teacher output), or the raw uint8 batches for ``augment="raw"``;
    ``epoch_step`` (K,) each client's batch number within its epoch (FedProx skips batch 0);
    ``net`` the :class:`~fnlcore.fl.stacked.StackedNet` (``net.net`` holds each parameter
    stacked (K, ...) under the model's own name); ``r`` the round; ``views`` the phase's
    declared views (name -> (K * B, C, H, W)); ``draws`` its declared draws (a per-batch draw
    as (K,), a per-sample one as (K, B, ...)); ``jobs`` each client's prepared
    :class:`~fnlcore.fl.client.LocalJob` (its ``info``), in client order; ``epoch_ends`` the
    positions of the clients whose step ends one of their epochs, known on the host (a
    per-epoch decision needs no device sync); ``copies`` each of the method's ``client_networks``
    kept per client (:mod:`fnlcore.fl.copies`: ``sb.copies[name](view)`` -> (K, B, ...), moved by a
    stage's ``after_step``); ``epochs`` each client's local epoch, host ints (a per-epoch rate, no sync).
    """

    logits: torch.Tensor | None
    idx: torch.Tensor
    mask: torch.Tensor | None
    clients: torch.Tensor
    x: torch.Tensor
    epoch_step: torch.Tensor
    net: StackedNet
    r: int
    views: dict[str, torch.Tensor] = field(default_factory=dict)
    draws: tuple = ()
    jobs: list | None = None
    networks: tuple[str, ...] = ()
    epoch_ends: tuple[int, ...] = ()  # positions of the clients whose step ends one of their epochs (host side)
    epoch_step_host: torch.Tensor | None = None  # ``epoch_step`` on the host (a per-batch decision, no sync)
    clients_host: torch.Tensor | None = None  # ``clients`` on the host
    moved_host: torch.Tensor | None = None  # (K,) on the host: the clients that have a batch at this step
    copies: dict = field(default_factory=dict)  # the method's client networks, one per client (fl.copies)
    epochs: tuple[int, ...] = ()  # each client's local epoch within the phase (read once per chunk, host ints)

    @property
    def moved(self) -> torch.Tensor | None:
        """(K,) on the device: the clients that have a batch at this step (None: all of them)."""
        return None if self.mask is None else self.mask[:, 0]

    def per_client(self, flat: torch.Tensor) -> torch.Tensor:
        """(K * B, ...) rows of a forward on ``x`` -> (K, B, ...)."""
        return flat.view(self.idx.shape[0], self.idx.shape[1], *flat.shape[1:])

    def forward(self, view: torch.Tensor) -> torch.Tensor:
        """The stacked network on a (K * B, C, H, W) view -> (K, B, classes) (padded rows masked);
        with several trained networks, every network's K clients: (G * K, B, classes), see :meth:`of`."""
        return self.net(*self._stacked(view))

    def forward_features(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward` returning the model's logits and penultimate features: (K, B, classes) and
        (K, B, features) (with several trained networks, (G * K, B, ...) each, see :meth:`of`)."""
        return self.net.forward_features(*self._stacked(view))

    def _stacked(self, view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The view on the stacked layout, once per trained network, and its real-row mask (B, G * K)."""
        g = max(len(self.networks), 1)
        rows = None if self.mask is None else self.mask.t().to(view.dtype).repeat(1, g)
        x = view if g == 1 else torch.cat([view] * g)
        return stacked_input(x, g * self.idx.shape[0]), rows

    def parameters(self, network: str | None = None) -> dict[str, torch.Tensor]:
        """Each trainable parameter of the clients' network ``network`` (default: the first trained)
        by the model's own name, stacked (K, ...): what a proximal term compares to a reference."""
        k = self.idx.shape[0]
        g = self.networks.index(network) if network and self.networks else 0
        return {n: p[g * k : (g + 1) * k] if self.networks else p for n, p in self.net.net.named_parameters()}

    def of(self, name: str, logits: torch.Tensor | None = None) -> torch.Tensor:
        """Network ``name``'s (K, B, ...) part of (G * K, B, ...) outputs (default: ``logits``)."""
        t = self.logits if logits is None else logits
        k = self.idx.shape[0]
        g = self.networks.index(name) if self.networks else 0
        return t[g * k : (g + 1) * k]




def flatten(params: tuple) -> list[torch.Tensor]:
    """The leaves of nested tuples of tensors, in order."""
    out = []
    for p in params:
        out.extend(flatten(p) if isinstance(p, tuple) else [p])
    return out
