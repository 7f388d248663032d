"""Everything a method takes from the engine, in one place: ``from fnlcore.methods.api import ...``.

A method is a hyper-parameter dataclass (:class:`MethodParams`, fields declared with
:func:`param`), a subclass of :class:`FLMethod` registered with ``@METHODS.register``, and its
stage table (:class:`Stage`): each stage's one loss form over K clients (:class:`StackedBatch`
-> (K,) losses; the sequential engine runs it at K = 1 on the plain model), what a client
prepares (:class:`LocalJob`, :class:`Phase`) and uploads, and the per-chunk hooks; the contract is
:mod:`fnlcore.fl.contract`, whose docstring a method author reads first. The engine
owns the loop, the state, the batching and the devices; what it offers a loss or a server step
is below; ``sqrt``, ``exp``, ``log``, ``sin`` and ``cos`` come from :mod:`numerics` (torch's own
pick their CPU kernel by the CPU's maker). Shared method pieces (mixup, proximal terms, logit
adjustment, multi-label losses, robust aggregation, ...) live in modules that register no method
(:mod:`.parts`, :mod:`.logit_adjust`, :mod:`.multilabel`, :mod:`.robust_aggregation`, ...): a method
module never imports another method's module (tests/test_layers.py).
"""

from __future__ import annotations

from .. import numerics
from ..augment import draw_device, on
from ..errors import ConfigError, FNLError
from ..fl import sampling
from ..fl.contract import (Batch, ClientUpdate, LocalJob, Phase, StackedBatch, Stage, capturable,
                           clients_cross_entropy, clients_mean, masked_mean)
from ..fl.copies import OneCopy, assign_clients_
from ..fl.local import draw_predict, evaluate, forward_bounded, predict
from ..fl.persist import ClientStore
from ..fl.state import State, load, parameter_keys, per_tensor_distance, snapshot, weighted_average
from ..registry import param
from ..syncs import host_side
from .base import METHODS, FLMethod, MethodParams
from .schedule import Stretch, warm_up_then

__all__ = [
    "assign_clients_", "Batch", "capturable", "ClientStore", "ClientUpdate", "ConfigError", "FLMethod", "FNLError",
    "LocalJob", "METHODS", "MethodParams", "OneCopy", "Phase", "Stage", "StackedBatch", "State", "Stretch",
    "clients_cross_entropy", "clients_mean", "draw_device", "draw_predict", "evaluate", "forward_bounded",
    "host_side", "load", "masked_mean", "on", "param", "numerics", "parameter_keys", "per_tensor_distance",
    "predict", "sampling", "snapshot", "warm_up_then",
    "weighted_average",
]
