"""`channel_parallel`: the notes' third scheme (通道并行), one process per GPU (nccl) or
`channel_parallel.nproc` on the CPU (gloo).

Every rank sees the whole micro-batch and holds 1/N of each residual block's inner channels
(resnet.CHANNEL_PLAN, applied by channel_split.py): each block's first convolution and its
BatchNorm by output channels, so statistics stay exact, the second by input channels, its
partial outputs summed by one all-reduce; the input gradient of the first comes back with
another. Two all-reduces of a block's activations per block and micro-batch, none of
parameters: it computes what `single` computes, at any N.
"""

from __future__ import annotations

from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import ChannelParallelConfig
from pipeline.context import DistContext
from pipeline.parallel_dims import ParallelDims
from pipeline.strategies.base import (
    Autocast,
    DataParallelRun,
    StrategyFacts,
    StrategySpec,
    gpu_count_or_nproc,
)
from pipeline.strategies.mesh_plan import apply_mesh

FACTS = StrategyFacts(
    name="channel_parallel",
    options=ChannelParallelConfig,
    # its collectives run inside every block: across nodes they would wait on the network
    spans_nodes=False,
    mesh=lambda options, world_size: ParallelDims(channel=world_size),
    same_at_any_world_size=lambda options: True,  # single's computation at any N
    # the all-reduces inside the forward are gloo's or NCCL's eager calls
    cuda_graphs=False,
    sharded_parameters=True,  # DTensors: contiguous NCHW, no channels_last
)


def nproc(options: ChannelParallelConfig, plan: BatchPlan, n_gpus: int) -> int:
    return gpu_count_or_nproc(n_gpus, options.nproc)


def parallelize(
    model: nn.Sequential,
    options: ChannelParallelConfig,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
) -> DataParallelRun:
    return apply_mesh(model, ParallelDims(channel=ctx.world_size), plan, ctx, sync_bn=False)


SPEC = StrategySpec(FACTS, nproc, parallelize)
