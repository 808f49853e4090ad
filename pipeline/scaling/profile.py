"""What one rank of a world of N computes, measured on this device by the strategy's own code.

ddp and fsdp run as rank 0 of N under torch's fake process group (`fake_world`): the
strategy parallelises the model for N ranks (FSDP shards its parameters N ways, each rank's
share of the batch is B/N), every collective returns at once, and the loop's own step
(`training.trainer.Trainer.step`) is timed. What the rank would send is read off the real calls as
they pass (`SentLog`): FSDP's all-gathers and reduce-scatters through the dispatcher, DDP's
gradient buckets through a communication hook that stands in for its all-reduce.

A pipeline stage's rank cannot be timed alone as one of N (its schedule waits for its
neighbours, and the step waits for the slowest stage across the fill and the drain), so
pipeline_parallel is measured block by block: the plain model split where the strategy splits
it (`split_points` of `block_flops`), each stage's forward and backward of one pipeline
micro-batch timed on this device, and the activations it would send weighed.

A hybrid's data x pipeline layout is measured stage by stage with the strategy's own code:
each of data rank 0's stage ranks stepped under the fake process group (its neighbours'
activations arrive at once, unfilled), its optimizer step timed apart, what it sends read off
(`measure_data_pipeline`), for step_time.pipeline_step to lay out and the data ranks'
gradient all-reduce to follow.

On a CPU each rank gets the share of the cores the launcher gives it (OMP_NUM_THREADS =
cores / N), with the others idle: what N processes do to each other's memory bandwidth is
not measured (docs/scaling.md says what that leaves out).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import statistics
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from pipeline import strategies
from pipeline.context import DistContext
from pipeline.data.device_data import to_device
from pipeline.data.synthetic import synthetic_split
from pipeline.interrupts.stop import StopRequest
from pipeline.numerics.build import Training, build_training
from pipeline.numerics.optim import make_optimizer
from pipeline.numerics.precision import build_precision
from pipeline.numerics.totals import Totals
from pipeline.parallel_dims import ParallelDims
from pipeline.resnet import INPUT_SHAPE, block_flops, build_model
from pipeline.run_spec import RunSpec
from pipeline.scaling.step_time import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, SEND, Call, Traffic
from pipeline.training.trainer import Trainer

# Not timed: allocator growth, cuDNN's and oneDNN's choices, the first bucket rebuild, and a
# process's first seconds of torch (3 steps were not enough: a first profile on 2 CPU cores
# once timed 3x the next).
TIMED_S = 2.0  # predict.time_s's default: what the committed check was measured with
WARM_STEPS = 3  # and at least half of `seconds` (predict.time_s)
BLOCKS, BLOCK_STEPS = 3, 3  # timed: the median of 3 blocks' mean step, `seconds` in all

# c10d ops by name -> the collective they are; the message is their largest tensor
COLLECTIVES = {
    "allgather": ALL_GATHER,
    "reduce_scatter": REDUCE_SCATTER,
    "allreduce": ALL_REDUCE,
    "send": SEND,
}


@dataclass(frozen=True)
class RankMemory:
    """One rank's training step at its peak, as the strategy's own code reached it: what its
    tensors held, by kind (MemTracker's "Parameter", "Gradient", "Optstate", "Activation",
    "Temp", ... and "Total"), and on a GPU the allocator's peak over the step (what a run
    reports as its peak allocated, less the data the run keeps on the device)."""

    rank: int
    tensors: dict[str, int]  # bytes
    allocator: int | None  # bytes, the profile's own small data set left out; None on a CPU
    holds_data: bool = True  # keeps the run's data on its device (DataParallel: GPU 0 only)

    @property
    def step_bytes(self) -> int:
        return self.allocator if self.allocator is not None else self.tensors["Total"]


@dataclass(frozen=True)
class RankProfile:
    strategy: str
    world_size: int
    per_rank_batch: int
    step_s: float  # the median optimizer step of rank 0, its communication removed
    traffic: Traffic  # what that step would have sent
    # rank 0's step at its peak; with sharded parameters the last rank's too (its shard is
    # the smaller where they do not divide evenly)
    memory: tuple[RankMemory, ...] = ()


@dataclass(frozen=True)
class StageProfile:
    stages: int
    micro_batch: int  # one pipeline micro-batch
    stage_s: list[float]  # forward and backward of one micro-batch, per stage
    boundary_bytes: list[int]  # the activations stage i sends to stage i+1
    optimizer_s: float  # the largest stage's optimizer step


@dataclass(frozen=True)
class DataPipelineProfile:
    """Data ranks each running a pipeline (a hybrid's data x pipeline): data rank 0's stages,
    each its rank of the job under the fake process group, stepped by the strategy's code."""

    stage_s: list[float]  # forward and backward of one pipeline micro-batch, per stage
    boundary_bytes: list[int]  # the activations stage i sends to stage i+1 per micro-batch
    microbatches: int  # pipeline micro-batches a micro-step (stage 0's sends counted)
    optimizer_s: float  # the slowest stage's optimizer step
    reduce_bytes: int  # the largest stage's gradients, all-reduced over its data group
    memory: tuple[RankMemory, ...]  # each stage's step at its peak


@dataclass(frozen=True)
class ReplicaProfile:
    """dp's or balanced_dp's replicas, one per device, each at its share of one forward's
    micro-batch (device 0 first): what one process driving N devices computes and moves."""

    shares: list[int]
    share_s: dict[int, float]  # a share's forward and backward of the whole model (timed)
    optimizer_s: float | None  # device 0's optimizer step; None: not timed
    memory: dict[int, dict[str, int]]  # a share's forward and backward at its peak, by kind
    parameter_bytes: int  # what replicate broadcasts (buffers too) and the backward reduces
    input_bytes: int  # the micro-batch as the model takes it, scattered from device 0
    output_bytes: int  # every replica's output, gathered to device 0


class SentLog(TorchDispatchMode):
    """Every collective that passes the dispatcher while it is on, as (kind, bytes)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        if name.startswith("c10d."):
            kind = next((k for op, k in COLLECTIVES.items() if op in name), None)
            if kind is not None:
                sizes = [
                    t.numel() * t.element_size()
                    for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor)
                ]
                self.calls.append(Call(kind, max(sizes, default=0), from_fsdp()))
        return func(*args, **(kwargs or {}))


def from_fsdp() -> bool:
    """Whether the collective being dispatched is FSDP's own (its gathers are prefetched and
    its reduce-scatters run behind the backward), not one inside a layer."""
    return any(f"{os.sep}fsdp{os.sep}" in frame.filename for frame in traceback.extract_stack())


@contextlib.contextmanager
def cores_of_one_rank(device: torch.device, n: int) -> Iterator[None]:
    """On a CPU, the threads one of n ranks gets (the launcher's OMP_NUM_THREADS), restored
    after; on a GPU nothing changes."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // n))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def fake_world(world_size: int, device: torch.device, rank: int = 0) -> Iterator[DistContext]:
    """Rank `rank` of `world_size` under the fake process group, with the cores such a rank
    gets."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    with cores_of_one_rank(device, world_size), flat_gathers():
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        try:
            gpus = (str(device.index or 0),) if device.type == "cuda" else ()
            yield DistContext(rank=rank, local_rank=0, world_size=world_size, gpus=gpus)
        finally:
            dist.destroy_process_group()


# torch's SyncBatchNorm (ddp's and fsdp's sync_bn on a GPU) gathers every rank's statistics
# into a (1, world * n) tensor. NCCL fills it as flat memory; the fake group splits it along
# dim 0 and refuses: "The size of tensor a (34) must match the size of tensor b (17)"
# (predict@ddp in the quickstart on an H200, 2026-11-28). Torch 2.14 calls the gather
# all_gather_single, 2.11 all_gather_into_tensor.
GATHERS_INTO_ONE = ("all_gather_single", "all_gather_into_tensor")


@contextlib.contextmanager
def flat_gathers() -> Iterator[None]:
    """While it is up, a gather into one (1, k) tensor is handed the same memory flat, (k,):
    the same bytes sent and the same values NCCL leaves, in a shape the fake group takes."""
    originals = {name: getattr(dist, name) for name in GATHERS_INTO_ONE if hasattr(dist, name)}

    def flat(gather: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(gather)
        def into_flat(output: torch.Tensor, input: torch.Tensor, *args: Any, **kw: Any) -> Any:
            if output.dim() == 2 and output.shape[0] == 1 and input.dim() == 1:
                output = output.view(-1)
            return gather(output, input, *args, **kw)

        return into_flat

    for name, gather in originals.items():
        setattr(dist, name, flat(gather))
    try:
        yield
    finally:
        for name, gather in originals.items():
            setattr(dist, name, gather)


def synthetic_data(n_train: int, device: torch.device) -> Any:
    images, labels = synthetic_split(n_train, seed=1)
    test_images, test_labels = synthetic_split(8, seed=2)
    arrays = {
        "train_images": images,
        "train_labels": labels,
        "test_images": test_images,
        "test_labels": test_labels,
    }
    return to_device(arrays, device, None, None)


def stand_in_for_ddp_all_reduce(training: Training, log: SentLog) -> None:
    """DDP's reducer calls its all-reduce below the dispatcher, and the fake group's result
    cannot complete it: a hook takes its place, noting each bucket and handing it back as
    reduced (the mean over identical ranks is the bucket itself)."""
    module = training.run.module
    if not isinstance(module, torch.nn.parallel.DistributedDataParallel):
        return

    def reduced(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        log.calls.append(Call(ALL_REDUCE, buffer.numel() * buffer.element_size()))
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(buffer)
        return done

    # DDP checks the hook's annotations as objects; this module's are strings (PEP 563)
    reduced.__annotations__ = {
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    module.register_comm_hook(None, reduced)


def timed(
    step: Callable[[], None],
    device: torch.device,
    seconds: float,
    warm_up: Sequence[Callable[[], None]] = (),
) -> float:
    """Seconds of one call of `step`, as an epoch sees it: the mean over a block of calls
    (at least BLOCK_STEPS, at least `seconds` / BLOCKS), the median of BLOCKS blocks, after
    WARM_STEPS untimed ones (and `seconds` / 2). Per-call timings on a busy 2-core machine
    read 10 to 20% above an epoch's mean; blocks do not. `warm_up`: the first untimed calls,
    each a step of its own that is read for something else (its traffic, its memory), so
    that reading it costs no step beyond the warm-up's; they count toward both minimums."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    start = time.perf_counter()
    for first in warm_up:
        first()
    done = len(warm_up)
    while done < WARM_STEPS or time.perf_counter() - start < seconds / 2:
        step()
        done += 1
    sync()
    means = []
    for _ in range(BLOCKS):
        start, done = time.perf_counter(), 0
        while done < BLOCK_STEPS or time.perf_counter() - start < seconds / BLOCKS:
            step()
            done += 1
        sync()
        means.append((time.perf_counter() - start) / done)
    return statistics.median(means)


@dataclass(frozen=True)
class BuiltRank:
    training: Training
    step: Callable[[], None]  # one optimizer step: the loop's own, eager
    data_bytes: int  # what its (synthetic, small) data set holds on the device


@contextlib.contextmanager
def one_rank(
    spec: RunSpec[Any], ctx: DistContext, device: torch.device, steps: int
) -> Iterator[BuiltRank]:
    """`spec`'s training as rank ctx.rank builds it, on synthetic data for `steps` optimizer
    steps (then round again), and its step."""
    torch.manual_seed(spec.seed)
    data = synthetic_data(spec.plan.batch_size * steps, device)
    plan = spec.job_plan(ctx.world_size, len(data.train_labels))
    training = build_training(spec, ctx, data, plan)
    training.run.module.train()
    batches = (b for epoch in itertools.count() for b in training.loader.epoch(epoch))
    totals = Totals.zeros(device)
    trainer = Trainer(training, ctx, StopRequest())

    def step() -> None:
        _, micro_batches = next(batches)
        trainer.step(micro_batches, totals)

    held = sum(t.numel() * t.element_size() for t in vars(data).values())
    try:
        yield BuiltRank(training, step, held)
    finally:
        training.run.release()


def tensors_at_peak(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: Callable[[], None],
    device: torch.device,
) -> dict[str, int]:
    """MemTracker's peak over one `step`, by kind ("Parameter", "Gradient", "Optstate",
    "Activation", "Temp", ..., "Total"): every tensor it makes, and the module's parameters,
    gradients and optimizer states from before."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(module, optimizer)

    def one_call_at_a_time(called: torch.nn.Module, args: object) -> None:
        # MemTracker keeps one call's statistics per module, and refuses a second forward of
        # it in the same step (a pipeline's micro-batches, gradient accumulation): each
        # forward starts them afresh. Its peak, which is what is read, spans the whole step.
        if called is module:
            tracker.reset_mod_stats()

    # registered before the tracker's own hooks, so that it runs before them
    hook = torch.nn.modules.module.register_module_forward_pre_hook(one_call_at_a_time)
    try:
        with tracker:
            step()
    finally:
        hook.remove()
    peak = next(v for d, v in tracker.get_tracker_snapshot("peak").items() if d.type == device.type)
    return {getattr(k, "value", str(k)): n for k, n in peak.items()}


def step_memory(rank: BuiltRank, device: torch.device) -> RankMemory:
    """One more step of a warmed-up rank, at its peak (`tensors_at_peak`); on a GPU the
    allocator's peak is read over the same step, its data set left out."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    module, optimizer = rank.training.run.module, rank.training.optimizer
    tensors = tensors_at_peak(module, optimizer, rank.step, device)
    allocator = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        allocator = torch.cuda.max_memory_allocated(device) - rank.data_bytes
    return RankMemory(dist.get_rank(), tensors, allocator)


def measure_rank(
    spec: RunSpec[Any], world_size: int, device: torch.device, seconds: float = TIMED_S
) -> RankProfile:
    """Rank 0 of a `world_size` job of `spec`'s data-parallel strategy, its steps timed for
    `seconds` (timed), and its step's memory at the peak; with sharded parameters, the last
    rank's memory too. The traffic and the memory are read on the warm-up's second and third
    steps: after the first has made the gradients and the optimizer's states (and DDP has
    rebuilt its buckets), every step allocates and sends the same."""
    steps = WARM_STEPS + BLOCKS * BLOCK_STEPS
    with fake_world(world_size, device) as ctx, one_rank(spec, ctx, device, steps) as rank:
        log = SentLog()
        stand_in_for_ddp_all_reduce(rank.training, log)
        traffic: list[Traffic] = []
        memory: list[RankMemory] = []

        def sent() -> None:
            # the dispatcher mode sees every operator in Python, which would add a third to a
            # small model's step on a CPU: on for this one step alone (DDP's stand-in hook
            # notes its buckets at every step: what this one sent is taken as it ends)
            log.calls.clear()
            with log:
                rank.step()
            traffic.append(Traffic(tuple(log.calls)))

        def at_peak() -> None:
            memory.append(step_memory(rank, device))

        step_s = timed(rank.step, device, seconds, warm_up=(rank.step, sent, at_peak))
        per_rank = rank.training.plan.per_rank
    if spec.facts.sharded_parameters and world_size > 1:
        memory.append(fake_rank_memory(spec, world_size, device, world_size - 1))
    return RankProfile(spec.name, world_size, per_rank, step_s, traffic[0], tuple(memory))


def measure_step(
    spec: RunSpec[Any], world_size: int, device: torch.device, seconds: float = TIMED_S
) -> float:
    """Rank 0's step of a `world_size` job of `spec`, timed as `measure_rank` times it, and
    nothing else: single's baseline, which is its step alone (its traffic and memory would be
    two more steps, one under MemTracker, that no document shows)."""
    steps = WARM_STEPS + BLOCKS * BLOCK_STEPS
    with fake_world(world_size, device) as ctx, one_rank(spec, ctx, device, steps) as rank:
        stand_in_for_ddp_all_reduce(rank.training, SentLog())
        return timed(rank.step, device, seconds)


def rank_memory(spec: RunSpec[Any], ctx: DistContext, device: torch.device) -> RankMemory:
    """ctx's rank of `spec`'s job in the process group that is up, fake or real: its step at
    the peak (step_memory), after a first step that makes the gradients and the optimizer's
    states. The fake group's DDP all-reduce is stood in for."""
    with one_rank(spec, ctx, device, 2) as built:
        if dist.get_backend() == "fake":
            stand_in_for_ddp_all_reduce(built.training, SentLog())
        built.step()
        return step_memory(built, device)


def fake_rank_memory(
    spec: RunSpec[Any], world_size: int, device: torch.device, rank: int
) -> RankMemory:
    """Rank `rank` of `world_size`'s step memory under the fake process group."""
    with fake_world(world_size, device, rank) as ctx:
        return rank_memory(spec, ctx, device)


def stage_memories(spec: RunSpec[Any], device: torch.device) -> tuple[RankMemory, ...]:
    """Every stage's rank of `spec`'s pipeline (one process each) under the fake process
    group: its step at the peak. The stages hold different blocks and, with a schedule's
    micro-batches in flight, different activations: each is its own role."""
    stages = spec.options.stages
    return tuple(fake_rank_memory(spec, stages, device, rank) for rank in range(stages))


def pipeline_split(name: str) -> Callable[[Sequence[float], int], list[int]] | None:
    """The strategy's own cut of the blocks into stages where it runs them as a pipeline (its
    spec's `stage_split`), else None; its module loaded by the registry (strategies.get), so
    only its own predict stage depends on it."""
    return strategies.get(name).stage_split


def replica_split(name: str) -> Callable[[Any, Any, int], list[int]] | None:
    """The strategy's own split of a forward's micro-batch over n devices where one process
    drives them as DataParallel replicas (its spec's `replica_shares`), else None."""
    return strategies.get(name).replica_shares


class Replicas:
    """The whole model on this device as DataParallel's replicas run it, built once, after
    a first step that makes the gradients and the optimizer's states: each share of a
    micro-batch measured (`share`) and device 0's optimizer step (`optimizer_s`), each once
    however many device counts ask for it. `seconds` None: memory only (a CPU's: nothing
    predicts the replicas' time there, REPLICAS_ON_A_CPU)."""

    def __init__(self, spec: RunSpec[Any], device: torch.device, seconds: float | None) -> None:
        self.device, self.seconds = device, seconds
        self.prec = build_precision(spec.train.precision, device, [None])
        self.model = build_model(spec.model.width, spec.seed).to(device, self.prec.dtype)
        self.model.train()
        self.optimizer = make_optimizer(self.model.parameters(), spec.train)
        self.share_s: dict[int, float] = {}
        self.memory: dict[int, dict[str, int]] = {}
        self.output_bytes_each = 0  # one sample's output, as the replicas return it

    def share(self, share: int) -> None:
        """The whole model's forward and backward at `share` samples: timed on this device,
        and at its peak (`tensors_at_peak`)."""
        if share in self.memory:
            return
        images, labels = synthetic_split(share, seed=1)
        x = ((torch.as_tensor(images).float() / 255).unsqueeze(1)).to(self.device, self.prec.dtype)
        y = torch.as_tensor(labels).long().to(self.device)

        def fwd_bwd() -> None:
            with self.prec.autocast():
                out = self.model(x)
            F.cross_entropy(out.float(), y).backward()

        if not self.memory:  # the first share's step makes the gradients and the states;
            # a later share finds them (a second would be seconds of a CPU's predict stage)
            fwd_bwd()
            self.optimizer.step()
        if self.seconds is not None:
            self.share_s[share] = timed(fwd_bwd, self.device, self.seconds)
        self.memory[share] = tensors_at_peak(self.model, self.optimizer, fwd_bwd, self.device)
        with torch.no_grad(), self.prec.autocast():
            one = self.model.eval()(x[:1])
        self.model.train()
        self.output_bytes_each = one.numel() * one.element_size()

    @functools.cached_property
    def optimizer_s(self) -> float | None:
        if self.seconds is None:
            return None
        return timed(self.optimizer.step, self.device, self.seconds)

    def profile(self, shares: list[int]) -> ReplicaProfile:
        """The replicas at `shares` (device 0 first), each share measured where it was not."""
        for share in sorted({s for s in shares if s > 0}):
            self.share(share)
        state = itertools.chain(self.model.parameters(), self.model.buffers())
        input_bytes_each = math.prod(INPUT_SHAPE) * torch.finfo(self.prec.dtype).bits // 8
        return ReplicaProfile(
            shares=list(shares),
            share_s={s: self.share_s[s] for s in shares if s in self.share_s},
            optimizer_s=self.optimizer_s,
            memory={s: self.memory[s] for s in shares if s in self.memory},
            parameter_bytes=sum(t.numel() * t.element_size() for t in state),
            input_bytes=sum(shares) * input_bytes_each,
            output_bytes=sum(shares) * self.output_bytes_each,
        )


def measure_replicas(
    spec: RunSpec[Any], shares: list[int], device: torch.device, seconds: float | None = TIMED_S
) -> ReplicaProfile:
    """DataParallel's replicas of `spec` at `shares`, measured afresh (`Replicas`)."""
    return Replicas(spec, device, seconds).profile(shares)


def measure_stages(
    spec: RunSpec[Any], device: torch.device, seconds: float = TIMED_S
) -> StageProfile:
    """pipeline_parallel's stages, one process each: every stage's forward and backward of one
    pipeline micro-batch, on this device, with the cores one of `stages` processes gets."""
    options = spec.options
    stages, plan = options.stages, spec.plan
    micro = plan.micro // options.microbatches
    with cores_of_one_rank(device, stages):
        prec = build_precision(spec.train.precision, device, [None])
        model = build_model(spec.model.width, spec.seed).to(device, prec.dtype)
        split = pipeline_split(spec.name)
        assert split is not None, f"{spec.name} runs no pipeline"
        bounds = split(block_flops(model), stages)
        images, labels = synthetic_split(micro, seed=1)
        x = ((torch.as_tensor(images).float() / 255).unsqueeze(1)).to(device, prec.dtype)
        y = torch.as_tensor(labels).long().to(device)
        stage_s, boundary, sizes = [], [], []
        for first, end in zip(bounds, bounds[1:]):
            blocks = model[first:end]
            last = end == len(model)
            inputs = x.detach().requires_grad_(first > 0)

            def fwd_bwd(
                blocks: torch.nn.Module = blocks, inputs: torch.Tensor = inputs, last: bool = last
            ) -> None:
                with prec.autocast():
                    out = blocks(inputs)
                if last:
                    F.cross_entropy(out.float(), y).backward()
                else:  # the gradient the next stage sends back has the activations' shape
                    out.backward(torch.ones_like(out))

            stage_s.append(timed(fwd_bwd, device, seconds))
            with torch.no_grad(), prec.autocast():
                x = blocks(inputs)
            if not last:
                boundary.append(x.numel() * x.element_size())
            sizes.append(sum(p.numel() for p in blocks.parameters()))
        largest = model[bounds[sizes.index(max(sizes))] : bounds[sizes.index(max(sizes)) + 1]]
        optimizer = make_optimizer(largest.parameters(), spec.train)
        optimizer_s = timed(optimizer.step, device, seconds)
    return StageProfile(stages, micro, stage_s, boundary, optimizer_s)


def measure_data_pipeline(
    spec: RunSpec[Any], dims: ParallelDims, device: torch.device, seconds: float = TIMED_S
) -> DataPipelineProfile:
    """Each stage of `spec`'s data x pipeline mesh `dims` (data rank 0's ranks 0..p-1), as
    its rank of the job under the fake process group: its step timed, less its optimizer's
    step (timed apart), over the schedule's micro-batches; its sends and its gradients'
    all-reduce read off a step and its peak off another, both of the warm-up (measure_rank)."""
    steps = WARM_STEPS + BLOCKS * BLOCK_STEPS
    grad_accum = spec.plan.grad_accum
    step_s: list[float] = []
    optimizer_s: list[float] = []
    calls: list[list[Call]] = []
    memory: list[RankMemory] = []
    for rank in range(dims.pipeline):
        with fake_world(dims.world, device, rank) as ctx, one_rank(spec, ctx, device, steps) as r:

            def sent(r: BuiltRank = r) -> None:
                log = SentLog()
                with log:
                    r.step()
                calls.append(log.calls)

            def at_peak(r: BuiltRank = r) -> None:
                memory.append(step_memory(r, device))

            step_s.append(timed(r.step, device, seconds, warm_up=(r.step, sent, at_peak)))
            optimizer_s.append(timed(r.training.optimizer.step, device, seconds))
    sends = [[c.size for c in stage if c.kind == SEND] for stage in calls]
    # GPipe runs every forward first: stage i's first sends are its activations to i + 1
    microbatches = len(sends[0]) // grad_accum
    reduced = [c.size for stage in calls for c in stage if c.kind == ALL_REDUCE]
    slowest = max(range(dims.pipeline), key=lambda i: step_s[i])
    return DataPipelineProfile(
        stage_s=[(t - o) / (grad_accum * microbatches) for t, o in zip(step_s, optimizer_s)],
        boundary_bytes=[stage[0] for stage in sends[:-1]],
        microbatches=microbatches,
        optimizer_s=optimizer_s[slowest],
        reduce_bytes=max(reduced, default=0),
        memory=tuple(memory),
    )
