"""`balanced_dp`: DataParallel that gives GPU 0 a smaller share of each batch.

GPU 0 holds, besides its replica's work, the gathered logits, the loss, the gradients of the
one model and the optimizer state, so under plain DataParallel it runs out of memory first.
`balanced_dp.gpu0_bsz` is GPU 0's share of the batch per optimizer step, as in the source
notes (`BalancedDataParallel(gpu0_bsz // acc_grad, ...)`): with gradient accumulation each
of the step's forwards gives GPU 0 gpu0_bsz / grad_accum samples (batch 16, gpu0_bsz 4,
grad_accum 2, 3 GPUs: each forward 2+3+3), and the rest is spread over the other GPUs (the
rule is batch_split.balanced_split). `gpu0_bsz: auto` picks the value by a short profiling
pass before the run's first step (gpu0_autotune.py), once per run: a resume takes the value
its checkpoint kept.

This is a rewrite of the widely copied BalancedDataParallel without its bugs: there, one
device divided by zero; the batch size was read from inputs[0], so keyword or non-tensor first
inputs broke it; the even-split fallback could give GPU 0 more than gpu0_bsz; chunks and
replicas could differ in number; and with gpu0_bsz 0 BatchNorm's running statistics never
updated (DataParallel keeps buffer updates only from GPU 0's replica, which never ran).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Optional

import torch
from torch import nn
from torch.nn.parallel import parallel_apply
from torch.nn.parallel._functions import Scatter

from pipeline.batch_plan import BatchPlan
from pipeline.config import BalancedDpConfig
from pipeline.context import DistContext
from pipeline.errors import UserError
from pipeline.strategies import gpu0_autotune
from pipeline.strategies.base import (
    Autocast,
    DataParallelRun,
    Decided,
    LoopForward,
    StrategyFacts,
    StrategySpec,
    alone,
)
from pipeline.strategies.batch_split import balanced_split, nonempty_chunks
from pipeline.strategies.dp import batchnorm_note, device_names, split_note
from pipeline.strategies.replica_autocast import AutocastDataParallel, keep_autocast

FACTS = StrategyFacts(
    name="balanced_dp",
    options=BalancedDpConfig,
    spans_nodes=False,
    mesh=alone,
    shaping_keys=("gpu0_bsz",),
)


def nproc(options: BalancedDpConfig, plan: BatchPlan, n_gpus: int) -> int:
    gpu0_per_forward(options, plan)  # refuses a gpu0_bsz the step's forwards cannot share
    return 1  # one process drives all devices


def replica_shares(options: BalancedDpConfig, plan: BatchPlan, n_devices: int) -> list[int]:
    """Each of n devices' share of one forward's micro-batch, GPU 0's its gpu0_bsz share (as
    dp's where auto has not decided it)."""
    return balanced_split(plan.micro, n_devices, gpu0_per_forward(options, plan))


def gpu0_per_forward(options: BalancedDpConfig, plan: BatchPlan) -> Optional[int]:
    """GPU 0's samples in each forward: balanced_dp.gpu0_bsz (per optimizer step) divided
    over the train.grad_accum forwards of the step. None: an even split (or auto, unresolved)."""
    gpu0_bsz, batch, accum = options.gpu0_bsz, plan.batch_size, plan.grad_accum
    if gpu0_bsz is None or gpu0_bsz == gpu0_autotune.AUTO:
        return None
    assert isinstance(gpu0_bsz, int)  # the schema's other values: null, auto
    if gpu0_bsz > batch:
        raise UserError(
            f"balanced_dp.gpu0_bsz: got {gpu0_bsz}, expected at most "
            f"train.batch_size ({batch}): it is GPU 0's share of each batch"
        )
    if gpu0_bsz % accum:
        raise UserError(
            f"balanced_dp.gpu0_bsz: got {gpu0_bsz}, expected a multiple of "
            f"train.grad_accum ({accum}): GPU 0's share of each batch is split "
            f"evenly over the step's {accum} forwards"
        )
    return gpu0_bsz // accum


def parallelize(
    model: nn.Sequential,
    options: BalancedDpConfig,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
) -> DataParallelRun:
    n_gpus, accum = len(ctx.slots), plan.grad_accum  # replicas, as dp's
    device_ids = list(ctx.slots)
    balanced = BalancedDataParallel(model, gpu0_per_forward(options, plan), device_ids=device_ids)
    if options.gpu0_bsz != gpu0_autotune.AUTO:
        return balanced_run(balanced, options, plan, ctx)

    key = gpu0_autotune.CHOSEN_KEY

    def at_start(
        loop: LoopForward, kept: Optional[Decided], say: Callable[[str], None]
    ) -> tuple[DataParallelRun, Decided]:
        """auto decided: measured on a fresh run, as this run decided it on a resume (its
        notes and MLflow params then say the one value it trained with). What it keeps, under
        its param's name: the value per optimizer step and the notes that say how."""
        if kept is not None:
            per_step, notes = kept[key]["value"], list(kept[key]["notes"])
            say(
                f"{key}={json.dumps(per_step)}: reused, as this run decided it at its start; "
                "not measured again"
            )
        else:
            gpu0_bsz, notes = gpu0_autotune.resolve_gpu0_bsz(
                model,
                plan,
                n_gpus,
                ctx.on_cuda,
                wrap=lambda module, size: BalancedDataParallel(module, size, device_ids=device_ids),
                loop=loop,
            )
            per_step = None if gpu0_bsz is None else gpu0_bsz * accum
        # in place: build.py compiled this very module, which has not run yet
        balanced.gpu0_bsz = None if per_step is None else per_step // accum
        run = balanced_run(balanced, options, plan, ctx, notes)
        return run, {key: {"value": per_step, "notes": notes}}

    # the even split until decided, before the first step
    unsettled = balanced_run(balanced, options, plan, ctx)
    return replace(unsettled, at_start=at_start)


