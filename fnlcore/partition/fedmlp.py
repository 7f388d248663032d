"""FedMLP's client split (szbonaldo/FedMLP): FedCorr's ``iid_sampling`` plus an
optional per-client subsample.

The published ICH index file (``iid-dictusers/ICH_1037_55000.npy``, 5 x 5,000)
is reproduced exactly by: ``set_seed(1037)`` (numpy and Python ``random``),
``iid_sampling(129535, 5, 1037)`` (lists in set order), then for clients
0..K-1 in order ``random.sample(client_list, 5000)`` (the commented-out lines
in ``main.py``). ChestXray14 uses no subsample.
"""

from __future__ import annotations

from ..assignment import ClientAssignment
from ..errors import ConfigError
from ..rng import python_rng
from ._checks import check_int, check_seed
from .fedcorr import iid_fedcorr


def fedmlp_equal(num_samples: int, num_clients: int, seed: int, subsample: int | None = 5000) -> ClientAssignment:
    """FedMLP's equal IID split: :func:`iid_fedcorr` then ``random.sample`` per client.

    Paper: FedMLP (MICCAI'24), "equal distribution of training data among
    clients"; ICH K=5 with ``subsample=5000``, ChestXray14 K=8 with ``subsample=None``.

    Parameters
    ----------
    num_samples, num_clients: n and K of :func:`iid_fedcorr`.
    seed: both ``np.random.seed(seed)`` (the split) and ``random.seed(seed)``
        (the subsample), as FedMLP's ``set_seed`` does.
    subsample: samples kept per client (each client's ``random.sample`` of its
        list, clients in order, one shared Python RNG); ``None`` keeps all.
    """
    where = "fedmlp_equal"
    seed = check_seed(where, seed)
    split = iid_fedcorr(num_samples, num_clients, seed)
    if subsample is None:
        return split
    keep = check_int(where, "subsample", subsample, minimum=1, hint="or None to keep every sample")
    per_client = int(split.sizes().min())
    if keep > per_client:
        raise ConfigError(
            f"{where}: subsample={keep} is more than the {per_client} samples each client holds "
            f"(num_samples={num_samples}, num_clients={num_clients}); use at most {per_client} or None"
        )
    rng = python_rng(seed)
    clients = tuple(rng.sample(c.tolist(), keep) for c in split.clients)
    return ClientAssignment.from_lists(split.num_samples, clients)


__all__ = ["fedmlp_equal"]
