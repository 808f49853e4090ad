"""The ResNet-18 of the source notes (d2l's variant for 28x28 Fashion-MNIST), and the facts
about it the strategies use: they import these, never restate them.

Differences from torchvision's ResNet-18: a 3x3 stride-1 stem and no max-pool (the images are
small), one input channel, and a 1x1 convolution without BatchNorm on the shortcut when the
shape changes. The network is a flat `nn.Sequential` of six blocks (stem, four residual
stages, head) so strategies can shard or split it at block boundaries.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

INPUT_SHAPE = (1, 28, 28)  # one normalised image (pipeline.data.device_data.normalize)
NUM_CLASSES = 10
# The blocks of `resnet18`, by index: the stem, the four residual stages, the head.
STEM = 0
RESIDUAL_STAGES = range(1, 5)
HEAD = 5
BLOCKS = 6


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


# Channel parallelism's plan for this network (the notes' 通道并行; applied by
# pipeline/strategies/channel_split.py): in every residual block the first convolution is split
# by its output channels and its BatchNorm with it, so each shard normalises its own channels
# over the whole micro-batch, exactly as one device does; the second convolution is split by its
# input channels, and the shards' partial outputs are summed before its bias. Everything else
# (the stem, the shortcut, the second BatchNorm, the head) is replicated. Layer -> how it splits.
CHANNEL_PLAN = {"conv1": "colwise", "bn1": "colwise", "conv2": "rowwise"}


def residual_blocks(model: nn.Sequential) -> list[Residual]:
    """The residual blocks of `resnet18`, in order: where CHANNEL_PLAN applies."""
    return [
        block
        for stage in RESIDUAL_STAGES
        for block in model[stage].children()
        if isinstance(block, Residual)
    ]


def split_channels(width: int) -> list[int]:
    """The channels CHANNEL_PLAN splits, per residual block of a `resnet18(width)`: each
    block's inner width (two blocks per stage)."""
    return [w for stage in (1, 2, 4, 8) for w in (stage * width,) * 2]


def residual_stage(in_ch: int, out_ch: int, downsample: bool) -> nn.Sequential:
    stride = 2 if downsample else 1
    return nn.Sequential(Residual(in_ch, out_ch, stride), Residual(out_ch, out_ch))


def resnet18(
    width: int = 64, num_classes: int = NUM_CLASSES, in_channels: int = INPUT_SHAPE[0]
) -> nn.Sequential:
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


# model.init: torch's own initialisation of each layer, or note 004's d2l `init_weights`
INITS = ("torch", "d2l")
D2L_STD = 0.01  # note 004: nn.init.normal_(m.weight, std=0.01)


def build_model(width: int, seed: int, init: str = "torch") -> nn.Sequential:
    """The same initial weights for every strategy and rank: seeded, built on the CPU, then
    initialised as `init` says (`initialise`)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return initialise(resnet18(width), init)
    finally:
        torch.random.set_rng_state(generator_state)


def initialise(model: nn.Sequential, init: str) -> nn.Sequential:
    """`torch`: the layers as torch built them (Kaiming-uniform weights, uniform biases).
    `d2l`: note 004's `init_weights`, `nn.init.normal_(m.weight, std=0.01)` on every module
    whose type is exactly Linear or Conv2d (its `type(m) in [...]`), biases and BatchNorm
    left as torch built them; drawn from the generator the caller seeded."""
    if init not in INITS:
        raise ValueError(f"model.init: got {init!r}, expected one of {', '.join(INITS)}")
    if init == "d2l":
        for module in model.modules():
            if type(module) in (nn.Linear, nn.Conv2d):
                assert isinstance(module, (nn.Linear, nn.Conv2d))  # for mypy: type() is exact
                nn.init.normal_(module.weight, std=D2L_STD)
    return model


def block_flops(model: nn.Sequential) -> list[int]:
    """Forward FLOPs of each block for one image. Counted on a meta copy: nothing is computed
    and the model's BatchNorm statistics do not move."""
    # imported here: only pipeline_parallel's split counts FLOPs, and every run imports this
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.empty(1, *INPUT_SHAPE, device="meta")
    flops = []
    for block in copy.deepcopy(model).to(device="meta", dtype=torch.float32):
        with FlopCounterMode(display=False) as counter:
            x = block(x)
        flops.append(counter.get_total_flops())
    return flops
