"""A strategy's epoch on N devices, predicted: its rank's step measured here at world size N
(profile.py), its communication over `link` (step_time.py), and the epoch its batch plan
makes of that step. single, on one device at any N, is measured the same way: the baseline
of every speedup (reporting/predicted.py divides).

Not predicted (checked.NOT_PREDICTED): dp and balanced_dp, whose one process drives every GPU
through threads (scatter, replicate, gather, and Python's lock between the replicas); their
time at N would need a model no run here can check (on a CPU DataParallel runs unsplit)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.errors import UserError
from pipeline.resnet import INPUT_SHAPE
from pipeline.run_spec import RunSpec
from pipeline.scaling.links import Link
from pipeline.scaling.profile import (
    RankMemory,
    RankProfile,
    measure_rank,
    measure_stages,
    stage_memories,
)
from pipeline.scaling.step_time import StepPrediction, data_parallel_step, pipeline_step

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
    """A rank's training peak on its device: its step's (profile.RankMemory) and the data."""
    return (memory.step_bytes + data.resident_bytes) / MIB


@dataclass(frozen=True)
class Prediction:
    strategy: str
    asked: int  # the N the user asked about
    devices: int  # how many of them the strategy uses (a pipeline: its stages)
    step: StepPrediction
    steps_per_epoch: int
    epoch_s: float
    samples_per_s: float
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
        return {
            "strategy": self.strategy,
            "devices_asked": self.asked,
            "devices_used": self.devices,
            "predicted_step_s": self.step.step_s,
            "predicted_epoch_s": self.epoch_s,
            "predicted_samples_per_s": self.samples_per_s,
            "compute_s": self.step.compute_s,
            "communication_s": self.step.comm_s,
            "exposed_communication_s": self.step.exposed_s,
            "bubble_s": self.step.bubble_s,
            "per_rank_batch": self.per_rank_batch,
            "steps_per_epoch": self.steps_per_epoch,
            **self.memory_json(),
        }


def predict_step(
    spec: RunSpec[Any], n: int, link: Link, device: torch.device, seconds: float
) -> tuple[int, StepPrediction, int, tuple[RankMemory, ...]]:
    """(devices used, the step predicted, the per-rank batch, the ranks' step memory: each
    role's rank, every stage of a pipeline) of `spec` asked to run on n."""
    overlaps = device.type == "cuda"
    if spec.name == "pipeline_parallel":
        stages = spec.options.stages
        if n < stages:
            raise UserError(
                f"pipeline_parallel.stages: got {stages}, but the prediction is for {n} "
                f"devices; expected at most {n} (one stage per device)"
            )
        s = measure_stages(spec, device, seconds)
        step = pipeline_step(
            s.stage_s,
            s.boundary_bytes,
            spec.options.microbatches,
            spec.plan.grad_accum,
            s.optimizer_s,
            link,
        )
        return stages, step, spec.plan.micro, stage_memories(spec, device)
    profile: RankProfile = measure_rank(spec, n, device, seconds)
    sharded = spec.facts.sharded_parameters
    window = profile.step_s * (1.0 if sharded else BACKWARD_SHARE)
    step = data_parallel_step(profile.step_s, window, profile.traffic, n, link, overlaps)
    return n, step, profile.per_rank_batch, profile.memory


def predict(
    spec: RunSpec[Any], n: int, link: Link, device: torch.device, data: DataSize, seconds: float
) -> Prediction:
    """`spec`'s epoch of `data` on n devices; its steps timed for `seconds`."""
    devices, step, per_rank, memory = predict_step(spec, n, link, device, seconds)
    plan = spec.job_plan(devices, data.train)
    epoch_s = plan.steps * step.step_s
    return Prediction(
        strategy=spec.name,
        asked=n,
        devices=devices,
        step=step,
        steps_per_epoch=plan.steps,
        epoch_s=epoch_s,
        samples_per_s=plan.samples_per_epoch / epoch_s,
        per_rank_batch=per_rank,
        data=data,
        memory=memory,
    )
