"""Channel parallelism (the notes' 通道并行, d2l's layerwise partitioning), the generic part:
a model's layers split over a channel group by a plan of the model's own (resnet.CHANNEL_PLAN),
every rank seeing the whole micro-batch.

Megatron-LM's two conjugate collectives around a split pair of layers:
    colwise   the layer split by its output channels (a Conv2d's weight and bias along dim 0,
              a BatchNorm2d's parameters and running statistics with them). Its input is whole
              on every rank; `f` (identity forward, all-reduce backward) on a convolution's
              input sums the input gradients that each rank's channels give back.
    rowwise   the layer split by its input channels (a Conv2d's weight along dim 1). Each rank
              computes a partial output; `g` (all-reduce forward, identity backward) sums them
              and the bias, replicated, is added once.
Everything else is replicated: its inputs, and so its gradients, are the same on every rank.

Parameters become DTensors on the channel mesh (Shard along the split dimension, Replicate
elsewhere) and so do the split running statistics: DCP then checkpoints them with their
global shapes and reshards them to another number of shards, and the whole model is gathered
with `full_tensor()`. Each layer computes on its local tensors (`to_local`), so the hot loop
runs plain kernels; the one collective per split pair each way is the only traffic.

Where data dimensions surround the channel one (a hybrid), `data_group` synchronises every
BatchNorm over the data ranks (sync_bn), as GlooSyncBatchNorm does over a whole job.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from pipeline.strategies.base import local
from pipeline.strategies.sync_batchnorm import BatchNormState, Group, synced_batch_norm

COLWISE, ROWWISE, REPLICATE = "colwise", "rowwise", "replicate"


class _CopyToShards(torch.autograd.Function):
    """f: identity forward; backward, the shards' input gradients summed."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        summed = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(summed, group=ctx.group)
        return summed, None


class _SumOverShards(torch.autograd.Function):
    """g: forward, the shards' partial outputs summed; identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        summed = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(summed, group=group)
        return summed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_shards(x: torch.Tensor, group: Group) -> torch.Tensor:
    out: torch.Tensor = _CopyToShards.apply(x, group)  # autograd.Function.apply is untyped
    return out


def sum_over_shards(x: torch.Tensor, group: Group) -> torch.Tensor:
    out: torch.Tensor = _SumOverShards.apply(x, group)
    return out


def conv_forward(conv: nn.Conv2d, how: str, group: Group) -> Callable[[torch.Tensor], torch.Tensor]:
    weight_bias = conv._conv_forward  # padding modes and all, on the tensors it is given

    def forward(x: torch.Tensor) -> torch.Tensor:
        if how == COLWISE:
            x = copy_to_shards(x, group)
        if how != ROWWISE:
            out: torch.Tensor = weight_bias(x, local(conv.weight), local(conv.bias))
            return out
        y = sum_over_shards(weight_bias(x, local(conv.weight), None), group)
        bias = local(conv.bias)
        return y if bias is None else y + bias.view(1, -1, 1, 1)

    return forward


def batch_norm_forward(
    bn: nn.BatchNorm2d, data_group: Group
) -> Callable[[torch.Tensor], torch.Tensor]:
    """nn.BatchNorm2d's forward on its local tensors; in training, over the data ranks'
    samples together where `data_group` is given."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        state = BatchNormState(
            local(bn.weight),
            local(bn.bias),
            local(bn.running_mean),
            local(bn.running_var),
            bn.num_batches_tracked,
            bn.momentum,
            bn.eps,
        )
        if bn.training and data_group is not None:
            return synced_batch_norm(x, state, data_group)
        factor = 0.0 if bn.momentum is None else bn.momentum
        if bn.training and bn.track_running_stats and state.num_batches_tracked is not None:
            state.num_batches_tracked.add_(1)  # nn.BatchNorm2d's rules, as its forward has them
            if bn.momentum is None:
                factor = 1.0 / float(state.num_batches_tracked)
        use_batch = bn.training or state.running_mean is None
        track = not bn.training or bn.track_running_stats
        return F.batch_norm(
            x,
            state.running_mean if track else None,
            state.running_var if track else None,
            state.weight,
            state.bias,
            use_batch,
            factor,
            bn.eps,
        )

    return forward


