"""`pipeline_parallel`: model parallelism with torch.distributed.pipelining.

The six blocks of the ResNet (stem, four residual stages, head) are cut into
`pipeline_parallel.stages` contiguous stages balanced by forward FLOPs. With one process per
stage (a GPU each, or gloo processes on the CPU), stage i runs on rank i, and each
(micro-)step of the shared loop is one run of the schedule (GPipe or 1F1B) over
`pipeline_parallel.microbatches` pipeline micro-batches: the first stage feeds the images,
the last one holds the labels and the loss, so it is the writer.

With one process for all stages (one GPU, or `pipeline_parallel.nproc: 1` on the CPU) the
same stages run in a looped schedule (GPipe's becomes LoopedBFS, 1F1B's Interleaved1F1B) on
that one device: micro-batches and all, but with no overlap, since every stage waits for the
one device. The run's notes say so. Evaluation then runs the blocks one after the other (torch
2.14's multi-stage schedules cannot evaluate), which is the same computation.

Gradients: the schedule's loss is the pipeline micro-batch mean / (microbatches x grad_accum)
with scale_grads=False, so the accumulated gradient is the mean over the global batch, as in
`single`. (scale_grads=True divides all of .grad by n_microbatches after each run, including
what the earlier accumulation micro-steps left there.)

Mixed precision: the loop runs each schedule step under the run's autocast, so the stages
compute in bf16 where autocast does. The schedule infers the shape and dtype of what crosses a
stage boundary from the first micro-batch it runs (again when it switches between training and
eval), under that same autocast: activations cross in the dtype they came out in, as they flow
on in `single`'s forward. fp16 does not apply: its loss scaling would have to wrap the
schedule's own backward (pipeline/numerics/build.py `fit_to_strategy`).

BatchNorm: a stage normalises one pipeline micro-batch at a time, so with microbatches > 1 its
statistics and running averages come from batch_size / grad_accum / microbatches samples and
training is not the computation `single` does; with microbatches = 1 it is the same one.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
)

from pipeline.batch_plan import BatchPlan
from pipeline.config import PipelineParallelConfig
from pipeline.context import DistContext
from pipeline.errors import UserError
from pipeline.parallel_dims import ParallelDims
from pipeline.resnet import BLOCKS, INPUT_SHAPE, block_flops
from pipeline.strategies.base import (
    Autocast,
    Loss,
    PipelinedRun,
    StateDict,
    StrategyFacts,
    StrategySpec,
)

FACTS = StrategyFacts(
    name="pipeline_parallel",
    options=PipelineParallelConfig,
    # stage i is rank i of one node; more nodes would need a stage-to-node map
    spans_nodes=False,
    mesh=lambda options, world_size: ParallelDims(pipeline=world_size),
    shaping_keys=("stages", "microbatches", "schedule"),
    # never compiled (its schedule runs the stages itself), so nothing to replay
    cuda_graphs=False,
)


def nproc(options: PipelineParallelConfig, plan: BatchPlan, n_gpus: int) -> int:
    """One process per stage where there is a GPU per stage (or, on the CPU, by default);
    one process for all of them on one GPU, or on the CPU with pipeline_parallel.nproc 1."""
    pp = options
    stages, chunks = pp.stages, pp.microbatches
    if stages > BLOCKS:
        raise UserError(
            f"pipeline_parallel.stages: got {stages}, but the model has {BLOCKS} blocks "
            f"to split; expected at most {BLOCKS}"
        )
    if n_gpus:
        if 1 < n_gpus < stages:
            raise UserError(
                f"pipeline_parallel.stages: got {stages}, but only {n_gpus} GPUs are available; "
                f"expected at most {n_gpus} (one stage per GPU), or one GPU for all stages"
            )
        processes = stages if n_gpus >= stages else 1
    else:
        processes = pp.nproc or stages
        if processes not in (1, stages):
            raise UserError(
                f"pipeline_parallel.nproc: got {processes}, expected {stages} (one process per "
                f"stage) or 1 (every stage in one process)"
            )
    if plan.micro % chunks:
        raise UserError(
            f"pipeline_parallel.microbatches: got {chunks}, which does not divide "
            f"train.batch_size / train.grad_accum = {plan.batch_size} / "
            f"{plan.grad_accum} = {plan.micro}"
        )
    if pp.schedule == "1f1b" and processes > 1 and chunks < stages:
        raise UserError(
            f"pipeline_parallel.microbatches: got {chunks}, schedule 1f1b needs at least "
            f"pipeline_parallel.stages = {stages}"
        )
    return processes


def split_points(costs: Sequence[float], stages: int) -> list[int]:
    """Boundaries [0, b1, ..., len(costs)] cutting the blocks into `stages` contiguous,
    non-empty groups whose largest total cost is as small as possible. Exhaustive: the model
    has six blocks, so there are at most ten ways to cut it."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot cut {n} blocks into {stages} non-empty stages")
    prefix = [0, *itertools.accumulate(costs)]

    def heaviest_stage(cuts: tuple[int, ...]) -> float:
        bounds = [0, *cuts, n]
        return max(prefix[b] - prefix[a] for a, b in zip(bounds, bounds[1:]))

    return [0, *min(itertools.combinations(range(1, n), stages - 1), key=heaviest_stage), n]


