"""Small convolutional backbones: LeNet-5, a FedAvg-style CNN, VGG-16 (with BatchNorm), a tiny smoke-test CNN."""

from __future__ import annotations

import torch
from torch import nn


def _flat_dim(module: nn.Module, in_channels: int, image_size: tuple[int, int]) -> int:
    with torch.no_grad():
        return int(module(torch.zeros(1, in_channels, *image_size)).shape[1])


def lenet5_backbone(in_channels: int, image_size: tuple[int, int]) -> tuple[nn.Module, int]:
    """LeNet-5 of Fed-NCL and FedCorr: conv5-6, pool, conv5-16, pool, FC120, FC84 (the head adds FC K).

    The two codes differ only in the head: Fed-NCL's applies a ReLU to the logits (model ``lenet5``),
    FedCorr's does not (``lenet5_linear_head``)."""
    convs = nn.Sequential(
        nn.Conv2d(in_channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
    )
    flat = _flat_dim(convs, in_channels, image_size)
    return nn.Sequential(convs, nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU()), 84


def cnn_backbone(in_channels: int, image_size: tuple[int, int]) -> tuple[nn.Module, int]:
    """FedAvg's CNN (no padding): conv5x5-32, pool, conv5x5-64, pool, FC512."""
    convs = nn.Sequential(
        nn.Conv2d(in_channels, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
    )
    flat = _flat_dim(convs, in_channels, image_size)
    return nn.Sequential(convs, nn.Linear(flat, 512), nn.ReLU()), 512


_VGG16 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


def vgg16_backbone(in_channels: int) -> tuple[nn.Module, int]:
    """Fed-NCL's VGG16: 13 conv3x3+BN+ReLU, 5 max-pools, AvgPool(1) -> 512."""
    layers: list[nn.Module] = []
    c = in_channels
    for v in _VGG16:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            c = v
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers), 512


def tiny_backbone(in_channels: int) -> tuple[nn.Module, int]:
    """Smoke-scale CNN (no paper): conv3x3/2-16, ReLU, conv3x3/2-32, ReLU, global average pool -> 32.

    The global pool makes it work at any image size (8x8 to 512x512) with
    a fixed, small parameter count.
    """
    net = nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )
    return net, 32
