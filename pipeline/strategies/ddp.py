"""`ddp`: DistributedDataParallel, one process per GPU (nccl) or `ddp.nproc` on the CPU (gloo).

Each rank trains on its strided share of every micro-batch (pipeline/data/device_data.py),
gradients are averaged over ranks in backward, and with gradient accumulation only the last
micro-step all-reduces (`no_sync` on the others). The mesh's data replicas alone
(`ParallelDims(replicate=N)`), applied by the function every mesh's replicas use
(replicas.replicate), with BatchNorm as `ddp.sync_bn` says.
"""

from __future__ import annotations

from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import DdpConfig
from pipeline.context import DistContext
from pipeline.strategies.base import (
    Autocast,
    DataParallelRun,
    StrategyFacts,
    StrategySpec,
    gpu_count_or_nproc,
    replicas,
)
from pipeline.strategies.replicas import replicate
from pipeline.strategies.sync_batchnorm import batchnorm_synced, rank_batchnorm

FACTS = StrategyFacts(
    name="ddp",
    options=DdpConfig,
    spans_nodes=True,
    mesh=replicas,
    same_at_any_world_size=batchnorm_synced,
    shaping_keys=("sync_bn",),
)


def nproc(options: DdpConfig, plan: BatchPlan, n_gpus: int) -> int:
    return gpu_count_or_nproc(n_gpus, options.nproc)


def parallelize(
    model: nn.Sequential, options: DdpConfig, plan: BatchPlan, ctx: DistContext, autocast: Autocast
) -> DataParallelRun:
    batchnorm = rank_batchnorm("ddp", model, options.sync_bn, plan, ctx.on_cuda)
    model = batchnorm.model
    ddp, reduce_grads_if = replicate(model, None, ctx.world_size, ctx)
    return DataParallelRun(
        module=ddp,
        forward=ddp,
        writer=ctx.is_main,
        devices=ctx.devices_of_ranks(),
        batch_split=[plan.per_rank] * ctx.world_size,
        reduce_grads_if=reduce_grads_if,
        full_state_dict=lambda: {k: v.detach().cpu() for k, v in model.state_dict().items()},
        notes=batchnorm.notes,
        before_eval=batchnorm.before_eval,
    )


SPEC = StrategySpec(FACTS, nproc, parallelize)
