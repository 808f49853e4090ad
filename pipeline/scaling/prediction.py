"""A strategy's epoch on N devices, predicted: its rank's step measured here at world size N
(profile.py), its communication over `link` (step_time.py), and the epoch its batch plan
makes of that step. single, on one device at any N, is measured the same way: the baseline
of every speedup (reporting/predicted.py divides).

dp and balanced_dp, whose one process drives every GPU as DataParallel replicas: each
device's share of a forward measured here as the whole model at that share (the strategy's
own split, balanced_dp's gpu0_bsz included), their scatter, replicate, gather and gradient
reduce modelled (step_time.replicated_step), and each device's memory built from its share's
peak: device 0 also holds the optimizer state, the gathered outputs and the data. On a CPU
DataParallel runs unsplit, so there only their memory is predicted (REPLICAS_ON_A_CPU); on a
GPU their time too. No real multi-GPU run has checked either (checked.BANDS has no band).

A hybrid's data x pipeline layout: each of its stages stepped as its rank under the fake
group (profile.measure_data_pipeline), the step pipeline_parallel's (step_time.pipeline_step)
followed by the data ranks' all-reduce of a stage's gradients (`data_pipeline_step`)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.errors import UserError
from pipeline.parallel_dims import ParallelDims
from pipeline.resnet import INPUT_SHAPE
from pipeline.run_spec import RunSpec
from pipeline.scaling.links import Link
from pipeline.scaling.profile import (
    DataPipelineProfile,
    RankMemory,
    RankProfile,
    ReplicaProfile,
    Replicas,
    StageProfile,
    measure_data_pipeline,
    measure_rank,
    measure_stages,
    pipeline_split,
    replica_split,
    stage_memories,
)
from pipeline.scaling.step_time import (
    ALL_REDUCE,
    BROADCAST,
    GATHER,
    REDUCE,
    SCATTER,
    Call,
    StepPrediction,
    Traffic,
    collective_seconds,
    data_parallel_step,
    pipeline_step,
    replicated_step,
)

# A data-parallel rank's backward, the window DDP's bucket all-reduces hide behind on a GPU:
# about two thirds of a step's computation (a backward costs about twice its forward).
BACKWARD_SHARE = 2 / 3
# What no prediction here holds; shown beside every one.
LEAVES_OUT = (
    "NCCL's own buffers and the CUDA context",
    "kernels slowed by communication running beside them",
    "what N processes do to each other's memory bandwidth and caches",
    "the data loader's and the stop vote's collectives",
)


MIB = 2**20
REPLICAS_ON_A_CPU = (
    "time not predicted on a CPU: DataParallel runs unsplit there, so nothing here times its "
    "replicas side by side; a GPU's predict stage predicts it (unchecked)"
)


@dataclass(frozen=True)
class DataSize:
    """The data a run trains and tests on: every rank keeps all of it on its device
    (data/device_data.py), uint8 images and int64 labels, beside its step's peak."""

    train: int  # the samples an epoch draws from
    test: int

    @property
    def resident_bytes(self) -> int:
        return (self.train + self.test) * (math.prod(INPUT_SHAPE) + 8)


def peak_mib(memory: RankMemory, data: DataSize) -> float:
    """A rank's training peak on its device: its step's (profile.RankMemory) and the data,
    where it keeps the data."""
    return (memory.step_bytes + (data.resident_bytes if memory.holds_data else 0)) / MIB


