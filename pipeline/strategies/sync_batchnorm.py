"""Synchronised BatchNorm that also runs on the CPU (gloo).

torch.nn.SyncBatchNorm refuses CPU tensors (its statistics kernels are CUDA's), so on the CPU
the BatchNorm layers are replaced by `GlooSyncBatchNorm`, which computes what
nn.SyncBatchNorm computes with one all-gather in forward and one in backward, as it does:
- forward: each rank's mean and centred sum of squares per channel, and its sample count,
  combined by Chan's parallel formula (as exact as two passes over the global micro-batch:
  nothing is subtracted from a sum of squares);
- backward: the global sums of dy and dy * x_hat, from which every rank's input gradient
  follows; the weight and bias gradients stay the rank's own, for DDP or FSDP to reduce.
One collective each way is the fewest a synchronised layer can wait on, and gloo gathers a
few hundred numbers in about a third of the time it all-reduces them (docs/performance.md
measures what the layer costs). Every rank sums the gathered rows in rank order, so all
ranks hold bitwise the same statistics. On CUDA the native SyncBatchNorm is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import FunctionCtx

from pipeline.batch_plan import BatchPlan
from pipeline.strategies.base import writer_buffers

DIMS = (0, 2, 3)  # all but the channels


Group = Optional[dist.ProcessGroup]  # None: the whole job


def gathered(rows: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Every rank's `rows` in `group`, stacked in rank order: shape (ranks, *rows.shape)."""
    parts = [torch.empty_like(rows) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, rows.contiguous(), group=group)
    return torch.stack(parts)


def global_moments(
    mean: torch.Tensor, m2: torch.Tensor, count: int, group: Group = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The global micro-batch's mean, biased variance and sample count from each rank's mean,
    centred sum of squares and count (Chan et al.'s parallel combination)."""
    channels = mean.numel()
    own = torch.cat([mean, m2, mean.new_tensor([float(count)])])
    table = gathered(own, group)
    means, m2s, counts = table[:, :channels], table[:, channels:-1], table[:, -1:]
    total = counts.sum()
    mean_all = (counts * means).sum(0) / total
    m2_all = m2s.sum(0) + (counts * (means - mean_all) ** 2).sum(0)
    return mean_all, m2_all / total, total


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        eps: float,
        group: Group = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # statistics at the parameters' precision where activations are lower (autocast)
        xs = x.to(torch.promote_types(x.dtype, weight.dtype))
        count = x.numel() // x.shape[1]
        own_mean = xs.sum(DIMS) / max(count, 1)  # a rank with no samples adds nothing
        own_m2 = ((xs - own_mean[None, :, None, None]) ** 2).sum(DIMS)
        mean, var, total = global_moments(own_mean, own_m2, count, group)
        invstd = torch.rsqrt(var + eps)
        x_hat = (xs - mean[None, :, None, None]) * invstd[None, :, None, None]
        ctx.save_for_backward(x_hat, weight, invstd, total)
        ctx.mark_non_differentiable(mean, var, total)
        ctx.x_dtype = x.dtype  # type: ignore[attr-defined]
        ctx.group = group  # type: ignore[attr-defined]
        y = x_hat * weight[None, :, None, None] + bias[None, :, None, None]
        return y, mean, var, total

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, *_unused: Any) -> tuple[Any, ...]:
        x_hat, weight, invstd, total = ctx.saved_tensors
        dy = dy.to(x_hat.dtype)
        sum_dy = dy.sum(DIMS)
        sum_dy_x_hat = (dy * x_hat).sum(DIMS)
        both = gathered(torch.cat([sum_dy, sum_dy_x_hat]), ctx.group).sum(0) / total
        mean_dy, mean_dy_x_hat = both.chunk(2)
        scale = (weight * invstd)[None, :, None, None]
        grad_x = scale * (
            dy - mean_dy[None, :, None, None] - x_hat * mean_dy_x_hat[None, :, None, None]
        )
        return grad_x.to(ctx.x_dtype), sum_dy_x_hat, sum_dy, None, None


@dataclass(frozen=True)
class BatchNormState:
    """A BatchNorm layer's tensors as one rank holds them (a channel shard's own, where the
    layer is split), for `synced_batch_norm`."""

    weight: torch.Tensor | None
    bias: torch.Tensor | None
    running_mean: torch.Tensor | None  # updated in place
    running_var: torch.Tensor | None
    num_batches_tracked: torch.Tensor | None
    momentum: float | None
    eps: float


def synced_batch_norm(x: torch.Tensor, bn: BatchNormState, group: Group = None) -> torch.Tensor:
    """Training-mode BatchNorm over `group`'s ranks' samples together (nn.SyncBatchNorm's
    result), with the running statistics updated as nn.BatchNorm2d updates them."""
    # the affine-free layer normalises alone: a weight of 1 and a bias of 0
    weight = bn.weight if bn.weight is not None else x.new_ones(x.shape[1])
    bias = bn.bias if bn.bias is not None else x.new_zeros(x.shape[1])
    y, mean, var, total = _SyncBatchNorm.apply(x, weight, bias, bn.eps, group)
    if bn.running_mean is not None and bn.running_var is not None:
        with torch.no_grad():
            tracked = bn.num_batches_tracked
            assert tracked is not None  # kept whenever running statistics are
            tracked.add_(1)
            # nn.BatchNorm2d's rule: momentum None means a cumulative average
            factor = 1.0 / float(tracked) if bn.momentum is None else bn.momentum
            unbiased = var * total / (total - 1).clamp(min=1)
            bn.running_mean.lerp_(mean.to(bn.running_mean.dtype), factor)
            bn.running_var.lerp_(unbiased.to(bn.running_var.dtype), factor)
    output: torch.Tensor = y  # autograd.Function.apply is untyped
    return output


class GlooSyncBatchNorm(nn.BatchNorm2d):
    # the ranks whose samples it normalises together; None: the whole job
    group: Group = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not dist.is_initialized() or dist.get_world_size(self.group) == 1:
            return super().forward(x)
        state = BatchNormState(
            self.weight,
            self.bias,
            self.running_mean,
            self.running_var,
            self.num_batches_tracked,
            self.momentum,
            self.eps,
        )
        return synced_batch_norm(x, state, self.group)


def convert_sync_batchnorm(
    model: nn.Sequential, on_cuda: bool, group: Group = None
) -> nn.Sequential:
    """The same model with every BatchNorm synchronised across `group` (None: the whole
    process group)."""
    converted = (
        nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
        if on_cuda
        else _swap_cpu(model, group)
    )
    assert isinstance(converted, nn.Sequential)  # only the BatchNorm layers are replaced
    return converted


def _swap_cpu(module: nn.Module, group: Group) -> nn.Module:
    if isinstance(module, nn.BatchNorm2d) and not isinstance(module, GlooSyncBatchNorm):
        # made in the layer's dtype, so its values are copied, not rounded (an fp64 layer)
        like: torch.Tensor | None = next(module.parameters(), None)
        if like is None:
            like = module.running_mean
        new = GlooSyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            device=None if like is None else like.device,
            dtype=None if like is None else like.dtype,
        )
        new.load_state_dict(module.state_dict())
        new.group = group
        return new
    for name, child in module.named_children():
        setattr(module, name, _swap_cpu(child, group))
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