def stage_blocks(model: nn.Sequential, first: int, end: int) -> nn.Sequential:
    """Blocks first..end-1 under their names in the plain model ("2", "3", ...), so the
    stage's state_dict keys are the plain model's. The other blocks run on other ranks: their
    memory is released here."""
    for i in [*range(first), *range(end, len(model))]:
        model[i].to("meta")
    return nn.Sequential(OrderedDict((str(i), model[i]) for i in range(first, end)))


def parallelize(
    model: nn.Sequential,
    options: PipelineParallelConfig,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
) -> PipelinedRun:
    stages, chunks = options.stages, options.microbatches
    if ctx.world_size not in (1, stages):  # e.g. several nodes, each started with nproc()
        raise UserError(
            f"pipeline_parallel.stages: got {stages}, but the job has {ctx.world_size} "
            f"processes; expected one process per stage (one node), or one for all stages"
        )
    step_batch = plan.micro
    flops = block_flops(model)
    bounds = split_points(flops, stages)
    loss_fn = schedule_loss(plan.grad_accum * chunks)  # the schedule's backward takes it

    notes = [
        f"pipeline_parallel: blocks split at {bounds[1:-1]} by forward FLOPs per image {flops}"
    ]
    if chunks > 1:
        notes.append(
            f"pipeline_parallel: BatchNorm statistics per pipeline micro-batch of "
            f"{step_batch // chunks} samples ({chunks} micro-batches), not per "
            f"batch of {step_batch}: not the same computation as single"
        )
    if ctx.world_size == 1:
        run = looped(model, options, ctx, bounds, loss_fn, step_batch)
        return replace(run, notes=(*notes, *run.notes))
    cut = StageCut(bounds, ctx.rank, step_batch // chunks, chunks, options.schedule)
    run = stage_run(model, cut, loss_fn, ctx, autocast)
    return replace(run, notes=tuple(notes))


@dataclass(frozen=True)
class StageCut:
    """One rank's stage of a pipeline: the blocks cut at `bounds`, its stage `index`, its
    schedule's micro-batches (`microbatches` of `chunk` samples) and the ranks of its
    pipeline in stage order (`group`; None: the whole job)."""

    bounds: list[int]
    index: int
    chunk: int
    microbatches: int
    schedule: str  # gpipe | 1f1b
    group: Optional[dist.ProcessGroup] = None

    @property
    def stages(self) -> int:
        return len(self.bounds) - 1


def stage_run(
    model: nn.Sequential, cut: StageCut, loss_fn: Loss, ctx: DistContext, autocast: Autocast
) -> PipelinedRun:
    """This rank's stage of `cut`, run by its schedule with its neighbours in `cut.group`
    (pipeline_parallel's, and each data rank's pipeline in a hybrid): the writer is the
    last stage, which gathers the whole model's state from its group's stages."""
    first, end = cut.bounds[cut.index], cut.bounds[cut.index + 1]
    # The stage's metadata, stated rather than inferred at the first step by an exchange with
    # its neighbours: so a rank also runs alone, under the fake process group, where the
    # predict stage measures it (scaling/profile.py)
    inputs, outputs = boundary_examples(model, first, end, cut.chunk, autocast)
    blocks = stage_blocks(model, first, end)
    stage = PipelineStage(
        blocks,
        cut.index,
        cut.stages,
        ctx.device,
        input_args=inputs,
        output_args=outputs,
        # the gradients that travel back have the activations' shapes and dtypes
        output_grads=None if end == len(model) else torch.zeros_like(outputs),
        input_grads=None if first == 0 else torch.zeros_like(inputs),
        group=cut.group,
    )
    schedule_class = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cut.schedule]
    schedule = schedule_class(
        stage, n_microbatches=cut.microbatches, loss_fn=loss_fn, scale_grads=False
    )

    def pipeline_step(x: torch.Tensor, y: torch.Tensor, training: bool) -> Optional[torch.Tensor]:
        inputs = (x,) if stage.is_first else ()
        target = y if stage.is_last else None
        run = schedule.step if training else schedule.eval
        logits: Optional[torch.Tensor] = run(*inputs, target=target)  # untyped in torch
        return logits

    def full_state_dict() -> StateDict:
        mine = {k: v.detach().cpu() for k, v in blocks.state_dict().items()}
        parts: list[Any] | None = [None] * cut.stages if stage.is_last else None
        # a collective over the pipeline's stages: every one sends
        dist.gather_object(mine, parts, group=cut.group, group_dst=cut.stages - 1)
        return {k: v for part in parts or () for k, v in part.items()}

    return PipelinedRun(
        module=blocks,
        step=pipeline_step,
        writer=stage.is_last,
        devices=ctx.devices_of_ranks(),
        batch_split=[cut.chunk * cut.microbatches] * ctx.world_size,
        full_state_dict=full_state_dict,
        eval_batch_size=cut.chunk * cut.microbatches,
    )