@dataclass(frozen=True)
class Prediction:
    strategy: str
    asked: int  # the N the user asked about
    devices: int  # how many of them the strategy uses (a pipeline: its stages)
    step: StepPrediction | None  # None: its time is not predicted here (REPLICAS_ON_A_CPU)
    steps_per_epoch: int
    epoch_s: float | None
    samples_per_s: float | None
    per_rank_batch: int
    data: DataSize
    memory: tuple[RankMemory, ...]  # the ranks' steps at their peaks; () where not predicted

    def memory_json(self) -> dict[str, Any]:
        if not self.memory:
            return {}
        on_gpu = self.memory[0].allocator is not None
        return {
            # each rank measured (rank 0; the last too where shards differ; every stage of a
            # pipeline) -> its peak
            "predicted_peak_mib": {str(m.rank): peak_mib(m, self.data) for m in self.memory},
            "peak_measured_as": "the allocator's peak" if on_gpu else "tensors (MemTracker)",
            "resident_data_mib": self.data.resident_bytes / MIB,
            "predicted_step_tensors_mib": {k: v / MIB for k, v in self.memory[0].tensors.items()},
        }

    def to_json(self) -> dict[str, Any]:
        step = self.step
        timing = (
            {"time_not_predicted": REPLICAS_ON_A_CPU}
            if step is None
            else {
                "predicted_step_s": step.step_s,
                "predicted_epoch_s": self.epoch_s,
                "predicted_samples_per_s": self.samples_per_s,
                "compute_s": step.compute_s,
                "communication_s": step.comm_s,
                "exposed_communication_s": step.exposed_s,
                "bubble_s": step.bubble_s,
            }
        )
        return {
            "strategy": self.strategy,
            "devices_asked": self.asked,
            "devices_used": self.devices,
            **timing,
            "per_rank_batch": self.per_rank_batch,
            "steps_per_epoch": self.steps_per_epoch,
            **self.memory_json(),
        }


def replica_traffic(profile: ReplicaProfile) -> Traffic:
    """What one DataParallel forward and its backward move, each call blocking."""
    return Traffic(
        (
            Call(SCATTER, profile.input_bytes, overlappable=False),
            Call(BROADCAST, profile.parameter_bytes, overlappable=False),
            Call(GATHER, profile.output_bytes, overlappable=False),
            Call(REDUCE, profile.parameter_bytes, overlappable=False),
        )
    )


STATES = ("Parameter", "Buffer", "Gradient", "Optstate")  # MemTracker's kinds of a module's


def replica_memories(profile: ReplicaProfile) -> tuple[RankMemory, ...]:
    """Each device's training peak as DataParallel holds it (device 0 first): its share's
    forward and backward at their peak (the module's states and the share's activations);
    device 0 also the optimizer state, every replica's output gathered and the run's data; each
    other device a replica (the parameters broadcast, their gradients until the reduce), with
    no optimizer state and no data. A device with no share (balanced_dp's gpu0_bsz 0) holds
    only the states."""
    any_share = next(iter(profile.memory.values()))
    out = []
    for i, share in enumerate(profile.shares):
        tensors = (
            dict(profile.memory[share]) if share > 0 else {k: any_share.get(k, 0) for k in STATES}
        )
        if i == 0:
            tensors["Gathered output"] = profile.output_bytes
        else:
            tensors["Optstate"] = 0
        tensors["Total"] = sum(v for k, v in tensors.items() if k != "Total")
        out.append(RankMemory(i, tensors, None, holds_data=i == 0))
    return tuple(out)


class Measurements:
    """What `spec`'s predictions measure on `device`, each step timed for `seconds`: measured
    once per strategy and reused at every N where it does not depend on N (a pipeline's
    stages, its memory; a share of DataParallel's replicas measured at another N)."""

    def __init__(self, spec: RunSpec[Any], device: torch.device, seconds: float) -> None:
        self.spec, self.device, self.seconds = spec, device, seconds

    @functools.cached_property
    def _replicas(self) -> Replicas:
        # on a CPU memory alone (REPLICAS_ON_A_CPU: nothing there predicts their time)
        timed_s = self.seconds if self.device.type == "cuda" else None
        return Replicas(self.spec, self.device, timed_s)

    def replicas(self, shares: list[int]) -> ReplicaProfile:
        """DataParallel's replicas at `shares`: each share and the optimizer's step measured
        once, whichever N asked first."""
        return self._replicas.profile(shares)

    @functools.cached_property
    def stages(self) -> StageProfile:
        return measure_stages(self.spec, self.device, self.seconds)

    @functools.cached_property
    def stage_memories(self) -> tuple[RankMemory, ...]:
        return stage_memories(self.spec, self.device)

    def rank(self, n: int) -> RankProfile:
        return measure_rank(self.spec, n, self.device, self.seconds)

    def data_pipeline(self, dims: ParallelDims) -> DataPipelineProfile:
        return measure_data_pipeline(self.spec, dims, self.device, self.seconds)


