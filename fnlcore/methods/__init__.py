"""Federated methods: one module per method, each a typed hyper-parameter dataclass + a registry entry.

Every module of this package is imported when METHODS is first read: adding a method is adding a file.

See :mod:`fnlcore.methods.base` for the method contract.
"""

from ..fl.contract import Batch, ClientUpdate, LocalJob, Phase, Stage
from ..fl.persist import ClientStore
from .base import METHODS, FLMethod, MethodParams, method_from_dict
from .schedule import Stretch

__all__ = ["METHODS", "Batch", "ClientStore", "ClientUpdate", "FLMethod", "LocalJob", "MethodParams",
           "Phase", "Stage", "Stretch", "method_from_dict"]
