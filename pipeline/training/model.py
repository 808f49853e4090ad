"""The ResNet-18 of the source notes (d2l's variant for 28x28 Fashion-MNIST).

Differences from torchvision's ResNet-18: a 3x3 stride-1 stem and no max-pool (the images are
small), one input channel, and a 1x1 convolution without BatchNorm on the shortcut when the
shape changes. The network is a flat `nn.Sequential` of six blocks (stem, four residual
stages, head) so strategies can shard or split it at block boundaries.
"""

from __future__ import annotations

import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(out_ch)
        needs_projection = stride != 1 or in_ch != out_ch
        self.shortcut = nn.Conv2d(in_ch, out_ch, 1, stride=stride) if needs_projection else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        skip = x if self.shortcut is None else self.shortcut(x)
        return torch.relu(y + skip)


def residual_stage(in_ch: int, out_ch: int, downsample: bool) -> nn.Sequential:
    stride = 2 if downsample else 1
    return nn.Sequential(Residual(in_ch, out_ch, stride), Residual(out_ch, out_ch))


def resnet18(width: int = 64, num_classes: int = 10, in_channels: int = 1) -> nn.Sequential:
    w = width
    return nn.Sequential(
        nn.Sequential(
            nn.Conv2d(in_channels, w, 3, stride=1, padding=1), nn.BatchNorm2d(w), nn.ReLU()
        ),
        residual_stage(w, w, downsample=False),
        residual_stage(w, 2 * w, downsample=True),
        residual_stage(2 * w, 4 * w, downsample=True),
        residual_stage(4 * w, 8 * w, downsample=True),
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, num_classes)),
    )


def build_model(width: int, seed: int) -> nn.Sequential:
    """The same initial weights for every strategy and rank: seeded, built on the CPU."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return resnet18(width)
    finally:
        torch.random.set_rng_state(generator_state)
