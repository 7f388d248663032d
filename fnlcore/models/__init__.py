"""Network architectures used by the papers, behind one builder.

Every model is a :class:`Classifier`: ``backbone`` maps images to a feature
vector, ``head`` maps features to logits. Methods that need the penultimate
feature (FedMLP's prototypes, FedGR's representation regulariser) use
``model.features(x)``; everything else calls ``model(x)``.

| name            | used by                                   |
|-----------------|-------------------------------------------|
| mlp             | the digits demo                           |
| lenet5          | Fed-NCL (MNIST, Fashion-MNIST): ReLU on the logits, as its code |
| lenet5_linear_head | FedCorr's LeNet (a plain linear head)  |
| cnn             | small FedAvg-style CNN (smoke scale)      |
| tiny            | smoke scale, any image size (8x8-512x512) |
| vgg16           | Fed-NCL (CIFAR-10)                        |
| resnet18_cifar  | FedCorr, FedDiv, FedGR (CIFAR-10)         |
| resnet34_cifar  | FedCorr, FedDiv, FedGR (CIFAR-100)        |
| resnet18        | FedNoRo, FedMLP (ImageNet weights option) |
| resnet50        | Clothing1M (ImageNet weights option)      |
"""

from __future__ import annotations

from .builder import MODELS, Classifier, build_model

__all__ = ["MODELS", "Classifier", "build_model"]
