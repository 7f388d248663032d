"""CIFAR ResNets (FedCorr/FedDiv/FedGR): 3x3 stride-1 stem, no max-pool, BasicBlocks."""

from __future__ import annotations

from torch import nn

_LAYERS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """Backbone only: returns the 512-d average-pooled feature."""

    def __init__(self, depth: int, in_channels: int = 3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        blocks: list[nn.Module] = []
        cin = 64
        for width, n, stride in zip((64, 128, 256, 512), _LAYERS[depth], (1, 2, 2, 2)):
            for i in range(n):
                blocks.append(BasicBlock(cin, width, stride if i == 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x):
        return self.pool(self.blocks(self.stem(x)))
