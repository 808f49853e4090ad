"""`hybrid`: data and model parallelism composed on one device mesh (the notes'
数据+模型并行): `hybrid.data` replicas x `hybrid.shard` FSDP2 shards x `hybrid.channel`
channel shards, one process per GPU (nccl) or their product on the CPU (gloo).

    hybrid: {data: 2, channel: 2}   data x channel: two replicas, each two channel shards
    hybrid: {data: 1, shard: 2, channel: 2}   FSDP x channel
    hybrid: {data: 2, shard: 2, channel: 1}   HSDP: replicated across two groups of 2 shards

The channel shards of one data rank see the same share of every micro-batch (channel is the
mesh's innermost dimension: neighbouring ranks, one node's GPUs); the data ranks split it as
ddp's do. With sync_bn every BatchNorm normalises over the data ranks' samples together, so
the run computes what `single` computes at any factorization (ParallelDims).

On GPUs the mesh takes every GPU in `devices`: where the section's product is another count,
its channel and shard sizes are cut to what divides the GPUs and data takes the rest (1 GPU:
one rank, as ddp on one GPU), and the run's notes say so.
"""

from __future__ import annotations

import math
from dataclasses import replace

from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import HybridConfig
from pipeline.context import DistContext
from pipeline.parallel_dims import ParallelDims, factorizations
from pipeline.strategies.base import Autocast, DataParallelRun, StrategyFacts, StrategySpec
from pipeline.strategies.mesh_plan import apply_mesh

# the section's keys -> the mesh's dimensions
KEYS = {"data": "replicate", "shard": "shard", "channel": "channel"}


def asked(options: HybridConfig) -> ParallelDims:
    return ParallelDims(replicate=options.data, shard=options.shard, channel=options.channel)


def mesh(options: HybridConfig, world_size: int) -> ParallelDims:
    """The section's mesh where it covers the job's processes (the CPU's, always), else
    fitted to them: channel and shard cut to what divides, data the rest."""
    dims = asked(options)
    if dims.world == world_size:
        return dims
    channel = math.gcd(options.channel, world_size)
    shard = math.gcd(options.shard, world_size // channel)
    return ParallelDims(replicate=world_size // (channel * shard), shard=shard, channel=channel)


def layouts(options: HybridConfig, n: int) -> list[HybridConfig]:
    """The section at every way to lay n devices on the dimensions it uses (8 over data x
    channel: 1x8, 2x4, 4x2, 8x1), for a prediction to compare."""
    keys = tuple(k for k, dim in KEYS.items() if getattr(asked(options), dim) > 1) or ("data",)
    return [
        replace(options, **{k: getattr(dims, KEYS[k]) for k in KEYS})
        for dims in factorizations(n, tuple(KEYS[k] for k in keys))
    ]


FACTS = StrategyFacts(
    name="hybrid",
    options=HybridConfig,
    # one node: a multi-node mesh would need each node's processes to hold whole channel
    # groups, and nproc to be the node's share of the mesh
    spans_nodes=False,
    mesh=mesh,
    layouts=layouts,
    same_at_any_world_size=lambda options: options.sync_bn,
    shaping_keys=("sync_bn",),
    cuda_graphs=False,  # collectives inside the forward, FSDP's hooks between graphs
    sharded_parameters=True,  # DTensors: contiguous NCHW
)


def nproc(options: HybridConfig, plan: BatchPlan, n_gpus: int) -> int:
    return n_gpus or asked(options).world


def parallelize(
    model: nn.Sequential,
    options: HybridConfig,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
) -> DataParallelRun:
    dims = mesh(options, ctx.world_size)
    run = apply_mesh(model, dims, plan, ctx, sync_bn=options.sync_bn)
    if dims == asked(options):
        return run
    fitted = (
        f"hybrid: asked for {asked(options).describe()} ({asked(options).world} processes); "
        f"{ctx.world_size} device(s): ran {dims.describe()}"
    )
    return replace(run, notes=(fitted, *run.notes))


SPEC = StrategySpec(FACTS, nproc, parallelize)