def balanced_run(
    balanced: BalancedDataParallel,
    options: BalancedDpConfig,
    plan: BatchPlan,
    ctx: DistContext,
    auto_notes: Sequence[str] = (),
) -> DataParallelRun:
    """The run of `balanced` at its gpu0_bsz; `auto_notes`: how auto decided it."""
    gpu0_bsz, micro = balanced.gpu0_bsz, plan.micro
    split = balanced_split(micro, max(len(ctx.slots), 1), gpu0_bsz)
    devices = device_names(ctx)
    notes = [split_note(FACTS.name, micro, split, devices), *auto_notes]
    if (note := batchnorm_note(FACTS.name, split)) is not None:
        notes.append(note)
    if len(devices) == 1 and gpu0_bsz is not None:
        notes.append(f"balanced_dp.gpu0_bsz={options.gpu0_bsz} has no effect on one device")
    return DataParallelRun(
        module=balanced.module,
        forward=balanced,
        writer=True,
        devices=devices,
        batch_split=split,
        notes=tuple(notes),
    )


class BalancedDataParallel(AutocastDataParallel):
    """nn.DataParallel whose first device gets `gpu0_bsz` samples per forward (None: even).

    Devices that get no samples get no chunk and run no replica. Without CUDA or with one GPU
    it behaves exactly like nn.DataParallel (which calls the module, or runs it on that GPU).
    """

    def __init__(
        self,
        module: nn.Module,
        gpu0_bsz: Optional[int],
        device_ids: Optional[Sequence[int]] = None,
        output_device: Optional[int] = None,
        dim: int = 0,
    ):
        super().__init__(module, device_ids, output_device, dim)
        self.gpu0_bsz = gpu0_bsz

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        batch_tensor = first_tensor((inputs, kwargs))
        if len(self.device_ids) < 2 or batch_tensor is None:
            # no CUDA (DataParallel calls the module), one GPU, or no tensor: nothing to balance
            return super().forward(*inputs, **kwargs)
        sizes = balanced_split(batch_tensor.size(self.dim), len(self.device_ids), self.gpu0_bsz)
        positions, chunk_sizes = zip(*nonempty_chunks(sizes))
        devices = [self.device_ids[p] for p in positions]
        device_inputs, device_kwargs = split_inputs(
            inputs,
            kwargs,
            len(devices),
            lambda t: Scatter.apply(devices, list(chunk_sizes), self.dim, t),
        )
        # Broadcasting copies from the first device listed, where the module lives, so
        # replicate to devices 0..last used and keep the replicas of those that got samples.
        every_replica = self.replicate(self.module, self.device_ids[: positions[-1] + 1])
        replicas = [every_replica[p] for p in positions]
        outputs = parallel_apply(keep_autocast(replicas), device_inputs, device_kwargs, devices)
        # the module's mode, not the wrapper's: the training loop switches the model itself
        if positions[0] != 0 and self.module.training:
            adopt_buffers(self.module, replicas[0])
        return self.gather(outputs, self.output_device)


@torch.no_grad()
def adopt_buffers(module: nn.Module, replica: nn.Module) -> None:
    """Copy the replica's buffers (BatchNorm running statistics) into the module.

    Only GPU 0's replica shares the module's buffers, so when GPU 0 got no samples its
    in-place updates would be lost; the first replica that ran stands in for it.
    """
    updated = dict(replica.named_buffers())
    for name, buffer in module.named_buffers():
        buffer.copy_(updated[name])


def first_tensor(obj: Any) -> Optional[torch.Tensor]:
    """The first tensor in `obj`, depth first through tuples, lists and dict values: the batch
    size is read from it, whether it came positionally or by keyword."""
    if isinstance(obj, torch.Tensor):
        return obj
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (tuple, list)) else ()
    for item in items:
        found = first_tensor(item)
        if found is not None:
            return found
    return None


def split_inputs(
    inputs: tuple[Any, ...],
    kwargs: dict[str, Any],
    n_chunks: int,
    split_tensor: Callable[[torch.Tensor], Sequence[torch.Tensor]],
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """Per-device positional and keyword inputs, one of each per chunk.

    Like DataParallel's scatter, but every tensor is cut by `split_tensor` (so into the given
    sizes rather than torch.chunk's): namedtuples, tuples, lists and dicts are split element by
    element, anything else is shared by every chunk. The forward passes torch's autograd-aware
    Scatter, which copies each chunk to its GPU and needs >=2 GPUs; the tests pass
    `t.split(sizes)` on CPU tensors, which checks everything here but the copies.
    """

    def split(obj: Any) -> list[Any]:
        if isinstance(obj, torch.Tensor):
            return list(split_tensor(obj))
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
            return [type(obj)(*parts) for parts in zip(*map(split, obj))]
        if isinstance(obj, (tuple, list)) and obj:
            return [type(obj)(parts) for parts in zip(*map(split, obj))]
        if isinstance(obj, dict) and obj:
            return [type(obj)(zip(obj, parts)) for parts in zip(*map(split, obj.values()))]
        return [obj] * n_chunks

    return split(tuple(inputs)), [dict(part) for part in split(dict(kwargs))]


SPEC = StrategySpec(FACTS, nproc, parallelize, replica_shares=replica_shares)
