"""Assembling a run: the seeded model, parallelized by its strategy, with the speed options
applied, its optimizer, training batches and loss. What the train stage trains and what
benchmarks/bench.py and benchmarks/profile_step.py time, built the same way."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import torch

from pipeline import memory
from pipeline.batch_plan import BatchPlan
from pipeline.context import DistContext
from pipeline.data.device_data import DeviceData
from pipeline.data.fashion_mnist import DATA_DIR
from pipeline.data.loaders import Batches, Feed, make_batches
from pipeline.numerics.graphed_step import GraphedStep, side_stream, step_graph
from pipeline.numerics.optim import LrSchedule, loss_function, make_optimizer
from pipeline.numerics.precision import (
    Precision,
    build_precision,
    configure_backends,
    fallback,
    gpu_capability,
    job_capabilities,
)
from pipeline.numerics.speed_defaults import cuda_graph_choice
from pipeline.numerics.torch_compile import compile_forward, graph_step_marker, mode_that_runs
from pipeline.resnet import build_model
from pipeline.results import SpeedFeatures
from pipeline.run_spec import RunSpec
from pipeline.strategies.base import (
    DataParallelRun,
    Decided,
    Forward,
    LoopForward,
    Loss,
    PipelinedRun,
    Run,
    StrategyFacts,
)


@dataclass(frozen=True)
class Training:
    run: Run  # what the strategy returned, as it returned it
    facts: StrategyFacts[Any]
    plan: BatchPlan  # the batch over this job's data-parallel ranks
    # a DataParallelRun's forward as the loop calls it (compiled when train.compile); None for
    # a pipeline, whose schedule runs its own stages
    forward: Optional[Forward]
    new_graph_step: Callable[[], None]  # called before each forward (CUDA graphs)
    # the whole step as one CUDA graph (train.cuda_graph: step, where it applies); None: eager
    graphed: Optional[GraphedStep]
    # how `forward` was made, for what the strategy measures before training (`started`)
    loop: LoopForward
    # the precision's, compile's, the loader's and memory's notes; `notes` puts those of the
    # run (the one `started` leaves, which may say what it decided) before them
    built_notes: tuple[str, ...]
    # the speed options as they applied (`speed_features`): the report and MLflow tags
    features: SpeedFeatures
    prec: Precision
    loader: Batches
    optimizer: torch.optim.Optimizer
    # a DataParallelRun's loss, the mean over one forward's samples (train.label_smoothing);
    # the step divides it by its forwards (trainer.py)
    loss_fn: Loss
    schedule: LrSchedule  # the learning rate of each global step, from the plan
    # the devices whose allocator peaks this process reads ([] on the CPU: its RSS), derived
    # once from the run's devices (memory.local_devices), which `started` keeps
    memory_devices: list[torch.device]

    @property
    def notes(self) -> tuple[str, ...]:
        """The run's notes, then the precision's, compile's, the loader's and memory's."""
        return (*self.run.notes, *self.built_notes)

    def started(
        self, kept: Optional[Decided], say: Callable[[str], None] = lambda line: None
    ) -> tuple[Training, Optional[Decided]]:
        """The training with its strategy's last step of building done (`Run.at_start`),
        once its speed options apply and before the first step, and what the strategy
        decided there (None: it decides nothing). `kept`: what an earlier process of this
        same run decided (a resume's), which it takes instead of deciding again."""
        if self.run.at_start is None:
            return self, None
        run, decided = self.run.at_start(self.loop, kept, say)
        return replace(self, run=run), decided


