"""Federated methods: one module per method, each a typed hyper-parameter dataclass + a registry entry.

See :mod:`fnlcore.methods.base` for the plug-in interface.
"""

from .base import METHODS, ClientUpdate, FLMethod, MethodParams, method_from_dict, register
from . import fedavg, fedla, fednoro, fedprox  # noqa: E402,F401  (registration)

__all__ = ["METHODS", "ClientUpdate", "FLMethod", "MethodParams", "method_from_dict", "register"]
