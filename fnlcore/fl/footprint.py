"""What a client takes on a device, and how many clients the batched engine stacks at once.

The batched engine stacks a round's clients into one computation; on a GPU their number is bounded
by the device's memory, not a constant (``training.batched_clients`` 0). A client's share is
estimated from what a step of it holds (:func:`client_bytes`): its networks' weights, gradients,
optimiser state and stacked copy, and its batch's activations twice (forward outputs and their
gradients), with the activations counted as the bytes every op of a forward pass writes
(:class:`OpCounter`; an upper bound: temporaries freed early count too). ``fnl plan`` counts
the same on the CPU (fnlcore/app/counts.py), so the plan's clients at once are the run's.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Of a device's memory, what the stacked clients may fill; the rest: the method's global networks,
# the data held on the device, evaluation and the allocator's slack.
MEMORY_SHARE = 0.6
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh"}


class OpCounter:
    """Counts the kernel-launching ATen ops dispatched inside it (views and empty allocations launch
    none), and the bytes of their outputs."""

    def __init__(self):
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if not (func.is_view or func._opname in _NO_KERNEL):
                    counter.ops += 1
                    counter.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out)
                                         if isinstance(t, torch.Tensor))
                return out

        self.ops = 0
        self.bytes = 0
        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def client_bytes(param_bytes: float, activation_bytes: float, batch_size: int, optimizer: str,
                 networks: int = 1) -> float:
    """Device bytes one client of a batched step takes: per network trained, its weights, gradients,
    optimiser state (Adam two tensors a parameter, SGD's momentum one) and stacked copy, and its
    batch's activations (``activation_bytes`` a sample) twice."""
    states = 2 if optimizer == "adam" else 1
    return networks * (param_bytes * (3 + states) + 2 * activation_bytes * batch_size)


def clients_at_once(batched_clients: int, clients: int, memory_bytes: float | None, per_client: float | None) -> int:
    """Clients the batched engine stacks at once: ``training.batched_clients`` where set, else as many
    of the round's as :data:`MEMORY_SHARE` of the device's memory holds (all where it is unknown)."""
    if batched_clients:
        return max(1, min(clients, batched_clients))
    if not memory_bytes or not per_client:
        return max(1, clients)
    return max(1, min(clients, int(MEMORY_SHARE * memory_bytes // per_client)))


def clients_in_memory(model: torch.nn.Module, sample: torch.Tensor, batch_size: int, optimizer: str,
                      networks: int, memory_bytes: float) -> int:
    """How many clients ``memory_bytes`` holds for ``model`` (its forward pass on ``sample``, a batch
    of normalised inputs on the model's device, counted; the model's mode and state unchanged)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), OpCounter() as forward:
            model(sample)
    finally:
        model.train(was_training)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    per_client = client_bytes(params, forward.bytes / sample.shape[0], batch_size, optimizer, networks)
    return clients_at_once(0, 1 << 30, memory_bytes, per_client)