def build_training(
    spec: RunSpec[Any],
    ctx: DistContext,
    data: DeviceData,
    plan: BatchPlan,
    raw_dir: Path = DATA_DIR / "raw",
) -> Training:
    """`plan`: the batch over this job's ranks (`RunSpec.job_plan`). `raw_dir`: the fetched
    IDX files, which data.loader=dataloader reads via torchvision. A strategy with a last
    step of its own before training (`run.at_start`) takes it in `Training.started`."""
    device, facts = ctx.device, spec.facts
    # what `auto` settings mean on this device for this strategy (speed_defaults.py)
    graph_asked, auto_notes = cuda_graph_choice(spec.train.cuda_graph, spec.name, device.type)
    train = replace(spec.train, cuda_graph=graph_asked)
    # one precision for the job, which every rank computes its gradients in (a collective)
    capabilities = job_capabilities(gpu_capability(device), ctx.world_size)
    prec = build_precision(train.precision, device, capabilities)
    # its process-wide switches (TF32, cuDNN autotuning) at once: the one fallback to come
    # (fit_to_strategy: a pipeline's fp16 trains in fp32) leaves TF32 off, as it was
    configure_backends(prec, device)
    model = build_model(spec.model.width, spec.seed, spec.model.init).to(device, prec.dtype)
    # DDP ties its gradient accumulators to the stream it is built on, and a capture breaks
    # where that is the default stream (torch's warning on the H200, 2026-11-28; PyTorch's
    # CUDA graphs notes, "Usage with DistributedDataParallel"): built on a side stream then
    with side_stream(device) if train.cuda_graph == "step" else nullcontext():
        run = spec.strategy.parallelize(model, spec.options, plan, ctx, prec.autocast)
    prec, channels_last = fit_to_strategy(prec, run, facts, train.channels_last)
    pipelined = isinstance(run, PipelinedRun)

    graphed, mode, graph_notes = step_graph(
        train, facts.cuda_graphs, device, ctx.world_size, run.devices, prec.name
    )
    graph_notes = [*auto_notes, *graph_notes]
    optimizer = run.distributed_optimizer(make_optimizer(run.module.parameters(), train))
    whole_step = GraphedStep(optimizer, device) if graphed else None  # its warm-up, then replays

    def prepare(module_forward: Optional[Forward]) -> tuple[Optional[Forward], list[str]]:
        return compile_forward(module_forward, train.compile, mode, facts.cuda_graphs)

    def as_the_loop_runs(module_forward: Forward) -> Forward:
        compiled, _ = prepare(module_forward)
        assert compiled is not None  # only a missing forward stays missing
        return compiled

    forward, compile_notes = prepare(run.forward if isinstance(run, DataParallelRun) else None)
    # compile's own graphs and their step marker give way to the whole step's
    new_graph_step = graph_step_marker(train, facts.cuda_graphs and not graphed)
    feed = Feed(plan, plan.data_rank(ctx.rank), prec.dtype, channels_last, device)
    loader = make_batches(data, spec.data, spec.seed, feed, raw_dir)
    return Training(
        run=run,
        facts=facts,
        plan=plan,
        forward=forward,
        new_graph_step=new_graph_step,
        loop=LoopForward(
            prepare=as_the_loop_runs,
            autocast=prec.autocast,
            channels_last=channels_last,
            new_graph_step=new_graph_step,
        ),
        built_notes=(
            *prec.notes,
            *compile_notes,
            *graph_notes,
            *loader.notes,
            *memory.notes(device),
        ),
        features=speed_features(
            prec.name,
            channels_last,
            mode if forward is not None and train.compile else None,
            facts.cuda_graphs,
            graphed,
            device,
        ),
        prec=prec,
        loader=loader,
        optimizer=optimizer,
        loss_fn=loss_function(train, schedule_owns_loss=pipelined),
        schedule=LrSchedule.of(train, plan.steps),
        graphed=whole_step,
        memory_devices=memory.local_devices(run.devices, ctx),
    )


def speed_features(
    precision: str,
    channels_last: bool,
    compile_mode: Optional[str],
    cuda_graphs: bool,
    graphed: bool,
    device: torch.device,
) -> SpeedFeatures:
    """The speed options a run applied, after every fallback, as summary.json's
    `speed_features` and the MLflow tags `speed.<key>` carry them, so a comparison can say
    when two runs differ in more than their strategy. `compile_mode`: the mode the forward
    was compiled in, None where it was not; `cuda_graphs`: the strategy takes them
    (StrategyFacts); `graphed`: the whole step is one graph."""
    if compile_mode is not None:
        compile_mode = mode_that_runs(compile_mode, cuda_graphs)
    compile_graphs = device.type == "cuda" and compile_mode in ("reduce-overhead", "max-autotune")
    return {
        "precision": precision,
        "channels_last": channels_last,
        "compile": compile_mode or "off",
        "cuda_graphs": "step" if graphed else "compile" if compile_graphs else "none",
    }


def fit_to_strategy(
    precision: Precision, run: Run, facts: StrategyFacts[Any], channels_last: Optional[bool]
) -> tuple[Precision, bool]:
    """Apply to the parallelized model what its strategy can take; note what it cannot.

    A pipeline schedule runs its stages under the loop's autocast, and sizes the buffers that
    carry activations between stages from its first micro-batch, run under that same autocast:
    bf16 trains as elsewhere. But the schedule runs backward itself, so fp16's loss scaling
    cannot apply: fp32 instead. Its stages send contiguous NCHW tensors: no channels_last. Sharded
    (DTensor) parameters must stay contiguous (FSDP2): no channels_last. Elsewhere the
    parameters are converted to channels_last in place, after wrapping, so DDP/DP keep the
    same Parameter objects; DDP warns once that gradient strides do not match its buckets,
    then lays the buckets out again after the first step.
    channels_last None (auto) means on for CUDA, off on the CPU.
    Returns the precision that runs and whether inputs should be channels_last.
    """
    if channels_last is None:
        channels_last = precision.device_type == "cuda"
    pipelined = isinstance(run, PipelinedRun)
    if pipelined and precision.scaler is not None:
        precision = fallback(
            precision.name,
            precision.device_type,
            "the pipeline schedule runs backward itself, without the loss scaling fp16 needs",
        )
    if not channels_last:
        return precision, False
    if pipelined or facts.sharded_parameters:
        why = (
            "pipeline stages send activations"
            if pipelined
            else "sharded (DTensor) parameters must be"
        )
        precision.notes.append(f"channels_last: not applied; {why} contiguous NCHW")
        return precision, False
    run.module.to(memory_format=torch.channels_last)
    return precision, True