# --- what `sync_bn` decides for a strategy whose ranks each run the whole model on their
# share of every micro-batch (ddp, fsdp): written once, for both


class SyncBnOptions(Protocol):
    """A params section with `sync_bn` (ddp's, fsdp's)."""

    @property
    def sync_bn(self) -> bool: ...


def batchnorm_synced(options: SyncBnOptions) -> bool:
    """Such a strategy's `same_at_any_world_size` (StrategyFacts): SyncBN normalises over the
    global micro-batch, so its ranks only split the work."""
    return options.sync_bn


@dataclass(frozen=True)
class RankBatchNorm:
    """BatchNorm as `sync_bn` leaves it to such a strategy: the model to parallelize, what the
    run's notes say of it, and the run's `before_eval` (DataParallelRun)."""

    model: nn.Sequential
    notes: tuple[str, ...]
    before_eval: Callable[[], None]


def rank_batchnorm(
    name: str, model: nn.Sequential, sync_bn: bool, plan: BatchPlan, on_cuda: bool
) -> RankBatchNorm:
    """With `sync_bn`, every BatchNorm synchronised across the ranks, nothing to note or to do
    before an evaluation; without, each rank's own statistics, said in a note, and before each
    evaluation every rank takes the writer's (`writer_buffers`), which model.pt holds."""
    if sync_bn:
        return RankBatchNorm(convert_sync_batchnorm(model, on_cuda), (), lambda: None)
    note = unsynced_note(name, plan.per_rank, plan.data_world)
    return RankBatchNorm(model, (note,) if note else (), writer_buffers(model))
