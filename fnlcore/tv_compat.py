"""Import torchvision through here, never directly.

On a CPU-only torch build, torchvision's compiled ops library cannot load, and
``import torchvision`` then fails while registering fake kernels for the ops
``torchvision::nms`` and ``torchvision::qnms``. Declaring those two operator
schemas first lets the pure-Python rest of the package (models, transforms,
weights) import. Where torchvision imports normally (a CUDA cluster) this
changes nothing: the plain import is tried first.
"""

from __future__ import annotations

import sys

import torch

_schema_lib = None  # keep the Library alive, or the schemas disappear


def import_torchvision():
    global _schema_lib
    try:
        import torchvision  # lazy: torchvision on demand, after the operator check below

        return torchvision
    except RuntimeError as err:
        if "torchvision::nms" not in str(err):
            raise
    for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[mod]
    if _schema_lib is None:
        _schema_lib = torch.library.Library("torchvision", "DEF")
        _schema_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _schema_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision  # lazy: torchvision on demand, after the operator check below

    return torchvision
