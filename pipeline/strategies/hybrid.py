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
"""

from __future__ import annotations

from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import HybridConfig
from pipeline.context import DistContext
from pipeline.errors import UserError
from pipeline.parallel_dims import ParallelDims
from pipeline.strategies.base import Autocast, DataParallelRun, StrategyFacts, StrategySpec
from pipeline.strategies.mesh_plan import apply_mesh


def dims_of(options: HybridConfig) -> ParallelDims:
    return ParallelDims(replicate=options.data, shard=options.shard, channel=options.channel)


def mesh(options: HybridConfig, world_size: int) -> ParallelDims:
    """The section's mesh, which must cover the job's processes."""
    dims = dims_of(options)
    dims.check_world(world_size, "hybrid (data x shard x channel)")
    return dims


FACTS = StrategyFacts(
    name="hybrid",
    options=HybridConfig,
    # one node: a multi-node mesh would need the processes per node to hold whole channel
    # groups, and nproc to be the node's share of the mesh
    spans_nodes=False,
    mesh=mesh,
    same_at_any_world_size=lambda options: options.sync_bn,
    shaping_keys=("sync_bn",),
    cuda_graphs=False,  # collectives inside the forward, FSDP's hooks between graphs
    sharded_parameters=True,  # DTensors: contiguous NCHW
)


def nproc(options: HybridConfig, plan: BatchPlan, n_gpus: int) -> int:
    """The mesh's processes: one per GPU, so `devices` must name as many."""
    world = dims_of(options).world
    if n_gpus and n_gpus != world:
        raise UserError(
            f"hybrid: data x shard x channel = {world} process(es), but devices gives "
            f"{n_gpus} GPU(s); expected a product of {n_gpus}"
        )
    return world


def parallelize(
    model: nn.Sequential,
    options: HybridConfig,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
) -> DataParallelRun:
    return apply_mesh(model, dims_of(options), plan, ctx, sync_bn=options.sync_bn)


SPEC = StrategySpec(FACTS, nproc, parallelize)
