"""`ddp`: DistributedDataParallel, one process per GPU (nccl) or `ddp.nproc` on the CPU (gloo).

Each rank trains on its strided share of every micro-batch (pipeline/data/device_data.py),
gradients are averaged over ranks in backward, and with gradient accumulation only the last
micro-step all-reduces (`no_sync` on the others).
"""

from __future__ import annotations

from contextlib import nullcontext

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from pipeline.config import Config
from pipeline.errors import UserError
from pipeline.strategies.base import Parallel, gpu_count_or_nproc, writer_buffers
from pipeline.strategies.sync_batchnorm import convert_sync_batchnorm
from pipeline.training.context import DistContext

NAME = "ddp"


def nproc(cfg: Config, n_gpus: int) -> int:
    world = gpu_count_or_nproc(n_gpus, cfg.ddp.nproc)
    check_divisible(cfg, world, "ddp")
    return world


def check_divisible(cfg: Config, world: int, name: str) -> None:
    step = world * cfg.train.grad_accum
    if cfg.train.batch_size % step:
        raise UserError(
            f"train.batch_size: got {cfg.train.batch_size}, {name} needs a multiple "
            f"of processes x train.grad_accum = {world} x {cfg.train.grad_accum}"
        )


def parallelize(model: nn.Sequential, cfg: Config, ctx: DistContext) -> Parallel:
    if cfg.ddp.sync_bn:
        model = convert_sync_batchnorm(model, ctx.on_cuda)
    device_ids = [ctx.device.index] if ctx.on_cuda else None
    # DDP's defaults on purpose: static_graph=True fails on the first no_sync() step of
    # gradient accumulation (reducer.cpp "expect_autograd_hooks_", torch 2.14), and
    # broadcast_buffers=False, pointless work saved under SyncBN, warns as deprecated.
    ddp = DDP(model, device_ids=device_ids)

    def reduce_grads_if(is_last: bool):
        return nullcontext() if is_last else ddp.no_sync()

    per_rank = cfg.train.batch_size // cfg.train.grad_accum // ctx.world_size
    return Parallel(
        module=ddp,
        forward=ddp,
        data_rank=ctx.rank,
        data_world=ctx.world_size,
        writer=ctx.is_main,
        devices=ctx.devices_of_ranks(),
        batch_split=[per_rank] * ctx.world_size,
        reduce_grads_if=reduce_grads_if,
        full_state_dict=lambda: {k: v.detach().cpu() for k, v in model.state_dict().items()},
        before_eval=(lambda: None) if cfg.ddp.sync_bn else writer_buffers(model),
    )
