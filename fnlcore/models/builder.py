"""Model registry and builder."""

from __future__ import annotations

import hashlib
import os
import pickle
import re
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlparse

import torch
import torch.hub
from torch import nn

from ..errors import ConfigError
from ..registry import Registry
from ..safe_pickle import weights_only_refusal
from . import cifar_resnet, small
from ..tv_compat import import_torchvision


class Classifier(nn.Module):
    """backbone -> feature vector -> head -> logits."""

    def __init__(self, backbone: nn.Module, head: nn.Module, feature_dim: int):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.feature_dim = feature_dim

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, penultimate features) from one pass (prototype methods: FedMLP, FedGR)."""
        f = self.backbone(x)
        return self.head(f), f


def _mlp(num_classes, in_channels, image_size, hidden=128):
    d = in_channels * image_size[0] * image_size[1]
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(d, hidden), nn.ReLU())
    return Classifier(backbone, nn.Linear(hidden, num_classes), hidden)


def _lenet5(num_classes, in_channels, image_size):
    """Fed-NCL's LeNet (``nets/models.py::Lenet``): a ReLU on the logits, kept for fidelity."""
    backbone, dim = small.lenet5_backbone(in_channels, image_size)
    return Classifier(backbone, nn.Sequential(nn.Linear(dim, num_classes), nn.ReLU()), dim)


def _lenet5_linear_head(num_classes, in_channels, image_size):
    """FedCorr's LeNet (``model/lenet.py``): the same backbone, plain linear logits."""
    backbone, dim = small.lenet5_backbone(in_channels, image_size)
    return Classifier(backbone, nn.Linear(dim, num_classes), dim)


def _cnn(num_classes, in_channels, image_size):
    backbone, dim = small.cnn_backbone(in_channels, image_size)
    return Classifier(backbone, nn.Linear(dim, num_classes), dim)


def _tiny(num_classes, in_channels, image_size):
    backbone, dim = small.tiny_backbone(in_channels)
    return Classifier(backbone, nn.Linear(dim, num_classes), dim)


def _vgg16(num_classes, in_channels, image_size):
    backbone, dim = small.vgg16_backbone(in_channels)
    head = nn.Sequential(
        nn.Linear(dim, 4096), nn.ReLU(True), nn.Dropout(0.5),
        nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(0.5),
        nn.Linear(4096, num_classes),
    )
    return Classifier(backbone, head, dim)


def _resnet_cifar(depth):
    def build(num_classes, in_channels, image_size):
        backbone = cifar_resnet.CifarResNet(depth, in_channels)
        return Classifier(backbone, nn.Linear(512, num_classes), 512)

    return build


