"""`horovod`: Horovod's DistributedOptimizer, one process per GPU or `horovod.nproc` on the
CPU, started by horovodrun over Gloo (pipeline/launch/horovod_run.py). Opt-in: Horovod is
built by `make install HOROVOD=1` (docs/horovod.md), and the strategy trains only where
`strategies` lists it.

The same model, seed, data order and LR schedule as ddp: each rank trains on its strided
share of every micro-batch (pipeline/data/device_data.py). Horovod averages the gradients
over the ranks in its fusion buffer as backward makes them (hooks on the gradient
accumulators), and the optimizer's step waits for them; with gradient accumulation it
all-reduces after the step's last backward only (`backward_passes_per_step`). Before the
first step, rank 0's parameters, and on a resume its optimizer state, are broadcast. What
the loop itself communicates (the stop vote, each epoch's meter, the checkpoints, and on the
CPU the synchronised BatchNorm) goes over torch's gloo process group, which the worker
opens for every strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Optional

import torch
from torch import nn

from pipeline.batch_plan import BatchPlan
from pipeline.config import HorovodConfig
from pipeline.context import DistContext
from pipeline.errors import UserError, first_line
from pipeline.strategies.base import (
    Autocast,
    DataParallelRun,
    Decided,
    LoopForward,
    Run,
    StrategyFacts,
    StrategySpec,
    gpu_count_or_nproc,
    replicas,
)
from pipeline.strategies.sync_batchnorm import RankBatchNorm, batchnorm_synced, rank_batchnorm

INSTALL = "make install HOROVOD=1"

FACTS = StrategyFacts(
    name="horovod",
    options=HorovodConfig,
    spans_nodes=False,  # horovodrun here starts one node's processes (-H localhost:N)
    mesh=replicas,
    same_at_any_world_size=batchnorm_synced,
    shaping_keys=("sync_bn",),
    launched_by="horovodrun",
)


def horovod_torch() -> Any:
    """horovod.torch, or the one line that says how to get it. Imported here, not at the
    module's top: the registry, the layout tests and every other strategy's commands import
    this module where Horovod is not installed (it is opt-in)."""
    try:
        import horovod.torch as hvd
    except ImportError as err:
        raise UserError(
            f"strategy horovod: Horovod is not installed in this Python ({first_line(err)}); "
            f"`{INSTALL}` builds it (docs/horovod.md)"
        ) from None
    return hvd


def nproc(options: HorovodConfig, plan: BatchPlan, n_gpus: int) -> int:
    horovod_torch()  # refused in the launcher, before any process starts
    return gpu_count_or_nproc(n_gpus, options.nproc)


def horovod_batchnorm(
    hvd: Any, model: nn.Sequential, sync_bn: bool, plan: BatchPlan, on_cuda: bool
) -> RankBatchNorm:
    """ddp's BatchNorm, but on GPUs Horovod's SyncBatchNorm where sync_bn asks for it. On the
    CPU it refuses ("SyncBatchNorm expected input tensor to be on GPU", horovod 0.28.1), so
    there the project's gloo SyncBatchNorm computes the same statistics over torch's group."""
    if not (sync_bn and on_cuda):
        return rank_batchnorm("horovod", model, sync_bn, plan, on_cuda)
    return RankBatchNorm(_swap_sync(model, hvd), ("horovod: hvd.SyncBatchNorm",), lambda: None)


def _swap_sync(module: nn.Module, hvd: Any) -> Any:
    if isinstance(module, nn.BatchNorm2d):
        new = hvd.SyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
        ).to(module.running_mean.device if module.running_mean is not None else None)
        new.load_state_dict(module.state_dict())
        return new
    for name, child in module.named_children():
        setattr(module, name, _swap_sync(child, hvd))
    return module


def parallelize(
    model: nn.Sequential,
    options: HorovodConfig,
    plan: BatchPlan,
    ctx: DistContext,
    autocast: Autocast,
) -> DataParallelRun:
    hvd = horovod_torch()
    hvd.init()
    # the DistContext was built from horovodrun's variables (horovod_run.torchrun_env):
    # Horovod's own view of the job must be the same
    if (hvd.rank(), hvd.size()) != (ctx.rank, ctx.world_size):
        raise RuntimeError(
            f"Horovod sees rank {hvd.rank()} of {hvd.size()}, the run rank {ctx.rank} of "
            f"{ctx.world_size}: was this process started by horovodrun?"
        )
    batchnorm = horovod_batchnorm(hvd, model, options.sync_bn, plan, ctx.on_cuda)
    model = batchnorm.model
    made: list[torch.optim.Optimizer] = []

    def distributed_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        wrapped: torch.optim.Optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            backward_passes_per_step=plan.grad_accum,
            op=hvd.Average,
        )
        horovod_zero_grad = wrapped.zero_grad

        def zero_grad(set_to_none: bool = True) -> None:
            # Horovod 0.28.1's zero_grad takes no argument and clears as torch's default,
            # set_to_none=True, does: what the loop asks (trainer.py), the one way it can
            assert set_to_none, "Horovod's zero_grad only sets gradients to None"
            horovod_zero_grad()

        # an attribute of this one optimizer: Horovod's methods call super(self.__class__),
        # which a subclass of its class would send round in a loop
        wrapped.zero_grad = zero_grad  # type: ignore[method-assign]
        made.append(wrapped)
        return wrapped

    run = DataParallelRun(
        module=model,
        forward=model,
        writer=ctx.is_main,
        devices=ctx.devices_of_ranks(),
        batch_split=[plan.per_rank] * ctx.world_size,
        notes=batchnorm.notes,
        before_eval=batchnorm.before_eval,
        distributed_optimizer=distributed_optimizer,
        release=hvd.shutdown,  # its background thread joined before the process groups go
    )

    def at_start(
        loop: LoopForward, kept: Optional[Decided], say: Callable[[str], None]
    ) -> tuple[Run, Decided]:
        """Horovod's broadcasts, after the checkpoint's restore (checkpoint_policy.py): the
        ranks start from rank 0's parameters and, where it has any, optimizer state. A fresh
        SGD has none, and Horovod's broadcast_optimizer_state would then make it some by a
        step on zero gradients, which under weight decay moves every parameter: there is
        nothing to broadcast, so it is not called. It decides nothing ({})."""
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        (optimizer,) = made
        if optimizer.state_dict()["state"]:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return replace(run, at_start=None), {}

    return replace(run, at_start=at_start)


SPEC = StrategySpec(FACTS, nproc, parallelize)
