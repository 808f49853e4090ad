"""`hybrid`: data and model parallelism composed on one device mesh (the notes'
数据+模型并行): `hybrid.data` replicas x `hybrid.shard` FSDP2 shards x `hybrid.pipeline`
pipeline stages x `hybrid.channel` channel shards, one process per GPU (nccl) or their
product on the CPU (gloo).

    hybrid: {data: 2, channel: 2}   data x channel: two replicas, each two channel shards
    hybrid: {data: 1, shard: 2, channel: 2}   FSDP x channel
    hybrid: {data: 2, shard: 2, channel: 1}   HSDP: replicated across two groups of 2 shards
    hybrid: {data: 2, pipeline: 2, channel: 1}   data x pipeline: two pipelines of 2 stages

The model ranks of one data rank (its channel shards, or its pipeline's stages) see the same
share of every micro-batch (they are the mesh's inner dimensions: neighbouring ranks, one
node's GPUs); the data ranks split it as ddp's do. With sync_bn every BatchNorm normalises
over the data ranks' samples together, so the run computes what `single` computes at any
factorization (ParallelDims), a pipeline's with `hybrid.microbatches` 1.

Data x pipeline (data_pipeline.py) runs pipeline_parallel's stages (GPipe) in each data
rank's pipeline and averages every stage's gradients over its data group after the step's
last schedule run. It is not composed with channel or shard: that is not built (each stage
would split or shard its own blocks over a sub-mesh of its own, and no parity test holds such
a run), so `hybrid.pipeline` > 1 with `hybrid.channel` or `hybrid.shard` > 1 is refused (one
line, exit 2, before any process starts), as are more stages than the model's blocks and a
`hybrid.microbatches` that does not divide a data rank's share.

On GPUs the mesh takes every GPU in `devices`: where the section's product is another count,
its channel and shard sizes are cut to what divides the GPUs and data takes the rest (1 GPU:
one rank, as ddp on one GPU), and the run's notes say so. Pipeline stages are not cut to fit
(a stage per GPU is what was asked): with pipeline > 1 the product must be the GPU count.
"""

from __future__ import annotations

import math
from dataclasses import replace

from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import HybridConfig
from pipeline.context import DistContext
from pipeline.errors import UserError
from pipeline.parallel_dims import ParallelDims, factorizations
from pipeline.resnet import BLOCKS
from pipeline.strategies.base import Autocast, Preset, Run, StrategyFacts, StrategySpec
from pipeline.strategies.data_pipeline import apply_data_pipeline
from pipeline.strategies.mesh_plan import apply_mesh

# the section's keys -> the mesh's dimensions
KEYS = {"data": "replicate", "shard": "shard", "pipeline": "pipeline", "channel": "channel"}


def asked(options: HybridConfig) -> ParallelDims:
    return ParallelDims(
        replicate=options.data,
        shard=options.shard,
        pipeline=options.pipeline,
        channel=options.channel,
    )


def mesh(options: HybridConfig, world_size: int) -> ParallelDims:
    """The section's mesh where it covers the job's processes (the CPU's, always), else
    fitted to them: channel and shard cut to what divides, data the rest (pipeline stages
    are not cut: `nproc` refuses another count)."""
    dims = asked(options)
    if dims.world == world_size or options.pipeline > 1:
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
        if dims.pipeline <= BLOCKS  # a stage needs a block
    ]


def same_at_any_world_size(options: HybridConfig) -> bool:
    """With sync_bn: a pipeline's micro-batches are the same samples at any factorization
    (data_pipeline.py), but with pipeline 1 `microbatches` does not apply, so a section
    with microbatches > 1 computes one thing with stages and another without."""
    return options.sync_bn and (options.microbatches == 1 or options.pipeline > 1)


def preset_of(options: HybridConfig, dims: ParallelDims) -> Preset | None:
    """The preset whose run a layout of one dimension builds (apply_mesh with that dimension
    alone, as the preset's parallelize does), with the preset's keys that must equal. Not
    ddp: its run may take CUDA graphs and channels_last, which a hybrid's never does, and a
    pipeline's micro-batches are each its own section's."""
    if dims.used == ("channel",):
        return "channel_parallel", {}
    if dims.used == ("shard",):
        return "fsdp", {"sync_bn": options.sync_bn, "mixed_precision": "none"}
    return None


FACTS = StrategyFacts(
    name="hybrid",
    options=HybridConfig,
    # one node: a multi-node mesh would need each node's processes to hold whole channel
    # groups, and nproc to be the node's share of the mesh
    spans_nodes=False,
    mesh=mesh,
    layouts=layouts,
    same_at_any_world_size=same_at_any_world_size,
    shaping_keys=("sync_bn", "microbatches"),
    cuda_graphs=False,  # collectives inside the forward, FSDP's hooks between graphs
    sharded_parameters=True,  # DTensors: contiguous NCHW
    preset_of=preset_of,
)


def nproc(options: HybridConfig, plan: BatchPlan, n_gpus: int) -> int:
    if options.pipeline > 1:
        check_pipeline(options, plan, n_gpus or asked(options).world)
    return n_gpus or asked(options).world


def check_pipeline(options: HybridConfig, plan: BatchPlan, processes: int) -> None:
    """Data x pipeline as the section asks it, on `processes`, or a UserError naming the key."""
    dims, p = asked(options), options.pipeline
    if dims.channel > 1 or dims.shard > 1:
        raise UserError(
            f"hybrid.pipeline: got {p} with hybrid.channel {dims.channel} and hybrid.shard "
            f"{dims.shard}; expected channel 1 and shard 1 (pipeline composes with data alone)"
        )
    if p > BLOCKS:
        raise UserError(
            f"hybrid.pipeline: got {p}, but the model has {BLOCKS} blocks to split; "
            f"expected at most {BLOCKS}"
        )
    if dims.world != processes:
        raise UserError(
            f"hybrid.pipeline: hybrid.data x hybrid.pipeline = {dims.data} x {p} = "
            f"{dims.world} processes, but the job has {processes} (GPUs in devices); expected "
            f"their product to be {processes} (pipeline stages are not cut to fit)"
        )
    share = plan.of_job(dims, f"hybrid ({dims.describe()})").per_rank
    if share % options.microbatches:
        raise UserError(
            f"hybrid.microbatches: got {options.microbatches}, which does not divide a data "
            f"rank's share of each micro-batch, train.batch_size / train.grad_accum / "
            f"hybrid.data = {plan.batch_size} / {plan.grad_accum} / {dims.data} = {share}"
        )


def parallelize(
    model: nn.Sequential,
    options: HybridConfig,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
) -> Run:
    dims = mesh(options, ctx.world_size)
    if dims.pipeline > 1:
        check_pipeline(options, plan, ctx.world_size)  # nproc's, at this job's world size
        return apply_data_pipeline(model, dims, plan, ctx, autocast, options)
    run = apply_mesh(model, dims, plan, ctx, sync_bn=options.sync_bn)
    if dims == asked(options):
        return run
    fitted = (
        f"hybrid: asked for {asked(options).describe()} ({asked(options).world} processes); "
        f"{ctx.world_size} device(s): ran {dims.describe()}"
    )
    return replace(run, notes=(fitted, *run.notes))


SPEC = StrategySpec(FACTS, nproc, parallelize)