def imagenet_state_dict(weights) -> dict:
    """A torchvision weights enum's state dict, from torch.hub's cache or downloaded there.

    Without internet the download fails; the ConfigError then names the file and the
    folder to put it in by hand. The file is checked against its published hash either way:
    torch.hub checks a download, and a file already in the cache (put there by hand, or by
    anyone who can write a shared TORCH_HOME) is checked here, before it is read.
    """
    filename = os.path.basename(urlparse(weights.url).path)
    folder = os.path.join(torch.hub.get_dir(), "checkpoints")
    cached = os.path.join(folder, filename)
    if os.path.exists(cached):
        _check_published_hash(cached, weights.url)
    try:
        # weights_only: the cached file may sit in a shared TORCH_HOME; loading never runs code
        return weights.get_state_dict(progress=False, check_hash=True, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ConfigError(
            f"pretrained weights: {os.path.join(folder, filename)} holds more than tensors and was not loaded "
            f"({weights_only_refusal(e)}); delete it and download {filename} again from {weights.url}"
        ) from None
    except OSError as e:  # URLError, HTTPError, socket errors, unwritable cache
        raise ConfigError(
            f"pretrained weights: cannot download {weights.url} ({e}); copy the file {filename} "
            f"into {folder} (from a machine with internet), or set pretrained: false"
        ) from None
    except RuntimeError as e:
        if "hash" not in str(e):
            raise
        raise ConfigError(
            f"pretrained weights: {filename} failed torchvision's hash check ({e}); copy a complete "
            f"{filename} from {weights.url} into {folder}"
        ) from None


def _published_hash(url: str) -> str | None:
    """The sha256 prefix a torchvision weight file's name publishes (``resnet18-f37072fd.pth``),
    as torch.hub's ``check_hash`` reads it; None where the name has none."""
    m = re.search(r"-([a-f0-9]+)\.", os.path.basename(urlparse(url).path))
    return m.group(1) if m else None


def _check_published_hash(path: str, url: str) -> None:
    expected = _published_hash(url)
    if expected is None:
        raise ConfigError(f"pretrained weights: {os.path.basename(path)} publishes no hash in its name, so "
                          f"{path} cannot be checked and was not loaded")
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    if not h.hexdigest().startswith(expected):
        raise ConfigError(
            f"pretrained weights: {path} does not match its published hash (sha256 {h.hexdigest()[:len(expected)]}..., "
            f"published {expected}...) and was not loaded: it is not the file published at {url}, or it is "
            f"incomplete; delete it and download it again (or copy the published file there)"
        )


def _resnet_tv(arch):
    def build(num_classes, in_channels, image_size, pretrained):
        tv = import_torchvision()
        net = getattr(tv.models, arch)(weights=None)
        if pretrained:
            net.load_state_dict(imagenet_state_dict(tv.models.get_model_weights(arch).IMAGENET1K_V1))
        dim = net.fc.in_features
        net.fc = nn.Identity()
        if in_channels != 3:
            net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        return Classifier(net, nn.Linear(dim, num_classes), dim)

    return build


@dataclass(frozen=True)
class ModelEntry:
    """A registered architecture: ``build(num_classes, in_channels, image_size[, pretrained])``."""

    name: str
    build: Callable[..., Classifier]
    pretrained_weights: bool = False  # ImageNet weights available (build takes ``pretrained``)


#: name -> ModelEntry; every module of fnlcore.models is imported on first use, so a new
#: architecture is one file calling ``MODELS.register(ModelEntry(name, build))``.
MODELS: Registry[ModelEntry] = Registry("model", "fnlcore.models")


for _name, _build in (("mlp", _mlp), ("lenet5", _lenet5), ("lenet5_linear_head", _lenet5_linear_head), ("cnn", _cnn),
                      ("tiny", _tiny), ("vgg16", _vgg16),
                      ("resnet18_cifar", _resnet_cifar(18)), ("resnet34_cifar", _resnet_cifar(34))):
    MODELS.register(ModelEntry(_name, _build))
MODELS.register(ModelEntry("resnet18", _resnet_tv("resnet18"), pretrained_weights=True))
MODELS.register(ModelEntry("resnet50", _resnet_tv("resnet50"), pretrained_weights=True))


def build_model(
    name: str,
    num_classes: int,
    in_channels: int,
    image_size: tuple[int, int],
    pretrained: bool = False,
) -> Classifier:
    """Build a registered architecture (see the table in :mod:`fnlcore.models`)."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; valid models: {', '.join(sorted(MODELS))}")
    entry = MODELS[name]
    if pretrained and not entry.pretrained_weights:
        with_weights = sorted(n for n, e in MODELS.items() if e.pretrained_weights)
        raise ConfigError(f"model {name!r} has no pretrained weights; only {', '.join(with_weights)} do")
    if entry.pretrained_weights:
        return entry.build(num_classes, in_channels, tuple(image_size), pretrained)
    return entry.build(num_classes, in_channels, tuple(image_size))


def default_model_for(in_channels: int, image_size: tuple[int, int]) -> str:
    """A sensible architecture for an input shape (used by 'auto' settings)."""
    h, w = image_size
    if h <= 16:
        return "mlp"
    if in_channels == 1 and h <= 32:
        return "lenet5"
    if h <= 32:
        return "cnn"
    return "resnet18"