def linear_forward(linear: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, local(linear.weight), local(linear.bias))

    return forward


def placements(module: nn.Module, how: str) -> dict[str, Placement]:
    """How each of `module`'s own tensors is laid out over the channel shards: a colwise
    layer's all along its output channels, a rowwise one's weight along its input channels,
    the rest replicated; a replicated layer's buffers stay plain tensors (alike on every
    rank), as do the counters (num_batches_tracked)."""
    out: dict[str, Placement] = {}
    for name, _ in module.named_parameters(recurse=False):
        if how == COLWISE:
            out[name] = Shard(0)
        elif how == ROWWISE and name == "weight":
            out[name] = Shard(1)
        else:
            out[name] = Replicate()
    if how == COLWISE:
        for name, b in module.named_buffers(recurse=False):
            if b is not None and b.is_floating_point():
                out[name] = Shard(0)
    return out


def distribute(t: torch.Tensor, mesh: DeviceMesh, placement: Placement) -> DTensor:
    """This rank's part of `t` (alike on every rank: the seeded model) as a DTensor."""
    if isinstance(placement, Shard):
        t = t.chunk(mesh.size(), placement.dim)[mesh.get_local_rank()].contiguous()
    return DTensor.from_local(t, mesh, [placement], run_check=False)


def forward_on_local(module: nn.Module, how: str, group: Group, data_group: Group) -> None:
    """Give a layer that holds tensors its forward on its local tensors."""
    if isinstance(module, nn.Conv2d):
        module.forward = conv_forward(module, how, group)  # type: ignore[method-assign,assignment]
    elif isinstance(module, nn.BatchNorm2d):
        module.forward = batch_norm_forward(module, data_group)  # type: ignore[method-assign,assignment]
    elif isinstance(module, nn.Linear) and how == REPLICATE:
        module.forward = linear_forward(module)  # type: ignore[method-assign,assignment]
    else:
        raise TypeError(f"channel parallelism cannot split a {type(module).__name__} ({how})")


def split_channels(
    model: nn.Module,
    plan: Mapping[nn.Module, str],
    mesh: DeviceMesh,
    data_group: Group = None,
) -> None:
    """Apply a channel plan to `model` in place: each layer named in `plan` split as it says
    (COLWISE, ROWWISE), every other layer that holds tensors replicated. `mesh`: the 1-D
    channel mesh; `data_group`: the data ranks BatchNorm is synchronised over (None: none)."""
    group = mesh.get_group()
    for module in model.modules():
        held = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if not held:  # an activation, a pooling, a container: nothing to split
            continue
        how = plan.get(module, REPLICATE)
        for name, placement in placements(module, how).items():
            tensor = getattr(module, name)
            if name in module._parameters:
                param = nn.Parameter(distribute(tensor.data, mesh, placement), tensor.requires_grad)
                module.register_parameter(name, param)
            else:
                module.register_buffer(name, distribute(tensor, mesh, placement))
        forward_on_local(module, how, group, data_group)


def split_bytes(
    model: nn.Module, plan: Mapping[nn.Module, str], per_sample: torch.Tensor
) -> list[tuple[str, int]]:
    """What one forward and backward of one sample (`per_sample`, as the model takes it) sends
    over the channel group, collective by collective, from the plan and the plain model's
    shapes: each colwise convolution's input gradient (f, backward) and each rowwise one's
    output (g, forward), all-reduced. Run on a meta copy: nothing is computed and no
    BatchNorm statistic moves."""
    names = {module: name for name, module in model.named_modules()}
    split = {names[module]: how for module, how in plan.items() if isinstance(module, nn.Conv2d)}
    meta = copy.deepcopy(model).to(device="meta")
    sizes: list[tuple[str, int]] = []

    def note(how: str) -> Callable[..., None]:
        def seen(m: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            moved = args[0] if how == COLWISE else out
            sizes.append((how, moved.numel() * moved.element_size()))

        return seen

    for name, module in meta.named_modules():
        if name in split:
            module.register_forward_hook(note(split[name]))
    meta(per_sample.to(device="meta"))
    return sizes
