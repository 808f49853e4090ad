"""Data ranks around pipeline stages, hybrid's data x pipeline (`ParallelDims(replicate=d,
pipeline=p)`): each data rank's p neighbouring ranks run pipeline_parallel's stages of the
blocks (`stage_run`, over the ranks of that pipeline alone), on the data rank's share of every
micro-batch; after the step's last schedule run, every stage's gradients are averaged over
its data group (the ranks that hold the same stage), bucketed as a hybrid's replicas reduce
theirs (replicas.replica_reduction), not overlapping the backward.

    data 2 x pipeline 2 on 4 ranks:  rank = 2 * data rank + stage
        ranks 0, 1: the pipeline of samples 0::2 of each micro-batch; ranks 2, 3: of 1::2
        gradients averaged over ranks {0, 2} (stage 0) and {1, 3} (stage 1)

With sync_bn every BatchNorm normalises over its data group's samples together. A rank's share
is cut into `microbatches` contiguous chunks of its strided samples, so chunk k of the data
group is the micro-batch's samples k*c*d .. (k+1)*c*d - 1, as one pipeline's chunk k would be
(c samples a rank): with sync_bn the run computes what pipeline_parallel computes at any
factorization, and with microbatches 1 what `single` computes. The writer is data rank 0's
last stage (rank p - 1); the whole model's state is gathered within its pipeline alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, cast

import torch.distributed as dist
from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import HybridConfig
from pipeline.context import DistContext
from pipeline.parallel_dims import ParallelDims
from pipeline.resnet import block_flops
from pipeline.strategies.base import Autocast, PipelinedRun
from pipeline.strategies.mesh_plan import data_group, writer_buffers_within
from pipeline.strategies.pipeline_parallel import StageCut, schedule_loss, split_points, stage_run
from pipeline.strategies.replicas import no_sync_needed, replicated_sync
from pipeline.strategies.sync_batchnorm import convert_sync_batchnorm, unsynced_note


def pipeline_group(dims: ParallelDims) -> Optional[dist.ProcessGroup]:
    """This rank's pipeline: the ranks that share its data coordinates, in stage order; every
    rank makes every group, as dist.new_group requires. None where it is the whole job."""
    if dims.pipeline == dims.world:
        return None
    subgroup, _ = dist.new_subgroups_by_enumeration(dims.group_ranks("pipeline"))
    return cast(dist.ProcessGroup, subgroup)


def apply_data_pipeline(
    model: nn.Sequential,
    dims: ParallelDims,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
    options: HybridConfig,
) -> PipelinedRun:
    """This rank's stage of its data rank's pipeline, its gradients averaged over its data
    group after the step's last micro-step (`reduce_grads_if`)."""
    if dims.shard > 1 or dims.channel > 1:
        raise ValueError("apply_data_pipeline: data x pipeline only (shard 1, channel 1)")
    chunks, share = options.microbatches, plan.per_rank
    flops = block_flops(model)
    bounds = split_points(flops, dims.pipeline)
    pipeline, data = pipeline_group(dims), data_group(dims)
    stage = dims.coords(ctx.rank)["pipeline"]
    cut = StageCut(bounds, stage, share // chunks, chunks, "gpipe", pipeline)
    run = stage_run(model, cut, schedule_loss(plan.grad_accum * chunks), ctx, autocast)
    blocks = run.module
    assert isinstance(blocks, nn.Sequential)  # stage_blocks' cut of the model
    notes = [
        f"mesh: {dims.describe()}",
        f"pipeline: blocks split at {bounds[1:-1]} by forward FLOPs per image {flops}",
    ]
    synced = options.sync_bn and dims.data > 1
    unsynced = None if synced else unsynced_note("hybrid", share, dims.data)
    if synced:  # in place: the stage's BatchNorm layers, over its data group
        convert_sync_batchnorm(blocks, ctx.on_cuda, data)
    if chunks > 1:
        each = f"{share // chunks * dims.data} samples over the data ranks" if synced else ""
        notes.append(
            f"pipeline: BatchNorm statistics per pipeline micro-batch ({chunks} of each data "
            f"rank's share): {each or f'{share // chunks} samples'}, not the micro-batch's "
            f"{plan.micro}: not the same computation as single"
        )
    first_data_rank = dims.data_rank(ctx.rank) == 0
    return replace(
        run,
        # data rank 0's last stage: its pipeline gathers the whole model for model.pt
        writer=first_data_rank and stage == dims.pipeline - 1,
        reduce_grads_if=(
            replicated_sync(blocks, data, dims.data) if dims.data > 1 else no_sync_needed
        ),
        # without sync_bn each data rank's statistics drift: every one takes data rank 0's
        before_eval=writer_buffers_within(blocks, data) if unsynced else (lambda: None),
        notes=(*notes, *([unsynced] if unsynced else [])),
    )
