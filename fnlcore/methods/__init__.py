"""Federated methods: one module per method, each a typed hyper-parameter dataclass + a registry entry.

Every module of this package is imported when METHODS is first read: adding a method is adding a file.

See :mod:`fnlcore.methods.base` for the plug-in interface.
"""

from .base import METHODS, ClientUpdate, CostStage, FLMethod, MethodParams, method_from_dict, register

__all__ = ["METHODS", "ClientUpdate", "CostStage", "FLMethod", "MethodParams", "method_from_dict", "register"]
