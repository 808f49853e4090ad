"""The optimizer, the learning-rate schedule and the training loss of the shared loop.

SGD runs as one fused kernel over all parameters where PyTorch has one for them (CUDA and
CPU tensors), else as foreach (multi-tensor) kernels: FSDP's sharded DTensor parameters. Both
replace a Python loop of small kernels per parameter; the update is the same SGD.

The schedule is a pure function of the global optimizer step (`LrSchedule.at`), set into the
optimizer before every step: nothing to checkpoint, and a run resumed mid-epoch continues on
exactly the curve it left.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from pipeline.config import TrainConfig, effective_lr
from pipeline.errors import UserError

ONECYCLE_DIV = 25.0  # torch.optim.lr_scheduler.OneCycleLR's div_factor ...
ONECYCLE_FINAL_DIV = 1e4  # ... and final_div_factor


def make_optimizer(params: Iterable[torch.nn.Parameter], train: TrainConfig) -> torch.optim.SGD:
    params = list(params)
    kernel = {"foreach": True} if any(isinstance(p, DTensor) for p in params) else {"fused": True}
    return torch.optim.SGD(
        params,
        lr=effective_lr(train),
        momentum=train.momentum,
        weight_decay=train.weight_decay,
        **kernel,
    )


@dataclass(frozen=True)
class LrSchedule:
    """The learning rate of every global optimizer step (0-based) of a run of train.epochs,
    its figures worked out once, where the run is built (build.py), from the train section
    and the plan's steps per epoch.

    none: constant. cosine: linear warm-up to lr over warmup_epochs, then half a cosine
    towards 0 (reached one step after the last). onecycle: OneCycleLR's shape (cosine phases,
    no momentum cycling) with its peak at warmup_epochs: lr/25 up to lr, then down to lr/25e4.
    """

    kind: str  # train.lr_schedule
    peak: float  # the effective lr (after lr_scaling)
    total: int  # optimizer steps of the run
    warm: int  # steps of the warm-up

    @classmethod
    def of(cls, train: TrainConfig, steps_per_epoch: int) -> LrSchedule:
        total = train.epochs * steps_per_epoch
        warm = min(round(train.warmup_epochs * steps_per_epoch), total - 1)
        return cls(train.lr_schedule, effective_lr(train), total, warm)

    def at(self, step: int) -> float:
        peak, total, warm = self.peak, self.total, self.warm
        if self.kind == "none":
            return peak
        if self.kind == "cosine":
            if step < warm:
                return peak * (step + 1) / warm
            return peak * 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, total - warm)))
        start, end = peak / ONECYCLE_DIV, peak / ONECYCLE_DIV / ONECYCLE_FINAL_DIV
        rise = max(0, warm - 1)  # OneCycleLR puts the peak at step pct_start * total - 1
        if step < rise:
            return _cos_between(start, peak, step / rise)
        return _cos_between(peak, end, (step - rise) / max(1, total - 1 - rise))


def _cos_between(a: float, b: float, fraction: float) -> float:
    return b + (a - b) / 2.0 * (1.0 + math.cos(math.pi * min(fraction, 1.0)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def loss_function(train: TrainConfig, schedule_owns_loss: bool) -> Callable[..., torch.Tensor]:
    """Cross-entropy with `train.label_smoothing`. A strategy whose pipeline schedule computes
    the loss itself cannot take label smoothing, so asking for it there is an error rather
    than a silent no-op."""
    if schedule_owns_loss and train.label_smoothing:
        raise UserError(
            f"train.label_smoothing: got {train.label_smoothing}, but this strategy "
            f"computes its loss inside its pipeline schedule (plain cross-entropy); "
            f"expected 0"
        )
    return functools.partial(F.cross_entropy, label_smoothing=train.label_smoothing)