def looped(
    model: nn.Sequential,
    options: PipelineParallelConfig,
    ctx: DistContext,
    bounds: list[int],
    loss_fn: Loss,
    step_batch: int,
) -> PipelinedRun:
    """Every stage in this one process, on its one device, run by a looped schedule."""
    stages = len(bounds) - 1
    modules = [
        nn.Sequential(OrderedDict((str(i), model[i]) for i in range(a, b)))
        for a, b in zip(bounds, bounds[1:])
    ]
    pipeline_stages = [PipelineStage(m, i, stages, ctx.device) for i, m in enumerate(modules)]
    schedule_class = {"gpipe": ScheduleLoopedBFS, "1f1b": ScheduleInterleaved1F1B}[options.schedule]
    schedule = schedule_class(
        pipeline_stages,
        n_microbatches=options.microbatches,
        loss_fn=loss_fn,
        scale_grads=False,
    )

    def pipeline_step(x: torch.Tensor, y: torch.Tensor, training: bool) -> Optional[torch.Tensor]:
        if training:
            logits: Optional[torch.Tensor] = schedule.step(x, target=y)  # untyped in torch
            return logits
        out: torch.Tensor = model(x)  # the stages one after the other, as the schedule would
        return out

    where = f"1 {'GPU' if ctx.on_cuda else 'process'}"
    note = (
        f"pipeline_parallel: {stages} stages on {where}: no overlap (the looped "
        f"{schedule_class.__name__} schedule runs with its micro-batches, but one device "
        f"works on one stage at a time)"
    )
    return PipelinedRun(
        module=model,
        step=pipeline_step,
        writer=True,
        devices=[str(ctx.device)],
        batch_split=[step_batch],
        notes=(note,),
        eval_batch_size=step_batch,
    )


def schedule_loss(forwards: int) -> Loss:
    """The loss each micro-batch's backward takes in the schedule: cross-entropy (a mean over
    that micro-batch) divided by the forwards of one optimizer step (train.grad_accum of
    them, each cut into the schedule's chunks), so that the accumulated gradient is the mean
    over the step's batch, as the shared step's (training/trainer.py) is."""

    def scaled(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels) / forwards

    return scaled


@torch.no_grad()
def boundary_examples(
    model: nn.Sequential, first: int, end: int, chunk: int, autocast: Autocast
) -> tuple[torch.Tensor, torch.Tensor]:
    """What blocks first..end-1 take in and give out for one pipeline micro-batch of `chunk`
    images, as the schedule's training and evaluation pass them: the whole model's forward
    (every rank holds it before the split) under the run's autocast, in eval mode so that no
    BatchNorm statistic moves, on zeros of the parameters' dtype and device."""
    param = next(model.parameters())
    x = torch.zeros(chunk, *INPUT_SHAPE, dtype=param.dtype, device=param.device)
    was_training = model.training
    model.eval()
    try:
        with autocast():
            before = model[:first](x)
            after = model[first:end](before)
    finally:
        model.train(was_training)
    # as in training: a received activation takes a gradient, which goes back to its sender
    return before.requires_grad_(first > 0), after.requires_grad_(True)


SPEC = StrategySpec(FACTS, nproc, parallelize, stage_split=split_points)
