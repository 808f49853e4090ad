"""Synchronised BatchNorm that also runs on the CPU (gloo).

torch.nn.SyncBatchNorm refuses CPU tensors, so on the CPU the BatchNorm layers are replaced by
`GlooSyncBatchNorm`: batch statistics come from differentiable all-reduces over the process
group, which gives the statistics (and gradients) of the global micro-batch. Two passes (mean,
then centred variance) keep it as accurate as the single-device BatchNorm it must match.
On CUDA the native SyncBatchNorm is used.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import FunctionCtx


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks; the gradient of a sum is the sum of the ranks' gradients."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    summed: torch.Tensor = _AllReduceSum.apply(x)  # autograd.Function.apply is untyped
    return summed


class GlooSyncBatchNorm(nn.BatchNorm2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not dist.is_initialized() or dist.get_world_size() == 1:
            return super().forward(x)
        dims = (0, 2, 3)
        count = torch.tensor([float(x.numel() // x.shape[1])], device=x.device)
        count = all_reduce_sum(count)
        mean = all_reduce_sum(x.sum(dims)) / count
        centred = x - mean[None, :, None, None]
        var = all_reduce_sum((centred * centred).sum(dims)) / count
        if self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                tracked = self.num_batches_tracked
                assert tracked is not None  # kept whenever running statistics are
                tracked.add_(1)
                # nn.BatchNorm2d's rule: momentum None means a cumulative average
                factor = 1.0 / float(tracked) if self.momentum is None else self.momentum
                unbiased = var * count / (count - 1).clamp(min=1)
                self.running_mean.lerp_(mean, factor)
                self.running_var.lerp_(unbiased, factor)
        y = centred * torch.rsqrt(var + self.eps)[None, :, None, None]
        return y * self.weight[None, :, None, None] + self.bias[None, :, None, None]


def convert_sync_batchnorm(model: nn.Sequential, on_cuda: bool) -> nn.Sequential:
    """The same model with every BatchNorm synchronised across the process group."""
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(model) if on_cuda else _swap_cpu(model)
    assert isinstance(converted, nn.Sequential)  # only the BatchNorm layers are replaced
    return converted


def _swap_cpu(module: nn.Module) -> nn.Module:
    if isinstance(module, nn.BatchNorm2d) and not isinstance(module, GlooSyncBatchNorm):
        new = GlooSyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
        )
        new.load_state_dict(module.state_dict())
        return new.to(device=module.weight.device, dtype=module.weight.dtype)
    for name, child in module.named_children():
        setattr(module, name, _swap_cpu(child))
    return module


def unsynced_note(name: str, per_rank: int, world: int) -> str | None:
    """What BatchNorm computes when a data-parallel strategy runs without sync_bn (None on
    one rank, where the rank's share is the whole micro-batch)."""
    if world < 2:
        return None
    return (
        f"{name}: sync_bn is off: BatchNorm normalises each rank's {per_rank} sample(s) per "
        f"forward with that rank's own statistics, not the micro-batch's {per_rank * world} as "
        f"in single; before each evaluation every rank takes rank 0's running statistics, "
        f"which model.pt holds"
    )
