"""A job's device mesh (pipeline/parallel_dims.py) applied to the plain model, one small
function per dimension, in a fixed order: channel first (it changes the layers), then the data
dimensions over what is left, FSDP2 where they shard (`fsdp_units.shard`), else replicas
(`replicas.replicate`: DDP's for a plain model, one bucket after the backward around channel
shards). Used by channel_parallel and hybrid; ddp and fsdp are the data dimensions alone,
applied by the same two functions (their modules add what their own sections ask: BatchNorm
as `sync_bn` says, fsdp's mixed precision).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from pipeline.batch_plan import BatchPlan
from pipeline.context import DistContext
from pipeline.parallel_dims import ParallelDims
from pipeline.resnet import CHANNEL_PLAN, INPUT_SHAPE, residual_blocks
from pipeline.strategies.base import DataParallelRun, gathered_state, local
from pipeline.strategies.channel_split import split_bytes, split_channels
from pipeline.strategies.fsdp_units import gradient_sync_if, shard
from pipeline.strategies.replicas import no_sync_needed, replicate
from pipeline.strategies.sync_batchnorm import Group, convert_sync_batchnorm


def data_group(dims: ParallelDims) -> Group:
    """This rank's group of data ranks (those that share its model coordinates); every rank
    makes every group, as dist.new_group requires. None where the data ranks are the whole
    job (torch's default group serves) or there is one."""
    if dims.data == 1 or dims.data == dims.world:
        return None
    subgroup, _ = dist.new_subgroups_by_enumeration(dims.group_ranks("replicate", "shard"))
    return cast(dist.ProcessGroup, subgroup)


def channel_plan(model: nn.Sequential) -> dict[nn.Module, str]:
    """resnet.CHANNEL_PLAN, layer by layer of this model."""
    return {
        getattr(block, layer): how
        for block in residual_blocks(model)
        for layer, how in CHANNEL_PLAN.items()
    }


def apply_channel(
    model: nn.Sequential, mesh: DeviceMesh, synced_over: Group, samples_per_step: int
) -> list[str]:
    """Split every residual block's inner channels over `mesh` (1-D); `synced_over`: the data
    ranks every BatchNorm is synchronised over, or None. -> its notes: what is split, and
    what its collectives move in an optimizer step of `samples_per_step` samples a rank
    (reckoned from the plan before the split)."""
    plan = channel_plan(model)
    moved = traffic_note(model, plan, mesh.size(), samples_per_step)
    split_channels(model, plan, mesh, synced_over)
    return [
        f"channel: {mesh.size()} shards of every residual block's inner channels (conv1 and "
        "bn1 by output channels, conv2 by input channels); stem, shortcut, bn2, head "
        "replicated",
        moved,
    ]


def traffic_note(model: nn.Sequential, plan: dict[nn.Module, str], n: int, samples: int) -> str:
    """What each rank's channel collectives move in an optimizer step of `samples` samples
    (f's gradients and g's outputs, all-reduced, blocking), from the plan and the plain
    model's activation shapes in its parameters' dtype (half of it under bf16 autocast): the
    same bytes the code sends (tests/unit/test_mesh_plan.py counts both)."""
    param = next(model.parameters())
    example = torch.zeros(1, *INPUT_SHAPE, dtype=param.dtype, device=param.device)
    sizes = split_bytes(model, plan, example)
    per_step = sum(size for _, size in sizes) * samples
    return (
        f"channel: {len(sizes)} all-reduces per forward and backward over {n} shards, "
        f"{per_step / 2**20:.2f} MiB of {str(param.dtype).removeprefix('torch.')} activations "
        "an optimizer step, blocking"
    )


def apply_mesh(
    model: nn.Sequential, dims: ParallelDims, plan: BatchPlan, ctx: DistContext, sync_bn: bool
) -> DataParallelRun:
    """The run of `dims` over this job: channel shards, then FSDP2 over the data shards or
    replicas (`replicate`). `sync_bn`: BatchNorm over the data ranks' samples."""
    if dims.pipeline > 1:
        raise ValueError("apply_mesh: pipeline stages are pipeline_parallel's")
    mesh = dims.mesh(ctx.device.type)
    group = data_group(dims)
    notes: list[str] = []
    before_eval = writer_buffers_within(model, group) if not sync_bn and dims.data > 1 else None
    if dims.channel > 1:
        synced_over = group if sync_bn and dims.data > 1 else None
        samples = plan.per_rank * plan.grad_accum
        notes += apply_channel(model, mesh["channel"], synced_over, samples)
    elif sync_bn and dims.data > 1:
        model = convert_sync_batchnorm(model, ctx.on_cuda)
    trained: nn.Module = model  # what the loop calls: DDP's wrapper where it replicates
    if dims.shard > 1:
        names = tuple(n for n in ("replicate", "shard") if getattr(dims, n) > 1)
        shard(model, mesh[names], mixed_precision="none")  # fsdp's units; a 2-D mesh: HSDP
        reduce_grads_if = gradient_sync_if(cast(FSDPModule, model))
    elif dims.replicate > 1:
        trained, reduce_grads_if = replicate(model, group, dims.replicate, ctx)
    else:
        reduce_grads_if = no_sync_needed
    return DataParallelRun(
        module=trained,
        forward=trained,
        writer=ctx.is_main,
        devices=ctx.devices_of_ranks(),
        batch_split=[plan.per_rank] * ctx.world_size,
        reduce_grads_if=reduce_grads_if,
        full_state_dict=lambda: gathered_state(model),
        before_eval=before_eval or (lambda: None),
        notes=(f"mesh: {dims.describe()}", *notes),
        # the mesh holds its groups in a registry of its own (torch 2.14), and DTensor's
        # sharding caches hold the mesh for the life of the process
        release=mesh._pg_registry.clear,
    )


def writer_buffers_within(model: nn.Module, group: Group) -> Callable[[], None]:
    """Without sync_bn: before each evaluation, every data rank takes the BatchNorm statistics
    of its group's first rank (its own channel shard of them), which model.pt holds."""
    first = 0 if group is None else dist.get_global_rank(group, 0)

    def share() -> None:
        for buffer in model.buffers():
            dist.broadcast(local(buffer), src=first, group=group)

    return share