def data_pipeline_step(
    profile: DataPipelineProfile, data: int, grad_accum: int, link: Link
) -> StepPrediction:
    """Data ranks each running a pipeline: its step as pipeline_parallel's
    (step_time.pipeline_step), then the data group's all-reduce of the largest stage's
    gradients, blocking (data_pipeline.py reduces after the step's last schedule run)."""
    step = pipeline_step(
        profile.stage_s,
        profile.boundary_bytes,
        profile.microbatches,
        grad_accum,
        profile.optimizer_s,
        link,
    )
    reduce_s = collective_seconds(ALL_REDUCE, profile.reduce_bytes, data, link)
    return StepPrediction(
        step_s=step.step_s + reduce_s,
        compute_s=step.compute_s,
        comm_s=step.comm_s + reduce_s,
        exposed_s=step.exposed_s + reduce_s,
        bubble_s=step.bubble_s,
    )


def predict_step(
    measured: Measurements, n: int, link: Link
) -> tuple[int, StepPrediction | None, int, tuple[RankMemory, ...]]:
    """(devices used, the step predicted, the per-rank batch, the ranks' step memory: each
    role's rank, every stage of a pipeline, every device of DataParallel's) of the strategy
    asked to run on n; the step None where its time is not predicted (REPLICAS_ON_A_CPU)."""
    spec, device = measured.spec, measured.device
    overlaps = device.type == "cuda"
    split = replica_split(spec.name)
    if split is not None:  # one process driving n devices as DataParallel replicas
        shares = split(spec.options, spec.plan, n)
        replicas = measured.replicas(shares)
        step = None
        if replicas.optimizer_s is not None:  # timed: a GPU's
            share_s = [replicas.share_s.get(share, 0.0) for share in shares]
            traffic = replica_traffic(replicas)
            step = replicated_step(
                share_s, replicas.optimizer_s, traffic, n, link, spec.plan.grad_accum
            )
        return n, step, max(shares), replica_memories(replicas)
    if pipeline_split(spec.name) is not None:  # its stages, one process each
        stages = spec.options.stages
        if n < stages:
            raise UserError(
                f"pipeline_parallel.stages: got {stages}, but the prediction is for {n} "
                f"devices; expected at most {n} (one stage per device)"
            )
        s = measured.stages
        step = pipeline_step(
            s.stage_s,
            s.boundary_bytes,
            spec.options.microbatches,
            spec.plan.grad_accum,
            s.optimizer_s,
            link,
        )
        return stages, step, spec.plan.micro, measured.stage_memories
    dims = spec.dims(n)
    if dims.pipeline > 1:  # data ranks each running a pipeline (a hybrid's data x pipeline)
        stages = measured.data_pipeline(dims)
        step = data_pipeline_step(stages, dims.data, spec.plan.grad_accum, link)
        return n, step, spec.plan.of_job(dims, spec.name).per_rank, stages.memory
    profile = measured.rank(n)
    sharded = spec.facts.sharded_parameters
    window = profile.step_s * (1.0 if sharded else BACKWARD_SHARE)
    step = data_parallel_step(profile.step_s, window, profile.traffic, n, link, overlaps)
    return n, step, profile.per_rank_batch, profile.memory


def predict(measured: Measurements, n: int, link: Link, data: DataSize) -> Prediction:
    """The strategy's epoch of `data` on n devices."""
    devices, step, per_rank, memory = predict_step(measured, n, link)
    plan = measured.spec.job_plan(devices, data.train)
    epoch_s = None if step is None else plan.steps * step.step_s
    return Prediction(
        strategy=measured.spec.name,
        asked=n,
        devices=devices,
        step=step,
        steps_per_epoch=plan.steps,
        epoch_s=epoch_s,
        samples_per_s=None if epoch_s is None else plan.samples_per_epoch / epoch_s,
        per_rank_batch=per_rank,
        data=data,
        memory=memory,
    )
