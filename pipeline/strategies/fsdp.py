"""`fsdp`: FSDP2 (`fully_shard`), one process per GPU (nccl) or `fsdp.nproc` on the CPU (gloo).

Each residual stage (blocks 1..4 of the Sequential) is sharded as its own unit, so only one
stage's parameters are gathered at a time, then the root takes the stem and the head. Data
flows as in ddp: each rank trains on its strided share of every micro-batch and gradients are
reduce-scattered (averaged over ranks) in backward; with gradient accumulation only the last
micro-step reduces (`set_requires_gradient_sync(False)` on the others).

`fsdp.mixed_precision` bf16|fp16 runs forward and backward with parameters in that dtype
(BatchNorm's excepted, see `shard`) and reduces gradients in fp32; the sharded parameters the
optimizer updates keep the model's dtype.
"""

from __future__ import annotations

from typing import cast

from torch import nn
from torch.distributed.fsdp import FSDPModule

from pipeline.batch_plan import BatchPlan
from pipeline.config import FsdpConfig
from pipeline.context import DistContext
from pipeline.parallel_dims import ParallelDims
from pipeline.strategies.base import (
    Autocast,
    DataParallelRun,
    StrategyFacts,
    StrategySpec,
    gathered_state,
    gpu_count_or_nproc,
)
from pipeline.strategies.fsdp_units import gradient_sync_if, shard
from pipeline.strategies.sync_batchnorm import batchnorm_synced, rank_batchnorm

FACTS = StrategyFacts(
    name="fsdp",
    options=FsdpConfig,
    spans_nodes=True,
    mesh=lambda options, world_size: ParallelDims(shard=world_size),
    same_at_any_world_size=batchnorm_synced,
    shaping_keys=("sync_bn", "mixed_precision"),
    # With its per-block all-gather/free hooks between graphs, reduce-overhead ran 24 s an
    # epoch on an H100, 27x single's (docs/performance.md).
    cuda_graphs=False,
    sharded_parameters=True,
)


def nproc(options: FsdpConfig, plan: BatchPlan, n_gpus: int) -> int:
    return gpu_count_or_nproc(n_gpus, options.nproc)


def parallelize(
    model: nn.Sequential, options: FsdpConfig, plan: BatchPlan, ctx: DistContext, autocast: Autocast
) -> DataParallelRun:
    batchnorm = rank_batchnorm("fsdp", model, options.sync_bn, plan, ctx.on_cuda)
    model = batchnorm.model
    mesh = FACTS.mesh(options, ctx.world_size).mesh(ctx.device.type)  # data shards alone
    shard(model, mesh, options.mixed_precision)

    sharded = cast(FSDPModule, model)  # fully_shard made the model an FSDPModule in place
    notes = list(batchnorm.notes)
    if options.mixed_precision != "none":
        notes.append(
            f"fsdp mixed precision: {options.mixed_precision} parameters in "
            f"forward/backward (BatchNorm's keep the model's dtype), fp32 gradient "
            f"reduction"
        )
    return DataParallelRun(
        module=model,
        forward=model,
        writer=ctx.is_main,
        devices=ctx.devices_of_ranks(),
        batch_split=[plan.per_rank] * ctx.world_size,
        reduce_grads_if=gradient_sync_if(sharded),
        full_state_dict=lambda: gathered_state(model),
        notes=tuple(notes),
        before_eval=batchnorm.before_eval,
        # the mesh holds its groups in a registry of its own (torch 2.14), and DTensor's
        # sharding caches hold the mesh for the life of the process
        release=mesh._pg_registry.clear,
    )


SPEC = StrategySpec(FACTS, nproc, parallelize)
