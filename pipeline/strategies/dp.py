"""`dp`: nn.DataParallel, one process driving every GPU in `devices`.

Each forward scatters the micro-batch over cuda:0..n-1 in torch.chunk pieces (see
batch_split.dp_split), runs a replica per piece and gathers the logits on cuda:0, where
the loop computes the loss: the model returns logits, never a per-device scalar loss, so the
mean is exact for unequal chunks and DataParallel has no scalars to gather. Gradients from the
replicas are summed into the one model on cuda:0.

Each replica runs in its own thread, in the autocast dtype the run asked for
(replica_autocast.py: torch's threads would fall back to fp16). BatchNorm normalises each
chunk on its own device and only cuda:0's replica keeps its running statistics; the notes
say so, with the chunk sizes, wherever the batch is split.

Without CUDA, DataParallel simply calls the model, so on the CPU this is `single` with a
wrapper; the run records that in `notes`.
"""

from __future__ import annotations

from itertools import zip_longest

from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import DpConfig
from pipeline.context import DistContext
from pipeline.strategies.base import (
    Autocast,
    DataParallelRun,
    StrategyFacts,
    StrategySpec,
    alone,
)
from pipeline.strategies.batch_split import dp_split
from pipeline.strategies.replica_autocast import AutocastDataParallel

FACTS = StrategyFacts(name="dp", options=DpConfig, spans_nodes=False, mesh=alone)


def nproc(options: DpConfig, plan: BatchPlan, n_gpus: int) -> int:
    return 1  # one process drives all devices


def parallelize(
    model: nn.Sequential, options: DpConfig, plan: BatchPlan, ctx: DistContext, autocast: Autocast
) -> DataParallelRun:
    n_gpus = len(ctx.slots)  # replicas: a GPU named twice in `devices` holds two
    data_parallel = AutocastDataParallel(model, device_ids=list(ctx.slots))
    split = dp_split(plan.micro, max(n_gpus, 1))
    devices = device_names(ctx)
    notes = (split_note(FACTS.name, plan.micro, split, devices), batchnorm_note(FACTS.name, split))
    # `module` is the plain model: it holds the parameters and its state_dict has no
    # "module." prefix, so results/dp/model.pt compares key for key with single's.
    return DataParallelRun(
        module=model,
        forward=data_parallel,
        writer=True,
        devices=devices,
        batch_split=split,
        notes=tuple(note for note in notes if note),
    )


def replica_shares(options: DpConfig, plan: BatchPlan, n_devices: int) -> list[int]:
    """Each of n devices' share of one forward's micro-batch, device 0 first: what the
    predict stage measures a replica at (pipeline/scaling/profile.py measure_replicas)."""
    return dp_split(plan.micro, n_devices)


def device_names(ctx: DistContext) -> list[str]:
    return [f"cuda:{i}" for i in ctx.slots] or [str(ctx.device)]


def split_note(name: str, micro: int, split: list[int], devices: list[str]) -> str:
    """What happens to one micro-batch, for the record; says so when nothing is split."""
    if len(devices) == 1:
        return f"{name} on 1 device ({devices[0]}): runs unsplit; needs >=2 GPUs to split"
    note = (
        f"{name}: each micro-batch of {micro} is split {'+'.join(map(str, split))} over "
        f"{', '.join(devices)}"
    )
    idle = [str(device) for device, size in zip_longest(devices, split, fillvalue=0) if size == 0]
    if idle:
        note += f"; no samples on {', '.join(idle)}"
    return note


def batchnorm_note(name: str, split: list[int]) -> str | None:
    """What DataParallel does to BatchNorm when a batch is split (None when it is not)."""
    if len(split) < 2:
        return None
    kept = split[0] if split[0] > 0 else next(size for size in split if size > 0)
    return (
        f"{name}: BatchNorm normalises each device's chunk ({'+'.join(map(str, split))}) "
        f"on its own, and only one replica's running statistics are kept: evaluation "
        f"uses statistics gathered from {kept} sample(s) per forward, not from the whole "
        f"batch as in single"
    )


SPEC = StrategySpec(FACTS, nproc, parallelize, replica_shares=replica_shares)
